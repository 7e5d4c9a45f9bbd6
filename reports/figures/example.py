"""One example sequence, token by token: attention and contribution as heat strips under the text.

For one query (the last token) at one layer, four strips under each key's token: the attention
averaged over heads, the layer-level contribution C_ij = Σ_h C_ij^h, and for one head (the
layer's strongest sink head) its α_ij^h and c_ij^h. Dense stores show every key; compact stores
keep only the sink keys, the tail window and one total over the middle keys (drawn hatched).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from matplotlib import colors, ticker
from matplotlib.cm import ScalarMappable
from matplotlib.patches import Rectangle

from attngeom.store.format import schema as S
from attngeom.common.vocab import MIDDLE, SINK, TAIL

from ..style import PLAIN, Page, colormap, figure
from ..summary import fmt
from ..tokens import clean_token

SECTION = "Example sequence"
DENSE_MAX_QUERY = 95          # dense stores: the query is the last token, at most position 95
STRIPS = (("alpha_layer", "α (mean over heads)"), ("contrib_layer", "C = Σ_h C^h (layer)"),
          ("alpha_head", "α^h"), ("contrib_head", "c^h"))


@dataclass
class Cell:
    label: str
    values: dict
    kind: str = "key"          # key, sink, tail, middle, query


def pick_example(ds, sinks) -> tuple[int, int, int, int]:
    """(sequence index, query, layer, head): first usable sequence, its last token, the most
    sink-heavy layer and that layer's strongest sink head."""
    lengths = ds[S.LENGTH].values
    seq = int(np.flatnonzero(ds.attngeom.sequence_ok.values & (lengths >= 2))[0])
    query = int(lengths[seq]) - 1
    if ds.attngeom.all_keys:
        query = min(query, DENSE_MAX_QUERY)
    if sinks is not None and np.isfinite(sinks["sink_rate_mean"].values).any():
        layer_pos = int(np.nanargmax(sinks["layer_sink_rate_mean"].values))
        layer = int(sinks[S.LAYER].values[layer_pos])
        head = int(sinks[S.HEAD].values[int(np.nanargmax(
            sinks["sink_rate_mean"].sel(layer=layer).values))])
    else:
        layer = int(ds[S.LAYER].values[ds.sizes[S.LAYER] // 2])
        head = int(ds[S.HEAD].values[0])
    return seq, query, layer, head


def _context(ds, seq: int, query: int, chars: int = 170) -> str:
    """The text up to and including the query token (its end, at most ``chars`` characters)."""
    if S.TOKEN not in ds:
        return "(no token strings in this store)"
    raw = [str(t) for t in ds[S.TOKEN].isel({S.SEQUENCE: seq}).values[: query + 1]]
    marked = any(m in t for t in raw for m in ("Ġ", "▁", "Ċ"))   # byte-level / sentencepiece
    text = ("" if marked else " ").join(raw).replace("Ġ", " ").replace("▁", " ")
    text = " ".join(text.replace("Ċ", " ").split())
    return text if len(text) <= chars else "…" + text[-chars:]


def token_labels(ds, seq: int) -> list[str]:
    """Readable token strings of sequence ``seq`` (token ids ``#id`` without text)."""
    if S.TOKEN in ds:
        return [clean_token(t) for t in ds[S.TOKEN].isel({S.SEQUENCE: seq}).values]
    return [f"#{int(t)}" for t in ds[S.TOKEN_ID].isel({S.SEQUENCE: seq}).values]


def cells(ds, seq: int, query: int, layer: int, head: int) -> list[Cell]:
    """The keys of the example query with their four values (see :data:`STRIPS`)."""
    at = {S.SEQUENCE: seq, S.QUERY: query}
    labels = token_labels(ds, seq)
    length = int(ds[S.LENGTH].values[seq])
    keys = ds.attngeom.groups(mask=False)          # the store's values, both layouts alike
    h = int(np.flatnonzero(ds[S.HEAD].values == head)[0])

    def four(values) -> dict[str, np.ndarray]:
        """values(name) -> DataArray (..., head, query, slot) of the layer: the four strips."""
        a = values(S.ALPHA).isel(at).sel({S.LAYER: layer}).values           # (H, slot)
        c_layer = values(S.CONTRIBUTION_LAYER).isel(at).sel({S.LAYER: layer}).values
        c_head = values(S.CONTRIBUTION).isel(at).sel({S.LAYER: layer, S.HEAD: head}).values
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)      # keys beyond the query: NaN
            mean = np.nanmean(a, 0) if a.ndim > 1 else a
        return {"alpha_layer": mean,
                "contrib_layer": np.nansum(c_layer, 0) if c_layer.ndim > 1 else c_layer,
                "alpha_head": a[h], "contrib_head": c_head}

    def cell(values: dict, i: int, j: int, kind: str) -> Cell:
        return Cell(labels[j], {k: float(v[i]) for k, v in values.items()},
                    "query" if j == query else kind)

    if keys.elementwise(MIDDLE):                                              # every key
        v = four(keys.pairs)
        hi = length if not ds.attngeom.causal else query + 1
        return [cell(v, j, j, "key") for j in range(hi)]
    k = keys.k
    v = four(lambda name: keys.group(SINK, name))
    out = [cell(v, j, j, "sink") for j in range(min(k, length))]
    middle = {name: keys.total(MIDDLE, name).isel(at).sel({S.LAYER: layer}).values
              for name in (S.ALPHA, S.CONTRIBUTION_LAYER, S.CONTRIBUTION)}
    n_middle = int(np.nanmax(keys.count(MIDDLE).isel(at).sel({S.LAYER: layer}).values))
    if n_middle > 0:
        out.append(Cell(f"{n_middle} middle", {
            "alpha_layer": float(np.nanmean(middle[S.ALPHA])),
            "contrib_layer": float(np.nansum(middle[S.CONTRIBUTION_LAYER])),
            "alpha_head": float(middle[S.ALPHA][h]),
            "contrib_head": float(middle[S.CONTRIBUTION][h])}, "middle"))
    t = four(lambda name: keys.group(TAIL, name))
    tail = [(query - lag, lag) for lag in range(keys.w)
            if query - lag >= k and np.isfinite(t["alpha_layer"][lag])]
    out += [cell(t, lag, j, "tail") for j, lag in sorted(tail)]
    return out


def _strips(head: int) -> list[tuple[str, str]]:
    return [(name, f"{label} (head {head})" if name.endswith("_head") else label)
            for name, label in STRIPS]


def _draw(ax, items: list[Cell], ncols: int, norms: dict, head: int) -> None:
    strip_h, text_h, gap = 0.8, 0.9, 0.7
    row_h = text_h + len(STRIPS) * strip_h + gap
    nrows = -(-len(items) // ncols)
    for n, item in enumerate(items):
        r, c = divmod(n, ncols)
        top = r * row_h
        ax.text(c + 0.5, top + text_h * 0.55, item.label, ha="center", va="center",
                fontsize=7, **PLAIN, fontweight="bold" if item.kind == "query" else "normal",
                color="#c44e52" if item.kind == "sink" else "black")
        for s, (name, _) in enumerate(STRIPS):
            value = item.values[name]
            norm, cmap = norms[name]
            face = cmap(norm(value)) if np.isfinite(value) else (0.9, 0.9, 0.9, 1)
            y = top + text_h + s * strip_h
            ax.add_patch(Rectangle((c + 0.04, y), 0.92, strip_h * 0.92, facecolor=face,
                                   edgecolor="black" if item.kind == "query" else "none",
                                   hatch="///" if item.kind == "middle" else None, lw=0.8))
            level = float(norm(value)) if np.isfinite(value) else 0.0
            dark = abs(level - 0.5) > 0.3 if "contrib" in name else level > 0.6
            ax.text(c + 0.5, y + strip_h * 0.46, fmt(value, 2), ha="center", va="center",
                    fontsize=5.5, color="white" if dark else "black")
        if c == 0:
            for s, (_, label) in enumerate(_strips(head)):
                ax.text(-0.1, top + text_h + (s + 0.46) * strip_h, label, ha="right",
                        va="center", fontsize=7)
    ax.set_xlim(-0.05, ncols)
    ax.set_ylim(nrows * row_h, 0)
    ax.axis("off")


def pages(ds, sinks=None) -> list[Page]:
    seq, query, layer, head = pick_example(ds, sinks)
    items = cells(ds, seq, query, layer, head)
    keys = [c for c in items if c.kind != "middle"]
    norms = {}
    for name, _ in STRIPS:
        vals = np.array([c.values[name] for c in keys], float)
        vals = vals[np.isfinite(vals)]
        if name.startswith("alpha"):
            top = float(vals.max()) if vals.size and vals.max() > 0 else 1.0
            norms[name] = (colors.PowerNorm(0.5, vmin=0, vmax=top, clip=True),
                           colormap("Blues"))
        else:
            lim = float(np.abs(vals).max()) if vals.size and np.abs(vals).max() > 0 else 1.0
            norms[name] = (colors.Normalize(-lim, lim, clip=True), colormap("RdBu_r"))
    ncols = 16 if len(items) > 16 else max(len(items), 8)
    fig = figure(left=0.13, right=0.97, top=0.84, bottom=0.3)
    ax = fig.add_subplot(1, 1, 1)
    _draw(ax, items, ncols, norms, head)
    for i, (name, label) in enumerate(_strips(head)):
        cax = fig.add_axes((0.13 + i * 0.215, 0.265, 0.18, 0.012))
        bar = fig.colorbar(ScalarMappable(*norms[name]), cax=cax, orientation="horizontal")
        bar.set_label(label, fontsize=7)
        bar.ax.tick_params(labelsize=6)
        norm = norms[name][0]
        bar.set_ticks([norm.vmin, (norm.vmin + norm.vmax) / 2 if name.startswith("contrib")
                       else norm.vmax / 4, norm.vmax])
        bar.ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt(v, 2)))
    context = _context(ds, seq, query)
    fig.text(0.06, 0.875, f"text up to the query: {context}", fontsize=7, color="0.3", **PLAIN)
    compact = not ds.attngeom.all_keys
    shown = (f"This compact store keeps only the sink key{'s' if ds.attngeom.sink_k > 1 else ''}"
             f" (red), the tail window of the {ds.attngeom.tail_w} most recent keys and, for "
             f"the other keys, only totals: the hatched cell is the sum over the middle keys "
             f"(α averaged over heads, contributions summed), coloured on the clipped scale. "
             f"Extract with --mode dense to see every key."
             if compact else "All keys up to the query are shown (dense store).")
    tokens = ("" if S.TOKEN in ds else " The store keeps no token strings (extracted with "
              "--no-text), so token ids (#id) stand in for the text.")
    caption = (f"Sequence {seq}, query = token {query} (the last one, outlined), layer {layer}; "
               f"head {head} is that layer's strongest sink head. Under each key's token: α "
               f"averaged over heads and the layer-level contribution C_ij = Σ_h C_ij^h (which "
               f"sums to 1 over heads and keys), then that head's α_ij^h and c_ij^h (summing to 1 "
               f"over keys). Contributions use a diverging scale: red adds to the output, blue "
               f"points against it (negative). Compare the sink's attention with its "
               f"contribution: attention says the first token matters; contribution says how much "
               f"it adds. {shown}{tokens}")
    return [Page(SECTION, "Example sequence: attention versus contribution, token by token",
                 fig, caption)]

