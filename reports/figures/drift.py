"""Semantic drift: zero the sink's value vectors (α kept) and watch the loss and the cone cosines."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from attngeom.store.format import schema as S

from ..style import Page, figure
from ..summary import fmt

SECTION = "Semantic drift"


def pages(faith, drift) -> list[Page]:
    fig = figure(wspace=0.3)
    dim = faith.attrs.get("unit_dim", S.SEQUENCE)
    name = drift.attrs.get("loss_variable", "drift_delta_ppl")
    lm = name == "drift_delta_ppl"
    ax = fig.add_subplot(1, 3, 1)
    if lm:
        v = faith["drift_delta_ppl"].values.astype(float)
        v = v[np.isfinite(v)]
        ax.boxplot([v], widths=0.4, showfliers=False)
        jitter = np.random.default_rng(0).uniform(-0.08, 0.08, len(v))
        ax.scatter(1 + jitter, v, s=10, color="#c44e52", alpha=0.7, zorder=3)
        ax.axhline(0, color="black", lw=0.7)
        ax.set_xticks([1], [f"{len(v)} {dim}s"])
        ax.set_ylabel("ΔPPL with the sink values zeroed")
    else:
        clean, after = float(faith["clean_accuracy"]), float(faith["drift_accuracy"])
        ax.bar([0, 1], [clean, after], color=["#8c8c8c", "#c44e52"])
        ax.set_xticks([0, 1], ["clean", "sink values zeroed"])
        ax.set_ylabel("accuracy")
        ax.set_ylim(0, 1)
    ax.set_title(f"Loss: mean {fmt(drift.attrs.get('loss_mean'))}, Wilcoxon p = "
                 f"{fmt(drift.attrs.get('loss_p_value'))}")

    x = drift[S.LAYER].values
    ax = fig.add_subplot(1, 3, 2)
    ax.plot(x, drift["cosine_low_before_mean"], "o-", ms=3, color="#4c72b0",
            label="low-norm outputs, clean")
    ax.plot(x, drift["cosine_low_after_mean"], "o-", ms=3, color="#c44e52",
            label="low-norm outputs, sink values zeroed")
    ax.plot(x, drift["cosine_all_before_mean"], "--", color="#4c72b0", lw=0.9,
            label="all outputs, clean")
    ax.plot(x, drift["cosine_all_after_mean"], "--", color="#c44e52", lw=0.9,
            label="all outputs, sink values zeroed")
    level = float(drift.attrs.get("level", 0.05))
    sig = np.nan_to_num(drift["cosine_low_p_holm"].values, nan=1.0) < level
    if sig.any():
        top = np.nanmax(drift["cosine_low_after_mean"].values)
        ax.scatter(x[sig], np.full(sig.sum(), top + 0.05), marker="*", s=18, color="black",
                   label=f"increase significant (Holm p < {fmt(level)})")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("cos(o_i^h, mean semantic value)")
    ax.set_title("Alignment with the semantic cone")
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.12), frameon=False, fontsize=7)

    ax = fig.add_subplot(1, 3, 3)
    ax.plot(x, drift["output_norm_low_before_mean"], "o-", ms=3, color="#4c72b0", label="clean")
    ax.plot(x, drift["output_norm_low_after_mean"], "o-", ms=3, color="#c44e52",
            label="sink values zeroed")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("‖o_i^h‖ of the low-norm outputs")
    ax.set_title("Norm of the low-norm head outputs")
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.12), frameon=False, fontsize=7)
    fig.subplots_adjust(bottom=0.4)
    before = float(drift["cosine_low_before_mean"].mean())
    after = float(drift["cosine_low_after_mean"].mean())
    frac = fmt(faith.attrs.get("drift_low_fraction", 0.1))
    what = "ΔPPL" if lm else "accuracy loss"
    caption = (f"The intervention sets the value vectors of the sink keys to zero and keeps α, "
               f"so the attention the sink receives now adds nothing. Left: per-{dim} {what} "
               f"(mean {fmt(drift.attrs.get('loss_mean'))}, one-sided Wilcoxon p = "
               f"{fmt(drift.attrs.get('loss_p_value'))}). Middle: cosine between each head output "
               f"and the mean projected value of the non-sink keys its query sees (the semantic "
               f"cone), for the lowest-norm {frac} of head outputs (solid; chosen on the clean "
               f"pass) and for all outputs (dashed). The paper predicts that without the sink the "
               f"low-norm outputs collapse into the cone: mean over layers {fmt(before)} → "
               f"{fmt(after)}; the increase is significant in {int(sig.sum())} of {len(x)} layers. "
               f"Right: the norms of the same outputs, clean and with the sink values zeroed "
               f"(mean over layers {fmt(drift['output_norm_low_before_mean'].mean())} → "
               f"{fmt(drift['output_norm_low_after_mean'].mean())}).")
    return [Page(SECTION, "Semantic drift: zeroing the sink's value vectors", fig, caption)]
