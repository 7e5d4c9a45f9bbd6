"""Faithfulness: loss against removal fraction per metric, the AOPC table and the order test."""

from __future__ import annotations

import numpy as np
from scipy import stats

from attngeom.store.format import schema as S
from attngeom.store.format.vocab import (ATTENTION, CONTRIBUTION, CONTRIBUTION_LAYER,
                                         VALUE_WEIGHTED, VALUE_WEIGHTED_NORMALIZED)

from ._style import METRIC_COLORS, METRIC_LABELS, Page, figure
from .summary import ci, fmt

SECTION = "Faithfulness"
SHORT = {ATTENTION: "attention", VALUE_WEIGHTED: "value-weighted",
         VALUE_WEIGHTED_NORMALIZED: "normalized", CONTRIBUTION: "contribution",
         CONTRIBUTION_LAYER: "layer contribution"}


def _curve(faith, metric, rank, mode, variable: str) -> tuple[np.ndarray, ...]:
    """Fractions, mean, and the t-based 95% band over units of ``variable``."""
    dim = faith.attrs.get("unit_dim", S.SEQUENCE)
    x = faith[variable].sel(metric=metric, rank=rank, mode=mode).astype(float)
    x = x.transpose("fraction", dim).values
    n = np.isfinite(x).sum(1)
    mean = np.nanmean(x, 1)
    sd = np.nanstd(x, 1, ddof=1) if x.shape[1] > 1 else np.zeros(len(mean))
    half = stats.t.ppf(0.975, np.maximum(n - 1, 1)) * sd / np.sqrt(np.maximum(n, 1))
    return faith["fraction"].values.astype(float), mean, mean - half, mean + half


def _curves_page(faith) -> Page:
    lm = faith.attrs.get("loss_variable", "delta_ppl") == "delta_ppl"
    variable = "delta_ppl" if lm else "correct"
    ylabel = "ΔPPL (intervened − clean)" if lm else "accuracy"
    origin = 0.0 if lm else float(faith["clean_accuracy"])
    ranks, modes = list(faith["rank"].values), list(faith["mode"].values)
    fig = figure(hspace=0.55, wspace=0.22)
    same = faith["same_ranking_as"] if "same_ranking_as" in faith else None
    for r, rank in enumerate(ranks):
        for m, mode in enumerate(modes):
            ax = fig.add_subplot(len(ranks), len(modes), r * len(modes) + m + 1)
            for metric in faith["metric"].values:
                x, mean, lo, hi = _curve(faith, metric, rank, mode, variable)
                copied = same is not None and str(same.sel(metric=metric, rank=rank).item())
                if 0.0 not in x:
                    x, mean = np.r_[0.0, x], np.r_[origin, mean]
                    lo, hi = np.r_[origin, lo], np.r_[origin, hi]
                color = METRIC_COLORS.get(str(metric), None)
                ax.plot(x, mean, "o-" if not copied else "s--", ms=3, lw=1.3, color=color,
                        label=METRIC_LABELS.get(str(metric), str(metric))
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
               + f"over {faith.sizes[dim]} {dim}s, bands the t-based 95% CI over {dim}s; p = 0 "
               f"is the clean model. A more faithful metric hurts more when its top keys go "
               f"(higher curve, left) and less when its bottom keys go (lower curve, right). "
               f"Dashed lines copy a metric whose ranking is provably identical. "
               + ("Signed ranking orders by the score, magnitude by |score|, which matters only "
                  "for contributions, the metrics that can be negative." if len(ranks) > 1 else
                  "Only the signed ranking was run."))
    what = "ΔPPL" if lm else "accuracy"
    return Page(SECTION, f"Faithfulness: {what} against removal fraction "
                f"(task: {faith.attrs.get('task', 'lm')})", fig, caption)


def _table(ax, rows, header, widths=None, title=""):
    ax.axis("off")
    table = ax.table(cellText=rows, colLabels=header, loc="upper center", cellLoc="center",
                     colWidths=widths)
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    table.scale(1, 1.25)
    for (r, _), cell in table.get_celld().items():
        cell.set_linewidth(0.3)
        if r == 0:
            cell.set_facecolor("#e8e8e8")
    ax.set_title(title, loc="left", fontsize=10)


def _tables_page(faith, aopc, order, label: str) -> Page:
    fig = figure(top=0.88, bottom=0.3, hspace=0.2)
    grid = fig.add_gridspec(2, 1, height_ratios=[1, 1.9])
    combos = [(m, r) for m in faith["mode"].values for r in faith["rank"].values]
    rows = []
    for metric in faith["metric"].values:
        row = [METRIC_LABELS.get(str(metric), str(metric))]
        for mode, rank in combos:
            sel = aopc[(aopc.metric == metric) & (aopc["mode"] == mode) & (aopc["rank"] == rank)]
            row.append(f"{fmt(sel.aopc_mean.iloc[0])} ± {fmt(sel.aopc_sem.iloc[0])}"
                       if len(sel) else "")
        rows.append(row)
    header = ["metric"] + [f"{m[:4]}. {r}" for m, r in combos]
    _table(fig.add_subplot(grid[0]), rows, header,
           [0.26] + [0.74 / len(combos)] * len(combos),
           f"AOPC of {label} (mean over fractions, then mean ± s.e. over units)")
    rows = []
    for _, t in order.iterrows():
        step = f"{SHORT.get(t['lower'], t['lower'])} → {SHORT.get(t['higher'], t['higher'])}"
        tested = np.isfinite(t["p_holm"])
        rows.append([t["mode"], t["rank"], step, str(int(t["n"])), fmt(t["mean_improvement"]),
                     ci(t["ci_low"], t["ci_high"]) if tested else "",
                     fmt(t["p_holm"]) if tested else "",
                     ("yes" if t["holds"] else "no") if tested else "not testable"])
    _table(fig.add_subplot(grid[1]), rows,
           ["mode", "rank", "step (lower → higher)", "n", "improvement", "95% CI (bootstrap)",
            "Holm p", "holds"], [0.13, 0.08, 0.33, 0.04, 0.09, 0.15, 0.08, 0.10],
           "Hierarchy test: attention < value-weighted < normalized < contribution")
    tested = order[order["p_holm"].notna()]
    caption = (f"Top: area over the perturbation curve (AOPC) per metric, mode and ranking; "
               f"larger is more faithful for comprehensiveness, smaller for sufficiency. Bottom: "
               f"each step of the paper's order tested on paired per-unit AOPC differences, "
               f"oriented so that a positive improvement means the step holds; one-sided "
               f"Wilcoxon signed-rank test, Holm correction over all tested steps, BCa bootstrap "
               f"CI of the mean improvement. A step holds when Holm p < "
               f"{fmt(order.attrs.get('level', 0.05))} and the CI lies above 0: "
               f"{int(tested['holds'].sum())} of {len(tested)} tested steps hold. Steps between "
               f"metrics with provably identical rankings are reported, not tested.")
    return Page(SECTION, "Faithfulness: AOPC and the order of metrics", fig, caption)


def pages(faith, aopc, order, label: str) -> list[Page]:
    return [_curves_page(faith), _tables_page(faith, aopc, order, label)]
