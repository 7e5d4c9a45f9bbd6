"""Models side by side: the stored analyses of several stores in one labeled Dataset.

:func:`compare` reads what ``attngeom analyze`` (and ``attngeom faithfulness``) stored in each
store's ``analysis/`` folder — it computes nothing again — and lays it out along a ``store``
dimension whose coordinates are the label, model, data (spec and sha256), probe input kind, BOS
(``bos``: whether the first token is the tokenizer's BOS, ``auto`` resolved; ``bos_option``:
as asked), layout, k, w, max_length, the mean tokens per sequence, the float type and the
settings the analyses used (ε, level). Stores that would share a default label ("model ·
data file") are told apart by the settings in which they differ. Per-layer variables share one ``layer``
dimension (NaN where a store has no such layer) with the coordinate ``relative_depth``
(store, layer) = layer / (the model's layers - 1), so an 18-layer and a 30-layer model share
one axis. A variable whose stores differ in a setting that changes it carries the attribute
``differs`` naming those settings; ``why`` (store, section) says why a section is empty.

Output names (stable): over (store) ``n_sequences n_tokens sink_head_share gu_sink_head_share
sink_rate_mean convex_share interior_minimum_share anti_aligned_share
residual_anti_aligned_share paper_pattern faith_loss_variable``; over (store, layer)
``layer_sink_rate_mean sink_head_fraction gu_layer_sink_share layer_convex_share
layer_interior_minimum_share pooled_vertex pooled_vertex_ci_low pooled_vertex_ci_high
layer_anti_aligned_share layer_residual_anti_aligned_share``; ``lmg_share`` (store, layer,
group, part) and ``pooled_lmg_share`` (store, group, part); ``aopc``, ``aopc_minmax`` (the
AOPC rescaled per unit between the lowest and highest of the rankings run: what compares across
models) and ``ranking_position`` (1 = the least faithful; store, metric, mode, rank);
``verdict`` and ``mde`` (store, step); ``why`` (store, section).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import xarray as xr

from attngeom.store import read_manifest
from attngeom.store.format import schema as S
from attngeom.store.io.reader import describe_store
from attngeom.store.io.results import entries

from .results import ANALYSIS_DIR, RESULT_FILES, analysis_state, read_analysis
from .faithfulness_stats import StatsSettings, read, stats_path
from attngeom.common.errors import Refusal

SECTIONS = ("sinks", "convexity", "anti_alignment", "decomposition", "faithfulness")
# the settings each section's numbers depend on (a cell is flagged where stores differ in one):
# what was measured (max_length, the tokens per sequence it left, the texts, the float type)
# and how the analysis read it
MEASURED = ("max_length", "tokens_per_sequence", "data_sha256", "dtype")
DEPENDS = {"sinks": ("epsilon", "sink_k", *MEASURED), "convexity": ("sink_k", "level", *MEASURED),
           "anti_alignment": ("sink_k", "level", *MEASURED),
           "decomposition": ("sink_k", "tail_w", *MEASURED),
           "faithfulness": ("level", "data_sha256", "max_length", "dtype", "faith_metrics",
                            "granularity")}
# what tells apart stores that would share a default label (model · data file name)
TELLS_APART = ("data_sha256", "max_length", "sink_k", "tail_w", "mode", "bos", "dtype",
               "n_sequences", "epsilon", "level")
PROBE_KINDS = {"probe:random": "random", "probe:repeated": "repeated"}


def input_kind(spec: str) -> str:
    """``random``/``repeated`` for a probe spec, else ``natural``."""
    return next((kind for prefix, kind in PROBE_KINDS.items() if spec.startswith(prefix)),
                "natural")


def _results(store: Path, manifest: dict, directory: Path) -> tuple[dict, dict]:
    """The stored analysis Datasets of a store, and why each missing one is missing."""
    state = analysis_state(store, manifest, directory)
    if state == "current":
        found = read_analysis(directory)
        found.pop("summary")
        return found, {}
    fix = f"run `attngeom analyze {store} --out {directory}`"
    why = {"missing": f"no complete analysis results in {directory} ({fix})",
           "stale": f"the analysis results in {directory} are older than the store ({fix})",
           "other": f"{directory} holds the analysis results of another store ({fix})"}[state]
    return {}, dict.fromkeys(RESULT_FILES, why)


def _tokens(store: Path, bos: str) -> tuple[str, float]:
    """The BOS choice as it came out (``auto`` resolved: is the first token of every sequence
    a special token?) and the number of tokens measured."""
    from attngeom.store.io.reader import open_store

    ds = open_store(store)
    n = float(ds[S.LENGTH].sum())
    if bos == "auto" and S.SPECIAL in ds:
        first = ds[S.SPECIAL].isel({S.POSITION: 0}).values
        bos = "yes" if first.size and bool(first.all()) else "no"
    return bos, n


def _per_layer(values: xr.DataArray, layers: np.ndarray) -> np.ndarray:
    """A (layer,) DataArray on the comparison's layer axis (NaN where absent)."""
    return values.reindex({S.LAYER: layers}).values.astype(float)


