"""What every score module shares: finite scores, row-by-row float64 products, float64 attention.

The kernels (:mod:`.exact_scores`, :mod:`.removal_scores`, :mod:`.field_scores`,
:mod:`.random_scores`, :mod:`.zeroing`) and the dispatchers above them (:mod:`.layer_scores`)
import these; this module imports none of them.

Every contraction over a query's vector in float64 is a product in blocks of rows
(:func:`rowmm`) whose rows have the same bits however many rows are computed together, so a
row's float64 scores are the same whether it is computed alone or with every other row: a
float64 tie (e.g. c = 1 at every head of a query that sees one key) is then broken by position
the same way in the fast path, in the tests and whatever the batch.

A float64 row's products over keys (its logits, its output z = alpha v, its dot products with
the values) run over the row's leading keys only: one past its last key that counts, rounded up
to a multiple of :data:`WIDTH_STEP` (:func:`widths`). A function of the row alone, like
:func:`rowmm`'s blocking, so every path still gives a row the same bits; under a causal mask
the near rows of a removal pass then multiply about half the keys they did.
"""

from __future__ import annotations

import functools
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
SERIAL = 1 << 21         # rowmm's products under this many multiply-adds run on one thread
WIDTH_STEP = 512         # a float64 row's products run over a multiple of this many keys


def finite(x: Tensor) -> Tensor:
    """0/0 (a zero head output) scores 0; +-inf clipped to the largest finite float."""
    big = torch.finfo(x.dtype).max
    return torch.nan_to_num(x, nan=0.0, posinf=big, neginf=-big)


def rowmm(a: Tensor, b: Tensor, rows: int = ROWS) -> Tensor:
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
    other code paths. A column's bits are not a function of the column alone (they change with
    the columns computed beside it), so a subset of b's columns is never multiplied alone.
    ``rows``: the block (probed as ROWS is; larger for a large b, which every block packs anew).
    """
    M, N = a.shape[-2], b.shape[-1]
    if b.dim() == 2 and a.dim() > 2:                     # one b: a's rows are one product's
        return rowmm(a.reshape(-1, a.shape[-1]), b, rows).reshape(*a.shape[:-1], N)
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = _padded(a, max(M, rows)), _padded(b, PAD)     # a: at least a block's rows
    (Mp, Kp), Np = a.shape[-2:], b.shape[-1]
    a = a.expand(*lead, Mp, Kp).reshape(-1, Mp, Kp)                        # (L, Mp, Kp)
    b = b.expand(*lead, Kp, Np).reshape(-1, Kp, Np)                        # (L, Kp, Np)
    out = a.new_empty(a.shape[0], Mp, Np)                                  # (L, Mp, Np)
    with one_thread() as n:
        n = n if a.shape[0] * Mp * Kp * Np >= SERIAL else 1
        _spread([[x for unit in part for x in _products(a, b, out, rows, *unit)]
                 for part in _parts(a.shape[0], Mp, n, rows)])
    return out.view(*lead, Mp, Np)[..., :M, :N]


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


Product = tuple[Tensor, Tensor, Tensor, bool]     # a, b, out, out is a last block's tail


def _products(a: Tensor, b: Tensor, out: Tensor, R: int, l0: int, l1: int, j0: int, j1: int
              ) -> list[Product]:
    """The products of one of :func:`_parts`' units: the full blocks in one batch (b broadcast,
    not copied); the last block's rows that no full block has, if the unit ends with it."""
    M, full = a.shape[1], a.shape[1] // R
    j, products = min(j1, full), []
    if j > j0:
        rows = slice(j0 * R, j * R)
        products.append((a[l0:l1, rows].reshape(-1, R, a.shape[2]),
                         b[l0:l1].expand(j - j0, *b.shape[1:]) if l1 - l0 == 1 else b[l0:l1],
                         out[l0:l1, rows].reshape(-1, R, out.shape[2]), False))
    if j1 > full:
        products.append((a[l0:l1, M - R:], b[l0:l1], out[l0:l1, full * R:], True))
    return products


