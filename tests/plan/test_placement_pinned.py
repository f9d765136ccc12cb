"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/placement.py."""
from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan.placement import placed_times, repack_stranded
from fcp_data.plan.types import CPGroup, MicroBatchPlan


def test_repack_never_raises_the_makespan_when_crossing_nodes_is_faster():
    """repack_stranded promises "the makespan drops or stays: checked". With a (legal) model whose inter-node
    bandwidth beats the intra-node one, packing a stranded heavy group into one node makes it slower; the repack
    must then be refused (mutant: packed_placement accepting any packing when slowest=False survived)."""
    cm = CostModel(alpha1=1e-9, alpha2=1e-4, alpha3=6e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e9,
                   bandwidth_inter=1e11, ranks_per_node=4, tokens_per_rank=100_000)
    lengths = np.array([300_000, 1_000, 1_000])
    ranks = [(2, 3, 4, 5), (0, 1), (6, 7)]  # the heavy 4-group straddles nodes 0 | 1
    S = lengths.astype(float)
    times = placed_times(S, S * S, ranks, cm)
    mb = MicroBatchPlan(groups=tuple(CPGroup(ranks=r, seq_ids=(k,), time=float(t))
                                     for k, (r, t) in enumerate(zip(ranks, times))), makespan=float(times.max()))
    out = repack_stranded(mb, lengths, np.zeros(3), 8, cm)
    assert out.makespan <= mb.makespan
    assert out.makespan == max(g.time for g in out.groups)
