"""Anti-alignment: layer x head maps of the sink-value cosines with FDR marks, and distributions."""

from __future__ import annotations

import numpy as np
from matplotlib.ticker import MaxNLocator

from attngeom.store.format import schema as S

from ..style import Page, figure, heatmap, legend_below, symmetric_limit, top_layers
from ..summary import fmt

SECTION = "Anti-alignment"
MAX_SEQUENCES = 64             # sequences read from the store for the token-level distribution


def _map_page(anti) -> Page:
    fig = figure(wspace=0.3)
    level = fmt(anti.attrs.get("analysis_level", 0.05))
    layers, heads = anti[S.LAYER].values, anti[S.HEAD].values
    lim = symmetric_limit(np.concatenate([anti["mean_cos"].values.ravel(),
                                          anti["residual_mean_cos"].values.ravel()]))
    for i, (prefix, title) in enumerate((("", "cos(ṽ_0, ṽ_j): sink value vs semantic values"),
                                         ("residual_", "cos(ṽ_0, r_i): sink value vs non-sink "
                                                       "output"))):
        ax = fig.add_subplot(1, 2, i + 1)
        marks = heatmap(ax, anti[prefix + "mean_cos"].transpose(S.LAYER, S.HEAD).values, cmap="RdBu_r",
                vmin=-lim, vmax=lim, rows=layers, cols=heads, label="mean cosine over sequences",
                marks=anti[prefix + "anti_aligned"].transpose(S.LAYER, S.HEAD).values.astype(bool),
                mark_label=f"anti-aligned: mean < 0, BH q < {level}")
        ax.set_title(title)
        if marks is not None:
            legend_below(ax, offset=0.07)
    total = int(anti["mean_cos"].size)
    caption = (f"Mean cosine between the sink's projected value ṽ_0 and (left) the projected "
               f"values of semantic tokens j ≥ k, (right) the non-sink part r_i of the head "
               f"output, per layer and head. Each sequence contributes one mean, and sequences "
               f"are the replicates of a one-sided t-test (H1: mean < 0) with Benjamini-Hochberg "
               f"control over layer × head. Blue is anti-aligned; circles mark significant heads: "
               f"{int(anti['anti_aligned'].sum())} of {total} (left) and "
               f"{int(anti['residual_anti_aligned'].sum())} of {total} (right) at q < {level}. "
               f"Mean over heads: {fmt(anti['mean_cos'].mean())} (left), "
               f"{fmt(anti['residual_mean_cos'].mean())} (right).")
    return Page(SECTION, "Anti-alignment of the sink value, per head", fig, caption)


def token_cosines(ds, layers: list[int]) -> dict[int, np.ndarray]:
    """Token-level cos(ṽ_0, ṽ_j) over semantic keys, pooled over heads, per layer."""
    n = min(ds.sizes[S.SEQUENCE], MAX_SEQUENCES)
    out = {}
    for layer in layers:
        block = ds.attngeom.load_block([S.SINK_VALUE_COSINE], layer=layer,
                                       sequences=slice(0, n), groups=())
        g = block.attngeom.groups()
        cos = g.per_key(S.SINK_VALUE_COSINE).values              # (S, H, K)
        keep = g.semantic_key.values[:, None, :] & np.isfinite(cos)
        out[layer] = cos[np.broadcast_to(keep, cos.shape)]
    return out


def _distribution_page(anti, ds, sinks) -> Page:
    import seaborn as sns

    fig = figure(wspace=0.3)
    ax = fig.add_subplot(1, 3, 1)
    bins = np.linspace(-1, 1, 41)
    ax.hist(anti["mean_cos"].values.ravel(), bins=bins, alpha=0.6, label="vs semantic values",
            color="#4c72b0")
    ax.hist(anti["residual_mean_cos"].values.ravel(), bins=bins, alpha=0.6,
            label="vs non-sink output", color="#dd8452")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("per-head mean cosine")
    ax.set_ylabel("heads")
    ax.set_title("All heads")
    legend_below(ax)

    ax = fig.add_subplot(1, 3, 2)
    layers = top_layers(sinks, 4) if sinks is not None else list(anti[S.LAYER].values[:4])
    values = token_cosines(ds, layers) if S.SINK_VALUE_COSINE in ds else {}
    data = [values[lay] for lay in layers if values.get(lay) is not None and values[lay].size]
    if data:
        sns.violinplot(data=data, ax=ax, inner="quartile", cut=0, color="#8fb0d8",
                       linewidth=0.8)
        ax.set_xticks(range(len(data)), [str(lay) for lay in layers if values[lay].size])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("layer (most sink-heavy)")
    ax.set_ylabel("cos(ṽ_0, ṽ_j), tokens of all heads")
    ax.set_title("Token level")

    ax = fig.add_subplot(1, 3, 3)
    x = anti[S.LAYER].values
    for prefix, color, label in (("", "#4c72b0", "vs semantic values"),
                                 ("residual_", "#dd8452", "vs non-sink output")):
        est, se = anti[prefix + "mixed_mean_cos"].values, anti[prefix + "mixed_se"].values
        ax.errorbar(x, est, yerr=1.96 * se, fmt="o-", ms=3, lw=0.8, capsize=2, color=color,
                    label=label)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("mixed-model mean cosine ± 1.96 se")
    ax.set_title("Per layer (random sequence intercept)")
    legend_below(ax)
    n_seq = min(ds.sizes[S.SEQUENCE], MAX_SEQUENCES)
    caption = (f"Left: distribution over heads of the mean cosines of the previous page. Middle: "
               f"token-level cosines between the sink value and each semantic token's value "
               f"(special tokens excluded), pooled over the heads of the four most sink-heavy "
               f"layers, from the first {n_seq} sequences of the store; lines mark quartiles. "
               f"Right: per layer, the intercept of a linear mixed model of the per-(sequence, "
               f"head) means with a random intercept per sequence (a robustness check of the "
               f"per-head tests). Mass below zero is the anti-alignment the paper describes: the "
               f"sink value points away from the semantic content it is mixed with.")
    return Page(SECTION, "Anti-alignment: distributions", fig, caption)


def pages(anti, ds, sinks=None) -> list[Page]:
    return [_map_page(anti), _distribution_page(anti, ds, sinks)]
