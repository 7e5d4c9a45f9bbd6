"""A faithfulness result's stored statistics as titled tables of strings, cell for cell the same in
``attngeom faithfulness``'s printout and in the PDF.

:func:`tables` turns the stored statistics
(:class:`attngeom.analysis.faithfulness_stats.FaithStats`)
into :class:`Table` objects, for every loss the statistics hold (ΔPPL and the log perplexity
ratio for language modelling, the accuracy loss for multiple choice); :func:`as_text` prints one
(columns separated by `` | ``), and the PDF draws the same rows
(:mod:`attngeom.reports.figures.faithfulness`). Numbers go through :func:`~.summary.fmt`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attngeom.analysis import equivalence as eq
from attngeom.common import metrics as M

from .summary import ci, fmt

VARIABLES = {"delta_ppl": "ΔPPL", eq.LOG_RATIO: "log(PPL / clean PPL), nats",
             "accuracy_loss": "accuracy loss"}
VERDICTS = {eq.HOLDS: "holds", eq.EQUIVALENT: "equivalent ±δ", eq.REVERSED: "reversed",
            eq.INCONCLUSIVE: "inconclusive", eq.NOT_TESTABLE: "not testable"}
SEP = " | "


@dataclass
class Table:
    """A titled table of strings; ``widths``: the PDF's relative column widths."""

    title: str
    header: list[str]
    rows: list[list[str]]
    widths: list[float]
    kind: str = ""            # curves, aopc, order: what it shows


def variable_label(variable: str) -> str:
    """``ΔPPL``, ``log(PPL / clean PPL), nats``, ``accuracy loss``, or the name itself."""
    return VARIABLES.get(variable, variable)


def _short(metric: str) -> str:
    return M.label(str(metric), "short")


def _cells(table: pd.DataFrame, variable: str) -> pd.DataFrame:
    return table[table["variable"] == variable]


def curves_table(curves: pd.DataFrame, variable: str) -> Table:
    """Mean loss per (metric, mode) row and (rank, fraction) column."""
    c = _cells(curves, variable)
    ranks, fractions = list(dict.fromkeys(c["rank"])), sorted(set(c["fraction"]))
    rows = []
    for (metric, mode), g in c.groupby(["metric", "mode"], sort=False):
        at = {(r.rank, r.fraction): r.loss_mean for r in g.itertuples()}
        rows.append([_short(metric), mode] + [fmt(at.get((r, p))) for r in ranks
                                              for p in fractions])
    header = ["metric", "mode"] + [f"{r} p={fmt(p)}" for r in ranks for p in fractions]
    n = len(header) - 2
    return Table(f"Mean {variable_label(variable)} at each removal fraction p", header, rows,
                 [0.18, 0.14] + [0.68 / n] * n, "curves")


def aopc_table(aopc: pd.DataFrame, variable: str) -> Table:
    """Mean ± s.e. of the per-unit AOPC and, beside it, the mean AOPC min-max over the
    rankings run, metrics by (mode, rank) columns."""
    a = _cells(aopc, variable)
    combos = [(m, r) for m in dict.fromkeys(a["mode"]) for r in dict.fromkeys(a["rank"])]
    minmax = "minmax_mean" in a
    rows = []
    for metric, g in a.groupby("metric", sort=False):
        at = {(r.mode, r.rank): r for r in g.itertuples()}
        cells = []
        for c in combos:
            cells.append(f"{fmt(at[c].aopc_mean)} ± {fmt(at[c].aopc_sem)}" if c in at else "")
            if minmax:
                cells.append(fmt(at[c].minmax_mean) if c in at else "")
        rows.append([_short(metric)] + cells)
    header = ["metric"] + [h for m, r in combos for h in
                           ([f"{m[:4]}. {r}", "min–max"] if minmax else [f"{m[:4]}. {r}"])]
    n = len(header) - 1
    return Table(f"AOPC of {variable_label(variable)} (mean over fractions, then mean ± s.e. "
                 "over units" + ("; min–max: the AOPC rescaled per unit between the lowest "
                                 "and the highest of the rankings run, mean" if minmax else "")
                 + ")", header, rows, [0.16] + [0.84 / n] * n, "aopc")


def order_table(order: pd.DataFrame, variable: str, level: float) -> Table:
    """Each step of the paper's order: improvement, CI, Holm p, MDE, TOST p and verdict."""
    o = _cells(order, variable)
    rows = []
    for t in o.itertuples():
        tested = pd.notna(t.p_holm)
        rows.append([t.mode, t.rank, f"{_short(t.lower)} → {_short(t.higher)}", str(int(t.n)),
                     fmt(t.mean_improvement), ci(t.ci_low, t.ci_high) if tested else "",
                     fmt(t.p_holm) if tested else "", fmt(t.mde) if tested else "",
                     fmt(t.p_tost) if tested else "", VERDICTS.get(t.verdict, t.verdict)])
    delta = fmt(o["delta"].iloc[0]) if len(o) else "n/a"
    header = ["mode", "rank", "step (lower → higher)", "n", "improvement",
              f"{100 * (1 - level):g}% CI (BCa)", "Holm p", "MDE", "TOST p", "verdict"]
    return Table(f"The paper's order on the AOPC of {variable_label(variable)} (improvement "
                 f"> 0: the step holds; TOST at δ = {delta})", header, rows,
                 [0.12, 0.08, 0.25, 0.04, 0.09, 0.15, 0.07, 0.07, 0.07, 0.1], "order")