def _one(store: Path, label: str, layers: np.ndarray, faith_name: str,
         settings: StatsSettings, loss: str | None = None) -> dict:
    manifest = read_manifest(store)
    info = describe_store(manifest)
    directory = store / ANALYSIS_DIR
    res, why = _results(store, manifest, directory)
    row: dict = {"label": label, **info, "kind": input_kind(info["data"]), "why": why,
                 "scalars": {}, "layers": {}, "lmg": None, "pooled_lmg": None, "aopc": None,
                 "steps": {}, "bos_option": info["bos"]}
    sc, per = row["scalars"], row["layers"]
    if info["mode"] is not None:                   # a results-only store has no tokens
        row["bos"], sc["n_tokens"] = _tokens(store, info["bos"])
        row["tokens_per_sequence"] = round(sc["n_tokens"] / max(info["n_sequences"], 1), 1)
    if "sinks" in res:
        s = res["sinks"]
        row["epsilon"], row["level"] = float(s.attrs.get("epsilon", np.nan)), float(
            s.attrs.get("analysis_level", np.nan))
        row["sink_k"] = int(s.attrs.get("analysis_sink_k", info["sink_k"] or 0))
        row["tail_w"] = int(s.attrs.get("analysis_tail_w", info["tail_w"] or 0))
        sc["sink_head_share"] = float(s["is_sink_head"].mean())
        sc["sink_rate_mean"] = float(s["sink_rate_mean"].mean())
        if "gu_sink_head_share" in s:
            sc["gu_sink_head_share"] = float(s["gu_sink_head_share"])
            per["gu_layer_sink_share"] = _per_layer(s["gu_layer_sink_share"], layers)
        per["layer_sink_rate_mean"] = _per_layer(s["layer_sink_rate_mean"], layers)
        per["sink_head_fraction"] = _per_layer(s["sink_head_fraction"], layers)
    if "convexity" in res:
        c = res["convexity"]
        sc["convex_share"] = float(c["convex"].mean())
        sc["interior_minimum_share"] = float(c["interior_minimum"].mean())
        per["layer_convex_share"] = _per_layer(c["convex"].mean(S.HEAD), layers)
        per["layer_interior_minimum_share"] = _per_layer(c["interior_minimum"].mean(S.HEAD),
                                                         layers)
        for name in ("pooled_vertex", "pooled_vertex_ci_low", "pooled_vertex_ci_high"):
            per[name] = _per_layer(c[name], layers)
    if "anti_alignment" in res:
        a = res["anti_alignment"]
        for name in ("anti_aligned", "residual_anti_aligned"):
            sc[f"{name}_share"] = float(a[name].mean())
            per[f"layer_{name}_share"] = _per_layer(a[name].mean(S.HEAD), layers)
    if "decomposition" in res:
        d = res["decomposition"]
        row["lmg"] = d["lmg_share"].reindex({S.LAYER: layers})
        row["pooled_lmg"] = d["pooled_lmg_share"]
        row["paper_pattern"] = str(d["pooled_paper_pattern"].item())
    _faithfulness(row, store, manifest, directory, faith_name, settings, loss)
    return row


