"""The comparison of several stores as a PDF, PNG figures and CSV tables (no torch).

Everything comes from :func:`attngeom.analysis.compare.compare` (the stores' stored analyses):
a one-page table (one row per store), per-layer figures on the relative-depth axis, the
faithfulness AOPC and verdicts, and for probe stores Gu et al.'s Table 1 pivot.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from attngeom.analysis.compare import table1
from attngeom.common.atomic import atomic_file, atomic_write_bytes
from attngeom.common.errors import Refusal

from ..style import Page, figure, style, table
from ..summary import fmt

SECTION = "Comparison"
FLAG = "†"                      # a cell whose stores differ in a setting that changes it
TABLE_COLUMNS = (              # (variable, header, percent)
    ("n_sequences", "n seq.", False), ("n_tokens", "n tokens", False),
    ("sink_head_share", "sink heads (pooled)", True),
    ("gu_sink_head_share", "sink heads (Gu, per input)", True),
    ("sink_rate_mean", "mean α_i0", False), ("convex_share", "convex heads", True),
    ("interior_minimum_share", "interior α*", True),
    ("anti_aligned_share", "anti-aligned cos(ṽ0, ṽj)", True),
    ("residual_anti_aligned_share", "anti-aligned cos(ṽ0, r)", True),
    ("paper_pattern", "decomposition", False))
LAYER_PANELS = (
    ("layer_sink_rate_mean", "mean sink rate α_i0"),
    ("gu_layer_sink_share", "sink heads, Gu et al.'s per-input share"),
    ("layer_convex_share", "share of heads convex in α_i0"),
    ("pooled_vertex", "pooled vertex α* (delta-method CI)"),
    ("layer_anti_aligned_share", "share anti-aligned: cos(ṽ0, ṽj) < 0"),
    ("layer_residual_anti_aligned_share", "share anti-aligned: cos(ṽ0, r_i) < 0"))


def _cell(ds: xr.Dataset, name: str, i: int, percent: bool) -> str:
    if name not in ds:
        return "n/a"
    value = ds[name].values[i]
    text = str(value) if isinstance(value, str) else (
        f"{fmt(100 * value)} %" if percent else fmt(value))
    return text + (FLAG if ds[name].attrs.get("differs") else "")


def summary_frame(ds: xr.Dataset) -> pd.DataFrame:
    """The one-page table as a DataFrame (one row per store)."""
    rows = {"store": ds["label"].values, "model": ds["model"].values, "data": ds["data"].values,
            "max_length": ds["max_length"].values,
            "tokens_per_sequence": ds["tokens_per_sequence"].values}
    for name, _, _ in TABLE_COLUMNS:
        if name in ds:
            rows[name] = ds[name].values
    return pd.DataFrame(rows)


def _table_page(ds: xr.Dataset) -> Page:
    fig = figure(top=0.88, bottom=0.25)
    header = ["store"] + [h for _, h, _ in TABLE_COLUMNS]
    rows = [[str(ds["label"].values[i])] + [_cell(ds, n, i, p) for n, _, p in TABLE_COLUMNS]
            for i in range(ds.sizes["store"])]
    table(fig.add_subplot(1, 1, 1), rows, header,
          [0.16] + [0.84 / len(TABLE_COLUMNS)] * len(TABLE_COLUMNS), "One row per store")
    why = [f"{ds['label'].values[i]}: {sec}: {ds['why'].values[i, j]}"
           for i in range(ds.sizes["store"]) for j, sec in enumerate(ds["section"].values)
           if ds["why"].values[i, j]]
    caption = ("Each cell is read from the store's stored analyses (attngeom analyze). Sink "
               "heads: pooled = mean α_i0 over queries i ≥ k of all sequences above ε; Gu = "
               "share of inputs whose mean α_i0 over all queries exceeds ε. Shares are of all "
               "(layer, head). " + (f"{FLAG}: the stores differ in a setting that changes this "
                                    f"column ({ds.attrs['differs']}). " if ds.attrs.get(
                                        "differs") else "")
               + (" Missing: " + "; ".join(why) if why else ""))
    return Page(SECTION, "Models side by side", fig, caption)


KIND_STYLE = {"natural": "-", "random": "--", "repeated": ":"}
VERTEX_YLIM = (-0.25, 1.25)     # α* lives on [0, 1]; wider CIs (a flat parabola) are clipped


def _line_styles(ds: xr.Dataset) -> list[dict]:
    """Colour by model and line style by input kind when stores repeat a model over kinds;
    else a colour per store."""
    models, kinds = list(ds["model"].values), list(ds["kind"].values)
    by_model = len(set(models)) < len(models) and len(set(kinds)) > 1
    keys = list(dict.fromkeys(models)) if by_model else list(range(len(models)))
    return [{"color": f"C{keys.index(models[i] if by_model else i) % 10}",
             "ls": KIND_STYLE.get(kinds[i], "-") if by_model else "-"}
            for i in range(len(models))]


def layer_figure(ds: xr.Dataset):
    """Per-layer panels of every store on the relative-depth axis (a matplotlib Figure)."""
    panels = [(n, t) for n, t in LAYER_PANELS if n in ds]
    fig = figure(hspace=0.55, wspace=0.2, bottom=0.3)
    cols, rows = 2, -(-len(panels) // 2)
    styles = _line_styles(ds)
    for p, (name, title) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, p + 1)
        for i in range(ds.sizes["store"]):
            x = ds["relative_depth"].values[i]
            y = ds[name].values[i]
            ok = np.isfinite(y)
            ax.plot(x[ok], y[ok], marker="o", ms=2.2, lw=1.1, label=str(ds["label"].values[i]),
                    **styles[i])
            if name == "pooled_vertex":
                lo, hi = (ds[f"pooled_vertex_ci_{e}"].values[i] for e in ("low", "high"))
                good = ok & np.isfinite(lo) & np.isfinite(hi)
                ax.fill_between(x[good], lo[good], hi[good], alpha=0.1, lw=0,
                                color=styles[i]["color"])
        if name == "pooled_vertex":
            ax.set_ylim(*VERTEX_YLIM)
        ax.set_title(title + (f" {FLAG}" if ds[name].attrs.get("differs") else ""))
        if p >= len(panels) - cols:
            ax.set_xlabel("relative depth (layer / (layers − 1))")
        ax.set_xlim(-0.02, 1.02)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.255), ncol=4,
               frameon=False)
    return fig


def _faith_page(ds: xr.Dataset) -> Page | None:
    if "verdict" not in ds:
        return None
    fig = figure(top=0.88, bottom=0.25)
    steps = list(ds["step"].values)
    rows = [[s] + [(f"{ds['verdict'].values[i, j]} (MDE {fmt(ds['mde'].values[i, j])})"
                    if ds["verdict"].values[i, j] else "not run")
                   for i in range(ds.sizes["store"])] for j, s in enumerate(steps)]
    table(fig.add_subplot(1, 1, 1), rows, ["step"] + list(ds["label"].values),
          [0.34] + [0.66 / ds.sizes["store"]] * ds.sizes["store"],
          "Faithfulness: each step of the paper's order, verdict and minimum detectable effect")
    return Page(SECTION, "Faithfulness across models", fig,
                "Verdicts of the stored order test on the AOPC of each store's loss (ΔPPL or "
                "accuracy loss): holds, equivalent within ±δ, reversed, or inconclusive at "
                "this n; the MDE is the smallest mean improvement the store's design detects.")


def _ranking_page(ds: xr.Dataset) -> Page | None:
    """Every metric's normalised AOPC and ranking position, store by store (signed rank)."""
    if "aopc_minmax" not in ds or not np.isfinite(ds["aopc_minmax"].values).any():
        return None
    from attngeom.common import metrics as M

    rank = "signed" if "signed" in ds["rank"].values else str(ds["rank"].values[0])
    modes = [str(m) for m in ds["mode"].values]
    metrics = [str(m) for m in ds["metric"].values]
    labels = [str(x) for x in ds["label"].values]
    fig = figure(top=0.9, bottom=0.27, hspace=0.35, wspace=0.45)
    grid = fig.add_gridspec(2, len(modes), height_ratios=[0.9, 1])
    flagged = ds["aopc_minmax"].attrs.get("differs", "")
    rows = []
    for metric in metrics:
        row = [M.label(metric, "short")]
        for mode in modes:
            for i in range(ds.sizes["store"]):
                at = dict(store=i, metric=metric, mode=mode, rank=rank)
                pos, mm = ds["ranking_position"].sel(at).item(), ds["aopc_minmax"].sel(at).item()
                row.append("" if not np.isfinite(mm) else
                           f"{int(pos) if np.isfinite(pos) else '–'}. {fmt(mm)}")
        rows.append(row)
    header = ["metric"] + [f"{mode[:4]}.\n{label}" for mode in modes for label in labels]
    n = len(header) - 1
    table(fig.add_subplot(grid[0, :]), rows, header, [0.18] + [0.82 / n] * n,
          f"Ranking position (1 = least faithful) and AOPC min–max, {rank} ranking"
          + (f" {FLAG}" if flagged else ""))
    for c, mode in enumerate(modes):
        ax = fig.add_subplot(grid[1, c])
        for i, label in enumerate(labels):
            x = ds["aopc_minmax"].sel(store=i, mode=mode, rank=rank).values
            ax.plot(x, np.arange(len(metrics)), "o", ms=4, label=label)
        ax.set_yticks(range(len(metrics)), [M.label(m, "short") for m in metrics])
        ax.set_xlim(-0.05, 1.05)
        ax.set_xlabel("AOPC min–max over the rankings run")
        ax.set_title(f"{mode}: {'higher' if mode == 'comprehensiveness' else 'lower'} is more "
                     "faithful")
    fig.axes[-1].legend(loc="lower right", fontsize=7, frameon=False)
    return Page(SECTION, "Faithfulness: every metric ranked, across models", fig,
                "Each store's AOPC of its loss rescaled per unit between the lowest (0) and the "
                "highest (1) AOPC of the rankings it ran (random included), mean over units: "
                "raw AOPC is not comparable across models (Edin et al., ACL 2025), this is "
                "when the stores ran the same metrics. The number before it is the metric's "
                "position in the store's ranking by mean AOPC."
                + (f" † The stores differ in {flagged}." if flagged else ""))


