"""Faithfulness: loss against removal fraction per metric, then every stored table, loss by loss.

The tables are :func:`attngeom.reports.faithfulness_tables.tables`, the rows
``attngeom faithfulness`` prints, drawn here page by page (a long table continues on the next
page).
"""

from __future__ import annotations

import numpy as np

from attngeom.common import metrics as M
from attngeom.store.format import schema as S

from ..faithfulness_tables import Table, tables, variable_label
from ..style import Page, figure, metric_color, table

SECTION = "Faithfulness"
ROWS_PER_PAGE = 24                 # table rows (headers included) a page holds


def _curve(curves, variable, metric, rank, mode) -> tuple[np.ndarray, ...]:
    """Fractions, mean and the stored t band of one curve (analysis.faithfulness_stats)."""
    c = curves[(curves["variable"] == variable) & (curves["metric"] == metric)
               & (curves["rank"] == rank) & (curves["mode"] == mode)].sort_values("fraction")
    return tuple(c[k].to_numpy(dtype=float) for k in ("fraction", "loss_mean", "ci_low",
                                                      "ci_high"))


def _curves_page(faith, stats) -> Page:
    variable, level = stats.variables[0], float(stats.attrs["level"])
    ranks, modes = list(faith["rank"].values), list(faith["mode"].values)
    fig = figure(hspace=0.55, wspace=0.22)
    same = faith["same_ranking_as"] if "same_ranking_as" in faith else None
    for r, rank in enumerate(ranks):
        for m, mode in enumerate(modes):
            ax = fig.add_subplot(len(ranks), len(modes), r * len(modes) + m + 1)
            for metric in faith["metric"].values:
                x, mean, lo, hi = _curve(stats.curves, variable, metric, rank, mode)
                copied = same is not None and str(same.sel(metric=metric, rank=rank).item())
                if 0.0 not in x:                      # p = 0: the clean model, no loss
                    x, mean, lo, hi = (np.r_[0.0, v] for v in (x, mean, lo, hi))
                color = metric_color(str(metric))
                ax.plot(x, mean, "o-" if not copied else "s--", ms=3, lw=1.3, color=color,
                        label=M.label(str(metric)) + (f" (= {copied})" if copied else ""))
                ax.fill_between(x, lo, hi, color=color, alpha=0.12, lw=0)
            ax.set_title(f"{mode}, {rank} ranking: remove the "
                         f"{'top' if mode == 'comprehensiveness' else 'bottom'}-ranked keys")
            ax.set_xlabel("removal fraction p")
            ax.set_ylabel(variable_label(variable))
            ax.set_xlim(left=0)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.285), ncol=3,
               frameon=False)
    fig.subplots_adjust(bottom=0.37)
    dim = faith.attrs.get("unit_dim", S.SEQUENCE)
    caption = (f"At every layer, each metric ranks the keys of each query (granularity: "
               f"{faith.attrs.get('granularity', 'head')}); comprehensiveness removes the "
               f"top-ranked fraction p of the terms α_ij ṽ_j from the head output, sufficiency "
               f"the bottom-ranked (no renormalisation). Lines are the mean "
               f"{variable_label(variable)} over {faith.sizes[dim]} {dim}s, bands the t-based "
               f"{100 * (1 - level):g}% CI over {dim}s; p = 0 is the clean model (no loss). A "
               f"more faithful metric hurts more when its top keys go (higher curve, left) and "
               f"less when its bottom keys go (lower curve, right). Dashed lines copy a metric "
               f"whose ranking is provably identical. "
               + ("Signed ranking orders by the score, magnitude by |score|, which matters only "
                  "for the metrics that can be negative." if len(ranks) > 1 else
                  "Only the signed ranking was run."))
    return Page(SECTION, f"Faithfulness: {variable_label(variable)} against removal fraction "
                f"(task: {faith.attrs.get('task', 'lm')})", fig, caption)


def _chunks(tabs: list[Table]) -> list[list[Table]]:
    """Tables packed into pages of :data:`ROWS_PER_PAGE` rows, a long one split in parts."""
    pages, page, used = [], [], 0
    for t in tabs:
        rows = t.rows or [[""] * len(t.header)]
        for start in range(0, len(rows), ROWS_PER_PAGE - 2):
            part = rows[start:start + ROWS_PER_PAGE - 2]
            title = t.title + (" (continued)" if start else "")
            if page and used + len(part) + 2 > ROWS_PER_PAGE:
                pages.append(page)
                page, used = [], 0
            page.append(Table(title, t.header, part, t.widths, t.kind))
            used += len(part) + 2
    return pages + ([page] if page else [])


