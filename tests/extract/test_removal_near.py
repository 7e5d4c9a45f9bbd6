"""A near row is decided from the float64 scores of its open candidates only (issue 46).

The reference is the full float64 re-rank of every ranking row: the rule as a numpy stable
argsort of the exact scores (``test_selection.numpy_rule``). Wherever the float32 scores lie
within their error bound, deciding only the candidates whose error intervals reach the cut's
must remove the same keys:

- a row whose float32 order is wrong at the cut and where one key besides the cut's is open
  (signed and magnitude ranks, comprehensiveness and sufficiency, every granularity): the same
  removed set, only those keys' exact scores asked for, and float32 alone gets it wrong;
- random rows (ties, signs, padding) with exact scores anywhere within a relative, absolute
  or square-root bound, and fractions from 0 to 1; the open candidates found from two
  thresholds against the intervals' definition;
- the tiny model's layers with the bound inflated (so that most rows are near and many keys
  open): ExactScores at the open keys, for every paper metric, and value zeroing, whose open
  keys alone rerun the sublayer in float64.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import tiny_models as tm
from test_selection import METRICS, _eligible, _layers, numpy_rule
from test_value_zeroing import _FastAndExact

from attngeom.extract.faithfulness import selection
from attngeom.extract.faithfulness.base import exact_alpha, exact_z, rowmm
from attngeom.extract.faithfulness.interventions import GRANULARITIES, MODES, RANKS, watching
from attngeom.extract.faithfulness.layer_scores import ExactScores, fast_scores, metric_scores
from attngeom.extract.faithfulness.near import open_candidates
from attngeom.extract.faithfulness.removal_scores import logit_scale
from attngeom.extract.faithfulness.selection import ErrorBound, Workspace, select
from attngeom.extract.measurement.hooks import attention_handler


class Asked:
    """``exact`` of given float64 scores (B, H, T, Tk) that records the candidates asked."""

    def __init__(self, s64: torch.Tensor):
        self.s64, self.rows, self.keys = s64, [], []

    def __call__(self, b, i, h, keys):
        self.rows.append((b, i, h))
        self.keys.append(keys)
        return selection.take(self.s64[b, :, i] if h is None else self.s64[b, h, i], keys)


def _spread(B, H, T, signed, seed):
    """Scores (B, H, T, T) whose values in a row are at least 1.5 times apart."""
    g = np.random.default_rng(seed)
    s = np.zeros((B, H, T, T))
    for row in np.ndindex(B, H, T):
        values = np.arange(1.0, T + 1) * (1 + 0.3 * g.random(T)) * 2.0 ** np.arange(T)
        s[row] = g.permutation(values) * (np.where(g.random(T) < 0.5, -1.0, 1.0) if signed
                                          else 1.0)
    return s


def _candidates(x, b, i, h, granularity):
    """A ranking row of x (B, H, T, Tk) as a view-free copy (N,), candidate j * H + h at
    query granularity, and where candidate c lives: (head, key)."""
    H = x.shape[1]
    if granularity == "head":
        return x[b, h, i], lambda c: (h, c)
    if granularity == "query":
        return x[b, :, i].T.reshape(-1), lambda c: (c % H, c // H)
    return x[b, 0, i], lambda c: (0, c)


def _twin(s64, eligible, p, mode, rank, granularity):
    """In each ranking row, the last-ranked candidate moved next to the one at the cut: 1e-9
    (relative) below it in float64, one float32 step above it in float32. Returns the float64
    and float32 scores and, per row, the two keys (the cut's, the twin's) exact is asked for."""
    s64 = s64.copy()
    s32 = s64.astype(np.float32)
    B, H, T, _ = s64.shape
    mag = np.abs if rank == "magnitude" else (lambda x: x)
    twins = {}
    for b, h, i in np.ndindex(B, H, T):
        if granularity != "head" and h > 0:
            continue
        e, where = _candidates(np.broadcast_to(eligible, s64.shape), b, i, h, granularity)
        idx = np.flatnonzero(e)
        k = int(np.floor(p * len(idx) + 0.5))
        m = k if mode == "comprehensiveness" else len(idx) - k   # candidates above the cut
        if len(idx) < 3 or not 1 <= m <= len(idx) - 1:
            continue
        row, _ = _candidates(s64, b, i, h, granularity)
        order = idx[np.argsort(-mag(row[idx]), kind="stable")]
        cut, twin = where(order[m - 1]), where(order[-1])
        sign = np.sign(s64[b, cut[0], i, cut[1]]) if rank == "magnitude" else 1.0
        k64, k32 = mag(s64[b, cut[0], i, cut[1]]), mag(s32[b, cut[0], i, cut[1]])
        s64[b, twin[0], i, twin[1]] = sign * (k64 - abs(k64) * 1e-9)
        s32[b, twin[0], i, twin[1]] = sign * np.nextafter(k32, np.float32(np.inf))
        twins[(b, 0 if granularity != "head" else h, i)] = (cut[1], twin[1])
    return torch.from_numpy(s64), torch.from_numpy(s32), twins


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rank", RANKS)
def test_a_row_with_one_open_key_besides_the_cut_is_the_full_rerank(granularity, mode, rank):
    B, T = 2, 12
    H = 1 if granularity == "token" else 3
    eligible = _eligible(B, H, T)
    s64, s32, twins = _twin(_spread(B, H, T, rank == "signed" and granularity != "token", 5),
                            eligible.numpy(), 0.3, mode, rank, granularity)
    assert len(twins) > 10
    error = ErrorBound(torch.full((B, H, T), 1e-6))
    exact = Asked(s64)
    got = select(s32.clone(), eligible, 0.3, mode, rank, granularity, error, exact, Workspace(),
                 inplace=True)
    want = numpy_rule(s64, eligible, 0.3, mode, rank, granularity)
    assert np.array_equal(got.numpy(), want)
    plain = select(s32, eligible, 0.3, mode, rank, granularity)
    assert not np.array_equal(plain.numpy(), want)         # float32 alone gets them wrong
    seen, asked = {}, 0
    for (b, i, h), keys in zip(exact.rows, exact.keys):
        for r in range(len(b)):                            # the cut's key and the twin's only
            at = (int(b[r]), int(h[r]) if granularity == "head" else 0, int(i[r]))
            seen[at] = sorted(keys[r].tolist())
        asked += len(b)
    assert seen == {at: sorted(pair) for at, pair in twins.items()}
    if granularity == "query":                             # the open candidates' heads only
        assert len(twins) < asked <= 2 * len(twins) < H * len(twins)


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("bound", ["relative", "absolute", "root"])
def test_rows_within_their_bound_decide_like_the_full_rerank(granularity, bound):
    """Exact scores anywhere within the bound of float32 scores with many ties and both signs
    (positive at token granularity, where a relative bound holds for the head sum)."""
    gen = torch.Generator().manual_seed(11)
    B, H, T = 2, 3, 16
    eligible = _eligible(B, H, T, per_head=granularity == "head", seed=2)
    size = 0.01 + torch.rand(B, H, T, generator=gen).double() * 0.04
    for trial in range(3):
        s32 = torch.randint(-6, 7, (B, H, T, T), generator=gen).float() / 4 + \
            (trial == 2) * torch.randn(B, H, T, T, generator=gen)
        if granularity == "token":
            s32 = s32.abs()
        a = s32.double().abs()
        if bound == "relative":
            error, e = ErrorBound(size.float()), size[..., None] * a
        elif bound == "absolute":
            error, e = ErrorBound(0 * size.float(), absolute=size.float()), size[..., None] + 0 * a
        else:
            error, e = ErrorBound(0 * size.float(), root=size.float()), size[..., None] * a.sqrt()
        if granularity == "token":
            if bound != "relative":
                continue                                 # the head sum's bound is relative
            e = size.amax(1, keepdim=True)[..., None] * a    # the largest over heads
        shift = (2 * torch.rand(B, H, T, T, generator=gen).double() - 1) * e
        s64 = s32.double() + shift * (torch.rand(B, H, T, T, generator=gen) < 0.7)
        for p in (0.0, 0.1, 0.3, 0.5, 0.9, 1.0):
            for mode in MODES:
                for rank in RANKS:
                    want = numpy_rule(s64, eligible, p, mode, rank, granularity)
                    got = select(s32.clone(), eligible, p, mode, rank, granularity, error,
                                 Asked(s64), Workspace(), inplace=True)
                    assert np.array_equal(got.numpy(), want), (trial, p, mode, rank)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_a_factor_common_to_a_head_row_is_left_out_of_its_comparisons(granularity):
    """float32 scores c s (1 + e), c up to 30 % off for each (head, query) row and |e| within
    ``within``: at head granularity ``within`` (the smaller) decides which rows are near and
    the removed sets are the float64 rule's; rows that mix heads keep the whole bound."""
    gen = torch.Generator().manual_seed(5)
    B, H, T = 2, 3, 16
    eligible = _eligible(B, H, T, per_head=granularity == "head", seed=4)
    within = 1e-3 + torch.rand(B, H, T, generator=gen).double() * 4e-3
    c = 1 + (2 * torch.rand(B, H, T, 1, generator=gen).double() - 1) * 0.3
    whole = ((c - 1).abs()[..., 0] + within) * 1.5                    # covers c and e
    for trial in range(3):
        s64 = torch.randint(-6, 7, (B, H, T, T), generator=gen).double() / 4 + \
            (trial == 2) * torch.randn(B, H, T, T, generator=gen).double()
        if granularity == "token":
            s64 = s64.abs()
        e = (2 * torch.rand(B, H, T, T, generator=gen).double() - 1) * within[..., None] / 2
        s32 = (c * s64 * (1 + e)).float()
        error = ErrorBound(whole.float(), within=within.float())
        for p in (0.1, 0.5, 0.9):
            for mode in MODES:
                for rank in RANKS:
                    want = numpy_rule(s64.numpy(), eligible, p, mode, rank, granularity)
                    asked = Asked(s64)
                    got = select(s32.clone(), eligible, p, mode, rank, granularity, error,
                                 asked, Workspace(), inplace=True)
                    assert np.array_equal(got.numpy(), want), (trial, p, mode, rank)
                    wide = Asked(s64)
                    select(s32.clone(), eligible, p, mode, rank, granularity,
                           ErrorBound(whole.float()), wide, Workspace(), inplace=True)
                    rows = lambda x: sum(len(r[0]) for r in x.rows)  # noqa: E731
                    if granularity == "head":
                        assert rows(asked) < rows(wide)
                    else:
                        assert rows(asked) == rows(wide)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_ranked_by_magnitude_the_magnitude_bound_decides(granularity):
    """float32 scores s (1 + e) with |e| up to 1e-2 and ``relative`` 0: a signed ranking is
    the float32 one (the bound says the scores are exact), a ranking by |score| takes
    ``magnitude`` (which covers e) and is the float64 rule's."""
    gen = torch.Generator().manual_seed(7)
    B, H, T = 2, 3, 16
    eligible = _eligible(B, H, T, per_head=granularity == "head", seed=6)
    s64 = torch.randint(-6, 7, (B, H, T, T), generator=gen).double() / 4 + \
        torch.randn(B, H, T, T, generator=gen).double() * 1e-3
    if granularity == "token":                  # summed over heads: no cancellation
        s64 = s64.abs()
    s32 = (s64 * (1 + (2 * torch.rand(B, H, T, T, generator=gen).double() - 1) * 1e-2)).float()
    error = ErrorBound(torch.zeros(B, H, T), magnitude=torch.full((B, H, T), 0.03))
    apart = 0
    for p in (0.1, 0.5, 0.9):
        for mode in MODES:
            want = numpy_rule(s64.numpy(), eligible, p, mode, "magnitude", granularity)
            got = select(s32.clone(), eligible, p, mode, "magnitude", granularity, error,
                         Asked(s64), Workspace(), inplace=True)
            assert np.array_equal(got.numpy(), want), (p, mode)
            signed = select(s32.clone(), eligible, p, mode, "signed", granularity, error,
                            Asked(s64), Workspace(), inplace=True)
            float32 = numpy_rule(s32.double().numpy(), eligible, p, mode, "signed", granularity)
            assert np.array_equal(signed.numpy(), float32), (p, mode)
            apart += not np.array_equal(float32, numpy_rule(s64.numpy(), eligible, p, mode,
                                                            "signed", granularity))
    assert apart > 0                     # the float32 ranking does differ from the rule's


