"""The second study's tables for studies/README.md, from studies/<model>/results_faithfulness/*.csv.

Called by studies/summarize.py, which writes them between ``<!-- BEGIN GENERATED 2 -->`` and
``<!-- END GENERATED 2 -->``. Verdicts are read from the CSVs (analysis/equivalence.py wrote
them); nothing is recomputed here but counts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

import gu_sinks
from tables import SHORT, f, markdown

FOLDER = "results_faithfulness"
DATA = (("prose", "prose"), ("gsm8k", "GSM8K"))
# design-1 variants (``--variant NAME``: CSVs d1_prose_NAME_*; geometry geo_prose_NAME_*)
QUERY = (("prose_query", "prose, query granularity"),)
LONG = (("prose_long", "prose, 512 tokens"),)
# a model whose pilot asked for more texts than reach 512 tokens has only the pilot to show
LONG_PILOT = (("prose_long_pilot", "prose, 512 tokens, the pilot only"),)
VERDICT_ORDER = ("holds", "does not hold: equivalent within ±δ", "does not hold: reversed",
                 "inconclusive at this n")
BRIEF = {"holds": "holds", "does not hold: equivalent within ±δ": "equivalent",
         "does not hold: reversed": "reversed", "inconclusive at this n": "inconclusive",
         "not testable (identical ranking)": "not testable"}


def read(root: Path, model: str, name: str) -> pd.DataFrame | None:
    path = root / model / FOLDER / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else None


def distinct(t: pd.DataFrame) -> pd.DataFrame:
    """Tested steps counted once (a magnitude-rank copy of a signed step repeats its numbers)."""
    tested = t[t["p_value"].notna()]
    return tested.drop_duplicates(["mode", "lower", "higher", "n", "p_value",
                                   "mean_improvement"])


def counts(t: pd.DataFrame) -> str:
    d = distinct(t)
    parts = [f"{BRIEF[v]} {int((d['verdict'] == v).sum())}" for v in VERDICT_ORDER]
    return f"{len(d)} distinct steps: " + ", ".join(parts)


# ---------------------------------------------------------------------------- claims
def not_run_yet(root: Path, model: str, step: str) -> str:
    """"not run yet (n=N planned, plan.csv)" for a step the model's plan.csv names and its
    timings.csv does not (planned or running); "" otherwise."""
    p, t = read(root, model, "plan"), read(root, model, "timings")
    if p is None or step not in set(p["step"]) or (t is not None and step in set(t["step"])):
        return ""
    return f"not run yet (n={int(p.set_index('step').loc[step, 'n_units'])} planned, plan.csv)"


def _order_part(root: Path, model: str, tag: str, label: str) -> str:
    t, s = read(root, model, f"d1_{tag}_order_log"), read(root, model, f"d1_{tag}_order")
    if t is None:
        return ""
    part = f"{label} (n={int(t['n'].max())}, m={int(t['m_tests'].max())}): {counts(t)}"
    if s is not None:
        part += f"; on ΔPPL: {counts(s)}"
    return part


def order_cell(root: Path, model: str, data=DATA) -> str:
    """Design 1's counts per data set; where the sample has not run, whether it is planned and
    its pilot's counts (variant ``<tag>_pilot``), if any."""
    parts = []
    for tag, label in data:
        part = _order_part(root, model, tag, label)
        if not part:
            pending = [not_run_yet(root, model, f"design1-{tag}"),
                       _order_part(root, model, f"{tag}_pilot", "the pilot only")]
            part = f"{label}: " + "; ".join(filter(None, pending)) if any(pending) else ""
        if part:
            parts.append(part)
    return "; ".join(parts) or "not run"


def rung_cell(root: Path, model: str, tag: str, lower: str, higher: str) -> str:
    """One step's verdict per (mode, rank), with its improvement, CI and MDE."""
    t = read(root, model, f"d1_{tag}_order_log")
    if t is None:
        return "not run"
    t = distinct(t[(t["lower"] == lower) & (t["higher"] == higher)])
    parts = [f"{r.mode}/{r.rank}: {BRIEF[r.verdict]} ({f(r.mean_improvement, 3)} "
             f"{_ci(r.ci_low, r.ci_high)}, MDE {f(r.mde, 3)})" for r in t.itertuples()]
    return (f"{SHORT.get(lower, lower)}→{SHORT.get(higher, higher)}, n={int(t['n'].max())}: " + "; ".join(parts)
            if parts else "not run")


