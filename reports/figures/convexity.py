"""Convexity: output norm against sink rate with the quadratic fit, LOWESS and the vertex."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from attngeom.store.format import schema as S
from attngeom.common.vocab import SINK

from ..style import Page, figure, legend_below, top_layers
from ..summary import ci, fmt

SECTION = "Convexity"
MAX_POINTS = 20000            # (query, head) points drawn per panel
MAX_SEQUENCES = 128


def layer_points(ds, layer, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(sink rate α_i0, output norm ‖o_i^h‖) of all heads of ``layer``, queries i ≥ k,
    the analyses' masks, at most :data:`MAX_POINTS` (a seeded subsample)."""
    n = min(ds.sizes[S.SEQUENCE], MAX_SEQUENCES)
    block = ds.attngeom.load_block([S.ALPHA, S.OUTPUT_NORM], layer=layer,
                                   sequences=slice(0, n), groups=(SINK,))
    g = block.attngeom.groups()
    x, y = g.sink_rate.values.ravel(), g.per_query(S.OUTPUT_NORM).values.ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) > MAX_POINTS:
        pick = np.random.default_rng(seed).choice(len(x), MAX_POINTS, replace=False)
        x, y = x[pick], y[pick]
    return x, y


def _panel(ax, ds, conv, layer) -> None:
    x, y = layer_points(ds, layer)
    c = conv.sel(layer=layer)
    if len(x):
        ax.hexbin(x, y, gridsize=45, bins="log", cmap="Greys", mincnt=1, linewidths=0.1,
                  extent=(0, 1, 0, float(np.percentile(y, 99.5)) * 1.05))
    b0, b1, b2 = (float(c[f"pooled_beta{i}"]) for i in range(3))
    grid = np.linspace(0, 1, 101)
    if np.isfinite(b2):
        ax.plot(grid, b0 + b1 * grid + b2 * grid**2, color="#c44e52", lw=1.6,
                label=f"quadratic fit (b2 = {fmt(b2)}, q = {fmt(c['pooled_q_value'])})")
    ax.plot(conv["grid"].values, c["pooled_lowess"].values, color="#4c72b0", lw=1.2, ls="--",
            label="LOWESS")
    vertex = float(c["pooled_vertex"])
    if np.isfinite(vertex) and -0.5 < vertex < 1.5:
        kind = "minimum" if b2 > 0 else "maximum (concave fit)"
        ax.axvline(vertex, color="#c44e52", lw=0.9)
        lo, hi = float(c["pooled_vertex_ci_low"]), float(c["pooled_vertex_ci_high"])
        if np.isfinite(lo) and np.isfinite(hi):
            ax.axvspan(max(lo, -0.5), min(hi, 1.5), color="#c44e52", alpha=0.15,
                       label=f"vertex α* = {fmt(vertex)}, {kind}, 95% CI {ci(lo, hi)}")
    star = float(c["pooled_analytic_vertex_median"])
    if np.isfinite(star):
        ax.axvline(star, color="#55a868", lw=1.1, ls=":",
                   label=f"geometric α* (median over queries) = {fmt(star)}")
    ax.set_xlim(0, 1)
    if len(x):
        ax.set_ylim(0, float(np.percentile(y, 99.5)) * 1.05)
    ax.set_title(f"layer {layer}: {len(x):,} (head, query) points")
    ax.set_xlabel("sink rate α_i0")
    ax.set_ylabel("output norm ‖o_i^h‖")
    legend_below(ax, ncol=2, offset=0.2, fontsize=6.5)          # never over the points