def _layer_cases(metric):
    """Each layer of the tiny llama's clean pass: float32 scores, their bound inflated 1e3
    times (most rows near, many keys open; for the signed metrics with the absolute term the
    test of their bound uses, the size of a key's term), the float64 definition and
    ExactScores."""
    _, _, seen = _layers()
    for proj, q, k, v, allowed, scale, softcap in seen:
        B, H, T, dh = q.shape
        kf, vf = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
        alpha64 = exact_alpha(q, kf, allowed, scale, softcap)
        z = exact_z(alpha64, vf.double())
        full = metric_scores(metric, alpha64, vf.double(), z, proj)
        p32 = type(proj)(weight=proj.weight.float(), gram=proj.gram.float(),
                         full=proj.full.float())
        fast, error = fast_scores(metric, alpha64.float(), v, p32, logit_scale(q, k, scale))
        rel, term = error.relative.double() * 1e3, None
        if metric == "contribution":
            term = metric_scores("value_weighted_normalized", alpha64, vf.double(), z, proj)
        elif metric == "contribution_layer":
            o = rowmm(z.transpose(1, 2).reshape(B, T, -1), proj.weight)
            term = metric_scores("value_weighted", alpha64, vf.double(), None, proj) / \
                o.norm(dim=-1)[:, None, :, None]
        wide = ErrorBound(rel, absolute=None if term is None else rel * term.amax(-1))
        yield fast, wide, full, ExactScores(metric, q, k, v, allowed, scale, softcap, proj), \
            allowed