def kinds_cell(root: Path, model: str) -> str:
    """Design 2 summarised per layer kind (sliding-window / global), Holm within each kind."""
    t = read(root, model, "d2_prose_layers_by_type")
    if t is None:
        return ""
    parts = []
    for kind, g in t.groupby("layer_type", sort=False):
        steps = []
        for (lower, higher), h in g.groupby(["lower", "higher"], sort=False):
            held = int((h["verdict"] == "holds").sum())
            steps.append(f"{SHORT.get(lower, lower)}→{SHORT.get(higher, higher)} holds in {held}/{len(h)}")
        parts.append(f"{kind}: " + ", ".join(steps))
    return "; by kind (Holm within each): " + "; ".join(parts)


def layers_cell(root: Path, model: str) -> str:
    t = read(root, model, "d2_prose_layers")
    if t is None:
        return "not run"
    parts = []
    for (lower, higher), g in t.groupby(["lower", "higher"], sort=False):
        held = g[g["verdict"] == "holds"]["layer"].tolist()
        rev = int((g["verdict"] == "does not hold: reversed").sum())
        eqv = int((g["verdict"] == "does not hold: equivalent within ±δ").sum())
        parts.append(f"{SHORT[lower]}→{SHORT[higher]} holds in {len(held)}/{len(g)} layers"
                     f"{' (' + ','.join(map(str, held)) + ')' if held else ''}, reversed in "
                     f"{rev}, equivalent in {eqv}")
    return f"n={int(t['n'].max())}: " + "; ".join(parts) + kinds_cell(root, model)


def gu_cell(root: Path, model: str) -> str:
    t = read(root, model, "gu_sinks")
    if t is None:
        return "not run"
    d = t[t["design_row"].astype(bool)].set_index("input")
    ours = " / ".join(f(d.loc[k, "pct_per_input_q0"]) for k in gu_sinks.GU_INPUTS if k in d.index)
    pooled = " / ".join(f(d.loc[k, "pct_pooled_q1"]) for k in gu_sinks.GU_INPUTS if k in d.index)
    return (f"{ours} % sink heads (natural / random / repeated, Gu's per-input count); pooled "
            f"over inputs, queries i ≥ 1: {pooled}; n={int(d['n_inputs'].max())}")


def long_tags(root: Path, model: str):
    """The 512-token sample's (tag, label), or the pilot's where the sample did not run."""
    if read(root, model, f"d1_{LONG[0][0]}_order_log") is None:
        return LONG_PILOT
    return LONG


def geo_long(root: Path, model: str, cell) -> str:
    """A geometry cell on the 512-token texts: the sample's, else the pilot's, labelled so."""
    tag = long_tags(root, model)[0][0]
    if not (root / model / FOLDER / f"geo_{tag}_summary.csv").exists():
        return "not run"
    if tag == LONG[0][0]:
        return cell(model, tag)
    sizes = read(root, model, "data").set_index("use")
    return f"the pilot only (n={int(sizes.loc[f'geo_{tag}', 'n'])}): {cell(model, tag)}"


def claim_rows(root: Path, models: list[str], geo_cells=()) -> list:
    """The second study's claims, (name, cell(model)); ``geo_cells``: (name, cell(model, tag))
    of summarize, read on this folder's geometry (none: no geometry rows)."""
    rows = [("Faithfulness order, all layers, fraction grid (design 1; log PPL ratio, "
             "δ = 0.05 nats)", lambda m: order_cell(root, m)),
            ("Faithfulness order at query granularity, the four rungs distinct (design 1 with "
             "contribution_layer; log PPL ratio, δ = 0.05 nats)",
             lambda m: order_cell(root, m, QUERY)),
            ("Output normalization, vw → vwn (query granularity)",
             lambda m: rung_cell(root, m, QUERY[0][0], "value_weighted",
                                 "value_weighted_normalized")),
            ("Faithfulness order on 512-token texts (head granularity, comprehensiveness, "
             "signed, p = 0.01, 0.05, 0.2)",
             lambda m: order_cell(root, m, long_tags(root, m))),
            ("Order per layer, each layer alone (design 2)", lambda m: layers_cell(root, m)),
            ("Sink heads, Gu et al.'s protocol (ε = 0.3, 64 tokens)", lambda m: gu_cell(root, m))]
    sizes = {m: read(root, m, "data") for m in models}
    n = {m: int(d.set_index("use").loc["geo_wikitext", "n"]) for m, d in sizes.items()
         if d is not None and "geo_wikitext" in set(d["use"])}
    label = "/".join(str(v) for v in sorted(set(n.values()))) or "?"
    for name, cell in geo_cells:
        rows.append((f"{name} (geometry, {label} WikiText-2 chunks)",
                     lambda m, c=cell: c(m, "wikitext")
                     if (root / m / FOLDER / "geo_wikitext_summary.csv").exists() else "not run"))
    for name, cell in geo_cells:
        rows.append((f"{name} (geometry, the 512-token texts)",
                     lambda m, c=cell: geo_long(root, m, c)))
    return rows


