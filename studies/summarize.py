"""Build the claims tables of studies/README.md from the committed CSVs.

    .venv/bin/python studies/summarize.py            # rewrite the generated parts of the README
    .venv/bin/python studies/summarize.py --print    # print them instead

The first study (studies/*/results_survey) goes between ``<!-- BEGIN GENERATED -->`` and
``<!-- END GENERATED -->``, the second (studies/*/results_faithfulness,
studies/summarize_faithfulness.py) between
``<!-- BEGIN GENERATED 2 -->`` and ``<!-- END GENERATED 2 -->``, the fourth (the Qwen models:
the same claims from both folders, whatever has run; the rest "not run") between
``<!-- BEGIN GENERATED 4 -->`` and ``<!-- END GENERATED 4 -->``, the methods ranked on every model
(studies/ranking.py) between ``<!-- BEGIN GENERATED 5 -->`` and ``<!-- END GENERATED 5 -->``;
every number comes from a CSV named next to it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import ranking
import summarize_faithfulness
from tables import SHORT, f, markdown

HERE = Path(__file__).resolve().parent
MODELS = ("smollm2-135m", "gemma3-270m", "minilm-l6")
ENCODERS = ("minilm-l6",)
FOURTH = ("qwen2.5-0.5b", "qwen2.5-1.5b")   # the fourth study's models
BEGIN, END = "<!-- BEGIN GENERATED -->", "<!-- END GENERATED -->"
BEGIN2, END2 = "<!-- BEGIN GENERATED 2 -->", "<!-- END GENERATED 2 -->"
BEGIN4, END4 = "<!-- BEGIN GENERATED 4 -->", "<!-- END GENERATED 4 -->"
BEGIN5, END5 = "<!-- BEGIN GENERATED 5 -->", "<!-- END GENERATED 5 -->"
RANKED = ("smollm2-135m", "gemma3-270m", *FOURTH)   # the token runs, in order of size
LM_RUNS = (("faith_prose", "prose"), ("faith_gsm8k", "GSM8K"), ("faith_prose_query", "prose, query gran."),
           ("mc_mmlu", "MMLU"), ("mc_winogrande", "WinoGrande"), ("mc_boolq", "BoolQ"))


ROOT = [HERE]  # where the <model>/results folders are (--root)
# the results folder the cells read (results_faithfulness: the second study)
RESULTS = ["results_survey"]


def read(model: str, name: str) -> pd.DataFrame | None:
    path = ROOT[0] / model / RESULTS[0] / f"{name}.csv"
    return pd.read_csv(path) if path.exists() else None


def second_study(cell):
    """``cell(model, tag)`` reading the second study's folder (results_faithfulness)."""
    def run(model: str, tag: str) -> str:
        RESULTS[0] = "results_faithfulness"
        try:
            return cell(model, tag)
        finally:
            RESULTS[0] = "results_survey"
    return run


# --------------------------------------------------------------------------------- claims
def _missing(model: str) -> str:
    if model in ENCODERS:
        return "not testable: encoder without a language-modelling head (no perplexity, no MC scoring)"
    return "not run (no CSV in results_survey/)"


def _holds(t: pd.DataFrame) -> str:
    """Distinct tested steps that hold: a magnitude-rank step between two non-negative baselines
    repeats the signed one (same rankings, same numbers) and is counted once."""
    tested = t[t["p_value"].notna()].drop_duplicates(
        ["mode", "lower", "higher", "aopc_lower", "aopc_higher", "mean_improvement"])
    return f"{int(tested['holds'].sum())}/{len(tested)}"


def order_tables(model: str):
    """(label, order table, log-ratio order table or None) of each faithfulness run present."""
    for prefix, label in LM_RUNS:
        t, lg = read(model, f"{prefix}_order"), read(model, f"{prefix}_order_log")
        if t is not None:
            yield label, t, lg


