"""The BFD kernel (``fcp_data.plan.bfd_kernel``, compiled by numba when installed) opens the numpy path's bins:
``bfd_groups`` on random integer lengths (long runs of equal lengths, which the numpy path takes a run at a time,
sequences longer than the unit, exact fits) and float lengths, for units below, at and above the lengths. Run as
plain Python too, so the comparison holds without numba."""

from __future__ import annotations

import numpy as np
import pytest

import fcp_data.plan.bfd as bfd
from fcp_data.plan.bfd_kernel import bfd_loop
from _kernels import kernel_variants  # tests/plan/_kernels.py


def _kernels():
    return kernel_variants(bfd_loop, bfd.SIGNATURE)


def _draw(rng: np.random.Generator) -> tuple[np.ndarray, float]:
    n = int(rng.integers(1, 400))
    kind = int(rng.integers(0, 4))
    if kind == 0:
        L = rng.integers(1, 5000, n)
    elif kind == 1:  # few distinct lengths: long runs
        L = rng.choice(rng.integers(1, 3000, 4), n)
    elif kind == 2:  # lengths that divide the unit: exact fits, zero headroom
        L = rng.choice([250, 500, 1000, 2000], n)
    else:
        L = rng.integers(1, 5000, n) * rng.uniform(0.5, 1.0, n)
    unit = float(rng.choice([1000, 2000, 4096, 3333.5, float(np.max(L)), float(np.max(L)) / 3]))
    return L, unit


@pytest.mark.parametrize("name,kernel", _kernels(), ids=lambda x: x if isinstance(x, str) else "")
def test_kernel_bins_equal_the_numpy_paths(monkeypatch, name, kernel):
    rng = np.random.default_rng(8)
    for _ in range(300 if name == "numba" else 80):
        L, unit = _draw(rng)
        monkeypatch.setattr(bfd, "_compiled_loop", lambda: None)
        want = bfd.bfd_groups(L, unit)
        monkeypatch.setattr(bfd, "_compiled_loop", lambda: kernel)
        monkeypatch.setattr(bfd, "JIT_MIN_SEQUENCES", 0)
        got = bfd.bfd_groups(L, unit)
        monkeypatch.undo()
        assert got == want, (name, L.size, unit)
