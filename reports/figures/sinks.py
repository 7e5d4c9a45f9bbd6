"""Sink heads: the layer x head map of mean sink rates, Gu et al.'s sink heads marked."""

from __future__ import annotations

import numpy as np

from attngeom.store.format import schema as S
from attngeom.common.vocab import EPSILON

from ..style import Page, figure, heatmap, legend_below
from ..summary import fmt

SECTION = "Sink heads"


def pages(sinks) -> list[Page]:
    fig = figure(wspace=0.35)
    grid = fig.add_gridspec(1, 3)
    ax = fig.add_subplot(grid[0, :2])
    rate = sinks["sink_rate_mean"].transpose(S.LAYER, S.HEAD).values
    layers, heads = sinks[S.LAYER].values, sinks[S.HEAD].values
    eps = float(sinks.attrs.get("epsilon", EPSILON))      # the analysis' own, else the default
    marks = sinks["is_sink_head"].transpose(S.LAYER, S.HEAD).values.astype(bool)
    heatmap(ax, rate, cmap="rocket_r", vmin=0, vmax=1, rows=layers, cols=heads,
            label="mean sink rate α_i0 (queries i ≥ k)", marks=marks,
            mark_label=f"sink head (mean rate > ε = {fmt(eps)})")
    legend_below(ax, offset=0.07)
    ax.set_title("Mean attention to the sink token, per head")

    side = fig.add_subplot(grid[0, 2])
    y = np.arange(len(layers)) + 0.5
    frac = sinks["sink_head_fraction"].values
    side.barh(y, frac, height=0.8, color="#c44e52", alpha=0.6, label="fraction of sink heads")
    side.plot(sinks["layer_sink_rate_mean"].values, y, "o-", color="black", ms=3,
              label="mean sink rate")
    side.set_ylim(len(layers), 0)
    step = max(1, len(layers) // 16)
    side.set_yticks(np.arange(0, len(layers), step) + 0.5, [str(v) for v in layers[::step]])
    side.set_xlim(0, 1)
    side.set_xlabel("fraction / rate")
    side.set_ylabel("layer")
    side.set_title("Per layer")
    legend_below(side, offset=0.09)

    n, total = int(marks.sum()), marks.size
    counts = sinks["sink_head_count"].values
    busiest = [int(layers[i]) for i in np.argsort(-counts, kind="stable")[:3] if counts[i] > 0]
    where = (f" Layers with the most sink heads: {', '.join(map(str, sorted(busiest)))}."
             if busiest else "")
    caption = (f"Left: mean sink rate α_i0 of every head over all queries i ≥ k of all sequences "
               f"(k = {sinks.attrs.get('analysis_sink_k', 1)}); circles mark sink heads in the "
               f"sense of Gu et al. (ICLR 2025), mean sink rate above ε = {fmt(eps)}: {n} of "
               f"{total} heads (fraction {fmt(n / total)}).{where} Right: per layer, the fraction "
               f"of heads that are sink heads (bars) and the mean sink rate over heads (dots). "
               f"Look for the layers where attention collapses onto the first token: these are "
               f"the heads whose output the sink's value geometry controls.")
    return [Page(SECTION, "Sink heads: where attention collapses onto the first token", fig,
                 caption)] + learned_sink_pages(sinks)


def learned_sink_pages(sinks) -> list[Page]:
    """The learned sink's weight per head, for models with learned sink logits (gpt-oss)."""
    if "learned_sink_rate_mean" not in sinks:
        return []
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    rate = sinks["learned_sink_rate_mean"].transpose("layer", "head").values
    heatmap(ax, rate, cmap="rocket_r", vmin=0, vmax=1, rows=sinks["layer"].values,
            cols=sinks["head"].values, label="mean learned-sink weight (queries i ≥ k)")
    ax.set_title("Mean weight of the learned sink logit, per head")
    caption = ("This model has a learned sink logit per head: a virtual key with no value that "
               "joins the softmax, so the real keys' α sum to 1 minus its weight "
               "(learned_sink_alpha). The map shows its mean weight over all queries i ≥ k; "
               "compare it with the emergent sink (position 0) on the previous page. The "
               "attention it absorbs adds nothing to the head output, and the contribution "
               "weights over real keys still sum to 1.")
    return [Page(SECTION, "Learned sinks: attention given to no token", fig, caption)]