def ranking_table(ranking: pd.DataFrame, variable: str, level: float) -> Table:
    """The metrics from the least to the most faithful, each adjacent step tested."""
    o = _cells(ranking, variable)
    rows = []
    for t in o.itertuples():
        tested = pd.notna(t.p_holm)
        rows.append([t.mode, t.rank, str(int(t.position)),
                     f"{_short(t.lower)} → {_short(t.higher)}", fmt(t.mean_improvement),
                     ci(t.ci_low, t.ci_high) if tested else "", fmt(t.p_holm) if tested else "",
                     fmt(t.mde) if tested else "", VERDICTS.get(t.verdict, t.verdict)])
    header = ["mode", "rank", "step", "less → more faithful", "improvement",
              f"{100 * (1 - level):g}% CI (BCa)", "Holm p", "MDE", "verdict"]
    return Table(f"Ranking of every metric run by mean AOPC of {variable_label(variable)}, "
                 "adjacent steps tested two-sided", header, rows,
                 [0.12, 0.08, 0.04, 0.3, 0.09, 0.15, 0.07, 0.06, 0.09], "ranking")


def random_table(vs_random: pd.DataFrame, variable: str, level: float) -> Table:
    """Each metric's AOPC against random's: paired difference and ratio of means."""
    o = _cells(vs_random, variable)
    rows = []
    for t in o.itertuples():
        tested = pd.notna(t.p_holm)
        rows.append([t.mode, t.rank, _short(t.metric), str(int(t.n)), fmt(t.mean_difference),
                     ci(t.ci_low, t.ci_high) if tested else "", fmt(t.p_holm) if tested else "",
                     fmt(t.ratio_of_means), ci(t.ratio_ci_low, t.ratio_ci_high),
                     ("better" if t.better else "not shown better") if tested else
                     "not testable"])
    header = ["mode", "rank", "metric", "n", "difference", f"{100 * (1 - level):g}% CI (BCa)",
              "Holm p", "ratio of means", "ratio CI", "verdict"]
    return Table(f"Against random on the AOPC of {variable_label(variable)} (difference > 0: "
                 "better than random)", header, rows,
                 [0.12, 0.08, 0.17, 0.04, 0.09, 0.15, 0.07, 0.08, 0.12, 0.08], "random")


def self_key_table(self_key: pd.DataFrame) -> Table | None:
    """Mean share of removed sets that hold the query's own key, per metric and condition."""
    s = self_key.dropna(subset=["share_mean"]) if len(self_key) else self_key
    if s.empty:
        return None
    combos = list(dict.fromkeys(zip(s["mode"], s["rank"], s["fraction"])))
    rows = []
    for metric, g in s.groupby("metric", sort=False):
        at = {(r.mode, r.rank, r.fraction): r.share_mean for r in g.itertuples()}
        rows.append([_short(metric)] + [fmt(at.get(c)) for c in combos])
    header = ["metric"] + [f"{m[:4]}. {r} p={fmt(p)}" for m, r, p in combos]
    return Table("Share of removed sets holding the query's own key (its residual x_i is never "
                 "removed)", header, rows, [0.2] + [0.8 / len(combos)] * len(combos), "self key")


def tables(stats) -> list[Table]:
    """Every table of the stored statistics ``stats``, loss by loss."""
    level = float(stats.attrs["level"])
    out = []
    for variable in stats.variables:
        out.append(curves_table(stats.curves, variable))
        out.append(aopc_table(stats.aopc, variable))
        if len(_cells(stats.order, variable)):
            out.append(order_table(stats.order, variable, level))
        if len(stats.ranking) and len(_cells(stats.ranking, variable)):
            out.append(ranking_table(stats.ranking, variable, level))
        if len(stats.vs_random) and len(_cells(stats.vs_random, variable)):
            out.append(random_table(stats.vs_random, variable, level))
    own = self_key_table(stats.self_key)
    return out + ([own] if own is not None else [])


def as_text(table: Table) -> str:
    """The title, then the header and each row with columns aligned and separated by ``|``."""
    lines = [table.header] + table.rows
    width = [max(len(line[c]) for line in lines) for c in range(len(table.header))]
    body = [SEP.join(cell.ljust(w) for cell, w in zip(line, width)).rstrip() for line in lines]
    return "\n".join([table.title + ":"] + body)


def parse_text(text: str) -> list[list[str]]:
    """The rows (header first) of a table printed by :func:`as_text`, cells stripped."""
    return [[cell.strip() for cell in line.split(SEP.strip())]
            for line in text.splitlines()[1:] if line.strip()]