@pytest.mark.parametrize("mode", MODES)
def test_thresholds_open_what_the_intervals_definition_opens(mode):
    """The open candidates from two thresholds of s~ (a relative and an absolute bound; rows
    of keys packed within 1e-4 of each other, so that many lie at an interval's end): every
    candidate the definition opens (X the largest U_j of the candidates <= lo, Y the
    smallest L_j of those >= hi, in float64 over each row), a few more within 2^-20 of a
    threshold at most, and the same count above; a row with rel >= 1/2 opens every candidate."""
    gen = torch.Generator().manual_seed(4)
    R, N = 400, 300
    s = torch.randn(R, N, generator=gen) * torch.rand(R, 1, generator=gen) * 10 ** torch.randint(
        -3, 3, (R, 1), generator=gen)
    s[::7] = (s[::7] * 8).round() / 8                                # ties
    s[1::3] = (1 + 1e-4 * torch.randn(len(s[1::3]), N, generator=gen)) * s[1::3, :1]  # packed
    n = torch.randint(2, N + 1, (R,), generator=gen)
    real = torch.arange(N) < n[:, None]
    key = s.masked_fill(~real, -torch.inf if mode == "comprehensiveness" else torch.inf)
    m = torch.randint(1, 10**6, (R,), generator=gen) % (n - 1) + 1   # 0 < m < n
    desc = key.masked_fill(~real, -torch.inf).sort(-1, descending=True).values
    hi, lo = desc.gather(-1, m[:, None] - 1)[:, 0], desc.gather(-1, m[:, None])[:, 0]
    rel = 10.0 ** -torch.randint(2, 7, (R,), generator=gen).float()
    rel[1::3] = 1e-5                                                 # many keys at the edges
    rel[:5] = 0.7
    absolute = torch.rand(R, generator=gen) * 1e-3 * (torch.rand(R, generator=gen) < 0.5)
    band = open_candidates(key, torch.arange(R), hi, lo, m, rel, absolute, None, 64)
    got = torch.zeros(R, N, dtype=torch.bool)
    got[band.row, band.col] = True
    s64, e = s.double(), rel.double()[:, None] * s.double().abs() + absolute.double()[:, None]
    low, high = s64 - e, s64 + e
    x = high.masked_fill(~(real & (s <= lo[:, None])), -np.inf).amax(-1)
    y = low.masked_fill(~(real & (s >= hi[:, None])), np.inf).amin(-1)
    above = real & (low > x[:, None])
    want = real & ~above & (high >= y[:, None])
    assert (want & ~got).sum() == 0                                  # none left out
    extra = got & ~want
    assert extra[5:].sum() <= 0.01 * want.sum()
    edge = torch.minimum((low - x[:, None]).abs(), (high - y[:, None]).abs())
    tol = 2.0 ** -20 * (s64.abs() + e + x.abs()[:, None] + y.abs()[:, None])
    assert bool((edge <= tol)[5:][extra[5:]].all())
    assert torch.equal(got[:5], real[:5]) and torch.equal(band.need[:5], m[:5])
    assert bool((band.need[5:] >= m[5:] - above[5:].sum(-1)).all())
    assert bool((band.need[5:] <= m[5:] - above[5:].sum(-1) + extra[5:].sum(-1)).all())


