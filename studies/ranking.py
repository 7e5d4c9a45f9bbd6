"""The methods ranked on every model: the token-granularity runs' tables for studies/README.md.

Called by studies/summarize.py, which writes them between ``<!-- BEGIN GENERATED 5 -->`` and
``<!-- END GENERATED 5 -->``. Each model's token run (variant ``token``: nine metrics, signed
rank, fractions 0.01, 0.05 and 0.2, both modes) exported its statistics, which
analysis/faithfulness_stats.py computed once from the run's result:
``d1_prose_token_ranking.csv`` (adjacent steps of the observed order, Holm and TOST),
``_vs_random.csv`` (each metric against the random floor) and ``_minmax.csv`` (the AOPC
min-max normalised per text over the nine rankings). Nothing is recomputed here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import summarize_faithfulness
from attngeom.common import metrics as M
from tables import f

FOLDER, NAME = summarize_faithfulness.FOLDER, "d1_prose_token"
VARIABLE = "log_ppl_ratio"       # the primary outcome; delta_ppl is in the same CSVs
RANK = "signed"                  # the token runs rank by the signed score only
# (mode, which way is more faithful, decimals of its AOPCs)
MODES = (("comprehensiveness", "higher is more faithful", 2),
         ("sufficiency", "lower is more faithful", 3))
# the sign between two adjacent methods, from the step's verdict
SIGN = {"holds": "<", "does not hold: equivalent within ±δ": "≈",
        "inconclusive at this n": "?", "does not hold: reversed": "!",
        "not testable (identical ranking)": "="}


def read(root: Path, model: str, part: str) -> pd.DataFrame | None:
    """The token run's ``part`` table (its primary outcome and rank only), or None."""
    t = summarize_faithfulness.read(root, model, f"{NAME}_{part}")
    if t is not None and "variable" in t:
        t = t[(t["variable"] == VARIABLE) & (t["rank"] == RANK)]
    return t


def label(model: str, root: Path) -> str:
    """The model's column label, with n and "pilot" where its token run is the pilot's."""
    info = read(root, model, "info")
    n = "?" if info is None else int(info["n_units"].iloc[0]) if "n_units" in info else "?"
    pilot = (root / model / FOLDER / "d1_prose_pilot_info.csv").exists() and not \
        (root / model / FOLDER / "d1_prose_info.csv").exists()
    return f"{model} (n={n}{', pilot' if pilot else ''})"


def order_line(steps: pd.DataFrame, mode: str, digits: int) -> str:
    """"random 0.04 < rollout 0.52 ≈ …": the observed order, least faithful first."""
    s = steps[steps["mode"] == mode].sort_values("position")
    if s.empty:
        return "not run"
    parts = [f"{M.label(s['lower'].iloc[0], 'short')} {f(s['aopc_lower'].iloc[0], digits)}"]
    for r in s.itertuples():
        parts.append(f"{SIGN.get(r.verdict, '?')} {M.label(r.higher, 'short')} "
                     f"{f(r.aopc_higher, digits)}")
    return " ".join(parts)


def order_table(root: Path, models: list[str]) -> str:
    lines = ["| mode | model | observed order, least faithful first (AOPC of the log-PPL ratio) |",
             "|---|---|---|"]
    for mode, why, digits in MODES:
        for m in models:
            steps = read(root, m, "ranking")
            cell = "not run" if steps is None else order_line(steps, mode, digits)
            lines.append(f"| {mode} ({why}) | {label(m, root)} | {cell} |")
    return "\n".join(lines)


def floor_cell(vs: pd.DataFrame | None, mm: pd.DataFrame | None, metric: str, mode: str) -> str:
    """"1.84 (47×, 1.00)": the AOPC, its ratio of means to random's, the min-max mean."""
    if vs is None or mm is None:
        return "not run"
    v = vs[(vs["metric"] == metric) & (vs["mode"] == mode)]
    n = mm[(mm["metric"] == metric) & (mm["mode"] == mode)]
    if n.empty:
        return "not run"
    if metric == "random":
        return f"{f(n['aopc_mean'].iloc[0], 3)} (floor, {f(n['minmax_mean'].iloc[0])})"
    r = v.iloc[0]
    mark = "" if r["better"] else " not better"
    return (f"{f(r['aopc_metric'], 3)} ({f(r['ratio_of_means'], 2)}×{mark}, "
            f"{f(n['minmax_mean'].iloc[0])})")


def floor_table(root: Path, models: list[str], mode: str) -> str:
    cols = [label(m, root) for m in models]
    lines = ["| metric | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    tables = {m: (read(root, m, "vs_random"), read(root, m, "minmax")) for m in models}
    for metric in [n for n in M.names() if any(
            t[1] is not None and metric_in(t[1], n) for t in tables.values())]:
        cells = [floor_cell(*tables[m], metric, mode) for m in models]
        lines.append(f"| {M.label(metric, 'short')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def metric_in(t: pd.DataFrame, metric: str) -> bool:
    return bool((t["metric"] == metric).any())


def generated(root: Path, models: list[str]) -> str:
    """The ranking section: the order per mode and model, then each metric against random."""
    models = [m for m in models if (root / m / FOLDER / f"{NAME}_ranking.csv").exists()]
    if not models:
        return ("Not run yet: each model's `run_faithfulness.sh` with the token variant writes "
                f"`studies/<model>/{FOLDER}/{NAME}_ranking.csv`.\n")
    parts = ["#### The methods ranked on every model (token granularity, signed rank, "
             "fractions 0.01, 0.05, 0.2)\n",
             "Between adjacent methods: `<` less faithful than, the step holds (Wilcoxon "
             "signed-rank, Holm over the run's steps), `≈` equivalent within δ = 0.05 nats "
             "(TOST), `?` neither: too few texts to tell, `=` the same ranking (not testable). "
             f"Numbers: each method's AOPC of the log-PPL ratio (`{NAME}_ranking.csv`).\n",
             order_table(root, models), ""]
    for mode, why, _ in MODES:
        parts += [f"**Against the random floor, {mode}** ({why}): AOPC, its ratio to "
                  "random's (ratio of means; \"not better\" where the Holm-corrected test "
                  "against random does not hold), and the AOPC min-max normalised per text "
                  "over the nine rankings (0 the text's lowest AOPC, 1 its highest; "
                  f"`{NAME}_vs_random.csv`, `{NAME}_minmax.csv`).\n",
                  floor_table(root, models, mode), ""]
    return "\n".join(parts) + "\n"