def _faithfulness(row: dict, store: Path, manifest: dict, directory: Path, name: str,
                  settings: StatsSettings, loss: str | None = None) -> None:
    if not row["causal"]:
        row["why"]["faithfulness"] = "not applicable: an encoder has no next-token loss"
        return
    if name not in entries(manifest):
        row["why"]["faithfulness"] = f"no faithfulness result '{name}' in the store"
        return
    path = stats_path(directory, name, settings)
    if not path.is_file():
        row["why"]["faithfulness"] = (f"no stored statistics {path.name} (run `attngeom "
                                      f"analyze {store} --out {directory}`)")
        return
    stats = read(path)
    variable = loss or stats.attrs["loss_variable"]
    if variable not in stats.variables:
        raise Refusal(f"--loss {variable}: {path} holds statistics of "
                      f"{', '.join(stats.variables)}; choose one of those")
    row["faith_loss_variable"] = variable
    row.setdefault("level", float(stats.attrs["level"]))
    row["aopc"] = stats.for_variable(stats.aopc, variable)
    row["faith_metrics"] = ",".join(sorted(set(row["aopc"]["metric"])))
    row["granularity"] = stats.attrs.get("granularity", "")
    ranking = stats.for_variable(stats.ranking, variable) if len(stats.ranking) else None
    row["positions"] = {} if ranking is None else {
        (r.higher if last else r.lower, r.mode, r.rank): r.position + last
        for r in ranking.itertuples() for last in (0, 1)}
    order = stats.for_variable(stats.order, variable)
    for r in order.itertuples():
        row["steps"][f"{r.mode}/{r.rank}: {r.lower} → {r.higher}"] = (r.verdict, r.mde)


def _layer_axis(stores: Sequence[Path]) -> np.ndarray:
    top = 0
    for store in stores:
        n = describe_store(read_manifest(store)).get("n_layers") or 0
        top = max(top, int(n))
    return np.arange(top)


def _differs(rows: list[dict]) -> dict[str, list[str]]:
    """Per section, the settings it depends on whose values differ between the stores."""
    out = {}
    for section, settings in DEPENDS.items():
        filled = [r for r in rows if section not in r["why"]]   # a store without it: no vote
        out[section] = [s for s in settings if len({str(r.get(s)) for r in filled}) > 1]
    return out


def compare(stores: Sequence[str | Path], labels: Sequence[str] | None = None, *,
            faithfulness: str = "faithfulness",
            settings: StatsSettings = StatsSettings(), loss: str | None = None) -> xr.Dataset:
    """Lay the stored analyses of ``stores`` side by side (see the module docstring).

    Parameters
    ----------
    stores : sequence of str or Path
        Store directories, each analysed (``attngeom analyze``) first.
    labels : sequence of str, optional
        One per store (default "model · data").
    faithfulness : str
        The name of the faithfulness result to read, where a store has one.
    settings : StatsSettings
        Which stored faithfulness statistics to read (level, resamples, seed, margins).
    loss : str, optional
        The loss whose faithfulness statistics to read (``delta_ppl``, ``log_ppl_ratio``);
        default each store's own loss variable.

    Returns
    -------
    xarray.Dataset
        One ``store`` dimension (coordinates label, model, data, kind, bos, mode, sink_k,
        tail_w, epsilon, level; ``relative_depth`` over store and layer).
    """
    stores = [Path(s) for s in stores]
    if labels is not None and len(labels) != len(stores):
        raise Refusal(f"--labels gives {len(labels)} labels for {len(stores)} stores; give "
                         "one per store")
    layers = _layer_axis(stores)
    rows = []
    for i, store in enumerate(stores):
        info = describe_store(read_manifest(store))
        label = labels[i] if labels else f"{info['model']} · {Path(str(info['data'])).name}"
        rows.append(_one(store, label, layers, faithfulness, settings, loss))
    if labels is None:
        _tell_apart(rows, stores)
    return _dataset(rows, layers, _differs(rows))