@pytest.mark.parametrize("mode", MODES)
def test_each_segments_own_bound_opens_what_its_intervals_open(mode):
    """Rows of 3 segments (a query's heads), each with its own relative and absolute bound: the
    open candidates are every one the definition opens (X the largest U_j of the candidates
    <= lo, Y the smallest L_j of those >= hi, each interval its segment's, in float64 over the
    row), a few more within 2^-20 of X or Y at most, and a row whose intervals no longer
    overlap leaves the band; its need is the count above the cut's as the definition says."""
    gen = torch.Generator().manual_seed(5)
    R, G, S = 300, 3, 40
    N = G * S
    s = torch.randn(R, N, generator=gen) * 10 ** torch.randint(-2, 2, (R, 1), generator=gen)
    s[1::2] = (1 + 1e-3 * torch.randn(len(s[1::2]), N, generator=gen)) * s[1::2, :1]  # packed
    n = torch.full((R,), N)
    real = torch.rand(R, N, generator=gen) < 0.9
    key = s.masked_fill(~real, -torch.inf if mode == "comprehensiveness" else torch.inf)
    m = torch.randint(1, 10**6, (R,), generator=gen) % (real.sum(-1) - 1) + 1
    desc = key.masked_fill(~real, -torch.inf).sort(-1, descending=True).values
    hi, lo = desc.gather(-1, m[:, None] - 1)[:, 0], desc.gather(-1, m[:, None])[:, 0]
    rel = 10.0 ** -torch.randint(3, 7, (R, G), generator=gen).float()
    absolute = torch.rand(R, G, generator=gen) * 1e-4 * (torch.rand(R, G, generator=gen) < 0.3)
    rel[:4, 1] = torch.inf                                           # a bound not finite
    rows = torch.arange(R)
    band = open_candidates(key, rows, hi, lo, m, rel.amax(-1), absolute.amax(-1), None, 64,
                           None, G, (rel, absolute))
    got = torch.zeros(R, N, dtype=torch.bool)
    got[band.rows[band.row], band.col] = True
    e = (rel.double().repeat_interleave(S, -1) * s.double().abs() +
         absolute.double().repeat_interleave(S, -1))
    low, high = s.double() - e, s.double() + e
    x = high.masked_fill(~(real & (s <= lo[:, None])), -np.inf).amax(-1)
    y = low.masked_fill(~(real & (s >= hi[:, None])), np.inf).amin(-1)
    above = real & (low > x[:, None])
    want = real & ~above & (high >= y[:, None])
    assert (want[4:] & ~got[4:]).sum() == 0 and bool(got[:4][real[:4]].all())
    extra = got & ~want
    edge = torch.minimum((low - x[:, None]).abs(), (high - y[:, None]).abs())
    tol = 2.0 ** -20 * (s.double().abs() + e + x.abs()[:, None] + y.abs()[:, None])
    assert bool((edge <= tol)[4:][extra[4:]].all())
    assert torch.equal(band.rows, rows[got.any(-1)])
    near = band.rows[band.rows >= 4]
    assert 0 < len(near) < R - 4 and want[4:].any(-1).sum() == len(near)   # rows leave
    need = dict(zip(band.rows.tolist(), band.need.tolist()))
    for r in near.tolist():
        assert need[r] == int(m[r] - above[r].sum()), r


