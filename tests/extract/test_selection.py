"""The fast selection (attngeom.extract.faithfulness.selection) against the rule written with numpy.

- On exact scores (many exact ties, padding, per-head masks, every granularity, rank, mode and a
  range of fractions) it equals a numpy stable argsort of every ranking row.
- Near-ties at the float32 margin: float32 scores that order the two keys at the cut the wrong
  way round are decided from the float64 scores (and without them the result is wrong, so the
  test can fail), also when the near rows are decided a few at a time.
- The float64 rows recomputed for near rows have the same bits as the full computation and are
  freed with their layer (no reference cycle); the float32 scores stay within their error bound
  (the signed ones: relative to |score| plus the size of the term, alpha ||v~|| / ||o||);
  subnormal scores at the cut are decided in float64; shared scratch tensors change nothing.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

try:
    from tests import tiny_models as tm
    from tests import tolerance as tol
except ImportError:
    import tiny_models as tm
    import tolerance as tol

from attngeom.extract.measurement.hooks import attention_handler
from attngeom.extract.faithfulness.interventions import (GRANULARITIES, MODES, RANKS,
                                                         Intervener, Removal, forward_logits)
from attngeom.extract.faithfulness.dense import attention_weights
from attngeom.extract.faithfulness import base
from attngeom.extract.faithfulness.base import exact_alpha, exact_z, logits64, rowmm
from attngeom.extract.faithfulness.context import LayerContext
from attngeom.extract.faithfulness.layer_scores import ExactScores, fast_scores, metric_scores
from attngeom.extract.faithfulness.removal_scores import logit_scale
from attngeom.extract.faithfulness import near, selection, sorting
from attngeom.extract.faithfulness.masks import Candidates
from attngeom.extract.faithfulness.selection import (ErrorBound, Workspace, n_remove, select,
                                        threshold_select, width_groups)

FRACTIONS = (0.0, 0.02, 0.1, 0.25, 0.5, 0.9, 1.0)
METRICS = ("attention", "value_weighted", "value_weighted_normalized", "contribution",
           "contribution_layer")


def numpy_rule(score, eligible, p, mode, rank, granularity):
    """Removed (B, H, T, Tk) from the definition: numpy's stable argsort of each ranking row."""
    score = np.asarray(score, dtype=np.float64)
    B, H, T, Tk = score.shape
    e = np.broadcast_to(np.asarray(eligible), score.shape)
    out = np.zeros(score.shape, dtype=bool)
    mag = np.abs if rank == "magnitude" else (lambda x: x)

    def pick(values, candidates):
        idx = np.flatnonzero(candidates)
        order = idx[np.argsort(-values[idx], kind="stable")]        # higher first, ties: lower
        k = int(np.floor(p * len(idx) + 0.5))
        return order[:k] if mode == "comprehensiveness" else order[len(order) - k:]

    for b in range(B):
        for i in range(T):
            if granularity == "head":
                for h in range(H):
                    out[b, h, i, pick(mag(score[b, h, i]), e[b, h, i])] = True
            elif granularity == "query":                             # candidate j * H + h
                chosen = pick(mag(score[b, :, i].T.reshape(-1)), e[b, :, i].T.reshape(-1))
                out[b, chosen % H, i, chosen // H] = True
            else:
                total = mag(np.where(e[b, :, i], score[b, :, i], 0.0).sum(0))
                out[b, :, i, pick(total, e[b, :, i].any(0))] = True
                out[b, :, i] &= e[b, :, i]
    return out


def _eligible(B, H, T, per_head=False, seed=0):
    e = torch.ones(T, T, dtype=torch.bool).tril()[None, None].repeat(B, H if per_head else 1, 1, 1)
    e[-1, :, :, T - 3:] = False                                      # a padded sequence
    e[-1, :, T - 3:, :] = False
    if per_head:                                                     # a sliding window per head
        g = torch.Generator().manual_seed(seed)
        e &= torch.rand(e.shape, generator=g) > 0.2
    return e


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("per_head", [False, True])
def test_exact_scores_follow_the_rule(granularity, per_head):
    gen = torch.Generator().manual_seed(7)
    B, H, T = 2, 3, 11
    ties = torch.randint(-3, 4, (B, H, T, T), generator=gen).float()          # many exact ties
    reals = torch.randn(B, H, T, T, generator=gen)
    eligible = _eligible(B, H, T, per_head)
    work = Workspace()                          # reused by every call, as in a forward pass
    for score in (ties, reals, ties.double()):
        for p in FRACTIONS:
            for mode in MODES:
                for rank in RANKS:
                    want = numpy_rule(score, eligible, p, mode, rank, granularity)
                    got = select(score, eligible, p, mode, rank, granularity, work=work)
                    assert np.array_equal(got.numpy(), want), (p, mode, rank)
                    kept = select(score, eligible, p, mode, rank, granularity, work=work,
                                  keep=True)                     # alpha's factor: 0 removed
                    assert kept.dtype == score.dtype
                    removed = (kept == 0) & eligible
                    assert np.array_equal(removed.expand(want.shape).numpy(), want)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_a_sliding_window_is_cut_over_its_own_columns(granularity):
    """Rows whose candidates start late (a sliding window of 8 keys, as Gemma's local layers)
    are cut from the window's columns alone: the rule's removals at every fraction, mode and
    rank, ties included."""
    gen = torch.Generator().manual_seed(11)
    B, H, T, W = 2, 3, 48, 8
    eligible = _eligible(B, H, T) & (torch.arange(T)[:, None] - torch.arange(T) < W)
    assert int(Candidates(eligible).first.max()) > 16      # windows past the leading columns
    work = Workspace()
    for score in (torch.randint(-3, 4, (B, H, T, T), generator=gen).float(),
                  torch.randn(B, H, T, T, generator=gen)):
        for p in (0.1, 0.5, 1.0):
            for mode in MODES:
                for rank in RANKS:
                    want = numpy_rule(score, eligible, p, mode, rank, granularity)
                    got = select(score, eligible, p, mode, rank, granularity, work=work)
                    assert np.array_equal(got.numpy(), want), (p, mode, rank)


def test_sorting_only_the_leading_columns_changes_nothing():
    """Rows whose eligible candidates lie in their first ``width`` columns (causal rows, padded
    keys) are sorted over those columns only: the same cut as sorting every column."""
    g = torch.Generator().manual_seed(3)
    R, N = 400, 300
    width = torch.randint(0, N + 1, (R,), generator=g)
    eligible = (torch.arange(N) < width[:, None]) & (torch.rand(R, N, generator=g) < 0.8)
    scores = torch.randint(-20, 20, (R, N), generator=g).float()            # with ties
    assert len(width_groups(width, N)) > 4
    n = eligible.sum(-1)
    for mode, fill in (("comprehensiveness", float("-inf")), ("sufficiency", float("inf"))):
        key = scores.masked_fill(~eligible, fill)
        for p in (0.02, 0.1, 0.5, 1.0):
            k = n_remove(n, p)
            for keep in (False, True):
                want = threshold_select(key, n, k, mode, keep=keep)
                got = threshold_select(key, n, k, mode, keep=keep, width=width,
                                       work=Workspace())
                assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (mode, p)


def _near_tie_scores(B, H, T, positive, seed):
    """float64 scores whose every ranking row holds pairs 1e-9 apart (below float32's
    resolution), and float32 scores that order every pair the wrong way round."""
    g = np.random.default_rng(seed)
    s64 = np.zeros((B, H, T, T))
    s32 = np.zeros((B, H, T, T), dtype=np.float32)
    for row in np.ndindex(B, H, T):
        k = np.arange(1, T // 2 + 1) * g.uniform(0.5, 2.0)          # pair values, row-specific
        sign = np.ones(len(k)) if positive else np.where(g.random(len(k)) < 0.5, -1.0, 1.0)
        small, large = sign * k, sign * k * (1 + 1e-9)
        where = g.permutation(T)
        s64[row][where[0::2]], s64[row][where[1::2]] = small, large
        s32[row][where[0::2]] = np.nextafter(large.astype(np.float32),
                                             np.float32(np.inf) * sign.astype(np.float32))
        s32[row][where[1::2]] = large.astype(np.float32)
    return torch.from_numpy(s64), torch.from_numpy(s32)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_values_at_two_ranks_are_those_a_sort_puts_there(threads, monkeypatch):
    """rank_values_ (each row partitioned at its own place, near either end, rows split among
    torch's threads above PARALLEL_SORT values a thread): the values numpy's sort of each row
    puts at its two places, ties and infinities included, and at a row's ends (one place)."""
    monkeypatch.setattr(sorting, "PARALLEL_SORT", 1 << 10)
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-30, 30, (101, 300), generator=g).float()             # with ties
    x[torch.rand(x.shape, generator=g) < 0.1] = float("inf")
    x[torch.rand(x.shape, generator=g) < 0.1] = float("-inf")
    upper = torch.randint(0, 300, (101,), generator=g)
    upper[:4] = torch.tensor([0, 1, 298, 299])
    lower = (upper - 1).clamp_min(0)
    lower[5:9] = upper[5:9]                                        # one place (a clamped cut)
    want = np.sort(x.numpy(), axis=-1)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        low, high = sorting.rank_values_(x.clone(), lower, upper)
    finally:
        torch.set_num_threads(before)
    rows = np.arange(101)
    assert np.array_equal(low.numpy(), want[rows, lower.numpy()])
    assert np.array_equal(high.numpy(), want[rows, upper.numpy()])


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("near_chunk", [None, 1])
def test_near_ties_at_the_float32_margin_are_decided_in_float64(granularity, near_chunk,
                                                                 monkeypatch):
    """(near_chunk 1: the near rows decided one at a time, as at long contexts.)"""
    if near_chunk is not None:
        monkeypatch.setattr(selection, "NEAR_CHUNK", near_chunk)        # copies of near rows
        monkeypatch.setattr(near, "NEAR_CHUNK", near_chunk)             # rows decided at a time
    B, H, T = 2, 3, 12
    eligible = _eligible(B, H, T)
    s64, s32 = _near_tie_scores(B, H, T, positive=granularity == "token", seed=1)
    if granularity == "token":                  # the head sum is then head 0's near-tied score
        s64[:, 1:], s32[:, 1:] = 0.0, 0.0
    error = ErrorBound(torch.full((B, H, T), 1e-6))                  # > float32 rounding here

    def exact(b, i, h, keys):
        return selection.take(s64[b, :, i] if h is None else s64[b, h, i], keys)

    wrong = 0
    for p in (0.1, 0.25, 0.5):
        for mode in MODES:
            for rank in RANKS:
                want = numpy_rule(s64, eligible, p, mode, rank, granularity)
                got = select(s32.clone(), eligible, p, mode, rank, granularity, error, exact,
                             Workspace(), inplace=True)
                assert np.array_equal(got.numpy(), want), (p, mode, rank)
                kept = select(s32.clone(), eligible, p, mode, rank, granularity, error, exact,
                              Workspace(), inplace=True, keep=True)
                removed = ((kept == 0) & eligible).expand(want.shape)
                assert np.array_equal(removed.numpy(), want), (p, mode, rank)
                plain = select(s32, eligible, p, mode, rank, granularity)
                wrong += not np.array_equal(plain.numpy(), want)
    assert wrong > 0                          # float32 alone gets these rows wrong


def test_subnormal_scores_are_decided_in_float64():
    """Two attention weights that underflowed to subnormals (float32 steps of 2^-149 = 1.4e-45)
    round apart the wrong way: 2.05e-45 up to two steps, 2.08e-45 down to one. Their error is
    40 %, far outside any bound relative to |score|; the absolute floor makes the row near."""
    s64 = torch.tensor([0.4, 0.3, 0.2, 0.1, 2.05e-45, 2.08e-45, 0.05, 0.01],
                       dtype=torch.float64).view(1, 1, 1, 8)
    s32 = s64.float()
    s32[..., 4], s32[..., 5] = 2 * 2.0 ** -149, 2.0 ** -149
    eligible = torch.ones(1, 1, 1, 8, dtype=torch.bool)
    error = ErrorBound(torch.full((1, 1, 1), 1e-6))

    def exact(b, i, h, keys):
        return selection.take(s64[b, :, i] if h is None else s64[b, h, i], keys)

    for p, mode in ((0.125, "sufficiency"), (0.875, "comprehensiveness")):
        want = numpy_rule(s64, eligible, p, mode, "signed", "head")
        assert want[..., 4].all() != want[..., 5].all()             # the cut between the two
        for granularity in ("head", "query"):
            got = select(s32.clone(), eligible, p, mode, "signed", granularity, error, exact)
            assert np.array_equal(got.numpy(), want), (mode, granularity)
        plain = select(s32, eligible, p, mode, "signed", "head")
        assert not np.array_equal(plain.numpy(), want)              # float32 alone: wrong


# ------------------------------------------------------------------------------ on a model
@functools.lru_cache(maxsize=None)
def _layers(arch: str = "llama"):
    """Each attention layer's inputs in a clean pass of a tiny model, and its handler."""
    model = tm.build(arch, seed=0)
    inputs = tm.example_inputs(arch, model, batch=2, seq_len=12, seed=1)
    seen, handler = [], Intervener(model)

    class Recorder:
        token_mask = inputs["attention_mask"].bool()

        def attend(self, call):
            allowed = call.allowed & self.token_mask[:, None, None, :]
            seen.append((handler.projection(call.index), call.query, call.key, call.value,
                         allowed, call.scaling, call.softcap))
            handler.token_mask = self.token_mask
            return handler.attend(call)

    with torch.no_grad(), attention_handler(model, Recorder()):
        model(**inputs, use_cache=False)
    return model, inputs, seen


@pytest.mark.parametrize("step", [512, 4])
@pytest.mark.parametrize("metric", METRICS)
def test_recomputed_rows_have_the_bits_of_the_full_computation(metric, step, monkeypatch):
    """ExactScores' rows are the whole layer's, bit for bit; with a width step of 4 keys each
    row's products run over its own leading keys (several widths in one product)."""
    monkeypatch.setattr(base, "WIDTH_STEP", step)
    _, _, seen = _layers()
    for proj, q, k, v, allowed, scale, softcap in seen:
        B, H, T, _ = q.shape
        kf, vf = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
        alpha = exact_alpha(q, kf, allowed, scale, softcap)
        full = metric_scores(metric, alpha, vf.double(), exact_z(alpha, vf.double()), proj)
        rows = ExactScores(metric, q, k, v, allowed, scale, softcap, proj)
        b, i = torch.tensor([1, 0, 1, 0]), torch.tensor([0, 5, 11, 7])
        h = torch.tensor([3, 0, 1, 2])
        assert torch.equal(rows(b, i, h), full[b, h, i])
        assert torch.equal(rows(b, i, None), full[b, :, i])
        rows.CHUNK = 2 * k.shape[2] * H                # gathered a few rows at a time
        assert torch.equal(rows(b, i, h), full[b, h, i])
        assert torch.equal(rows(b, i, None), full[b, :, i])
        every = torch.arange(B * H * T)                 # many rows of each head and query
        b, h, i = every // (H * T), every // T % H, every % T
        assert torch.equal(rows(b, i, h), full[b, h, i])


def test_a_layers_float64_rows_go_with_it_without_the_cycle_collector():
    """The float64 rows of a layer's near rows and its float64 keys and values are freed when
    the layer is done, not when Python's cycle collector next runs (a closure over the rows
    kept them: hundreds of MB more resident by the last layer at 4,096 tokens)."""
    import gc
    import weakref

    proj, q, k, v, allowed, scale, softcap = _layers()[2][0]
    zero = torch.zeros(3, dtype=torch.long)
    gc.disable()
    try:
        exact = ExactScores("value_weighted_normalized", q, k, v, allowed, scale, softcap, proj)
        exact(zero, torch.arange(3), zero, torch.zeros(3, 2, dtype=torch.long))
        freed = weakref.ref(exact)
        del exact
        assert freed() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("K,N", [(64, 64), (65, 17), (127, 64), (64, 129), (200, 5)])
def test_a_row_product_has_the_same_bits_wherever_the_row_lies(K, N):
    g = torch.Generator().manual_seed(K * N)
    a = torch.randn(2, 600, K, dtype=torch.float64, generator=g)
    b = torch.randn(2, K, N, dtype=torch.float64, generator=g)
    full = rowmm(a, b)                                           # (2, 600, N)
    for r in (0, 3, 7):
        for offset in (1, 3):                                    # not 64-byte aligned
            flat = torch.zeros(2 * K + offset, dtype=torch.float64)
            alone = flat[offset:].view(2, 1, K).copy_(a[:, r:r + 1])
            assert torch.equal(rowmm(alone, b), full[:, r:r + 1])
            strided = torch.zeros(2, 1, K + offset, dtype=torch.float64)[..., offset:]
            assert torch.equal(rowmm(strided.copy_(a[:, r:r + 1]), b), full[:, r:r + 1])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):                                         # and however many threads
            torch.set_num_threads(n)
            for M in [*range(1, 20), 31, 100, 257, 599]:          # and rows computed together
                for start in (0, 1):
                    got = rowmm(a[:, start:start + M], b)
                    assert torch.equal(got, full[:, start:start + M]), (n, M, start)
            assert torch.equal(rowmm(a[1, 5:9], b[1]), full[1, 5:9])        # no lead dims
            assert torch.equal(rowmm(a, b.mT.contiguous().mT), full)         # b transposed
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("K,N", [(4096, 64), (64, 2048)])
def test_a_row_product_has_the_same_bits_in_any_batch_of_products(K, N):
    """Long sums (alpha v over every key, K = 4,096: BLAS splits them over threads by the
    product's shape) and wide rows, each pair's rows computed with other pairs' products in
    one call or alone, with 1 and 2 threads: the same bits."""
    g = torch.Generator().manual_seed(K)
    a = torch.randn(5, 130, K, dtype=torch.float64, generator=g)
    b = torch.randn(5, K, N, dtype=torch.float64, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        full = torch.stack([rowmm(a[p], b[p]) for p in range(5)])    # one pair at a time
        for n in (1, 2):
            torch.set_num_threads(n)
            assert torch.equal(rowmm(a, b), full), n                  # every pair together
            assert torch.equal(rowmm(a[2], b[2]), full[2]), n           # one pair alone
            for M in (1, 23, 25, 49, 130):
                got = rowmm(a[1:4, 130 - M:], b[1:4])
                assert torch.equal(got, full[1:4, 130 - M:]), (n, M)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("inner", [False, True])
def test_a_row_within_its_width_has_the_bits_of_its_own_product(inner, monkeypatch):
    """rowmm_within: each row (of 3 x 2 sequences, broadcast b, widths 16 to 70 in steps of 16,
    or 32 for every row, or with one sequence's rows all of one width, three of rowmm's
    blocks beside others' one, and rows of width 0) has the bits of rowmm of that row alone
    over b's leading width columns (or terms of the sum), and 0 past them (a width 0: 0)."""
    monkeypatch.setattr(base, "WIDTH_STEP", 16)
    g = torch.Generator().manual_seed(5)
    K, N = (70, 8) if inner else (8, 70)
    a = torch.randn(3, 2, 50, K, dtype=torch.float64, generator=g)
    b = torch.randn(3, 1, K, N, dtype=torch.float64, generator=g)
    last = torch.randint(0, 71, (3, 2, 50, 1), generator=g)             # one past the last key
    width = base.widths(torch.arange(70) < last)
    assert torch.equal(width.long(), ((last[..., 0].clamp_min(1) + 15) // 16 * 16).clamp(max=70))
    assert len(width.unique()) == 5                                # 16, 32, 48, 64, 70
    skew = width.clone()
    skew[0, 0], skew[1, 1, :30] = 48, 0                  # 50 rows of width 48; 30 not asked
    for width in (width, torch.full_like(width, 32), skew):       # and one width for all
        got = base.rowmm_within(a, b, width, inner)
        for s, h, r in torch.cartesian_prod(torch.arange(3), torch.arange(2), torch.arange(50)):
            w = int(width[s, h, r])
            if w == 0:
                assert bool((got[s, h, r] == 0).all())
                continue
            want = rowmm(a[s, h, r:r + 1, :w], b[s, 0, :w]) if inner else \
                rowmm(a[s, h, r:r + 1], b[s, 0, :, :w])
            assert torch.equal(got[s, h, r, :want.shape[1]], want[0])
            assert inner or bool((got[s, h, r, w:] == 0).all())


@pytest.mark.parametrize("metric", METRICS)
def test_fast_scores_stay_within_their_bound(metric):
    _, _, seen = _layers()
    for proj, q, k, v, allowed, scale, softcap in seen:
        H = q.shape[1]
        alpha64 = exact_alpha(q, k.repeat_interleave(H // k.shape[1], 1), allowed, scale,
                              softcap)
        vf = v.repeat_interleave(H // k.shape[1], 1).double()
        want = metric_scores(metric, alpha64, vf, exact_z(alpha64, vf), proj)
        alpha = attention_weights(q, k, allowed, scale, softcap, torch.float32)
        p32 = type(proj)(weight=proj.weight.float(), gram=proj.gram.float(),
                         full=proj.full.float())
        got, error = fast_scores(metric, alpha.clone(), v, p32, logit_scale(q, k, scale))
        err = (got.double() - want).abs()
        size = got.double().abs()
        if metric == "contribution":             # signed: relative to |score| + the term's size
            size = size + metric_scores("value_weighted_normalized", alpha64, vf,
                                        exact_z(alpha64, vf), proj)
        elif metric == "contribution_layer":
            B, _, T, dh = q.shape
            o = rowmm(exact_z(alpha64, vf).transpose(1, 2).reshape(B, T, H * dh), proj.weight)
            size = size + metric_scores("value_weighted", alpha64, vf, None, proj) / \
                o.norm(dim=-1)[:, None, :, None]
        bound = error.relative[..., None].double() * size
        real = allowed.expand_as(err)
        assert err[real].max() > 0                                   # float32 really differs
        assert (err <= bound)[real].all(), float((err / bound)[real].max())
        if error.within is not None:          # up to a factor common to the (head, query) row
            ratio = torch.where(real & (want > 0), got.double() / want, torch.nan)
            c = ratio.nanmedian(-1).values.nan_to_num(1.0)[..., None]
            if metric in ("contribution", "contribution_layer"):   # signed: its bound has c = 1
                c = 1.0
            rest = (got.double() - c * want).abs()
            bound = error.within[..., None].double() * size
            assert (rest <= bound)[real].all(), float((rest / bound)[real].max())
        if metric == "contribution_layer":      # chosen keys refined (the layer's context)
            context = LayerContext(0, q, k, v, allowed, scale, softcap, None, proj)
            _, error = fast_scores(metric, alpha.clone(), v, p32, logit_scale(q, k, scale),
                                   context=context)
            B, H, T, Tk = want.shape
            row = torch.arange(B * H * T)
            b, h, i = row // (H * T), row // T % H, row % T
            t, bound = error.refine(b, i, h, torch.arange(Tk).expand(len(row), Tk))
            logits = logits64(q, k.repeat_interleave(H // k.shape[1], 1), scale, softcap)
            factor = (logits - logits.amax(-1, keepdim=True)).exp().masked_fill(~allowed, 0)
            rest = (t - factor.sum(-1).reshape(-1, 1) * want[b, h, i]).abs()   # t = C s
            real = allowed.expand_as(want)[b, h, i]
            assert rest[real].max() > 0                   # float32's head outputs remain in t
            assert (rest <= bound)[real].all(), float((rest / bound)[real].max())


def test_shared_scratch_tensors_change_nothing():
    model, inputs, _ = _layers()
    removals = [Removal(m, mode, 0.3, "magnitude", g) for m in ("attention", "contribution")
                for mode in MODES for g in GRANULARITIES]
    work, shared = Workspace(), {}
    for r in removals:
        together = forward_logits(model, inputs, Intervener(model, removal=r, workspace=work,
                                                            projections=shared))
        alone = forward_logits(model, inputs, Intervener(model, removal=r))
        assert torch.equal(together, alone), r


def test_learned_sinks_join_the_softmax():
    """alpha with learned sink logits (gpt-oss) against numpy: the sink is a virtual key with no
    value, so a row's alpha sums to 1 - sink weight; a query with no allowed key puts all its
    weight on the sink. Float32 (fast), float64 (exact) and recomputed rows agree."""
    gen = torch.Generator().manual_seed(3)
    B, H, G, T, dh, scale = 2, 4, 2, 6, 8, 0.35
    q, k = torch.randn(B, H, T, dh, generator=gen), torch.randn(B, G, T, dh, generator=gen)
    sinks = 2 * torch.randn(1, H, 1, generator=gen)
    allowed = torch.ones(T, T).tril().bool().expand(B, 1, T, T).clone()
    allowed[1, 0, 2] = False                                   # a query with no allowed key
    logits = np.einsum("bhid,bhjd->bhij", q.double().numpy(),
                       np.repeat(k.double().numpy(), H // G, 1)) * scale
    logits = np.where(allowed.numpy(), logits, -np.inf)
    full = np.concatenate([logits, np.broadcast_to(sinks.double().numpy()[..., None],
                                                   (B, H, T, 1))], -1)
    p = np.exp(full - full.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True))[..., :-1]
    assert (want[1, :, 2] == 0.0).all()                        # exp(-inf): exactly 0
    # alpha's rounding: alpha times its logits' (dot products of d_head, their sizes S) and
    # the softmax's (the normaliser of T + 1 terms, the exp, the division): 2 alpha (1 + S)
    S = np.einsum("bhid,bhjd->bhij", np.abs(q.double().numpy()),
                  np.repeat(np.abs(k.double().numpy()), H // G, 1)) * scale
    size = 2 * want * (1 + np.abs(sinks.double().numpy())[..., None] + S.max(-1, keepdims=True))
    fast = attention_weights(q, k, allowed, scale, None, torch.float32, sinks)
    tol.assert_close(fast.numpy(), want, tol.dot(dh + T + 4, size, vs=tol.F64), "fast alpha")
    exact = exact_alpha(q, k.repeat_interleave(H // G, 1), allowed, scale, None, sinks)
    tol.assert_close(exact.numpy(), want, tol.dot(dh + T + 4, size, tol.F64, vs=tol.F64),
                     "exact alpha")
    rows = ExactScores("attention", q, k, k, allowed, scale, None, None, sinks)
    b, i, h = torch.tensor([1, 0, 1]), torch.tensor([2, 5, 3]), torch.tensor([3, 0, 1])
    assert torch.equal(rows(b, i, h), exact[b, h, i])
    assert torch.equal(rows(b, i, None), exact[b, :, i])
