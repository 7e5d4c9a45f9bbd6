"""What every score module shares: finite scores, row-by-row float64 products, float64 attention.

The kernels (:mod:`.exact_scores`, :mod:`.removal_scores`, :mod:`.field_scores`,
:mod:`.random_scores`, :mod:`.zeroing`) and the dispatchers above them (:mod:`.layer_scores`)
import these; this module imports none of them.

Every contraction over a query's vector in float64 is a product in blocks of rows
(:func:`rowmm`) whose rows have the same bits however many rows are computed together, so a
row's float64 scores are the same whether it is computed alone or with every other row: a
float64 tie (e.g. c = 1 at every head of a query that sees one key) is then broken by position
the same way in the fast path, in the tests and whatever the batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from ..measurement.geometry import softmax_masked, vecdot

Tensor = torch.Tensor
PAD = 8                  # rowmm pads K and N to multiples of this (8 float64: 64 bytes)
ROWS = 24                # rows per block of rowmm: one BLAS product of one shape each
BLOCK = 256              # rowmm's columns and terms in blocks of this (each its own product)
SERIAL = 1 << 21         # rowmm's products under this many multiply-adds run on one thread


def finite(x: Tensor) -> Tensor:
    """0/0 (a zero head output) scores 0; +-inf clipped to the largest finite float."""
    big = torch.finfo(x.dtype).max
    return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)


def rowmm(a: Tensor, b: Tensor, rows: int = ROWS, cols: Tensor | None = None,
          terms: Tensor | None = None) -> Tensor:
    """``a @ b`` for a (..., M, K), b (..., K, N) whose rows have the same bits however many
    rows are computed together, wherever they lie in memory and however many threads run.

    Every row is computed in a block of :data:`ROWS` rows, each block one BLAS product of the
    same shape on one thread (:func:`one_thread`): the blocks of consecutive rows, and where
    ROWS does not divide M a last block of the last ROWS rows (a smaller M is zero-padded, as K
    and N to multiples of :data:`PAD`, in aligned contiguous copies where needed); the blocks
    are spread over torch's threads by a thread pool. BLAS gives a row other bits with another
    M (another blocking of the rows), another alignment and, on several threads, another split
    of the product (MKL splits a long sum over threads, by the product's shape and the batch);
    a block of one shape on one thread leaves a row's bits to its values and its place in the
    block, and every place gives the same bits when ROWS is a multiple of the kernels' row
    tiles (probed on each of MKL's code paths: blocks of 4, 12, 16, 24, 48, 96 and 192 rows
    on all, not 6, 8 or 32 on its AVX2 path). ``tests/extract/test_selection.py`` checks every M up to 600,
    long sums and batches of products on 1 and 2 threads; ``.ci/standins`` runs it on MKL's
    other code paths. A column's bits change with the columns computed beside it, and a sum's
    with its length, so past :data:`BLOCK` columns (terms) each block of BLOCK is a product of
    its own (the last one shorter) and the terms' blocks are added in order: a column's bits
    depend on N and K, never on which other blocks are computed.

    ``rows``: the block (probed as ROWS is; larger for a large b, which every block packs
    anew). ``cols`` (..., M) int: row r is needed in its first cols[r] columns only; ``terms``
    (..., M): a's row r is 0 past its first terms[r] entries. A block of rows then skips the
    column (term) blocks past its rows' largest: the skipped columns are 0, the rest the same
    bits as without (a skipped sum's block adds exactly 0).
    """
    M, N = a.shape[-2], b.shape[-1]
    width = cols if terms is None else terms
    if b.dim() == 2 and a.dim() > 2:                     # one b: a's rows are one product's
        flat = None if width is None else width.expand(a.shape[:-1]).reshape(-1)
        out = rowmm(a.reshape(-1, a.shape[-1]), b, rows, *((flat, None) if terms is None
                                                             else (None, flat)))
        return out.reshape(*a.shape[:-1], N)
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = _padded(a, max(M, rows)), _padded(b, PAD)     # a: at least a block's rows
    (Mp, Kp), Np = a.shape[-2:], b.shape[-1]
    a = a.expand(*lead, Mp, Kp).reshape(-1, Mp, Kp)                        # (L, Mp, Kp)
    b = b.expand(*lead, Kp, Np).reshape(-1, Kp, Np)                        # (L, Kp, Np)
    out = a.new_empty(a.shape[0], Mp, Np)                                  # (L, Mp, Np)
    need = None if width is None else _needed(width.expand(*lead, M).reshape(-1, M), Mp,
                                              rows, Np if terms is None else Kp)
    with one_thread() as n:
        n = n if a.shape[0] * Mp * Kp * Np >= SERIAL else 1
        _spread([[x for unit in part for x in _products(a, b, out, rows, need, terms is None,
                                                         *unit)]
                 for part in _parts(a.shape[0], Mp, n, rows)])
    return out.view(*lead, Mp, Np)[..., :M, :N]


def _needed(width: Tensor, Mp: int, R: int, size: int) -> list[list[int]]:
    """(L, blocks): how many :data:`BLOCK`s of columns (terms) each block of R rows needs, the
    blocks as :func:`_parts` makes them (the last one the last R rows), from each row's width
    (L, M) (padded rows need none)."""
    L, M = width.shape
    w = torch.zeros(L, Mp, dtype=torch.long, device=width.device)
    w[:, :M] = width.clamp(0, size)
    nb, full = -(-Mp // R), Mp // R
    top = w[:, :full * R].reshape(L, full, R).amax(-1)
    if nb > full:
        top = torch.cat([top, w[:, Mp - R:].amax(-1, keepdim=True)], 1)
    return (-(-top // BLOCK)).tolist()


def _blocks(size: int) -> list[tuple[int, int]]:
    """The blocks of :data:`BLOCK` columns (terms) of a product: one when size <= BLOCK."""
    return [(s, min(s + BLOCK, size)) for s in range(0, size, BLOCK)] or [(0, 0)]


@contextmanager
def one_thread() -> Iterator[int]:
    """torch, and with it MKL, on one thread within; yields the thread count outside."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield n
    finally:
        torch.set_num_threads(n)


def _parts(L: int, M: int, n: int, R: int) -> list[list[tuple[int, int, int, int]]]:
    """n parts of equal work of the blocks of R rows of L products of M >= R rows: (l0, l1,
    j0, j1): blocks j0 to j1 of products l0 to l1, block j the rows j R to (j + 1) R, and,
    where R does not divide M, a last block of M's last R rows."""
    nb = -(-M // R)
    cuts = [t * L * nb // n for t in range(n + 1)]
    if nb == 1:
        return [[(lo, hi, 0, 1)] for lo, hi in zip(cuts, cuts[1:]) if hi > lo]
    return [[(l, l + 1, max(lo - l * nb, 0), min(hi - l * nb, nb))
             for l in range(lo // nb, -(-hi // nb))] for lo, hi in zip(cuts, cuts[1:]) if hi > lo]


Product = tuple[Tensor, Tensor, Tensor, bool, int, bool]
# a (X, R, K), b (X, K, N), out, out is a last block's tail, blocks needed, over columns


def _products(a: Tensor, b: Tensor, out: Tensor, R: int, need: list | None, over_cols: bool,
              l0: int, l1: int, j0: int, j1: int) -> list[Product]:
    """The products of one of :func:`_parts`' units: runs of full blocks that need as many
    column (term) blocks, each run one batch (b broadcast, not copied); the last block's rows
    that no full block has, if the unit ends with it."""
    M, K, full = a.shape[1], a.shape[2], a.shape[1] // R
    every = len(_blocks(b.shape[2] if over_cols else K))
    j, products = min(j1, full), []
    items = [(l, 0) for l in range(l0, l1)] if l1 - l0 > 1 else [(l0, jj) for jj in range(j0, j)]
    runs: list[list] = []
    for l, jj in items:
        c = every if need is None else need[l][jj]
        if runs and runs[-1][2] == c:
            runs[-1][1] = (l, jj)
        else:
            runs.append([(l, jj), (l, jj), c])
    for (la, ja), (lb, jb), c in runs:
        rows = slice(ja * R, (jb + 1) * R)
        lo, hi = la, lb + 1
        x = (hi - lo) * (jb + 1 - ja)
        products.append((a[lo:hi, rows].reshape(x, R, K),
                         b[lo:hi].expand(x, *b.shape[1:]) if hi - lo == 1 else b[lo:hi],
                         out[lo:hi, rows].reshape(x, R, out.shape[2]), False, c, over_cols))
    if j1 > full:
        c = every if need is None else need[l0][-1]
        products.append((a[l0:l1, M - R:], b[l0:l1], out[l0:l1, full * R:], True, c, over_cols))
    return products


def _product(a: Tensor, b: Tensor, out: Tensor, used: int, over_cols: bool) -> None:
    """out = a @ b (X, R, N) by :data:`BLOCK`s of columns and terms, the first ``used`` blocks
    of columns (zero past them) or of terms (the rest of a is 0)."""
    cols, terms = _blocks(b.shape[2]), _blocks(a.shape[2])
    if len(cols) == len(terms) == 1 and used == 1:
        torch.bmm(a, b, out=out)
        return
    cols, terms = (cols[:used], terms) if over_cols else (cols, terms[:used])
    for c0, c1 in cols:
        acc = None
        for k0, k1 in terms:                             # the terms' blocks added in order
            p = torch.bmm(a[:, :, k0:k1], b[:, k0:k1, c0:c1])
            acc = p if acc is None else acc.add_(p)
        out[..., c0:c1] = 0.0 if acc is None else acc
    if over_cols:
        out[..., cols[-1][1] if cols else 0:] = 0.0


def _spread(parts: list[list[Product]]) -> None:
    """Each part's products (a tail: the product's last rows into out), the parts on the
    calling thread and the threads of a pool (one-thread workers, in the caller's inference
    mode, which is per thread; no autograd: the exact scores are never differentiated)."""
    inference = torch.is_inference_mode_enabled()

    def run(part: list[Product]) -> None:
        with torch.inference_mode(inference), torch.no_grad():
            for a, b, out, tail, used, over_cols in part:
                if tail:
                    whole = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
                    _product(a, b, whole, used, over_cols)
                    out.copy_(whole[:, a.shape[1] - out.shape[1]:])
                else:
                    _product(a, b, out, used, over_cols)
    key = (os.getpid(), len(parts) - 1)                      # a forked child needs its own
    if len(parts) > 1 and _POOL.get("key") != key:
        _POOL.update(key=key, pool=ThreadPoolExecutor(key[1], "attngeom-rowmm",
                                                      torch.set_num_threads, (1,)))
    done = [_POOL["pool"].submit(run, part) for part in parts[1:]]
    run(parts[0])                                        # the calling thread takes a part too
    for future in done:
        future.result()


_POOL: dict = {}


def _padded(x: Tensor, rows: int) -> Tensor:
    """x (..., R, C) itself if contiguous, 64-byte aligned, R a multiple of ``rows`` and C of
    :data:`PAD`, else a fresh (aligned) contiguous copy zero-padded to that (a transposed
    operand would take another kernel, with other bits)."""
    R, C = x.shape[-2:]
    if R % rows or C % PAD:
        return F.pad(x.contiguous(), (0, -C % PAD, 0, -R % rows))   # F.pad keeps strides
    if not x.is_contiguous() or x.data_ptr() % (8 * PAD):
        return x.clone(memory_format=torch.contiguous_format)
    return x


def logits64(q: Tensor, k: Tensor, scale: float, softcap: float | None,
             width: Tensor | None = None) -> Tensor:
    """Attention logits (..., Tq, Tk) in float64, row by row (``width`` (..., Tq): each row's
    first so many only, :func:`rowmm`'s ``cols``; 0 past them)."""
    s = rowmm(q.double(), k.double().transpose(-1, -2), cols=width) * scale
    return s if softcap is None else torch.tanh(s / softcap) * softcap


def last_allowed(allowed: Tensor) -> Tensor:
    """(...,) int: one past each row's last allowed key, of ``allowed`` (..., Tk) bool."""
    position = torch.arange(1, allowed.shape[-1] + 1, dtype=torch.int32, device=allowed.device)
    return torch.mul(allowed, position).amax(-1)


def exact_alpha(q: Tensor, k: Tensor, allowed: Tensor, scale: float, softcap: float | None,
                sinks: Tensor | None = None, width: Tensor | None = None) -> Tensor:
    """Float64 attention (..., Tq, Tk) of query rows q over keys k (per query head).

    ``sinks``: learned sink logits broadcastable to (..., Tq), or None; the sink joins the
    softmax as a virtual key with no value (its weight is left out of alpha). ``width``
    (..., Tq): :func:`last_allowed` of ``allowed``, where the caller has it: the logits past
    it are not computed (the same bits).
    """
    logits = logits64(q, k, scale, softcap, width)
    if sinks is None:
        return softmax_masked(logits, allowed)
    logits = logits.masked_fill(~allowed, float("-inf"))
    column = sinks.double().expand(logits.shape[:-1])[..., None]            # (..., Tq, 1)
    return torch.softmax(torch.cat([logits, column], -1), dim=-1)[..., :-1]


def value_norms(vf: Tensor, gram: Tensor) -> Tensor:
    """||v~_j^h|| (B, H, Tk) for values per query head vf (B, H, Tk, dh), one (b, h) at a time."""
    B, H = vf.shape[:2]
    return torch.stack([torch.stack([key_norms(vf[b, h], gram[h]) for h in range(H)])
                        for b in range(B)])


def key_norms(v: Tensor, gram: Tensor) -> Tensor:
    """sqrt(v G v) (Tk,) for one head's keys v (Tk, dh) (the same bits however it is called)."""
    return vecdot(v.contiguous() @ gram, v).clamp_min(0).sqrt()