@pytest.mark.parametrize("metric", METRICS)
def test_exact_scores_at_open_keys_have_the_bits_of_the_full_rows(metric):
    for *_, full, rows, _ in _layer_cases(metric):
        B, H, T, Tk = full.shape
        g = torch.Generator().manual_seed(3)
        b, i = torch.randint(0, B, (9,), generator=g), torch.randint(0, T, (9,), generator=g)
        h = torch.randint(0, H, (9,), generator=g)
        keys = torch.randint(0, Tk, (9, 4), generator=g)
        assert torch.equal(rows(b, i, h, keys), full[b, h, i].gather(-1, keys))
        assert torch.equal(rows(b, i, None, keys), selection.take(full[b, :, i], keys))
        rows.entry = dataclasses.replace(rows.entry, builtin=False)    # a plugin's kernel:
        assert torch.equal(rows(b, i, h, keys), full[b, h, i].gather(-1, keys))  # full rows
        assert torch.equal(rows(b, i, None, keys), selection.take(full[b, :, i], keys))


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_float64_sublayer_rows_have_the_same_bits_however_many_run_together(arch):
    """Value zeroing's float64 rows (``SublayerCall.outputs64``): a near row's scores do not
    depend on the rows decided with it."""
    from attngeom.extract.faithfulness.sublayer import SublayerCall, sublayer_structure

    sub = sublayer_structure(tm.build(arch))[0]
    call = SublayerCall(sub, sub.probe_call)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, sub.d, dtype=torch.float64, generator=g)
    z = torch.randn(300, sub.width, dtype=torch.float64, generator=g)
    full = call.outputs64(x, z)
    for M in [*range(1, 12), 31, 64, 257]:
        for start in (0, 1, 5):
            assert torch.equal(call.outputs64(x[start:start + M], z[start:start + M]),
                               full[start:start + M]), (M, start)