CAPTIONS = {
    "curves": "Mean loss over units at each removal fraction (the curves' points).",
    "aopc": "AOPC: the per-unit mean of the loss over the swept fractions; larger is more "
            "faithful for comprehensiveness, smaller for sufficiency.",
    "order": "Each step of the paper's order on paired per-unit AOPC differences, oriented so "
             "that a positive improvement means the step holds: one-sided Wilcoxon signed-rank "
             "test, Holm correction over the tested steps of the loss, BCa bootstrap CI of the "
             "mean improvement; a step holds when Holm p < level and the CI lies above 0. MDE: "
             "the smallest mean improvement the design detects with the stated power at the "
             "first Holm level; a step that does not hold is 'equivalent ±δ' when TOST puts "
             "its mean within ±δ, 'inconclusive' when the design cannot tell. Steps between "
             "provably identical rankings are reported, not tested.",
    "ranking": "Every metric run, random included, ordered per mode and ranking from the least "
               "to the most faithful by mean AOPC; each adjacent step tested as the paper's "
               "order is (paired Wilcoxon, two-sided as the order comes from the same data, Holm, "
               "BCa CI, MDE, TOST).",
    "random": "Each metric against the random floor: the mean paired per-unit AOPC difference "
              "(oriented: > 0 is better than random), its BCa CI and one-sided Wilcoxon test "
              "with Holm over the rows; and the ratio of the mean AOPCs (paired percentile "
              "bootstrap CI), above 1 better for comprehensiveness, below 1 for sufficiency.",
    "self key": "ALTI and the norm-based method score the query's own key with its residual, "
                "which the removal (α_ij ṽ_j only) cannot remove; the _sa variants rank it by "
                "its attention part.",
}


def table_pages(tabs: list[Table]) -> list[Page]:
    """The tables drawn page by page, each page's caption saying what its kinds of table are."""
    pages = []
    for part in _chunks(tabs):
        fig = figure(top=0.9, bottom=0.12, hspace=0.45)
        grid = fig.add_gridspec(len(part), 1, height_ratios=[len(t.rows) + 2 for t in part])
        for g, t in zip(grid, part):
            table(fig.add_subplot(g), t.rows, t.header, t.widths, t.title)
        kinds = list(dict.fromkeys(t.kind for t in part))
        pages.append(Page(SECTION, "Faithfulness: " + ", ".join(kinds) + " tables", fig,
                          " ".join(CAPTIONS.get(k, "") for k in kinds)))
    return pages


def ranking_figure(stats, variable: str | None = None):
    """Per (mode, rank): each metric's mean AOPC min-max over the rankings run, with its t
    interval, metrics in the ranking's order (least faithful at the bottom)."""
    variable = variable or stats.variables[0]
    a = stats.aopc[stats.aopc["variable"] == variable]
    r = stats.ranking[stats.ranking["variable"] == variable]
    combos = list(dict.fromkeys(zip(a["mode"], a["rank"])))
    fig = figure(hspace=0.45, wspace=0.45, bottom=0.12)
    for n, (mode, rank) in enumerate(combos):
        ax = fig.add_subplot(2, -(-len(combos) // 2), n + 1)
        steps = r[(r["mode"] == mode) & (r["rank"] == rank)].sort_values("position")
        order = list(steps["lower"]) + list(steps["higher"].iloc[-1:])
        cell = a[(a["mode"] == mode) & (a["rank"] == rank)].set_index("metric")
        order = order or list(cell.index)
        for y, metric in enumerate(order):
            row = cell.loc[metric]
            ax.errorbar(row.minmax_mean, y, xerr=[[row.minmax_mean - row.minmax_ci_low],
                                                  [row.minmax_ci_high - row.minmax_mean]],
                        fmt="o", ms=4, color=metric_color(metric), capsize=2)
        ax.set_yticks(range(len(order)), [M.label(m, "short") for m in order])
        ax.set_xlim(-0.05, 1.05)
        ax.set_xlabel(f"AOPC min–max of {variable_label(variable)}")
        ax.set_title(f"{mode}, {rank}: {'higher' if mode == 'comprehensiveness' else 'lower'} "
                     "is more faithful")
    return fig


def pages(faith, stats) -> list[Page]:
    """The curves page, the ranking figure and the table pages, from the stored statistics."""
    out = [_curves_page(faith, stats)]
    if len(stats.ranking) and "minmax_mean" in stats.aopc:
        variable = stats.variables[-1]
        out.append(Page(SECTION, "Faithfulness: every metric ranked", ranking_figure(
            stats, variable), f"Mean AOPC of {variable_label(variable)} rescaled per unit "
            "between the lowest (0) and the highest (1) AOPC of the rankings run on it, with "
            "its t interval; metrics in the order of the ranking table (least faithful at the "
            "bottom for comprehensiveness and sufficiency alike)."))
    return out + table_pages(tables(stats))

