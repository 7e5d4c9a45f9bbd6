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


def pages(faith, stats) -> list[Page]:
    """The curves page and the table pages, from the stored statistics ``stats``."""
    return [_curves_page(faith, stats)] + table_pages(tables(stats))