@pytest.mark.parametrize("metric", METRICS)
def test_near_rows_of_a_model_decide_like_the_full_rerank(metric):
    asked = [0, 0]

    for fast, wide, full, rows, eligible in _layer_cases(metric):
        def exact(b, i, h, keys):
            asked[0] += len(b)
            asked[1] += keys.numel()
            return rows(b, i, h, keys)
        exact.layer_scope = rows.layer_scope       # contribution_layer's asked for by query

        for granularity in GRANULARITIES:
            for mode in MODES:
                for rank in RANKS:
                    for p in (0.1, 0.5):
                        want = numpy_rule(full, eligible, p, mode, rank, granularity)
                        got = select(fast.clone(), eligible, p, mode, rank, granularity, wide,
                                     exact, Workspace(), inplace=True)
                        assert np.array_equal(got.numpy(), want), (granularity, mode, rank, p)
    assert asked[0] > 100 and asked[1] > 2 * asked[0]      # many near rows, several keys open


class _ZeroingLayers(_FastAndExact):
    """Value zeroing at every layer of a float32 pass: the removal decided from the float32
    scores and their bound (inflated 100 times) and ExactScores at the open keys, against the
    rule on the float64 scores of every key; the float64 sublayer rows it reruns, and those
    its near rows would have rerun for every key they see."""

    def __init__(self, model):
        super().__init__(model)
        self.rows = {"open": 0, "near rows, every key": 0}
        self.checked = 0

    def compare(self, call, ctx, fast, err, full) -> None:
        wide = ErrorBound(err.relative, absolute=err.absolute * 1e4, root=err.root * 1e2)
        B, _, T, Tk = fast.shape
        exact = ExactScores("value_zeroing", call.query, call.key, call.value, call.allowed,
                            call.scaling, call.softcap, ctx.proj, call.sinks, ctx)
        b, i = (t.reshape(-1) for t in torch.meshgrid(torch.arange(B), torch.arange(T),
                                                       indexing="ij"))
        keys = torch.randint(0, Tk, (len(b), 3), generator=torch.Generator().manual_seed(1))
        assert torch.equal(exact(b, i, None, keys), selection.take(full[b, :, i], keys))
        eligible = call.allowed.expand(B, 1, T, Tk)
        seen = eligible.any(1).sum(-1)                                  # (B, T) keys a row sees

        def near(b, i, h, keys):                       # what the full rows would have rerun
            self.rows["near rows, every key"] += int((1 + seen[b, i]).sum())
            return exact(b, i, h, keys)

        for mode in MODES:
            for p in (0.1, 0.5):
                want = numpy_rule(full, eligible, p, mode, "signed", "token")
                counted = _count_rows(ctx.sublayer, self.rows, "open")
                got = select(fast.clone(), eligible, p, mode, "signed", "token", wide, near,
                             Workspace(), inplace=True)
                counted.restore()
                assert np.array_equal(got.expand(B, 1, T, Tk).numpy(), want), (call.index, mode)
                self.checked += 1


