"""The report's summary paragraph: one sentence per finding, each with its number.

Numbers are formatted by :func:`fmt` (three significant digits, ``"n/a"`` for missing values), so
a test can format the analysis results the same way and find the strings in the PDF text.
Every function takes the results (see :mod:`.load`) and returns a sentence, or None when the
result it needs is missing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attngeom.store.format import schema as S
from attngeom.common import metrics as M
from attngeom.common.vocab import EPSILON

MIN_SEQUENCES = 3            # the analyses' clustered fits and per-head tests need this many


def fmt(x, digits: int = 3) -> str:
    """``x`` to ``digits`` significant digits (``"n/a"`` when missing or not finite).

    Plain notation from 1e-4 up to 1e6 (``7620``, ``0.000312``), scientific outside.
    """
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if not np.isfinite(x):
        return "n/a"
    out = f"{x:.{digits}g}"
    if 10 ** digits <= abs(float(out)) < 1e6:
        out = f"{float(out):.0f}"
    return "0" if out == "-0" else out


def ci(low, high) -> str:
    """``[low, high]`` with :func:`fmt`."""
    return f"[{fmt(low)}, {fmt(high)}]"


def sink_layer(sinks) -> int:
    """The layer coordinate with the highest mean sink rate."""
    rate = sinks["layer_sink_rate_mean"].fillna(-np.inf)
    return int(sinks[S.LAYER].values[int(np.argmax(rate.values))])


# ----------------------------------------------------------------------------- sentences
def sinks_sentence(sinks) -> str | None:
    if sinks is None:
        return None
    heads = sinks["is_sink_head"]
    n, total = int(heads.sum()), int(heads.size)
    eps = sinks.attrs.get("epsilon", EPSILON)      # the analysis' own, else the default
    layer = sink_layer(sinks)
    rate = float(sinks["layer_sink_rate_mean"].sel(layer=layer))
    return (f"Sink heads: {n} of {total} heads (fraction {fmt(n / total)}) attend to the sink "
            f"with a mean rate above {fmt(eps)} (Gu et al.); the most sink-heavy layer is "
            f"layer {layer} (mean sink rate {fmt(rate)}).")


def convexity_sentence(convexity, sinks) -> str | None:
    if convexity is None or sinks is None:
        return None
    layer = sink_layer(sinks)
    c = convexity.sel(layer=layer)
    n_layers = int(convexity["pooled_convex"].sum())
    n_heads, total = int(convexity["convex"].sum()), int(convexity["convex"].size)
    analytic = fmt(c["pooled_analytic_vertex_median"])
    text = (f"Convexity: output norm is convex in the sink rate (b2 > 0, q < "
            f"{fmt(convexity.attrs.get('analysis_level', 0.05))}) in {n_layers} of "
            f"{convexity.sizes['layer']} layers (pooled fits) and {n_heads} of {total} heads; ")
    if not np.isfinite(float(c["pooled_vertex"])):
        n_seq = int(np.nan_to_num(float(c.get("pooled_n_sequences", np.nan))))
        return text + (f"in layer {layer} the vertex is not estimable ({n_seq} sequences; the "
                       f"sequence-clustered fit needs at least {MIN_SEQUENCES}).")
    text += (f"in layer {layer} the fitted vertex is α* = {fmt(c['pooled_vertex'])}, "
             f"95% CI {ci(c['pooled_vertex_ci_low'], c['pooled_vertex_ci_high'])}")
    if analytic != "n/a":
        text += f" (geometric prediction, median over queries: {analytic})"
    return text + "."


def anti_alignment_sentence(anti) -> str | None:
    if anti is None:
        return None
    level = fmt(anti.attrs.get("analysis_level", 0.05))
    total = int(anti["mean_cos"].size)
    if not np.isfinite(anti["mean_cos"].values).any():
        n_seq = int(np.nan_to_num(float(anti["n_sequences"].max()))) if "n_sequences" in anti \
            else 0
        return (f"Anti-alignment: not testable with {n_seq} sequences (sequences are the "
                f"replicates; the per-head tests need at least {MIN_SEQUENCES}).")
    return (f"Anti-alignment: the mean cosine between the sink value and semantic values is "
            f"{fmt(anti['mean_cos'].mean())} over heads, with {int(anti['anti_aligned'].sum())} "
            f"of {total} heads significantly negative (q < {level}); against the non-sink "
            f"output it is {fmt(anti['residual_mean_cos'].mean())}, "
            f"{int(anti['residual_anti_aligned'].sum())} of {total} heads significant.")


def decomposition_sentence(decomposition) -> str | None:
    if decomposition is None:
        return None
    verdict = decomposition.attrs.get("verdict", "")              # names each pooled share
    return f"Decomposition: {verdict}"


def faithfulness_sentence(aopc: pd.DataFrame | None, table: pd.DataFrame | None,
                          loss_name: str) -> str | None:
    """Order of the metrics by comprehensiveness AOPC (signed ranking) and the tested steps."""
    if aopc is None or not len(aopc):
        return None
    comp = aopc[(aopc["mode"] == "comprehensiveness") & (aopc["rank"] == "signed")]
    if not len(comp):
        comp = aopc[aopc["mode"] == aopc["mode"].iloc[0]]
        comp = comp[comp["rank"] == comp["rank"].iloc[0]]
    comp = comp.sort_values("aopc_mean", kind="stable")
    mode, rank = comp["mode"].iloc[0], comp["rank"].iloc[0]
    order, last = "", None
    for m, v in zip(comp["metric"], comp["aopc_mean"]):
        if last is not None:
            order += " = " if v == last else " < "
        order += f"{M.label(m, 'words')} ({fmt(v)})"
        last = v
    text = f"Faithfulness: by {mode} AOPC of {loss_name} ({rank} ranking), {order}"
    if table is not None and len(table):
        tested = table[table["p_holm"].notna()]
        text += (f"; {int(tested['holds'].sum())} of {len(tested)} tested steps of the paper's "
                 f"order hold (Holm p < {fmt(table.attrs.get('level', 0.05))}, CI above 0)")
    return text + "."


def drift_sentence(drift) -> str | None:
    if drift is None:
        return None
    name = drift.attrs.get("loss_variable", "drift_delta_ppl")
    what = "ΔPPL" if "ppl" in name else "accuracy loss"
    before = float(drift["cosine_low_before_mean"].mean())
    after = float(drift["cosine_low_after_mean"].mean())
    return (f"Semantic drift: zeroing the sink's value vectors (α kept) gives mean "
            f"{what} = {fmt(drift.attrs.get('loss_mean'))} (one-sided Wilcoxon p = "
            f"{fmt(drift.attrs.get('loss_p_value'))}); the low-norm head outputs' cosine to the "
            f"semantic cone goes from {fmt(before)} to {fmt(after)} (mean over layers).")


def sentences(data) -> list[str]:
    """All available findings of a :class:`~.load.ReportData`, in report order."""
    a = data.analysis or {}
    out = [faithfulness_sentence(data.aopc, data.order, data.loss_label),
           sinks_sentence(a.get("sinks")),
           convexity_sentence(a.get("convexity"), a.get("sinks")),
           anti_alignment_sentence(a.get("anti_alignment")),
           decomposition_sentence(a.get("decomposition")),
           drift_sentence(data.drift)]
    return [s for s in out if s]
