"""The sample size of a design-1 run from its pilot (studies/README.md, "Design of the fourth
study"), printed alone on stdout so that a run script can read it::

    N=$(.venv/bin/python studies/sample_size.py --pilot RESULTS/d1_prose_pilot_order_log.csv \\
        --reference studies/smollm2-135m/results_faithfulness/d1_prose_order_log.csv \\
        --reference studies/gemma3-270m/results_faithfulness/d1_prose_order_log.csv \\
        --plans RESULTS/plan_pilot.csv RESULTS/plan_token_cost.csv \\
        --spent RESULTS/timings.csv studies/MODEL/results_survey/timings.csv \\
        --budget-hours 6 --reserve-hours 0.75 --out RESULTS/sample_size.csv)

The steps are the pilot's tested steps of one (mode, rank) (default comprehensiveness, signed:
the primary outcome's). For each reference (another model's design 1), the target of a step is
that run's MDE for the same step, and the n it needs is the smallest multiple of ``--step`` at
which the MDE (:func:`attngeom.analysis.equivalence.mde`, with the pilot's paired SD and Holm
family m) is no larger for every step. n is the first reference's n when the budget pays for
it; else the budget's n, the whole of it, and the table says which reference's MDE that
reaches (the others are reported, not aimed at). Never below ``--floor``, never above
``--max-n``. The budget's n: (budget - CPU spent - reserve) / CPU per text, CPU spent being
the ``cpu_seconds`` of the ``--spent`` timings (``seconds`` where a row has none), CPU per text
the sum over ``--plans`` of their ``design1-prose`` row's CPU seconds per pass x passes per
batch / batch size (each plan is a run the sample will make, timed before it).

The decision is kept: when ``--out`` exists its n is printed again, so that a resumed study
keeps the n it started with (the CPU spent grows while the sample runs); delete it to decide
again.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from attngeom.analysis import equivalence as eq


def steps(order_log: str | Path, mode: str, rank: str) -> pd.DataFrame:
    """The tested steps of (mode, rank) of an order table on the log PPL ratio."""
    t = pd.read_csv(order_log)
    t = t[(t["mode"] == mode) & (t["rank"] == rank) & t["sd_improvement"].notna()]
    return t.assign(step=t["lower"] + "->" + t["higher"]).set_index("step")


def n_for(sd: float, m: int, target: float, step: int = 4) -> int:
    """The smallest multiple of ``step`` whose MDE is at most ``target``."""
    z = eq.mde(sd, 4, m) * 2                      # the MDE at n = 4, times sqrt(4)
    n = step * max(1, math.ceil((z / target) ** 2 / step))
    while n > step and eq.mde(sd, n - step, m) <= target:
        n -= step                                 # the closed form's rounding, either way
    while eq.mde(sd, n, m) > target:
        n += step
    return n


def cpu_spent(paths: list[str]) -> float:
    """CPU seconds of the timing rows of ``paths`` (wall seconds where a row has no CPU)."""
    total = 0.0
    for path in paths:
        if Path(path).exists():
            t = pd.read_csv(path)
            cpu = t["cpu_seconds"] if "cpu_seconds" in t else pd.Series(float("nan"), t.index)
            total += float(cpu.fillna(t["seconds"]).sum())
    return total


def cpu_per_text(plans: list[str]) -> float:
    """CPU seconds per text of the planned runs (their ``design1-prose`` rows)."""
    total = 0.0
    for path in plans:
        row = pd.read_csv(path).set_index("step").loc["design1-prose"]
        total += row["cpu_seconds_per_pass"] * row["passes_per_batch"] / row["batch_size"]
    return total


def choose(a: argparse.Namespace) -> tuple[int, pd.DataFrame]:
    pilot = steps(a.pilot, a.mode, a.rank)
    per_text, spent = cpu_per_text(a.plans), cpu_spent(a.spent)
    left = (a.budget_hours - a.reserve_hours) * 3600 - spent
    n_budget = max(a.floor, a.step * int(max(left, 0) / per_text / a.step))
    cap = min(n_budget, a.max_n or n_budget)
    rows, needs = [], []
    for ref in a.reference:
        targets = steps(ref, a.mode, a.rank)["mde"]
        need = {s: n_for(pilot.at[s, "sd_improvement"], int(pilot.at[s, "m_tests"]),
                         targets[s], a.step) for s in pilot.index if s in targets}
        needs.append(max(max(need.values(), default=a.floor), a.floor))
        rows += [dict(reference=ref, step=s, target_mde=targets[s], n_needed=k)
                 for s, k in need.items()]
    if needs[0] <= cap:
        n, why = needs[0], f"MDE of {a.reference[0]}"
    else:                                     # the whole budget, and what it reaches
        n = cap
        met = [ref for ref, k in zip(a.reference, needs) if k <= n]
        why = f"the budget; MDE of {met[0]} met" if met else "the budget binds: no target met"
    table = pd.DataFrame(rows)
    table["sd_pilot"] = table["step"].map(pilot["sd_improvement"])
    table["mde_at_n"] = [eq.mde(pilot.at[s, "sd_improvement"], n, int(pilot.at[s, "m_tests"]))
                         for s in table["step"]]
    table = table.assign(n=n, chosen_for=why, n_budget=n_budget, cpu_seconds_per_text=per_text,
                         cpu_hours_spent=spent / 3600, budget_hours=a.budget_hours,
                         reserve_hours=a.reserve_hours, pilot=str(a.pilot))
    return n, table


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pilot", required=True, help="the pilot's d1_*_order_log.csv")
    p.add_argument("--reference", action="append", required=True,
                   help="another run's d1_*_order_log.csv whose MDE is the target (strictest "
                        "first; repeat)")
    p.add_argument("--plans", nargs="+", required=True, help="plan CSVs of the sample's runs")
    p.add_argument("--spent", nargs="*", default=[], help="timings.csv of what already ran")
    p.add_argument("--budget-hours", type=float, required=True, help="CPU-hours in all")
    p.add_argument("--reserve-hours", type=float, default=0.0,
                   help="CPU-hours kept for the steps after the sample")
    p.add_argument("--floor", type=int, default=32)
    p.add_argument("--max-n", type=int, default=0, help="texts available (0: no cap)")
    p.add_argument("--step", type=int, default=4, help="n is a multiple of this (a batch)")
    p.add_argument("--mode", default="comprehensiveness")
    p.add_argument("--rank", default="signed")
    p.add_argument("--out", help="write the figures behind n here (CSV)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.out and Path(a.out).is_file():                # decided already: keep it
        print(int(pd.read_csv(a.out)["n"].iloc[0]))
        return 0
    for path in [a.pilot, *a.reference, *a.plans]:
        if not Path(path).is_file():
            print(f"sample_size: no file {path}; run the pilot (and its plans) first",
                  file=sys.stderr)
            return 2
    n, table = choose(a)
    if a.out:
        table.to_csv(a.out, index=False)
    print(table.drop(columns=["pilot"]).to_string(index=False), file=sys.stderr)
    print(n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