def _spread(parts: list[list[Product]]) -> None:
    """Each part's products (a tail: the product's last rows into out), the parts on the
    calling thread and the threads of a pool (one-thread workers, in the caller's inference
    mode, which is per thread; no autograd: the exact scores are never differentiated)."""
    inference = torch.is_inference_mode_enabled()

    def run(part: list[Product]) -> None:
        with torch.inference_mode(inference), torch.no_grad():
            for a, b, out, tail in part:
                if tail:
                    out.copy_(torch.bmm(a, b)[:, a.shape[1] - out.shape[1]:])
                else:
                    torch.bmm(a, b, out=out)
    done = [workers("rowmm", len(parts) - 1).submit(run, part) for part in parts[1:]]
    run(parts[0])                                        # the calling thread takes a part too
    for future in done:
        future.result()


def workers(name: str, threads: int) -> ThreadPoolExecutor:
    """A pool of ``threads`` worker threads named ``attngeom-<name>``, torch on one thread in
    each, made once per process (a forked child makes its own: its parent's threads are not in
    it)."""
    return _workers(name, threads, os.getpid())


@functools.lru_cache(maxsize=8)
def _workers(name: str, threads: int, pid: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, f"attngeom-{name}", torch.set_num_threads, (1,))


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


def widths(x: Tensor) -> Tensor:
    """How many leading keys each float64 row's products run over, for x (..., N) >= 0 (the
    row's attention, or its allowed keys, bool): one past its last nonzero entry rounded up
    to a multiple of :data:`WIDTH_STEP`, at least one step and at most N; (...,) int32. Read
    from each block of WIDTH_STEP entries' largest (one reduction, no (..., N) temporary)."""
    N, S = x.shape[-1], WIDTH_STEP
    y = x.view(torch.uint8) if x.dtype == torch.bool else x
    full = N // S
    parts = [y[..., :full * S].unflatten(-1, (full, S)).amax(-1)] if full else []
    if N % S:
        parts.append(y[..., full * S:].amax(-1, keepdim=True))
    block = torch.arange(1, -(-N // S) + 1, dtype=torch.int32, device=x.device)
    last = torch.mul(torch.cat(parts, -1) > 0, block).amax(-1)         # last nonzero block
    return (last.clamp_min(1) * S).clamp_max(N)


def rowmm_within(a: Tensor, b: Tensor, width: Tensor, inner: bool,
                 index: Tensor | None = None) -> Tensor:
    """:func:`rowmm` with row r of a multiplied by b's leading ``width[r]`` columns (``inner``
    False: the output's columns past it are 0) or rows (``inner`` True: the sum over a's first
    ``width[r]`` columns, the rest being 0); a row of width 0 is not multiplied (its output
    is 0). a (..., M, K), b (..., K, N), width (..., M) (:func:`widths`), broadcastable in the
    leading dims; with ``index`` (L,), a (L, M, K) and b (G, K, N) blocks of which a's l-th
    multiplies b[index[l]] (no (L, K, N) copy).

    The rows of one width are multiplied together, the sequences that take as many of
    :func:`rowmm`'s blocks of :data:`ROWS` rows in one product, each padded to the largest
    count with repeats of its first (a row's bits do not depend on the rows beside it)."""
    (M, K), N = a.shape[-2:], b.shape[-1]
    if bool((width == (K if inner else N)).all()):                   # every row: every key
        return rowmm(a, b if index is None else b[index])
    if index is None:
        lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2], width.shape[:-1])
        a = a.expand(*lead, M, K).reshape(-1, M, K)                      # (L, M, K)
        b = b.expand(*lead, K, N).reshape(-1, K, N)                      # (L, K, N)
    else:
        lead = a.shape[:-2]
    block = (lambda s: s) if index is None else (lambda s: index[s])   # noqa: E731
    every = slice(None) if index is None else index
    width = width.expand(*lead, M).reshape(-1, M)                        # (L, M)
    out = a.new_zeros(a.shape[0], M, N)
    for w in width.unique().tolist():
        if w == 0:                                 # rows not asked for
            continue
        if bool((width == w).all()):               # one width: no rows gathered
            if inner:
                return rowmm(a[..., :w], b[every, :w]).view(*lead, M, N)
            out[..., :w] = rowmm(a, b[every, :, :w])
            break
        seq, row = (width == w).nonzero(as_tuple=True)                 # by sequence, then row
        blocks = (-(-torch.bincount(seq) // ROWS))[seq]       # rowmm's blocks of its sequence
        for n in blocks.unique().tolist():
            at = blocks == n
            _within(a, b, out, seq[at], row[at], w, inner, block)
    return out.view(*lead, M, N)


def _within(a: Tensor, b: Tensor, out: Tensor, seq: Tensor, row: Tensor, w: int, inner: bool,
            block) -> None:
    """out[seq, row] of :func:`rowmm_within` for rows (seq, row) of width w (sorted by
    sequence), each sequence's rows padded to the largest count with repeats of its first."""
    seqs, which, count = torch.unique_consecutive(seq, return_inverse=True, return_counts=True)
    start = count.cumsum(0) - count
    slot = torch.arange(len(seq), device=seq.device) - start[which]
    index_rows = row[start][:, None].repeat(1, int(count.max()))
    index_rows[which, slot] = row                                      # (S, m) rows
    if inner:                                      # (S, m, w) @ (S, w, N), copies of those
        part = rowmm(a[seqs[:, None], index_rows, :w], b[block(seqs), :w])
        out[seq, row] = part[which, slot]
    else:                                          # (S, m, K) @ (S, K, w)
        part = rowmm(a[seqs[:, None], index_rows], b[block(seqs), :, :w])
        out[seq, row, :w] = part[which, slot]


def exact_z(alpha: Tensor, v: Tensor, width: Tensor | None = None,
            index: Tensor | None = None) -> Tensor:
    """z = alpha v (..., M, dh) in float64 for alpha (..., M, Tk) and values v (..., Tk, dh),
    each row's sum over its keys up to its width (``width``, else :func:`widths` of alpha, as
    every caller computes it); ``index``: v's blocks by alpha's (:func:`rowmm_within`)."""
    if width is None:
        width = widths(alpha)
    return rowmm_within(alpha, v, width, inner=True, index=index)


def logits64(q: Tensor, k: Tensor, scale: float, softcap: float | None,
             width: Tensor | None = None, index: Tensor | None = None) -> Tensor:
    """Attention logits (..., Tq, Tk) in float64, row by row (scaled and capped in place:
    at long contexts a fresh (rows, Tk) float64 tensor costs as much as the pass over it);
    with ``width`` (..., Tq) only each row's leading keys (:func:`rowmm_within`, 0 past them;
    ``index``: k's blocks by q's)."""
    kt = k.double().transpose(-1, -2)
    s = rowmm(q.double(), kt) if width is None else \
        rowmm_within(q.double(), kt, width, inner=False, index=index)
    s = s.mul_(scale)
    return s if softcap is None else s.div_(softcap).tanh_().mul_(softcap)


def exact_alpha(q: Tensor, k: Tensor, allowed: Tensor, scale: float, softcap: float | None,
                sinks: Tensor | None = None, index: Tensor | None = None,
                asked: Tensor | None = None) -> Tensor:
    """Float64 attention (..., Tq, Tk) of query rows q over keys k (per query head), each
    row's logits over its allowed keys' width (:func:`widths`); with ``index`` (L,), q (L,
    Tq, dh) and k (G, Tk, dh) blocks, q's l-th over k[index[l]] (:func:`rowmm_within`).

    ``sinks``: learned sink logits broadcastable to (..., Tq), or None; the sink joins the
    softmax as a virtual key with no value (its weight is left out of alpha). ``asked``
    (..., Tq) bool or None (every row): the rows wanted; the others' logits are not
    computed (their alpha is uniform over their allowed keys, a batch's padding).
    """
    width = widths(allowed) if asked is None else widths(allowed).mul_(asked)
    logits = logits64(q, k, scale, softcap, width, index)
    if sinks is None:
        return softmax_masked(logits, allowed, inplace=True)
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
