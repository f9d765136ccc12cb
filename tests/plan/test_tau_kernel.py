"""The headroom-fill kernel (``fcp_data.plan.tau_kernel``) gives the numpy path's groupings: ``tau_groupings`` on
random micro-batches (Wikipedia-like long tails, full attention, visual tokens, v1 and v2 models with every §4.1
switch, tight and loose memory, one node and several) with the kernel, compiled when numba is installed and as plain
Python, against the numpy prefix scan. Fails if a prefix sum is re-associated or the memory test dropped."""

from __future__ import annotations

import numpy as np
import pytest

import fcp_data.plan.tau as tau
from fcp_data import jit
from fcp_data.plan.tau_kernel import SIGNATURE, headroom_loop
from fcp_data.presets import preset_cost_model
from _kernels import kernel_variants  # tests/plan/_kernels.py


def _variants():
    return kernel_variants(headroom_loop, SIGNATURE)


def _instance(rng: np.random.Generator):
    cm = preset_cost_model(str(rng.choice(["Qwen3-8B", "Llama3-8B", "Qwen3-1.7B"])), str(rng.choice(["ascend-910c", "h100"])),
                           v2=bool(rng.random() < 0.7))
    scale = {k: float(getattr(cm, k)) * 10 ** rng.uniform(-1, 1) for k in ("alpha1", "alpha2", "alpha3", "gamma",
                                                                              "alpha_blk", "alpha_vis")}
    cm = cm.replace(**scale, tokens_per_rank=int(rng.choice([4096, 16384, 32768])))
    n = int(rng.integers(8, 300))
    L = np.minimum(rng.lognormal(7.5, 1.5, n).astype(np.int64) + 1, 8 * cm.tokens_per_rank)
    etas = (rng.random(n) < 0.3).astype(np.float64) if rng.random() < 0.4 else np.zeros(n)
    visual = (L * rng.uniform(0, 0.9, n)).round() if rng.random() < 0.4 else None
    N = int(rng.choice([4, 8, 16, 24, 64]))
    return L, etas, N, cm, visual


@pytest.mark.parametrize("name,kernel", _variants(), ids=lambda x: x if isinstance(x, str) else "")
def test_headroom_kernel_gives_the_numpy_groupings(monkeypatch, name, kernel):
    rng = np.random.default_rng(41)
    filled_with_light = 0
    for trial in range(150 if name == "numba" else 60):
        L, etas, N, cm, visual = _instance(rng)
        monkeypatch.setattr(jit, "_ACTIVE", [False])
        want = tau.tau_groupings(L, etas, N, cm, visual=visual, spread=1)
        monkeypatch.setattr(jit, "_ACTIVE", [True])
        monkeypatch.setattr(tau, "headroom_kernel", lambda: kernel)
        got = tau.tau_groupings(L, etas, N, cm, visual=visual, spread=1)
        monkeypatch.undo()
        assert got == want, (name, trial)
        filled_with_light += sum(1 for groups, filled in want if filled and any(len(g) > 1 for g in groups))
    assert filled_with_light > 10  # the fill took light sequences often enough to be tested


def test_dense_running_minimum_gives_the_sparse_groupings(monkeypatch):
    """A small tau table is kept dense (``np.minimum.accumulate`` of the whole table) instead of a RunningMin over
    useful degrees: the same groupings on the random instances above (the bisection's target, the ranks per long
    sequence, the coarse variants), and the dense path is the one small instances take."""
    rng = np.random.default_rng(43)
    dense_taken = 0
    for trial in range(120):
        L, etas, N, cm, visual = _instance(rng)
        monkeypatch.setattr(tau, "_DENSE_TAU_MAX", 0)
        want = tau.tau_groupings(L, etas, N, cm, visual=visual, spread=1)
        monkeypatch.setattr(tau, "_DENSE_TAU_MAX", 1 << 30)
        got = tau.tau_groupings(L, etas, N, cm, visual=visual, spread=1)
        monkeypatch.undo()
        assert got == want, trial
        dense_taken += min(L.size, max(int((L > cm.tokens_per_rank).sum()), N // 2)) * N <= tau._DENSE_TAU_MAX
    assert dense_taken > 100