def _tell_apart(rows: list[dict], stores: list[Path]) -> None:
    """Rows sharing a label get the settings in which they differ appended ("(max_length 48,
    sink_k 1)"), and rows still alike their store folder's name."""
    for label in {r["label"] for r in rows}:
        same = [i for i, r in enumerate(rows) if r["label"] == label]
        if len(same) < 2:
            continue
        keys = [k for k in TELLS_APART if len({str(rows[i].get(k)) for i in same}) > 1]
        parts = {i: [f"{k} {_short(rows[i].get(k))}" for k in keys] for i in same}
        alike = [i for i in same if sum(parts[j] == parts[i] for j in same) > 1]
        for i in alike:
            parts[i].append(stores[i].name)
        for i in same:
            rows[i]["label"] = f"{label} ({', '.join(parts[i])})"


def _short(value) -> str:
    return value[:8] if isinstance(value, str) and len(value) == 64 else str(value)


def _dataset(rows: list[dict], layers: np.ndarray, differs: dict) -> xr.Dataset:
    n = len(rows)
    coords = {"store": np.arange(n), S.LAYER: layers}
    for name in ("label", "model", "data", "data_sha256", "kind", "bos", "bos_option", "mode",
                 "dtype"):
        coords[name] = ("store", np.array([str(r.get(name)) for r in rows], dtype=object))
    for name in ("sink_k", "tail_w", "epsilon", "level", "n_layers", "max_length",
                 "tokens_per_sequence"):
        coords[name] = ("store", np.array([r.get(name, np.nan) if r.get(name) is not None
                                           else np.nan for r in rows], dtype=float))
    depth = np.array([layers / max(float(r.get("n_layers") or 1) - 1, 1.0) for r in rows])
    coords["relative_depth"] = (("store", S.LAYER), depth)
    ds = xr.Dataset(coords=coords)
    ds["n_sequences"] = ("store", np.array([r["n_sequences"] for r in rows], dtype=float))
    scalar = {k for r in rows for k in r["scalars"]}
    for name in sorted(scalar):
        ds[name] = ("store", np.array([r["scalars"].get(name, np.nan) for r in rows]))
    for name in sorted({k for r in rows for k in r["layers"]}):
        ds[name] = (("store", S.LAYER), np.array(
            [r["layers"].get(name, np.full(len(layers), np.nan)) for r in rows]))
    _lmg(ds, rows)
    _faith(ds, rows)
    ds["paper_pattern"] = ("store", np.array([r.get("paper_pattern", "") for r in rows],
                                             dtype=object))
    ds["why"] = (("store", "section"), np.array(
        [[r["why"].get(sec, "") for sec in SECTIONS] for r in rows], dtype=object))
    ds = ds.assign_coords(section=list(SECTIONS))
    for section, names in _SECTION_VARS.items():
        for name in names:
            if name in ds and differs[section]:
                ds[name].attrs["differs"] = ", ".join(differs[section])
    ds.attrs["differs"] = "; ".join(f"{k}: {', '.join(v)}" for k, v in differs.items() if v)
    return ds


_SECTION_VARS = {
    "sinks": ("sink_head_share", "gu_sink_head_share", "sink_rate_mean", "layer_sink_rate_mean",
              "sink_head_fraction", "gu_layer_sink_share"),
    "convexity": ("convex_share", "interior_minimum_share", "layer_convex_share",
                  "layer_interior_minimum_share", "pooled_vertex", "pooled_vertex_ci_low",
                  "pooled_vertex_ci_high"),
    "anti_alignment": ("anti_aligned_share", "residual_anti_aligned_share",
                       "layer_anti_aligned_share", "layer_residual_anti_aligned_share"),
    "decomposition": ("lmg_share", "pooled_lmg_share", "paper_pattern"),
    "faithfulness": ("aopc", "aopc_minmax", "ranking_position", "verdict", "mde"),
}


