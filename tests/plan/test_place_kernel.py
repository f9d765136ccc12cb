"""The placement kernel (``fcp_data.plan.place_kernel``, compiled by numba when installed) gives the numpy path's
ranks: ``place_groups`` on random degree lists — whole-node groups, best fit with ties between nodes, remainders
that no node holds (spread over the nodes with most free ranks), long tails of degree-1 groups, a partial last node,
one node, one rank per node, every rank used or some left idle. Run as plain Python too, so the comparison holds
without numba."""

from __future__ import annotations

import numpy as np
import pytest

import fcp_data.plan.placement as placement
from fcp_data.plan.place_kernel import SIGNATURE, place_loop
from _kernels import kernel_variants  # tests/plan/_kernels.py


def _draw(rng: np.random.Generator) -> tuple[list[int], int, int]:
    N = int(rng.integers(1, 300))
    R = int(rng.choice([1, 2, 3, 4, 8, 16, N, int(rng.integers(1, N + 1))]))
    budget = N if rng.random() < 0.5 else int(rng.integers(1, N + 1))  # every rank used, or some idle
    kind = int(rng.integers(0, 4))
    degrees: list[int] = []
    while budget > 0:
        if kind == 0:
            d = int(rng.integers(1, budget + 1))
        elif kind == 1:  # mostly small groups around the node size: best fit, ties, stranded remainders
            d = int(min(budget, rng.choice([1, 2, 3, max(1, R - 1), R, R + 1, max(1, R // 2)])))
        elif kind == 2:  # one or two wide groups, then degree 1
            d = int(min(budget, rng.integers(1, 3 * R + 2))) if len(degrees) < 2 else 1
        else:
            d = int(min(budget, rng.geometric(0.3)))
        degrees.append(d)
        budget -= d
    rng.shuffle(degrees)
    return degrees, N, R


@pytest.mark.parametrize("name,kernel", kernel_variants(place_loop, SIGNATURE),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_kernel_ranks_equal_the_numpy_path(monkeypatch, name, kernel):
    rng = np.random.default_rng(12)
    monkeypatch.setattr(placement, "PLACE_JIT_MIN_GROUPS", 1)
    monkeypatch.setattr(placement.jit, "active", lambda: True)
    monkeypatch.setattr(placement, "place_kernel", lambda: kernel)
    spread = 0
    for _ in range(1500 if name == "numba" else 300):
        degrees, N, R = _draw(rng)
        want = placement._place(list(degrees), N, R)
        got = placement.place_groups(np.array(degrees, dtype=np.int64), N, R)
        assert got == want, (name, degrees, N, R)
        spread += any(len({r // R for r in g}) > 1 + (len(g) - 1) // R for g in want)
    assert spread > 20  # remainders that no node held were drawn (a group spread over more nodes than it needs)


def test_small_placements_stay_in_python(monkeypatch):
    """Below PLACE_JIT_MIN_GROUPS groups, or before any kernel loaded numba in the process, the kernel is not asked."""
    monkeypatch.setattr(placement, "place_kernel", lambda: pytest.fail("kernel asked"))
    monkeypatch.setattr(placement.jit, "active", lambda: False)
    assert placement.place_groups([2] * 20, 64, 16) == placement._place([2] * 20, 64, 16)
    monkeypatch.setattr(placement.jit, "active", lambda: True)
    k = placement.PLACE_JIT_MIN_GROUPS - 1
    assert placement.place_groups([1] * k, 64, 16) == [(r,) for r in range(k)]