def _table1_page(ds: xr.Dataset) -> Page | None:
    if not (ds["kind"] != "natural").any() or "gu_sink_head_share" not in ds:
        return None
    pivot = table1(ds)
    fig = figure(top=0.88, bottom=0.5)
    rows = [[str(m)] + [fmt(v) for v in r] for m, r in zip(pivot.index, pivot.to_numpy())]
    table(fig.add_subplot(1, 1, 1), rows, ["model"] + list(pivot.columns),
          [0.4] + [0.6 / len(pivot.columns)] * len(pivot.columns),
          "Percent of sink heads (ε = {}), Gu et al.'s Table 1 protocol".format(
              ", ".join(sorted({fmt(e) for e in ds["epsilon"].values}))))
    return Page(SECTION, "Sink heads on natural, random and repeated tokens", fig,
                "Per input, a head's score is the mean α_i0 over every query (α_00 = 1 "
                "included); the percentage of (input, layer, head) above ε, as in Gu et al. "
                "(ICLR 2025), Table 1.")


def write_csv(ds: xr.Dataset, directory: str | os.PathLike) -> list[Path]:
    """summary.csv, layers.csv (long: store, layer, relative_depth, ...), table1.csv for
    probe stores, and for faithfulness results ranking.csv (long: store, metric, mode, rank:
    ranking_position, aopc_minmax) and order.csv (store, step: verdict, mde), in
    ``directory``: the numbers the PDF's pages show."""
    out = Path(directory)
    files = {"summary.csv": summary_frame(ds)}
    layer_vars = [n for n, _ in LAYER_PANELS if n in ds] + [
        n for n in ("sink_head_fraction", "layer_interior_minimum_share",
                    "pooled_vertex_ci_low", "pooled_vertex_ci_high") if n in ds]
    long = ds[layer_vars].assign_coords(label=ds["label"]).to_dataframe().reset_index()
    files["layers.csv"] = long.dropna(subset=layer_vars, how="all")
    if (ds["kind"] != "natural").any() and "gu_sink_head_share" in ds:
        files["table1.csv"] = table1(ds).reset_index()
    for name, names in (("ranking.csv", ("ranking_position", "aopc_minmax")),
                        ("order.csv", ("verdict", "mde"))):
        if all(n in ds for n in names):
            frame = ds[list(names)].assign_coords(label=ds["label"]).to_dataframe()
            files[name] = frame.reset_index().dropna(subset=[names[-1]])
    written = []
    for name, frame in files.items():
        atomic_write_bytes(out / name, frame.to_csv(index=False).encode())
        written.append(out / name)
    return written