def _scatter_page(ds, conv, sinks) -> Page:
    layers = top_layers(sinks, 4)
    fig = figure(hspace=0.8, wspace=0.22)
    nrows, ncols = -(-len(layers) // 2), min(2, len(layers))
    for i, layer in enumerate(layers):
        _panel(fig.add_subplot(nrows, ncols, i + 1), ds, conv, layer)
    level = fmt(conv.attrs.get("analysis_level", 0.05))
    caption = (f"Head output norm ‖o_i^h‖ against the sink rate α_i0 for the {len(layers)} most "
               f"sink-heavy layers (all heads pooled; grey hexagons count (head, query) points on "
               f"a log scale, a seeded subsample of at most {MAX_POINTS:,} per layer). Red: the "
               f"quadratic OLS fit with sequence-clustered errors; blue dashed: LOWESS; the red "
               f"band is the delta-method 95% CI of the vertex α* = -b1/(2 b2). Green dotted: the "
               f"minimiser that the geometry predicts, o = α ṽ_0 + (1-α) r̄ giving α* = "
               f"(‖r̄‖² - ⟨ṽ_0, r̄⟩)/‖ṽ_0 - r̄‖² per query (median). The paper's claim is a convex "
               f"curve (b2 > 0, one-sided q < {level}) with its minimum inside (0, 1): heads that "
               f"attend partly to the sink have the smallest outputs.")
    return Page(SECTION, "Convexity: output norm against sink rate", fig, caption)


def _vertex_page(conv) -> Page:
    fig = figure(wspace=0.28)
    ax = fig.add_subplot(1, 2, 1)
    x = conv[S.LAYER].values
    v = conv["pooled_vertex"].values
    lo, hi = conv["pooled_vertex_ci_low"].values, conv["pooled_vertex_ci_high"].values
    convex = conv["pooled_convex"].values.astype(bool)
    for mask, style, label in ((convex, dict(fmt="o", color="#c44e52"),
                                "convex fit (b2 > 0, q < level): minimum"),
                               (~convex, dict(fmt="o", color="0.6", mfc="white"),
                                "not significantly convex")):
        if mask.any():
            ax.errorbar(x[mask], v[mask], yerr=np.abs(np.vstack([v - lo, hi - v])[:, mask]),
                        capsize=2, ms=4, lw=0.9, label=label, **style)
    star = conv["pooled_analytic_vertex_median"].values
    if np.isfinite(star).any():
        ax.plot(x, star, "_", color="#55a868", ms=9, mew=2, label="geometric α* (median)")
    ax.axhspan(0, 1, color="#4c72b0", alpha=0.06)
    ax.set_ylim(-0.3, 1.3)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("vertex α* with 95% CI (clipped to [-0.3, 1.3])")
    ax.set_title("Pooled vertex per layer")
    legend_below(ax, ncol=2)

    ax = fig.add_subplot(1, 2, 2)
    n_heads = conv.sizes[S.HEAD]
    ax.bar(x, conv["convex"].sum(S.HEAD) / n_heads, color="#dd8452", alpha=0.5,
           label="convex heads")
    ax.bar(x, conv["interior_minimum"].sum(S.HEAD) / n_heads, color="#c44e52", width=0.5,
           label="convex with vertex CI inside (0, 1)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("fraction of heads")
    ax.set_title("Per-head fits")
    legend_below(ax)
    n_int = int(conv["pooled_interior_minimum"].sum())
    caption = (f"Left: the vertex α* of the quadratic fit pooled over the heads of each layer, with "
               f"its delta-method 95% CI (sequence-clustered); filled red where the fit is "
               f"significantly convex, so that α* is a minimum. {int(convex.sum())} of {len(x)} "
               f"layers are convex and {n_int} have the whole CI inside (0, 1), the interior "
               f"minimum the paper predicts. Green: the geometric minimiser (median over queries)"
               f"; agreement with the fitted vertex supports the explanation o = α ṽ_0 + (1-α) r̄. "
               f"Right: per layer, the fraction of heads whose own fit is convex and whose "
               f"vertex CI lies inside (0, 1) ({int(conv['convex'].sum())} and "
               f"{int(conv['interior_minimum'].sum())} of {conv['convex'].size} heads).")
    return Page(SECTION, "Convexity: the vertex per layer", fig, caption)


def pages(ds, conv, sinks) -> list[Page]:
    """The scatter page; the per-layer vertex page only when some fit could be made (it needs
    at least 3 sequences for its clustered errors), never drawn empty."""
    if not np.isfinite(conv["pooled_vertex"].values).any():
        page = _scatter_page(ds, conv, sinks)
        page.caption += (f" No quadratic fit was possible ({ds.sizes[S.SEQUENCE]} sequences; the "
                         "sequence-clustered fit needs at least 3), so the per-layer vertex page "
                         "is left out.")
        return [page]
    return [_scatter_page(ds, conv, sinks), _vertex_page(conv)]
