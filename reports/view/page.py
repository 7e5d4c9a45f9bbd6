"""An interactive view of a store as one self-contained HTML file (and inline in Jupyter).

``view(ds, sequence=0)`` takes any ``xarray.Dataset`` with the store's names and dims (an
opened store, a cut of one, a measurement held in memory) or a store's path, and returns a
:class:`View`: ``.save(path)`` writes the page, ``_repr_html_`` renders the same HTML inline.
The page needs no network and no server: script and style are inlined from
``reports/view/assets/`` (plain JS and CSS written for it), the numbers embedded as described in :mod:`.data`.

What it shows: a layer x head map of the sink rate and of what the sink contributes (this
sequence, or pooled over the view's sequences); for the chosen sequence, layer and head (or all
heads: the layer total), the tokens as a strip with two colour bands (α and the contribution
by default; value-weighted attention, cosine, value norm), the learned sink's weight where the
model has one, and in compact stores the middle keys' total; dense stores add a query x key
heat map. Clicking a token (or a heat-map row) makes it the query; hovering shows the numbers.
A long sequence's strip draws the sink keys and a window of keys at the query (the others are
gap cells that move the query into them), so the page stays responsive at 8,192 tokens.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from pathlib import Path

import numpy as np
import xarray as xr

from attngeom.common import metrics as M
from attngeom.store.format import schema as S
from attngeom.common.options.ranges import runs_text
from attngeom.common.vocab import VIEW_MAX_BYTES as MAX_BYTES

from . import data as V
from attngeom.common.errors import Refusal

ASSETS = Path(__file__).with_name("assets")
SCRIPTS = ("view_data.js", "view_ui.js")    # one function body, in this order
NOTE = ("Numbers are the store's, embedded as float16: about 3 significant digits (fewer below "
        "6e-5). α is the attention weight α_ij^h, c = α‖ṽ‖cos(o^h, ṽ)/‖o^h‖ the contribution "
        "(sums to 1 over keys; red adds to the head output, blue points against it); in the "
        "layer total, α is averaged over heads and C = Σ_h C^h (sums to 1 over keys). "
        "Value-weighted attention is α‖ṽ‖. The maps average over queries i ≥ k. ")
COMPACT_NOTE = ("This compact store keeps (query, key) values only for the sink keys and the "
                "tail window of the most recent keys; the other keys (hatched) appear as one "
                "Σ middle total.")


class View:
    """A rendered view: ``html`` (the whole page), ``fragment`` (its body, what Jupyter shows)."""

    def __init__(self, fragment: str, title: str):
        self.fragment, self.title = fragment, title

    @property
    def html(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title></head>\n<body>\n{self.fragment}\n"
                "</body></html>\n")

    @property
    def nbytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def _repr_html_(self) -> str:
        return self.fragment

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (a new or replaced file); return the path."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.html, encoding="utf-8")
        tmp.replace(path)
        return path


def view(ds: xr.Dataset | str | Path, sequence: int | None = None, *, sequences=None,
         layers=None, heads=None, max_bytes: int = MAX_BYTES) -> View:
    """Make an interactive view of ``ds`` (see the module doc).

    Parameters
    ----------
    ds : xarray.Dataset or str or Path
        A Dataset with the store's variable names and dims, or a store directory.
    sequence : int, optional
        Label of the sequence shown first (default: the first selected).
    sequences : str or list of int, optional
        Sequence labels to embed, in the range syntax (``"0:4,7"``) or a list; default all.
    layers : str or list of int, optional
        Layer labels to embed, likewise.
    heads : str or list of int, optional
        Head labels to embed, likewise.
    max_bytes : int
        Refuse (a one-line error naming a selection that fits) a page larger than this.

    Returns
    -------
    View
        Rendered inline as a notebook cell's last value; ``.save("view.html")`` writes the
        self-contained page.
    """
    return build(ds, sequence, sequences=sequences, layers=layers, heads=heads,
                 max_bytes=max_bytes, cli=False)


def _option(cli: bool, name: str, value: str) -> str:
    return f"--{name.replace('_', '-')} {value}" if cli else f"{name}='{value}'"


def build(ds, sequence=None, *, sequences=None, layers=None, heads=None,
          max_bytes: int = MAX_BYTES, cli: bool = True) -> View:
    """:func:`view` with messages naming command-line options (``cli``) or arguments."""
    if isinstance(ds, (str, Path)):
        from attngeom.store import open_store

        ds = open_store(ds)
    if "alpha" not in ds or S.LAYER not in ds.dims:
        raise Refusal("the view needs an attngeom store or measurement with alpha; this one "
                         "has none (a faithfulness-only store, or cut without alpha)")
    sub = V.select(ds, sequences, layers, heads, prefix="--" if cli else "")
    compact, k = V.is_compact(sub), V.sink_k(sub)
    labels = sub[S.SEQUENCE].values.tolist()
    first = labels[0] if sequence is None else int(sequence)
    if first not in labels:
        raise Refusal(f"sequence {first} is not among the selected sequences "
                         f"({runs_text(labels)}); choose one of them")
    sums, blobs = V.MapSums(), []
    budget = max_bytes - _fixed_bytes(sub)
    used = 0
    for block in V.blocks(sub):
        V.add_maps(block, k, sums)
        for i in range(block.sizes[S.SEQUENCE]):
            blobs.append(V.sequence_blob(block.isel({S.SEQUENCE: i}), compact))
            used += _blob_bytes(blobs[-1], sub)
            if used > budget:
                raise Refusal(_too_big(sub, blobs, used, budget, max_bytes, cli))
    meta = _meta(sub, blobs, sums, labels.index(first), compact, k)
    out = View(_fragment(meta, blobs), f"attngeom view: {meta['model']}")
    if out.nbytes > max_bytes:
        raise Refusal(_too_big(sub, blobs, out.nbytes, max_bytes, max_bytes, cli))
    return out


def _fixed_bytes(sub: xr.Dataset) -> int:
    """Bytes of the page that do not grow with sequences (assets, labels), rounded up."""
    assets = sum(p.stat().st_size for p in ASSETS.iterdir())
    return assets + 4000 + 16 * (sub.sizes[S.LAYER] + sub.sizes[S.HEAD])


def _blob_bytes(blob: V.SequenceBlob, sub: xr.Dataset) -> int:
    """Page bytes of one sequence: base64 blob, its tokens and index, its maps."""
    text = sum(len(t.encode()) + len(r.encode()) + 8 for t, r in zip(blob.tokens, blob.raw_tokens))
    maps = 9 * len(V.MAP_METRICS) * sub.sizes[S.LAYER] * sub.sizes[S.HEAD]
    return 4 * (len(blob.data) + 2) // 3 + text + 100 * len(blob.index) + maps


def _too_big(sub, blobs, used: int, budget: int, max_bytes: int, cli: bool) -> str:
    n = sub.sizes[S.SEQUENCE]
    per = used / len(blobs)
    fit = max(0, int(budget // per)) if per else n
    estimate = (max_bytes - budget) + per * n
    what = (f"the view of {n} sequence(s) x {sub.sizes[S.LAYER]} layer(s) x "
            f"{sub.sizes[S.HEAD]} head(s) would be about {estimate / 1e6:.1f} MB, over "
            f"{_option(cli, 'max_bytes', f'{max_bytes:d}')} ({max_bytes / 1e6:g} MB)")
    if fit >= 1:
        labels = sub[S.SEQUENCE].values.tolist()[:fit]
        hint = f"select fewer, e.g. {_option(cli, 'sequences', runs_text(labels))} ({fit} fit)"
    else:
        layers = sub[S.LAYER].values.tolist()
        keep = max(1, int(len(layers) * budget // per))
        hint = (f"one sequence alone is {per / 1e6:.1f} MB: select fewer layers, e.g. "
                f"{_option(cli, 'sequences', runs_text(sub[S.SEQUENCE].values.tolist()[:1]))} "
                f"{_option(cli, 'layers', runs_text(layers[:keep]))}")
    return f"{what}; {hint}, or raise {'--max-bytes' if cli else 'max_bytes'}"


def _rounded(values: np.ndarray) -> list:
    """float32 map values as JSON numbers with 4 significant digits (NaN -> null)."""
    return [None if not np.isfinite(v) else float(f"{v:.4g}") for v in np.ravel(values)]


def _initial(sums: V.MapSums, blob: V.SequenceBlob, seq_index: int) -> dict:
    """The most sink-heavy layer (pooled), its strongest sink head, the last token."""
    rate = sums.pooled().get("sink_rate")
    layer = head = 0
    if rate is not None and np.isfinite(rate).any():
        ok = np.isfinite(rate)
        per_layer = np.where(ok, rate, 0).sum(1) / np.maximum(ok.sum(1), 1)
        layer = int(np.argmax(np.where(ok.any(1), per_layer, -np.inf)))
        row = rate[layer]
        head = int(np.nanargmax(row)) if np.isfinite(row).any() else 0
    return {"sequence": seq_index, "layer": layer, "head": head, "query": blob.length - 1}


def _meta(sub: xr.Dataset, blobs: list[V.SequenceBlob], sums: V.MapSums, seq_index: int,
          compact: bool, k: int) -> dict:
    pooled = sums.pooled()
    attrs = sub.attrs
    return {
        "model": str(attrs.get("model", "model")), "mode": "compact" if compact else "dense",
        "config_hash": str(attrs.get("config_hash", "in memory"))[:16],
        "sink_k": k, "tail_w": int(sub.sizes.get(S.LAG, 0)),
        "layers": [int(v) for v in sub[S.LAYER].values],
        "heads": [int(v) for v in sub[S.HEAD].values],
        "maps": {"names": {n: V.MAP_METRICS[n][1] for n in pooled},
                 "per_sequence": {n: [_rounded(m) for m in sums.per_sequence[n]] for n in pooled},
                 "pooled": {n: _rounded(pooled[n]) for n in pooled}},
        "sequences": [{"label": b.label, "length": b.length, "tokens": b.tokens,
                       "raw": b.raw_tokens, "special": b.special, "finite": b.finite,
                       "index": b.index} for b in blobs],
        "initial": _initial(sums, blobs[seq_index], seq_index),
        "note": NOTE + (COMPACT_NOTE if compact else ""),
        "symbols": {name: M.label(name, "symbol") for name in M.names()},   # metric registry
    }


def _json(obj) -> str:
    """JSON safe inside <script>: no '<' (so no '</script>' or '<!--' from token text)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def _fragment(meta: dict, blobs: list[V.SequenceBlob]) -> str:
    css = (ASSETS / "view.css").read_text(encoding="utf-8")
    js = "\n".join((ASSETS / name).read_text(encoding="utf-8") for name in SCRIPTS)
    data = _json(meta)
    digest = hashlib.sha256(data.encode()).hexdigest()[:12]
    root_id = f"attngeom-view-{digest}"
    parts = [f'<div class="ag-view" id="{root_id}" tabindex="0">', f"<style>{css}</style>",
             f'<script type="application/json" class="ag-meta">{data}</script>']
    parts += [f'<script type="application/octet-stream" class="ag-blob">'
              f'{base64.b64encode(b.data).decode()}</script>' for b in blobs]
    parts.append('<div class="ag-fallback">This view needs JavaScript (in Jupyter: a trusted '
                 'notebook; or open the saved HTML file in a browser).</div>')
    # each view takes its root by id and drops the id, so identical views on one page work
    parts.append(f'<script>(function () {{ "use strict";\nvar root = document.getElementById('
                 f'"{root_id}");\nroot.removeAttribute("id");\n{js}}})();</script>')
    parts.append("</div>")
    return "\n".join(parts)