def write_pdf(ds: xr.Dataset, out: str | os.PathLike, png: str | os.PathLike | None = None
              ) -> Path:
    """The comparison PDF (and, with ``png``, its main figure as a PNG: the per-layer figure,
    or the ranking figure for stores that hold faithfulness results only)."""
    from matplotlib.backends.backend_pdf import PdfPages

    from .report import decorate

    out = Path(out)
    layered = any(n in ds for n, _ in LAYER_PANELS)     # faithfulness-only stores have none
    with style():
        ranking = _ranking_page(ds)
        if png is not None and not layered and ranking is None:
            raise Refusal("--png: the stores hold neither per-layer results nor a faithfulness "
                          "ranking, so there is no figure to write; leave out --png")
        pages = [_table_page(ds)]
        if layered:
            pages.append(Page(
                SECTION, "Per layer, on a shared relative-depth axis", layer_figure(ds),
                "Each line is one store; x = layer / (the model's layers − 1), so models of "
                "different depth share the axis (a subset store keeps its place). Vertex "
                "panel: y clipped to [−0.25, 1.25] (α* lies in [0, 1]; a near-flat parabola's "
                "CI runs off the axis)."))
        pages += [p for p in (_faith_page(ds), ranking, _table1_page(ds)) if p is not None]
        with atomic_file(out) as tmp, PdfPages(tmp, metadata={"Title": "attngeom compare"}) \
                as pdf:
            for n, page in enumerate(pages, 1):
                decorate(page, n, len(pages), f"{ds.sizes['store']} stores")
                pdf.savefig(page.fig)
        if png is not None:
            fig = layer_figure(ds) if layered else _ranking_page(ds).fig   # undecorated
            with atomic_file(png) as tmp:
                fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return out