def faith_cell(model: str) -> str:
    parts = []
    for label, t, lg in order_tables(model):
        extra = f" ({_holds(lg)} on log PPL ratio)" if lg is not None else ""
        parts.append(f"{label} (n={int(t['n'].max())}): {_holds(t)} distinct tested steps hold{extra}")
    return "; ".join(parts) or _missing(model)


def decomposition_cell(model: str, tag: str = "wikitext") -> str:
    g = read(model, f"geo_{tag}_decomposition_group_part")
    s = read(model, f"geo_{tag}_decomposition_scalar")
    lay = read(model, f"geo_{tag}_decomposition_layer")
    if g is None:
        return "no data"
    out = []
    for group in ("sink", "tail"):
        sub = g[g["group"] == group].set_index("part")["pooled_lmg_share"]
        out.append(f"{group} LMG " + ", ".join(f"{p} {f(v)}" for p, v in sub.items()))
    holds = int(lay["paper_pattern_holds"].astype(bool).sum())
    return (f"{'; '.join(out)}; pooled pattern: {s['pooled_paper_pattern'].iloc[0]}; "
            f"holds in {holds}/{len(lay)} layers")


def anti_cell(model: str, tag: str = "wikitext") -> str:
    h = read(model, f"geo_{tag}_anti_alignment_layer_head")
    lay = read(model, f"geo_{tag}_anti_alignment_layer")
    if h is None:
        return "no data"
    n_seq = int(h["n_sequences"].max())
    k = int(h["anti_aligned"].astype(bool).sum())
    kr = int(h["residual_anti_aligned"].astype(bool).sum())
    mixed = int(((lay["mixed_p_value"] < 0.05) & (lay["mixed_mean_cos"] < 0)).sum())
    return (f"cos(ṽ0,ṽj)<0 at q<0.05 (BH): {k}/{len(h)} heads (median mean cos "
            f"{f(h['mean_cos'].median())}); cos(ṽ0,r_i)<0: {kr}/{len(h)} heads (median "
            f"{f(h['residual_mean_cos'].median())}); mixed model: {mixed}/{len(lay)} layers; "
            f"n={n_seq} seq")


def convex_cell(model: str, tag: str = "wikitext") -> str:
    h = read(model, f"geo_{tag}_convexity_layer_head")
    lay = read(model, f"geo_{tag}_convexity_layer")
    sinks = read(model, f"geo_{tag}_sinks_layer")
    if h is None:
        return "no data"
    convex = int(h["convex"].astype(bool).sum())
    interior = int((h["convex"].astype(bool) & h["interior_minimum"].astype(bool)).sum())
    pl = int((lay["pooled_convex"].astype(bool) & lay["pooled_interior_minimum"].astype(bool)).sum())
    top = int(sinks.set_index("layer")["layer_sink_rate_mean"].idxmax())
    r = lay.set_index("layer").loc[top]
    return (f"convex (q<0.05): {convex}/{len(h)} heads, {interior} with interior vertex; pooled: "
            f"{pl}/{len(lay)} layers convex with interior vertex; most sink-heavy layer {top}: "
            f"β2={f(r['pooled_beta2'])}, q={f(r['pooled_q_value'], 3)}, vertex {f(r['pooled_vertex'])} "
            f"[{f(r['pooled_vertex_ci_low'])}, {f(r['pooled_vertex_ci_high'])}] vs analytic median "
            f"{f(r['pooled_analytic_vertex_median'])}")


def drift_cell(model: str) -> str:
    parts = []
    for prefix, label in LM_RUNS[:2]:
        info, lay = read(model, f"{prefix}_info"), read(model, f"{prefix}_drift_layers")
        if info is None or "drift_mean" not in info:
            continue
        i = info.iloc[0]
        up = int(((lay["cosine_low_p_holm"] < 0.05) & (lay["cosine_low_change_mean"] > 0)).sum())
        parts.append(f"{label}: ΔPPL {f(i['drift_mean'])} [{f(i['drift_ci_low'])}, "
                     f"{f(i['drift_ci_high'])}], p={f(i['drift_p_value'], 3)}, n={int(i['drift_n'])}; "
                     f"low-norm cone cosine rises (Holm<0.05) in {up}/{len(lay)} layers "
                     f"(mean {f(lay['cosine_low_before_mean'].mean())}→"
                     f"{f(lay['cosine_low_after_mean'].mean())})")
    return "; ".join(parts) or _missing(model)


