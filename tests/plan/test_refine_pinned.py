"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/refine.py."""
from __future__ import annotations

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.plan.refine import refine_moves
from fcp_data.plan.placement import placed_times
from fcp_data.plan.types import CPGroup, MicroBatchPlan

CM = CostModel(alpha1=1e-10, alpha2=1e-5, alpha3=1e4, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
               bandwidth_inter=1e10, ranks_per_node=8, tokens_per_rank=1 << 20)


def _plan(groups, ranks, lengths):
    s = lengths.astype(float)
    S = np.array([s[g].sum() for g in groups])
    Q = np.array([(s[g] ** 2).sum() for g in groups])
    t = placed_times(S, Q, ranks, CM)
    return MicroBatchPlan(groups=tuple(CPGroup(ranks=r, seq_ids=tuple(g), time=float(x)) for g, r, x in zip(groups, ranks, t)),
                          makespan=float(t.max()))


def test_refinement_keeps_moving_until_balanced():
    """11 equal sequences, 10 on rank 0 and 1 on rank 1: the local search must keep moving sequences out of the
    slowest group while that helps, ending at the balanced 6 | 5 split (hand-derived optimum of two single ranks).
    Mutant: refine_moves' max_moves 32 -> 1 survived the suite (one move leaves 9 | 2)."""
    lengths = np.full(11, 1000, dtype=np.int64)
    mb = _plan([list(range(10)), [10]], [(0,), (1,)], lengths)
    out = refine_moves(mb, lengths, np.zeros(11), CM)
    want = CM.beta1 + CM.alpha1 * 6 * 1000.0 ** 2 + CM.alpha2 * 6000.0  # six sequences on one rank
    assert out.makespan == pytest.approx(want, rel=1e-12)
    assert sorted(len(g.seq_ids) for g in out.groups) == [5, 6]
    assert sorted(k for g in out.groups for k in g.seq_ids) == list(range(11))
