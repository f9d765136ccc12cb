"""The LPT kernel (``fcp_data.plan.lpt_kernel``, compiled by numba when installed) returns the numpy path's labels:
``lpt_labels`` in both modes (classic below 16 groups, rounds from 16) and ``lpt_heap``, on random work with ties
(equal and zero work), integer and float sizes, loose and tight capacities (rounds that break the capacity, items
that fit nowhere). Run as plain Python too, so the comparison holds without numba."""

from __future__ import annotations

import numpy as np
import pytest

import fcp_data.plan.lpt as lpt
from fcp_data.plan.lpt_kernel import SIGNATURE, lpt_loop
from _kernels import kernel_variants  # tests/plan/_kernels.py


def _kernels():
    return kernel_variants(lpt_loop, SIGNATURE)


def _draw(rng: np.random.Generator):
    n, k = int(rng.integers(1, 300)), int(rng.choice([2, 3, 7, 15, 16, 17, 33, 64, 130]))
    work = rng.choice([rng.random(n), np.round(rng.random(n), 1), np.zeros(n), rng.pareto(1.0, n)])
    sizes = rng.integers(1, 5000, n).astype(np.float64)
    if rng.random() < 0.3:
        sizes = sizes * rng.uniform(0.3, 1.0, n)
    total = float(sizes.sum())
    capacity = float(rng.choice([total * 2, total / k * rng.uniform(1.0, 1.3), sizes.max(), total / k * 0.9]))
    return work, sizes, k, capacity


@pytest.mark.parametrize("name,kernel", _kernels(), ids=lambda x: x if isinstance(x, str) else "")
def test_kernel_labels_equal_the_numpy_paths(monkeypatch, name, kernel):
    rng = np.random.default_rng(21)
    failed = placed = 0
    for _ in range(400 if name == "numba" else 150):
        work, sizes, k, capacity = _draw(rng)
        for fn, args in ((lpt.lpt_labels, (work, sizes, k, capacity)),
                         (lpt.lpt_heap, (np.sort(work)[::-1], sizes, k, capacity))):
            monkeypatch.setattr(lpt, "_kernel", lambda n, k: None)
            want = fn(*args)
            monkeypatch.setattr(lpt, "_kernel", lambda n, k: kernel)
            got = fn(*args)
            monkeypatch.undo()
            if want is None:
                assert got is None
                failed += 1
            else:
                assert got is not None and np.array_equal(got, want), (name, fn.__name__, k, capacity)
                placed += 1
    assert failed > 0.1 * (failed + placed) and placed > 0.3 * (failed + placed)  # both outcomes drawn often


def test_large_packings_use_the_kernel_when_numba_is_installed(monkeypatch):
    compiled = lpt._kernel(1 << 20, lpt.JIT_MAX_GROUPS)
    if compiled is None:
        pytest.skip("numba is not installed (pip install fcp[fast]) or FCP_JIT=0")
    monkeypatch.setattr(lpt, "jit_active", lambda: False)  # a process that has not loaded numba yet
    assert lpt._kernel(lpt.JIT_MIN_WORK, 1) is compiled and lpt._kernel(lpt.JIT_MIN_WORK - 1, 1) is None
    assert lpt._kernel(1 << 20, lpt.JIT_MAX_GROUPS + 1) is None  # many groups: the heap / blocks path
    monkeypatch.setattr(lpt, "jit_active", lambda: True)  # numba loaded: from the smaller size on
    assert lpt._kernel(lpt.JIT_ACTIVE_MIN_WORK, 1) is compiled and lpt._kernel(lpt.JIT_ACTIVE_MIN_WORK - 1, 1) is None
    assert lpt._kernel(1 << 20, lpt.JIT_MAX_GROUPS + 1) is None


@pytest.mark.parametrize("num_groups", [1, 2, 37, 1 << 16, (1 << 16) + 1, 1 << 20])
def test_stable_order_is_the_stable_argsort(num_groups):
    """``stable_order`` (16-bit radix keys while the ids fit) is ``np.argsort(label, kind="stable")``: the same
    permutation, ties in index order, at the 16-bit boundary and past it; ``labels_to_groups`` built on it lists
    each group's ids ascending. A key that wraps (ids ≥ 2**16 cast to 16 bits) or an unstable sort fails it."""
    rng = np.random.default_rng(num_groups)
    for n in (0, 1, 5, 513, 4096):
        label = rng.integers(0, num_groups, n).astype(np.int64)
        if n and num_groups > 2:
            label[: n // 3] = num_groups - 1  # the largest id, many ties
        assert np.array_equal(lpt.stable_order(label, num_groups), np.argsort(label, kind="stable"))
        groups = lpt.labels_to_groups(label, num_groups)
        assert groups == [sorted(np.flatnonzero(label == g).tolist()) for g in np.unique(label)]


def test_labels_gid_gives_group_terms_of_its_own_sums():
    """``labels_to_groups(..., gid=True)``'s positions give ``group_terms_of`` exactly the sums it builds from the lists
    (empty groups skipped, the same order of additions), and place each sequence in its own list."""
    from fcp_data.plan.bfd import group_terms_of

    rng = np.random.default_rng(3)
    for _ in range(200):
        n, k = int(rng.integers(1, 300)), int(rng.integers(1, 80))
        label = rng.integers(0, k, n).astype(np.int64)
        L, E, V = rng.integers(1, 5000, n), rng.uniform(0, 1, n), rng.integers(0, 900, n).astype(np.float64)
        groups, gid = lpt.labels_to_groups(label, k, gid=True)
        assert groups == lpt.labels_to_groups(label, k)
        assert all(i in groups[g] for i, g in enumerate(gid.tolist()))
        for want, got in zip(group_terms_of(groups, L, E, V), group_terms_of(groups, L, E, V, gid=gid)):
            assert np.array_equal(want, got)


def test_presorted_items_skip_only_the_sort():
    """``lpt_labels(..., presorted=True)`` on items already heaviest first (ties in index order, many of them) gives
    the labels of the sorting call, for both LPT modes, with and without binding capacity."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n, k = int(rng.integers(1, 400)), int(rng.integers(1, 70))
        work = -np.sort(-rng.choice(rng.uniform(0, 10, int(rng.integers(1, 20))), n))  # non-increasing, ties
        sizes = rng.integers(1, 1000, n).astype(np.float64)
        cap = float(rng.choice([np.inf, sizes.sum() / k * 1.2, sizes.max() * 2]))
        want = lpt.lpt_labels(work, sizes, k, cap)
        got = lpt.lpt_labels(work, sizes, k, cap, presorted=True)
        assert (want is None and got is None) or np.array_equal(want, got)
