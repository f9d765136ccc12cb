"""The cost model's kernels (``fcp_data.cost_kernel``) and stage 2's allocation kernel (``fcp_data.plan.allocate_kernel``)
give bit-for-bit what the numpy paths give: ``CostModel.time`` on random models (every §4.1 switch on and off,
visual tokens or None, scalar degrees and node flags, float32 and int inputs), the dense stage-2 table, and
``allocate_fast`` on random tables (ties, ``inf`` entries, masks, tables with no allocation). Each kernel runs
compiled when numba is installed and as plain Python, so the comparison holds without numba. Also: a process that
never compiled a planner kernel keeps the numpy path (numba is not imported for small plans)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import fcp_data.cost_kernel as ck
import fcp_data.plan.allocate as alloc
from fcp_data import jit
from fcp_data.cost_kernel import TABLE_SIGNATURE, TIME_SIGNATURE, table_loop, time_loop
from fcp_data.plan.allocate_kernel import SIGNATURE as ALLOC_SIGNATURE
from fcp_data.plan.allocate_kernel import allocate_loop
from fcp_data.presets import preset_cost_model
from _kernels import kernel_variants  # tests/plan/_kernels.py

BASE = preset_cost_model("Qwen3-8B", "ascend-910c", v2=True)


_variants = kernel_variants


def _model(rng: np.random.Generator):
    kw = {k: 0.0 if rng.random() < 0.3 else float(getattr(BASE, k) or 1e-6) * 10 ** rng.uniform(-2, 2)
          for k in ("alpha1", "alpha2", "alpha3", "beta1", "beta2", "gamma", "alpha_blk", "alpha_vis")}
    kw.update(bandwidth_intra=10 ** rng.uniform(9, 12), bandwidth_inter=10 ** rng.uniform(8, 11),
              ranks_per_node=int(rng.integers(1, 17)), tokens_per_rank=int(rng.integers(1000, 100_000)))
    try:
        return BASE.replace(**kw)
    except ValueError:  # out of the model's range: draw again
        return _model(rng)


def _groups(rng: np.random.Generator, K: int):
    S = rng.integers(1, 500_000, K).astype(np.float64)
    e = rng.integers(0, 2, K)
    V = rng.uniform(0, 1e4, K) if rng.random() < 0.5 else None
    return S, (1 + e) * S * S, (1 + e) * S, V


@pytest.mark.parametrize("name,time_k,table_k", [(a, f, g) for (a, f), (_, g) in
                                                  zip(_variants(time_loop, TIME_SIGNATURE),
                                                      _variants(table_loop, TABLE_SIGNATURE))],
                         ids=lambda x: x if isinstance(x, str) else "")
def test_time_and_table_kernels_equal_the_numpy_path(monkeypatch, name, time_k, table_k):
    rng = np.random.default_rng(31)
    for trial in range(400 if name == "numba" else 120):
        cm = _model(rng)
        K, N = int(rng.integers(1, 40)), int(rng.integers(1, 70))
        S, Q, B, V = _groups(rng, K)
        d = rng.integers(1, 70, K).astype(np.float64)
        intra = rng.random(K) < 0.5
        if trial % 5 == 1:
            d, intra = int(d[0]), bool(intra[0])  # scalars, as tau's prefix scan passes them
        if trial % 7 == 2:
            S, Q = S.astype(np.float32), Q.astype(np.int64)  # converted as the numpy path converts them
        Bx = None if not cm.alpha_blk and trial % 2 else B
        monkeypatch.setattr(jit, "_ACTIVE", [False])
        want = cm.time(S, Q, d, intra, B=Bx, V=V)
        want_table = alloc.TimeTable(S, Q, N, cm, B=Bx, V=V).dense()
        monkeypatch.setattr(jit, "_ACTIVE", [True])
        monkeypatch.setattr(ck, "time_kernel", lambda: time_k)
        monkeypatch.setattr(ck, "table_kernel", lambda: table_k)
        got = ck.compiled_time(cm, S, Q, d, intra, Bx, V)
        got_table = alloc.TimeTable(S, Q, N, cm, B=Bx, V=V).dense()
        assert got is not None and np.array_equal(got, want), (name, trial)
        assert np.array_equal(got_table, want_table), (name, trial)
        assert np.array_equal(cm.time(S, Q, d, intra, B=Bx, V=V), want)  # the public entry point takes the kernel


def test_kernel_path_declines_what_it_does_not_cover(monkeypatch):
    """2-D (broadcast) arguments, mismatched lengths and alpha_blk without B go to the numpy path (which raises
    the error for the last)."""
    monkeypatch.setattr(jit, "_ACTIVE", [True])
    monkeypatch.setattr(ck, "time_kernel", lambda: time_loop)
    S = np.array([1000.0, 2000.0])
    assert ck.compiled_time(BASE, S[:, None], S[:, None], np.array([[1.0, 2.0]]), True, None, None) is None
    assert ck.compiled_time(BASE, S, S, np.ones(3), True, S, None) is None
    assert ck.compiled_time(BASE, S, S * S, np.ones(2), True, None, None) is None  # BASE has alpha_blk > 0
    with pytest.raises(TypeError, match="needs B"):
        BASE.time(S, S * S, np.ones(2), True)
    monkeypatch.setattr(jit, "_ACTIVE", [False])
    assert ck.compiled_time(BASE, S, S * S, np.ones(2), True, S, None) is None  # no kernel loaded: numpy


def _tables(rng: np.random.Generator):
    K = int(rng.integers(1, 30))
    N = int(rng.integers(K, 70)) if rng.random() < 0.9 else K
    if rng.random() < 0.4:  # few distinct values: ties everywhere
        T = rng.choice([1.0, 2.0, 3.0, 5.0], size=(K, N))
    else:
        T = np.sort(rng.uniform(0, 10, (K, N)), axis=1)[:, ::-1] + rng.uniform(0, 1, (K, N))
    T[rng.random((K, N)) < rng.uniform(0, 0.6)] = np.inf
    allowed = rng.random(N) < 0.7 if rng.random() < 0.3 else None
    return T, N, allowed


@pytest.mark.parametrize("name,kernel", _variants(allocate_loop, ALLOC_SIGNATURE),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_allocation_kernel_equals_the_numpy_path(monkeypatch, name, kernel):
    rng = np.random.default_rng(32)
    none = 0
    for trial in range(1500 if name == "numba" else 300):
        T, N, allowed = _tables(rng)
        monkeypatch.setattr(jit, "_ACTIVE", [False])
        want = alloc.allocate_fast(T, N, allowed)
        monkeypatch.setattr(jit, "_ACTIVE", [True])
        monkeypatch.setattr(alloc, "dense_kernel", lambda: kernel)
        got = alloc.allocate_fast(T, N, allowed)
        assert got[0] == want[0], (name, trial)
        assert (got[1] is None and want[1] is None) or np.array_equal(got[1], want[1]), (name, trial)
        none += want[1] is None
    assert 0 < none < trial  # tables without an allocation were drawn, and with one


def test_small_plans_never_import_numba():
    """Planning below the kernels' thresholds keeps numba out of the process (its import costs ~1 s, ~120 MB):
    the cost model's kernels only run once a planner kernel has loaded it."""
    code = ("import sys, numpy as np\nfrom fcp_data.plan import plan_batch\nfrom fcp_data.presets import "
            "preset_cost_model\ncm = preset_cost_model('Qwen3-8B', 'ascend-910c', v2=True)\n"
            "plan_batch(np.array([4096, 9000, 30000, 1200, 800, 70000]), num_ranks=8, cost_model=cm)\n"
            "print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