def claims(root: Path, models: list[str], geo_cells) -> str:
    """The second study's claims table."""
    return markdown(claim_rows(root, models, geo_cells), models)


# ---------------------------------------------------------------------------- details
def _ci(lo, hi) -> str:
    return f"[{f(lo)}, {f(hi)}]"


def order_details(root: Path, model: str) -> str:
    rows = []
    for tag, label in DATA + QUERY + LONG + LONG_PILOT:
        t, s = read(root, model, f"d1_{tag}_order_log"), read(root, model, f"d1_{tag}_order")
        if t is None:
            continue
        for i, r in enumerate(t.itertuples()):
            sec = "" if s is None else (f"{f(s['mean_improvement'].iloc[i])} "
                                        f"{_ci(s['ci_low'].iloc[i], s['ci_high'].iloc[i])}, "
                                        f"{f(s['p_holm'].iloc[i], 3)}, "
                                        f"{BRIEF[s['verdict'].iloc[i]]}")
            rows.append(f"| {label} | {r.mode} | {r.rank} | {SHORT.get(r.lower, r.lower)}→{SHORT.get(r.higher, r.higher)} | "
                        f"{r.n} | {f(r.mean_improvement, 3)} {_ci(r.ci_low, r.ci_high)} | "
                        f"{f(r.p_holm, 3)} | {f(r.mde, 3)} | {f(r.p_tost, 3)} "
                        f"{_ci(r.ci90_low, r.ci90_high)} | {r.verdict} | {sec} |")
    if not rows:
        return ""
    head = ("| data | mode | rank | step | n | improvement [95% BCa CI] | p (Holm) | MDE (80%) | "
            "TOST p [90% CI] | verdict | ΔPPL: improvement [CI], p (Holm), verdict |\n"
            + "|---" * 11 + "|")
    return (f"\n#### {model}: design 1 steps (`d1_*_order_log.csv`, ΔPPL `d1_*_order.csv`)\n\n"
            f"{head}\n" + "\n".join(rows) + "\n")


def curve_details(root: Path, model: str) -> str:
    found = [(label, read(root, model, f"d1_{tag}_curves"), read(root, model, f"d1_{tag}_aopc"))
             for tag, label in DATA + QUERY + LONG + LONG_PILOT]
    found = [(label, c[c["variable"] == "log_ppl_ratio"], a.set_index(
        ["variable", "metric", "rank", "mode"])) for label, c, a in found if c is not None]
    fractions = sorted({p for _, c, _ in found for p in c["fraction"].unique()})
    rows = []
    for label, c, a in found:
        groups = c.groupby(["mode", "rank", "metric"], sort=False)
        for mode, rank, metric in sorted(groups.groups, key=lambda k: (
                list(c["mode"].unique()).index(k[0]), list(c["rank"].unique()).index(k[1]),
                list(SHORT).index(k[2]) if k[2] in SHORT else len(SHORT))):
            g = groups.get_group((mode, rank, metric)).set_index("fraction")["loss_mean"]
            la, da = a.loc[("log_ppl_ratio", metric, rank, mode)], a.loc[
                ("delta_ppl", metric, rank, mode)]
            rows.append(f"| {label} | {mode} | {rank} | {SHORT.get(metric, metric)} | "
                        + " | ".join(f(g[p], 3) if p in g.index else "—" for p in fractions)
                        + f" | {f(la['aopc_mean'], 3)} ± {f(la['aopc_sem'], 3)} | "
                          f"{f(da['aopc_mean'])} |")
    if not rows:
        return ""
    head = ("| data | mode | rank | metric | " + " | ".join(f"p={p:g}" for p in fractions)
            + " | AOPC ± s.e. | AOPC of ΔPPL |\n" + "|---" * (len(fractions) + 6) + "|")
    return (f"\n#### {model}: mean log(PPL / clean PPL) at every fraction (`d1_*_curves.csv`, "
            f"figures `d1_*_curves.png`)\n\n{head}\n" + "\n".join(rows) + "\n")


