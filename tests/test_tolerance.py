"""tests/tolerance.py itself: the bounds hold where they claim to and are not vacuous."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tolerance as tol


def test_gamma_is_higham_s():
    u = 2.0 ** -24
    assert tol.unit(tol.F32) == u and tol.unit(tol.F64) == 2.0 ** -53
    assert tol.unit(tol.F16) == 2.0 ** -11
    assert tol.gamma(10) == 10 * u / (1 - 10 * u)
    with pytest.raises(ValueError):
        tol.gamma(2 ** 24)                                      # n u >= 1: no bound


@pytest.mark.parametrize("n", [3, 64, 1000])
def test_dot_bound_holds_for_float32_kernels_and_blockings(n):
    """Float32 dot products (numpy's and torch's kernels, one sum per term as a loop too)
    within gamma(n) sum |a||b| of the float64 value; cancelling sums included."""
    rng = np.random.default_rng(n)
    for _ in range(20):
        a, b = rng.normal(size=(2, n)).astype(np.float32)
        b[-1] = -np.float32(a[:-1].astype(np.float64) @ b[:-1] / a[-1])     # cancels
        exact = a.astype(np.float64) @ b.astype(np.float64)
        bound = tol.dot(n, np.abs(a).astype(float) @ np.abs(b))
        loop = np.float32(0)
        for x, y in zip(a, b):
            loop = np.float32(loop + np.float32(x * y))
        for got in (a @ b, float(torch.from_numpy(a) @ torch.from_numpy(b)), loop):
            np.testing.assert_allclose(got, exact, **bound)


def test_sums_to_one_holds_for_a_float32_softmax():
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.normal(0, 4, size=(200, 37)).astype(np.float32))
    rows = torch.softmax(logits, -1).double().sum(-1).numpy()
    np.testing.assert_allclose(rows, 1.0, **tol.sums_to_one(37, depth=37 + 1))


def test_a_comparison_fails_beyond_its_bound(monkeypatch):
    monkeypatch.delenv("TOLERANCE_LOG", raising=False)     # moved on purpose: not a spread
    want = np.array([1.0, -2.0, np.nan, 0.0])
    bound = tol.dot(8, np.array([1.0, 2.0, 1.0, 1.0]))
    tol.assert_close(want + 0.9 * bound.atol, want, bound)
    with pytest.raises(AssertionError, match="1 of 3 beyond the rounding bound"):
        tol.assert_close(want + np.array([0, 0, 0, 2]) * bound.atol, want, bound)
    with pytest.raises(AssertionError, match="NaN pattern"):
        tol.assert_close(np.nan_to_num(want), want, bound)


def test_a_bound_unpacks_as_keywords_and_adds_up():
    bound = tol.dot(16, 2.0, vs=tol.F64) + tol.relative(3)
    assert dict(bound) == {"rtol": tol.gamma(3), "atol": 2 * (tol.gamma(16)
                                                               + tol.gamma(16, tol.F64))}
    np.testing.assert_allclose(1.0, 1.0, **bound)
    torch.testing.assert_close(torch.ones(2), torch.ones(2), **bound)
    assert 1.0 + bound["atol"] / 2 == bound.approx(1.0)
    assert 1.0 + 3 * bound["atol"] + 3 * bound["rtol"] != bound.approx(1.0)
    with pytest.raises(TypeError, match="assert_close"):
        dict(tol.dot(4, np.ones(3)))                        # elementwise: not keywords
