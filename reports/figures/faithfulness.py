"""Faithfulness: loss against removal fraction per metric, the AOPC table and the order test."""

from __future__ import annotations

import numpy as np

from attngeom.analysis import equivalence as eq
from attngeom.common import metrics as M
from attngeom.store.format import schema as S

from ..style import Page, figure, metric_color, table
from ..summary import ci, fmt

SECTION = "Faithfulness"
VERDICTS = {eq.HOLDS: "holds", eq.EQUIVALENT: "equivalent ±δ", eq.REVERSED: "reversed",
            eq.INCONCLUSIVE: "inconclusive", eq.NOT_TESTABLE: "not testable"}


def _curve(curves, metric, rank, mode) -> tuple[np.ndarray, ...]:
    """Fractions, mean and the stored t band (analysis.faithfulness_stats) of one curve."""
    at = dict(metric=metric, rank=rank, mode=mode)
    return (curves["fraction"].values.astype(float),
            *(curves[k].sel(at).transpose("fraction").values
              for k in ("curve_mean", "curve_low", "curve_high")))


def _curves_page(faith, curves, level: float) -> Page:
    lm = faith.attrs.get("loss_variable", "delta_ppl") == "delta_ppl"
    ylabel = "ΔPPL (intervened − clean)" if lm else "accuracy"
    origin = 0.0 if lm else float(faith["clean_accuracy"])
    ranks, modes = list(faith["rank"].values), list(faith["mode"].values)
    fig = figure(hspace=0.55, wspace=0.22)
    same = faith["same_ranking_as"] if "same_ranking_as" in faith else None
    for r, rank in enumerate(ranks):
        for m, mode in enumerate(modes):
            ax = fig.add_subplot(len(ranks), len(modes), r * len(modes) + m + 1)
            for metric in faith["metric"].values:
                x, mean, lo, hi = _curve(curves, metric, rank, mode)
                copied = same is not None and str(same.sel(metric=metric, rank=rank).item())
                if 0.0 not in x:
                    x, mean = np.r_[0.0, x], np.r_[origin, mean]
                    lo, hi = np.r_[origin, lo], np.r_[origin, hi]
                color = metric_color(str(metric))
                ax.plot(x, mean, "o-" if not copied else "s--", ms=3, lw=1.3, color=color,
                        label=M.label(str(metric))
                        + (f" (= {copied})" if copied else ""))
                ax.fill_between(x, lo, hi, color=color, alpha=0.12, lw=0)
            ax.set_title(f"{mode}, {rank} ranking: remove the "
                         f"{'top' if mode == 'comprehensiveness' else 'bottom'}-ranked keys")
            ax.set_xlabel("removal fraction p")
            ax.set_ylabel(ylabel)
            ax.set_xlim(left=0)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.285), ncol=3,
               frameon=False)
    fig.subplots_adjust(bottom=0.37)
    dim = faith.attrs.get("unit_dim", S.SEQUENCE)
    caption = (f"At every layer, each metric ranks the keys of each query (granularity: "
               f"{faith.attrs.get('granularity', 'head')}); comprehensiveness removes the "
               f"top-ranked fraction p of the terms α_ij ṽ_j from the head output, sufficiency "
               f"the bottom-ranked (no renormalisation). "
               + ("Lines are the mean ΔPPL " if lm else "Lines are the accuracy ")
               + f"over {faith.sizes[dim]} {dim}s, bands the t-based {100 * (1 - level):g}% CI "
               f"over {dim}s; p = 0 is the clean model. A more faithful metric hurts more when its top keys go "
               f"(higher curve, left) and less when its bottom keys go (lower curve, right). "
               f"Dashed lines copy a metric whose ranking is provably identical. "
               + ("Signed ranking orders by the score, magnitude by |score|, which matters only "
                  "for contributions, the metrics that can be negative." if len(ranks) > 1 else
                  "Only the signed ranking was run."))
    what = "ΔPPL" if lm else "accuracy"
    return Page(SECTION, f"Faithfulness: {what} against removal fraction "
                f"(task: {faith.attrs.get('task', 'lm')})", fig, caption)