def layer_details(root: Path, model: str) -> str:
    t, means = read(root, model, "d2_prose_layers"), read(root, model, "d2_prose_layer_means")
    if t is None:
        return ""
    steps = list(dict.fromkeys(zip(t["lower"], t["higher"])))
    m = means.pivot(index="layer", columns="metric", values="log_ppl_ratio_mean")
    rows = []
    for layer in sorted(t["layer"].unique()):
        cells = [f(m.loc[layer, k], 3) for k in ("attention", "value_weighted", "contribution")]
        for lower, higher in steps:
            r = t[(t["layer"] == layer) & (t["lower"] == lower) & (t["higher"] == higher)].iloc[0]
            cells.append(f"{f(r.mean_improvement, 3)} {_ci(r.ci_low, r.ci_high)}, "
                         f"{f(r.p_holm, 3)}, {BRIEF[r.verdict]}")
        rows.append(f"| {layer} | " + " | ".join(cells) + " |")
    head = ("| layer | raw | vw | contrib | "
            + " | ".join(f"{SHORT[a]}→{SHORT[b]}: improvement [CI], p (Holm over layers), verdict"
                         for a, b in steps) + " |\n" + "|---" * (4 + len(steps)) + "|")
    return (f"\n#### {model}: design 2, one layer at a time (`d2_prose_layers.csv`, figure "
            f"`{model}/{FOLDER}/d2_prose_layers.png`; columns raw/vw/contrib: mean log PPL "
            f"ratio; n={int(t['n'].max())})\n\n{head}\n" + "\n".join(rows) + "\n")


def gu_details(root: Path, models: list[str]) -> str:
    rows = []
    for model in models:
        t = read(root, model, "gu_sinks")
        if t is None:
            continue
        for bos, g in t.groupby("bos", sort=False):
            g = g.set_index("input")
            cells = [f"{f(g.loc[k, 'pct_per_input_q0'])} ({f(g.loc[k, 'pct_pooled_q1'])})"
                     if k in g.index else "—" for k in gu_sinks.GU_INPUTS]
            rows.append(f"| {model} | {'with' if bos else 'without'} BOS | " + " | ".join(cells)
                        + f" | {int(g['n_inputs'].max())} |")
    if not rows:
        return ""
    for name, values in gu_sinks.GU_TABLE1.items():
        rows.append(f"| {name} (Gu et al., Table 1) | tokenizer default | "
                    + " | ".join(f"{v:.2f}" for v in values) + " | — |")
    head = ("| model | first token | natural | random | repeated | inputs |\n" + "|---" * 6 + "|")
    return ("\n#### Sink heads with Gu et al.'s protocol (`gu_sinks.csv`): percent of heads with "
            "mean α to the first token > 0.3 — their count (per input, queries i ≥ 0) and, in "
            "parentheses, the design's (averaged over inputs, queries i ≥ 1)\n\n"
            f"{head}\n" + "\n".join(rows) + "\n")


def bos_shift_details(root: Path, models: list[str]) -> str:
    """Where the sink goes when a BOS is prepended (`gu_bos_shift.csv`, studies/gu_bos_shift.py)."""
    rows, eps = [], set()
    for model in models:
        t = read(root, model, "gu_bos_shift")
        if t is None:
            continue
        eps |= set(t["epsilon"])
        for r in t.itertuples():
            rows.append(f"| {model} | {r.input} | {'with' if r.bos else 'without'} BOS | "
                        f"{f(r.pct_sink_key0, 1)} | {f(r.pct_sink_key1, 1)} | "
                        f"{f(r.pct_sink_key01, 1)} | {f(r.mean_alpha_key0)} | "
                        f"{f(r.mean_alpha_key1)} | {f(r.mean_alpha_key0 + r.mean_alpha_key1)} | "
                        f"{r.n_inputs} |")
    if not rows:
        return ""
    head = ("| model | input | first token | % heads > ε on key 0 | on key 1 | on keys 0 + 1 | "
            "mean α key 0 | key 1 | keys 0 + 1 | inputs |\n" + "|---" * 10 + "|")
    eps = "/".join(f(e, 1) for e in sorted(eps))
    return ("\n#### Where the sink goes when a BOS is prepended (`gu_bos_shift.csv`): percent of "
            f"heads whose mean α over the queries after the key exceeds ε = {eps}, on key 0 (the "
            "BOS where prepended, else the first text token), key 1 and the two summed; Gu's "
            "inputs\n\n" + head + "\n" + "\n".join(rows) + "\n")


