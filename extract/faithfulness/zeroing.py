"""Value zeroing (Mohebbi, Zuidema, Chrupała and Alishahi, EACL 2023) as removal scores.

The score of key j for query i at a layer is the cosine distance between the layer's output at i
computed normally, ``y_i = f(x_i, z_i)``, and computed with key j's value vectors zeroed in every
head, ``y'_ij = f(x_i, z_i - alpha_ij v_j)`` (per head ``z_i^h - alpha_ij^h v_j^g(h)``: zeroing v_j
removes exactly that term, alpha is unchanged, no renormalisation), where f is the rest of the
layer after the attention (W_O, the residual add, the normalisations and the MLP), run by the
model's own modules row by row (:mod:`.sublayer`). The rest of the layer is per position, so
only query i's row is recomputed for each (i, j): one row of the sublayer per pair, not a rerun
of the layer. ``s_ij = 1 - cos(y_i, y'_ij)`` is computed as ``||y^_i - y'^_ij||^2 / 2`` with y^ the
unit vectors: the same number, without the cancellation of 1 - cos for nearby vectors. A key no
head attends to (alpha_ij = 0 in every head) has y' = y and scores 0 without a row. The self key
j = i is zeroed like any other (the residual x_i stays): what removing the key removes.

Scores with the heads combined (scope ``token``): they rank keys at ``--granularity token``; the
removal ranks them unnormalised (a query's scores divided by one positive number rank alike),
the scores API (:mod:`.attribution`) gives them normalised over keys, as the authors do.

Cost: a row per (query, key) pair a query attends to, T (T + 1) / 2 per causal sequence and
layer, each about the multiply-adds of W_O and the MLP: about T / 2 forward passes' worth of the
layer for each layer (:func:`~..loading.budget.check_zeroing` refuses a run out of reach).

Float32. y and y' come out of the sublayer in the model's dtype with an absolute error of about
``e_i = unit (||x_i|| + ||y_i||) / ||y_i||`` in the direction y^ (``unit`` the metric's
``error_unit`` times u, fitted on real models); then ``|s~ - s| <= sqrt(2 s) e + e^2 / 2``, the
bound's ``root`` and ``absolute`` terms (:class:`~.selection.ErrorBound`).
"""

from __future__ import annotations

import torch

from ..measurement.geometry import repeat_kv
from .base import finite, rowmm
from .dense import weighted_values
from .selection import ErrorBound

Tensor = torch.Tensor