def _lmg(ds: xr.Dataset, rows: list[dict]) -> None:
    template = next((r["pooled_lmg"] for r in rows if r["pooled_lmg"] is not None), None)
    if template is None:
        return
    empty = xr.full_like(template, np.nan)
    ds["pooled_lmg_share"] = xr.concat([r["pooled_lmg"] if r["pooled_lmg"] is not None
                                        else empty for r in rows], "store",
                                       coords="minimal").drop_vars("store", errors="ignore")
    layered = [r["lmg"] for r in rows]
    base = next(x for x in layered if x is not None)
    ds["lmg_share"] = xr.concat([x if x is not None else xr.full_like(base, np.nan)
                                 for x in layered], "store", coords="minimal").drop_vars(
        "store", errors="ignore")


def _faith(ds: xr.Dataset, rows: list[dict]) -> None:
    ds["faith_loss_variable"] = ("store", np.array([r.get("faith_loss_variable", "")
                                                    for r in rows], dtype=object))
    tables = [r["aopc"] for r in rows if r["aopc"] is not None]
    if not tables:
        return
    keys = ("metric", "mode", "rank")
    axes = {k: list(dict.fromkeys(v for t in tables for v in t[k])) for k in keys}
    shape = (len(rows),) + tuple(len(axes[k]) for k in keys)
    aopc, minmax, position = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    for i, r in enumerate(rows):
        for t in ([] if r["aopc"] is None else r["aopc"].itertuples()):
            at = (i, axes["metric"].index(t.metric), axes["mode"].index(t.mode),
                  axes["rank"].index(t.rank))
            aopc[at] = t.aopc_mean
            minmax[at] = getattr(t, "minmax_mean", np.nan)
            position[at] = r.get("positions", {}).get((t.metric, t.mode, t.rank), np.nan)
    ds["aopc"] = (("store",) + keys, aopc)
    ds["aopc_minmax"] = (("store",) + keys, minmax)
    ds["ranking_position"] = (("store",) + keys, position)
    steps = list(dict.fromkeys(s for r in rows for s in r["steps"]))
    ds["verdict"] = (("store", "step"), np.array(
        [[r["steps"].get(s, ("", np.nan))[0] for s in steps] for r in rows], dtype=object))
    ds["mde"] = (("store", "step"), np.array(
        [[r["steps"].get(s, ("", np.nan))[1] for s in steps] for r in rows], dtype=float))
    ds.coords.update({k: axes[k] for k in keys})
    ds.coords["step"] = steps


def table1(ds: xr.Dataset, variable: str = "gu_sink_head_share") -> "pd.DataFrame":
    """Make Gu et al.'s Table 1: the percent of sink heads, model by input kind.

    Parameters
    ----------
    ds : xarray.Dataset
        The result of :func:`compare`.
    variable : str
        The share to tabulate (default Gu et al.'s per-input count).

    Returns
    -------
    pandas.DataFrame
        Rows per model (with the BOS choice in the label where stores differ in it), columns
        natural, random and repeated, in that order.
    """
    import pandas as pd

    frame = pd.DataFrame({"model": ds["model"].values, "bos": ds["bos"].values,
                          "kind": ds["kind"].values, "value": 100 * ds[variable].values})
    if frame["bos"].nunique() > 1:
        frame["model"] = frame["model"] + " (BOS " + frame["bos"] + ")"
    out = frame.pivot_table(index="model", columns="kind", values="value", sort=False)
    return out[[k for k in ("natural", "random", "repeated") if k in out.columns]]