def _tables_page(faith, aopc, order, label: str) -> Page:
    fig = figure(top=0.88, bottom=0.3, hspace=0.2)
    grid = fig.add_gridspec(2, 1, height_ratios=[1, 1.9])
    combos = [(m, r) for m in faith["mode"].values for r in faith["rank"].values]
    rows = []
    for metric in faith["metric"].values:
        row = [M.label(str(metric))]
        for mode, rank in combos:
            sel = aopc[(aopc.metric == metric) & (aopc["mode"] == mode) & (aopc["rank"] == rank)]
            row.append(f"{fmt(sel.aopc_mean.iloc[0])} ± {fmt(sel.aopc_sem.iloc[0])}"
                       if len(sel) else "")
        rows.append(row)
    header = ["metric"] + [f"{m[:4]}. {r}" for m, r in combos]
    table(fig.add_subplot(grid[0]), rows, header,
          [0.26] + [0.74 / len(combos)] * len(combos),
          f"AOPC of {label} (mean over fractions, then mean ± s.e. over units)")
    rows = []
    for _, t in order.iterrows():
        step = f"{M.label(t['lower'], 'short')} → {M.label(t['higher'], 'short')}"
        tested = np.isfinite(t["p_holm"])
        rows.append([t["mode"], t["rank"], step, str(int(t["n"])), fmt(t["mean_improvement"]),
                     ci(t["ci_low"], t["ci_high"]) if tested else "",
                     fmt(t["p_holm"]) if tested else "", fmt(t["mde"]) if tested else "",
                     VERDICTS.get(t["verdict"], t["verdict"])])
    table(fig.add_subplot(grid[1]), rows,
          ["mode", "rank", "step (lower → higher)", "n", "improvement",
           f"{100 * (1 - float(order.attrs.get('level', 0.05))):g}% CI (bootstrap)",
           "Holm p", "MDE", "verdict"], [0.13, 0.08, 0.27, 0.04, 0.09, 0.15, 0.07, 0.07, 0.10],
          "Hierarchy test: " + " < ".join(M.label(m, "short") for m in M.PAPER_ORDER))
    tested = order[order["p_holm"].notna()]
    caption = (f"Top: area over the perturbation curve (AOPC) per metric, mode and ranking; "
               f"larger is more faithful for comprehensiveness, smaller for sufficiency. Bottom: "
               f"each step of the paper's order tested on paired per-unit AOPC differences, "
               f"oriented so that a positive improvement means the step holds; one-sided "
               f"Wilcoxon signed-rank test, Holm correction over all tested steps, BCa bootstrap "
               f"CI of the mean improvement. A step holds when Holm p < "
               f"{fmt(order.attrs.get('level', 0.05))} and the CI lies above 0: "
               f"{int(tested['holds'].sum())} of {len(tested)} tested steps hold. MDE: the "
               f"smallest mean improvement the design detects with power "
               f"{fmt(order.attrs.get('power', 0.8))} at the first Holm level; a step that does "
               f"not hold is 'equivalent' when TOST puts its mean within ±δ = "
               f"{fmt(order['delta'].iloc[0]) if len(order) else 'n/a'}, 'inconclusive' when "
               f"the design cannot tell. Steps between metrics with provably identical rankings "
               f"are reported, not tested.")
    return Page(SECTION, "Faithfulness: AOPC and the order of metrics", fig, caption)


def pages(faith, curves, aopc, order, label: str) -> list[Page]:
    """The curves and the tables pages, from the stored statistics."""
    level = float(order.attrs.get("level", 0.05))
    return [_curves_page(faith, curves, level), _tables_page(faith, aopc, order, label)]