def sink_cell(model: str, tag: str = "wikitext") -> str:
    s, h = read(model, f"geo_{tag}_sinks_layer"), read(model, f"geo_{tag}_sinks_layer_head")
    if s is None or h is None:
        return "no data"
    return (f"{int(h['is_sink_head'].astype(bool).sum())}/{len(h)} heads are sink heads "
            f"(mean α_i0 > 0.3); layer-mean sink rate {f(s['layer_sink_rate_mean'].min())}"
            f"–{f(s['layer_sink_rate_mean'].max())}")


def mc_cell(model: str) -> str:
    t = read(model, "mc_clean")
    if t is None:
        return _missing(model)
    return "; ".join(f"{r.task} {r.correct}/{r.n}={f(r.accuracy)} [{f(r.ci_low)}, {f(r.ci_high)}]; "
                     f"chance {f(r.chance)} (p={f(r.p_above_chance, 3)}), majority answer "
                     f"{f(r.majority_rate)} (p={f(r.p_above_baseline, 3)}) → "
                     f"{'sweep run' if r.above_chance else 'not above baseline: no sweep'}"
                     for r in t.itertuples())


def geo_tags(model: str) -> list[str]:
    """Geometry data sets of a model, WikiText first."""
    folder = ROOT[0] / model / "results_survey"
    tags = sorted(p.name[4:-12] for p in folder.glob("geo_*_summary.csv"))
    return sorted(tags, key=lambda t: t != "wikitext")


def per_geo(cell):
    def run(model: str) -> str:
        tags = geo_tags(model)
        if not tags:
            return _missing(model)
        if len(tags) <= 1:
            return cell(model, *tags)
        return " <br> ".join(f"**{t}**: {cell(model, t)}" for t in tags)
    return run


CLAIMS = (("Faithfulness order raw < vw < vwn < contrib", faith_cell),
          ("Sinks driven by norm ratio & cosine, tail by α & cosine", per_geo(decomposition_cell)),
          ("Anti-alignment of sink values", per_geo(anti_cell)),
          ("Convex sink-rate curve, interior minimum", per_geo(convex_cell)),
          ("Semantic drift when sink value zeroed", drift_cell),
          ("Sink heads (Gu et al., ε=0.3)", per_geo(sink_cell)),
          ("MC clean accuracy (95% Clopper-Pearson; one-sided exact binomial p)", mc_cell))


def claims_table(models: list[str]) -> str:
    return markdown(CLAIMS, models)


def _verdict(r) -> str:
    if pd.isna(r.p_value):
        return "not testable (identical ranking)"
    return "holds" if r.holds else "does not hold"


def order_details(model: str) -> str:
    rows = []
    for label, t, lg in order_tables(model):
        for i, r in enumerate(t.itertuples()):
            log = "" if lg is None else f"{f(lg['p_holm'].iloc[i], 3)}, {_verdict(lg.iloc[i])}"
            rows.append(f"| {label} | {r.mode} | {r.rank} | {SHORT[r.lower]}→{SHORT[r.higher]} | "
                        f"{r.n} | {f(r.aopc_lower)} → {f(r.aopc_higher)} | {f(r.mean_improvement)} "
                        f"[{f(r.ci_low)}, {f(r.ci_high)}] | {f(r.p_holm, 3)} | {_verdict(r)} | "
                        f"{log} |")
    if not rows:
        return ""
    head = ("| data | mode | rank | step | n | AOPC lower → higher | improvement [95% CI] | "
            "p (Holm) | verdict | log-ratio: p (Holm), verdict |\n|---|---|---|---|---|---|---|---|---|---|")
    return f"\n#### {model}: faithfulness steps (`*_order.csv`, `*_order_log.csv`)\n\n{head}\n" \
        + "\n".join(rows) + "\n"