def zeroed_rows(z: Tensor, alpha: Tensor, value: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """Head outputs (n, H dv) of queries i with key j's values zeroed: z_i - alpha_ij v_j.

    z (H, T, dv) clean head outputs; alpha (H, T, Tk); value (G, Tk, dv) per kv head; i, j (n,)."""
    H = z.shape[0]
    v = repeat_kv(value[:, j].transpose(0, 1), H)                         # (n, H, dv)
    rows = z[:, i].transpose(0, 1) - alpha[:, i, j].T[..., None] * v.to(z.dtype)
    return rows.reshape(len(i), -1)


def distance(y: Tensor, y2: Tensor) -> Tensor:
    """1 - cos(y, y2) per row, as ||y^ - y2^||^2 / 2 (0 where a vector is 0)."""
    unit = lambda v: finite(v / torch.linalg.vector_norm(v, dim=-1, keepdim=True))  # noqa: E731
    return (unit(y) - unit(y2)).square().sum(-1) / 2


def _pairs(alpha: Tensor, queries: Tensor | None, wanted: Tensor | None = None) -> Tensor:
    """(P, 2) the (query, key) pairs some head attends to, of real queries (and ``wanted``
    (T, Tk) ones); alpha (H, T, Tk)."""
    seen = (alpha > 0).any(0)                                           # (T, Tk)
    if queries is not None:
        seen &= queries[:, None]
    if wanted is not None:
        seen &= wanted
    return seen.nonzero()


def _scores(alpha: Tensor, value: Tensor, z: Tensor, x: Tensor, y: Tensor, run, chunk: int,
            queries: Tensor | None, out: Tensor, wanted: Tensor | None = None) -> None:
    """Fill ``out`` (T, Tk) with the distances of one sequence: x (T, d) its block inputs at
    the queries, y (T, d) their clean outputs, ``run(x, z) -> y`` the sublayer on rows; only
    at the ``wanted`` (T, Tk) pairs if given (0 elsewhere)."""
    out.zero_()
    pairs = _pairs(alpha, queries, wanted)
    for part in pairs.split(chunk):
        i, j = part[:, 0], part[:, 1]
        y2 = run(x[i], zeroed_rows(z, alpha, value, i, j))
        out[i, j] = distance(y[i].to(out.dtype), y2.to(out.dtype))


# ------------------------------------------------------------------------------ float32
def fast_value_zeroing(x, unit: float) -> tuple[Tensor, ErrorBound]:
    """The layer's distances (B, 1, T, Tk) in alpha's dtype, through the model's own modules
    in its dtype; error ``sqrt(2 s) e + e^2 / 2`` with e per query (module docstring)."""
    ctx = x.context
    layer = ctx.sublayer
    alpha = x.alpha
    B, H, T, Tk = alpha.shape
    model_dtype = layer.x.dtype
    unit = unit * torch.finfo(model_dtype).eps / torch.finfo(alpha.dtype).eps   # its rounding
    z = weighted_values(alpha, x.value, x.blocks)                       # (B, H, T, dv)
    flat = z.transpose(1, 2).reshape(B * T, -1)
    xs = layer.x.reshape(B * T, -1)
    y = torch.cat([layer.outputs(xs[a:a + 4096], flat[a:a + 4096])
                   for a in range(0, B * T, 4096)]).to(alpha.dtype).view(B, T, -1)
    out = x.out[:, :1]
    chunk = layer.sub.chunk(model_dtype)
    for b in range(B):
        real = None if ctx.queries is None else ctx.queries[b]
        _scores(alpha[b], x.value[b], z[b], layer.x[b], y[b], layer.outputs, chunk, real,
                out[b, 0])
    norm = torch.linalg.vector_norm(y, dim=-1)
    e = finite(unit * (torch.linalg.vector_norm(layer.x.to(y.dtype), dim=-1) + norm) / norm)
    return finite(out), ErrorBound(torch.zeros_like(e)[:, None], absolute=(e * e / 2)[:, None],
                                   root=(2 ** 0.5 * e)[:, None])


# ------------------------------------------------------------------------------ float64
def exact_value_zeroing(rows) -> Tensor:
    """The float64 distances (n, Tk) at rows (b, i) (a :class:`~.field_scores.TokenRows64`):
    alpha, the values and x in float64, the sublayer a float64 copy of the block; (n, K) at
    ``rows.keys`` when given, a sublayer row for each of those keys (and one for the clean
    output) instead of one for each key the query attends to."""
    ctx = rows.context
    layer = ctx.sublayer
    out = torch.zeros(len(rows.b), ctx.key.shape[2], dtype=torch.float64,
                      device=ctx.query.device)
    chunk = layer.sub.chunk(torch.float64)
    for b in rows.b.unique().tolist():
        at = (rows.b == b).nonzero()[:, 0]
        i = rows.i[at]
        alpha = rows.alpha(b, i)                                         # (H, m, Tk)
        value = ctx.value[b].double()                                    # (G, Tk, dv)
        z = rowmm(alpha, repeat_kv(value[None], alpha.shape[0])[0])     # (H, m, dv)
        x = layer.x[b, i].double()                                       # (m, d)
        y = layer.outputs64(x, z.transpose(0, 1).reshape(len(i), -1))
        part = out.new_zeros(len(i), out.shape[1])
        wanted = None if rows.keys is None else torch.zeros_like(part, dtype=torch.bool) \
            .scatter_(1, rows.keys[at], True)
        _scores(alpha, value, z, x, y, layer.outputs64, chunk, None, part, wanted)
        out[at] = part
    return rows.at(finite(out))