def sample_size(root: Path, models: list[str]) -> str:
    """The n a pilot chose (`sample_size.csv`, studies/sample_size.py) and the MDE it reaches,
    step by step, next to each reference model's target."""
    lines = []
    for model in models:
        t = read(root, model, "sample_size")
        if t is None:
            continue
        r0 = t.iloc[0]
        steps = []
        for step, g in t.groupby("step", sort=False):
            a, b = step.split("->")
            targets = ", ".join(f"{Path(r.reference).parts[-3]}'s {f(r.target_mde, 4)} (n = "
                                f"{r.n_needed})" for r in g.itertuples())
            steps.append(f"{SHORT.get(a, a)}→{SHORT.get(b, b)}: pilot SD {f(g['sd_pilot'].iloc[0], 3)}, "
                         f"MDE {f(g['mde_at_n'].iloc[0], 4)} at n = {r0['n']}; targets {targets}")
        chosen = re.sub(r"studies/([^/]+)/\S+\.csv", r"\1's", str(r0["chosen_for"]))
        lines.append(f"- {model}: n = {r0['n']} ({chosen}; the budget pays for {r0['n_budget']} "
                     f"at {f(r0['cpu_seconds_per_text'], 0)} CPU s a text). " + "; ".join(steps))
    if not lines:
        return ""
    return ("\n#### Sample size from the pilot (`sample_size.csv`; MDE of the AOPC of the log "
            "PPL ratio, comprehensiveness, signed; target: a reference model's MDE, with the n "
            "that reaches it)\n\n" + "\n".join(lines) + "\n")


def _resumed(r) -> str:
    """" (resumed ...)" for a step whose time is only the last invocation's part."""
    resumed = getattr(r, "resumed", False)
    if pd.isna(resumed) or not bool(resumed):
        return ""
    before = getattr(r, "units_before", float("nan"))
    return " (resumed: that invocation only)" if pd.isna(before) else \
        f" (resumed after {int(before)} units: that invocation only)"


def runtime(root: Path, models: list[str]) -> str:
    lines = ["\n#### Plan and runtime (`plan.csv`: timed before the run; `timings.csv`: "
             "the run)\n"]
    for model in models:
        p, t = read(root, model, "plan"), read(root, model, "timings")
        if p is not None:
            total = p[p["step"] == "total"].iloc[0]
            lines.append(f"- {model}: planned {int(total['batch_passes'])} batch passes, "
                         f"{f(total['cpu_hours'])} CPU-hours (timed {p['timed'].iloc[0]})")
        if t is not None:
            cpu = t["cpu_seconds"].fillna(t["seconds"]).sum() / 3600
            lines.append(f"- {model}: ran " + ", ".join(f"{r.step} {r.seconds:.0f} s{_resumed(r)}"
                                                       for r in t.itertuples())
                         + f"; {f(t['seconds'].sum() / 3600)} h wall, {f(cpu)} CPU-hours")
    return "\n".join(lines) + "\n"


def generated(root: Path, models: list[str], geo_cells) -> str:
    models = [m for m in models if (root / m / FOLDER).is_dir()]
    if not models:
        return ("Not run yet: `studies/<model>/run_faithfulness.sh` writes "
                "`studies/<model>/results_faithfulness/`.\n")
    parts = ["### Claims against each model (second study)\n", claims(root, models, geo_cells)]
    for model in models:
        parts += [order_details(root, model), curve_details(root, model),
                  layer_details(root, model)]
    parts += [gu_details(root, models), bos_shift_details(root, models), runtime(root, models)]
    return "\n".join(p for p in parts if p) + "\n"