def generated() -> str:
    models = [m for m in MODELS if (ROOT[0] / m / "results_survey").is_dir()]
    parts = ["### Claims against each model\n", claims_table(models), ""]
    parts += [order_details(m) for m in models]
    parts += survey_runtime(models)
    return "\n".join(parts) + "\n"


def survey_runtime(models: list[str], level: str = "###") -> list[str]:
    """The results_survey folders' runtime and data lines."""
    parts = [f"\n{level} Runtime (`timings.csv`, seconds, wall clock on a quiet 2-core machine)\n"]
    for m in models:
        t = read(m, "timings")
        if t is not None:
            parts.append(f"- {m}: " + ", ".join(f"{r.step} {r.seconds:.0f}" for r in t.itertuples())
                         + f"; total {t['seconds'].sum() / 60:.1f} min")
    parts.append(f"\n{level} Data used (`data.csv`)\n")
    for m in models:
        d = read(m, "data")
        if d is not None:
            parts.append(f"- {m}: " + "; ".join(f"{r.use}: {r.n} from {Path(r.data).name} "
                                                 f"(max {r.max_length} tokens)" for r in d.itertuples()))
    return parts


def generated2() -> str:
    geo = [(name, second_study(cell)) for name, cell in
           (("Sinks driven by norm ratio & cosine, tail by α & cosine", decomposition_cell),
            ("Anti-alignment of sink values", anti_cell),
            ("Convex sink-rate curve, interior minimum", convex_cell),
            ("Sink heads (mean α_i0 > 0.3 over queries)", sink_cell))]
    return summarize_faithfulness.generated(ROOT[0], list(MODELS[:2]), geo)


def generated4() -> str:
    """The fourth study: the first study's claims from results_survey/ (geometry, drift) and the
    second's from results_faithfulness/ (design 1, Gu), one table, whatever has run."""
    root = ROOT[0]
    models = [m for m in FOURTH if (root / m / "results_survey").is_dir()
              or (root / m / summarize_faithfulness.FOLDER).is_dir()]
    if not models:
        return ("Not run yet: `studies/<model>/run_survey.sh` and `run_faithfulness.sh` write "
                "`studies/<model>/results_survey/` and `results_faithfulness/`.\n")
    rows = [(f"{name} (`results_survey/`)", cell) for name, cell in CLAIMS]
    rows += [(f"{name} (`results_faithfulness/`)", cell) for name, cell in
             summarize_faithfulness.claim_rows(root, models)]
    parts = ["#### Claims against each model (fourth study, results so far)\n",
             markdown(rows, models), "",
             summarize_faithfulness.gu_details(root, models),
             summarize_faithfulness.bos_shift_details(root, models),
             summarize_faithfulness.sample_size(root, models),
             summarize_faithfulness.runtime(root, models)]
    parts += survey_runtime(models, "####")
    return "\n".join(p for p in parts if p) + "\n"


def replace_block(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise SystemExit(f"studies/README.md: markers {begin} / {end} missing; add them where "
                         "the tables go")
    head, rest = text.split(begin, 1)
    return head + begin + "\n" + body + end + rest.split(end, 1)[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--print", action="store_true", help="print instead of editing the README")
    p.add_argument("--root", type=Path, default=HERE, help="folder holding <model>/results")
    args = p.parse_args()
    ROOT[0] = args.root
    first, second, fourth = generated(), generated2(), generated4()
    fifth = ranking.generated(ROOT[0], list(RANKED))
    if args.print:
        print(first + "\n" + second + "\n" + fourth + "\n" + fifth)
        return
    readme = HERE / "README.md"
    text = replace_block(readme.read_text(encoding="utf-8"), BEGIN, END, first)
    text = replace_block(text, BEGIN2, END2, second)
    text = replace_block(text, BEGIN4, END4, fourth)
    readme.write_text(replace_block(text, BEGIN5, END5, fifth), encoding="utf-8")
    print(f"updated {readme}")


if __name__ == "__main__":
    main()