class _count_rows:
    """Counts the float64 sublayer rows run (``SublayerCall.outputs64``) into ``into[name]``."""

    def __init__(self, sub, into: dict, name: str):
        self.sub, self.kept = sub, sub.outputs64

        def outputs64(x, z):
            into[name] += len(x)
            return self.kept(x, z)
        sub.outputs64 = outputs64

    def restore(self) -> None:
        self.sub.outputs64 = self.kept


def test_value_zeroing_reruns_only_the_open_keys_in_float64():
    model = tm.build("llama")
    handler = _ZeroingLayers(model)
    with torch.inference_mode(), attention_handler(model, handler), watching(handler):
        model(**tm.example_inputs("llama", batch=2, seq_len=14))
    rows = handler.rows
    assert handler.checked > 0 and rows["near rows, every key"] > 50, rows
    # a near row reruns its query's clean output and its open keys, not every key it sees
    assert 0 < rows["open"] < 0.5 * rows["near rows, every key"], rows


def test_refined_scores_decide_near_rows_like_the_full_rerank():
    """contribution_layer's near rows (the float32 bound inflated 1e5 times: most rows near)
    ranked first by their refined scores (the kernel's ``refine``, from the layer's context),
    at head granularity: the same removed set as the float64 rule, most rows settled without
    their float64 scores."""
    from attngeom.extract.faithfulness.context import LayerContext
    from attngeom.extract.faithfulness.dense import attention_weights

    _, _, seen = _layers()
    settled, asked = [0], [0]
    for proj, q, k, v, allowed, scale, softcap in seen:
        H = q.shape[1]
        kf, vf = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // k.shape[1], 1)
        alpha64 = exact_alpha(q, kf, allowed, scale, softcap)
        full = metric_scores("contribution_layer", alpha64, vf.double(),
                             exact_z(alpha64, vf.double()), proj)
        alpha = attention_weights(q, k, allowed, scale, softcap, torch.float32)
        p32 = type(proj)(weight=proj.weight.float(), gram=proj.gram.float(),
                         full=proj.full.float())
        context = LayerContext(0, q, k, v, allowed, scale, softcap, None, proj)
        fast, error = fast_scores("contribution_layer", alpha, v, p32, logit_scale(q, k, scale),
                                  context=context)
        rows = ExactScores("contribution_layer", q, k, v, allowed, scale, softcap, proj)

        def exact(b, i, h, keys):
            asked[0] += len(b)
            return rows(b, i, h, keys)
        exact.layer_scope = True

        def refine(b, i, h, keys):
            settled[0] += len(b)
            return error.refine(b, i, h, keys)

        wide = dataclasses.replace(error, relative=error.relative * 1e5, within=None,
                                   refine=refine)
        for mode in MODES:
            for rank in RANKS:
                for p in (0.1, 0.5):
                    want = numpy_rule(full, allowed, p, mode, rank, "head")
                    got = select(fast.clone(), allowed, p, mode, rank, "head", wide, exact,
                                 Workspace(), inplace=True)
                    assert np.array_equal(got.numpy(), want), (mode, rank, p)
    assert settled[0] > 100 and asked[0] < settled[0] / 4    # most near rows settled refined


def test_padded_gathers_each_rows_open_columns_in_any_order_of_rows():
    from attngeom.extract.faithfulness.near import Band, padded

    g = torch.Generator().manual_seed(0)
    is_open = torch.rand(50, 30, generator=g) < 0.1
    is_open[3], is_open[7] = False, True                    # a row with none, one with all
    row, col = is_open.nonzero(as_tuple=True)
    band = Band(torch.arange(50) * 3, row, col, torch.zeros(50, dtype=torch.long))
    at = torch.randperm(50, generator=g)
    cols, real = padded(band, at)
    for r, a in enumerate(at.tolist()):
        want = is_open[a].nonzero()[:, 0]
        assert torch.equal(cols[r][real[r]], want)
        assert (cols[r][~real[r]] == (want[0] if len(want) else 0)).all()
