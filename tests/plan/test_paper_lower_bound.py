"""The §4.1 lower bound printed next to every FCP time in docs/EVALUATION.md (``benchmarks/paper/common.py::
lower_bound``) is a true lower bound: never above the exhaustive optimum (tiny batches, one micro-batch, v1 and v2
presets, causal/full masks, visual tokens) nor above FCP's plan with ``micro_batches="auto"``; and it is tight for a
single sequence (its best degree alone). A failure means the report claims a bound that some plan beats."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from fcp_data.plan import plan_batch
from fcp_data.presets import preset_cost_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "paper"))
from common import lower_bound  # noqa: E402

REL = 1e-9  # float summation order only


def _cm(v2: bool, tokens_per_rank: int, ranks_per_node: int = 8):
    kw = {"frozen_vision": False} if v2 else {}
    return preset_cost_model("Qwen3-VL-8B", "h100", v2=v2, tokens_per_rank=tokens_per_rank,
                             ranks_per_node=ranks_per_node, **kw)


@pytest.mark.parametrize("v2", [False, True])
def test_bound_below_exhaustive_optimum(v2):
    rng = np.random.default_rng(3 if v2 else 4)
    checked = 0
    for _ in range(25):
        n, N = int(rng.integers(1, 6)), int(rng.choice([2, 3, 4, 8]))
        E = 8192
        L = rng.integers(64, 2 * E, n).astype(np.int64)
        if L.sum() > N * E or (np.ceil(L / E) > N).any():
            continue  # one micro-batch must be feasible for the exhaustive reference
        etas = (rng.random(n) < 0.3).astype(float)
        vis = (L * rng.random(n) * 0.9).astype(np.int64) if v2 else None
        cm = _cm(v2, E, ranks_per_node=int(rng.choice([2, 4, 8])))  # small nodes: rings cross them
        best = plan_batch(L, num_ranks=N, cost_model=cm, etas=etas, solver="exhaustive", micro_batches=1,
                          visual=vis).makespan
        lb = lower_bound(L, N, cm, etas=etas, visual=vis)
        assert 0 < lb <= best * (1 + REL), (L.tolist(), N, lb, best)
        checked += 1
    assert checked >= 10


@pytest.mark.parametrize("v2", [False, True])
def test_bound_below_fcp_auto_on_larger_batches(v2):
    rng = np.random.default_rng(11)
    cm = _cm(v2, 16384)
    for _ in range(4):
        L = np.minimum(rng.lognormal(7.5, 1.6, 200).astype(np.int64) + 1, 60000)
        vis = (L * 0.8).astype(np.int64) if v2 else None
        p = plan_batch(L, num_ranks=16, cost_model=cm, solver="fcp", micro_batches="auto", visual=vis)
        assert lower_bound(L, 16, cm, visual=vis) <= p.makespan * (1 + REL)


def test_bound_tight_for_one_sequence():
    """One sequence: v2's critical-path term is its best degree's time, which the exhaustive solver also finds."""
    cm = _cm(True, 8192)
    for s, v in ((30000, 20000), (5000, 0), (8192, 8000)):
        L, vis = np.array([s]), np.array([v])
        best = plan_batch(L, num_ranks=8, cost_model=cm, solver="exhaustive", micro_batches=1, visual=vis).makespan
        assert lower_bound(L, 8, cm, visual=vis) == pytest.approx(best, rel=1e-9)
