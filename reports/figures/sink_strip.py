"""The example sequence as a whole, token by token: what each token gives the sink, and gets.

Under every token (as the query i) of the example sequence, at the example layer, two heat
strips: α_i0 averaged over heads (how much the token attends to the sink) and C_i0 = Σ_h
C_i0^h (how much of the token's layer output the sink actually contributes, diverging colours:
blue is a negative contribution). Works for dense and compact stores (both keep the sink key).
"""

from __future__ import annotations

import numpy as np
from matplotlib import colors

from attngeom.store.format import schema as S
from attngeom.common.vocab import SINK

from ..style import PLAIN, Page, colormap, figure
from .example import SECTION, pick_example, token_labels
from ..summary import fmt

PER_ROW, MAX_TOKENS = 16, 64


def sink_strips(ds, seq: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(α_i0 mean over heads, Σ_h C_i0^h) for every query i of sequence ``seq`` (NaN beyond)."""
    keys = ds.isel({S.SEQUENCE: seq}).sel({S.LAYER: layer}).attngeom.groups(mask=False)
    sink = {S.SINK: 0}                                                # the key at position 0
    alpha = keys.group(SINK, S.ALPHA).isel(sink).mean(S.HEAD).transpose(S.QUERY).values
    contrib = keys.group(SINK, S.CONTRIBUTION_LAYER).isel(sink).sum(S.HEAD, min_count=1) \
        .transpose(S.QUERY).values
    return np.asarray(alpha, float), np.asarray(contrib, float)


def pages(ds, sinks=None) -> list[Page]:
    seq, _, layer, _ = pick_example(ds, sinks)
    alpha, contrib = sink_strips(ds, seq, layer)
    n = min(int(ds[S.LENGTH].values[seq]), MAX_TOKENS)
    labels = token_labels(ds, seq)[:n]
    rows = -(-n // PER_ROW)
    lim = float(np.nanmax(np.abs(contrib[:n]))) if np.isfinite(contrib[:n]).any() else 1.0
    norms = ((colors.Normalize(0, 1), colormap("Blues")),
             (colors.Normalize(-lim, lim), colormap("RdBu_r")))
    fig = figure()
    height = 0.62 / max(rows, 1)
    for r in range(rows):
        lo, hi = r * PER_ROW, min(n, (r + 1) * PER_ROW)
        ax = fig.add_axes((0.14, 0.86 - (r + 1) * height, 0.82 * (hi - lo) / PER_ROW,
                           height * 0.55))
        for k, (values, (norm, cmap)) in enumerate(zip((alpha, contrib), norms)):
            ax.imshow(values[None, lo:hi], extent=(lo - 0.5, hi - 0.5, k + 1, k), aspect="auto",
                      norm=norm, cmap=cmap, interpolation="nearest")
            for i in range(lo, hi):
                v = values[i]
                dark = np.isfinite(v) and abs(norm(v) - (0.5 if k else 0)) > 0.35
                ax.text(i, k + 0.5, fmt(v, 2), ha="center", va="center", fontsize=5,
                        color="white" if dark else "black", **PLAIN)
        ax.set_ylim(2, 0)
        ax.set_yticks([0.5, 1.5], ["α_i0 (mean over heads)", "C_i0 = Σ_h C_i0^h"], fontsize=6)
        ax.set_xticks(range(lo, hi), labels[lo:hi], fontsize=6)
        ax.xaxis.tick_top()
        ax.tick_params(length=0)
        ax.grid(False)
        for side in ax.spines.values():
            side.set_visible(False)
    length = int(ds[S.LENGTH].values[seq])
    cut = f" (first {MAX_TOKENS} of {length} tokens)" if length > MAX_TOKENS else ""
    caption = (f"Sequence {seq}{cut}, layer {layer}, every token as the query i. Top strip: "
               f"how much the token attends to the sink (α_i0, averaged over heads, blue "
               f"0 to 1). Bottom strip: how much of the token's layer output the sink actually "
               f"contributes (C_i0 summed over heads; red positive, blue negative, scale ±"
               f"{fmt(lim, 2)}). Where the top strip is dark and the bottom one pale, the token "
               f"attends to the sink but the sink adds almost nothing: the sink as a no-op. "
               f"The first token is the sink itself (it attends only to itself).")
    return [Page(SECTION, "Example sequence: attention to the sink and its contribution, "
                          "token by token", fig, caption)]
