"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/microbatch.py."""
from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch
from fcp_data.plan.microbatch import plan_micro_batches
from fcp_data.plan.types import CPGroup, MicroBatchPlan

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)


def _fake(lengths, seen):
    """solve_one whose micro-batch makespan is (its sequence count)²: more micro-batches are always cheaper."""
    def solve_one(ids, left=1):
        seen.append(len(ids))
        t = float(len(ids)) ** 2
        return MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=range(len(ids)), time=t),), makespan=t), None
    return solve_one


def test_auto_tries_extra_more_micro_batch_counts():
    """auto: from the first M whose bins fit, ``extra`` (default 2) more counts are solved and the cheapest kept.
    Here the cheapest is always the largest M tried, so auto must end at M = first fit + 2 = 3 (mutant: the
    window one shorter, ``M >= first_fit + extra``, survived the suite)."""
    lengths = np.full(12, 100, dtype=np.int64)  # fits one micro-batch: first fit M = 1
    seen = []
    mbs, _ = plan_micro_batches(lengths, np.zeros(12), 4, CM, _fake(lengths, seen), "auto", prune=False)
    assert len(mbs) == 3
    assert sorted(k for mb in mbs for g in mb.groups for k in g.seq_ids) == list(range(12))  # each sequence once


def test_auto_keeps_fewer_micro_batches_on_ties():
    """On one rank with only a per-token cost (alpha2 a power of two: sums are exact), every split of the batch has
    the same total makespan; auto must keep the fewest micro-batches (DESIGN §5 / microbatch docstring: "fewer
    micro-batches on ties"). Mutant: ``cost <= best_cost`` (ties to more micro-batches) survived the suite."""
    cm = CostModel(alpha1=0.0, alpha2=2.0 ** -20, alpha3=0.0, beta1=0.0, beta2=0.0, bandwidth_intra=1e11,
                   bandwidth_inter=1e10, ranks_per_node=1, tokens_per_rank=8192)
    lengths = [1000, 2000, 500, 700, 300, 1200]
    plan = plan_batch(lengths, num_ranks=1, cost_model=cm, micro_batches="auto")
    assert len(plan.micro_batches) == 1
    assert plan.makespan == cm.alpha2 * sum(lengths)


def test_plan_is_optimal_only_when_every_micro_batch_is():
    """An exact solver's ``optimal`` over several micro-batches is the AND of theirs (one unproved micro-batch makes
    the plan unproved); mutant: ``optimal or opt`` survived the suite."""
    lengths = np.array([3000, 2500, 2000, 1500], dtype=np.int64)
    flags = iter([True, False])

    def solve_one(ids, left=1):
        t = float(len(ids))
        return MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=range(len(ids)), time=t),), makespan=t), next(flags)

    mbs, optimal = plan_micro_batches(lengths, np.zeros(4), 4, CM, solve_one, 2)
    assert len(mbs) == 2 and optimal is False


def test_fixed_count_refusal_names_the_memory_minimum():
    """min_micro_batches is ceil(Σs / (N·E)) and the refusal of a too-small fixed count says so (mutant: one less
    survived the suite: auto's first count below it only solves nothing)."""
    import pytest
    from fcp_data.plan.microbatch import min_micro_batches

    lengths = np.full(10, 8000, dtype=np.int64)  # 80,000 tokens on 2 x 8192: at least 5 micro-batches
    assert min_micro_batches(lengths, 2, CM) == 5
    assert min_micro_batches(np.array([8192 * 2]), 2, CM) == 1  # exactly full
    with pytest.raises(ValueError, match="at least 5 needed by memory"):
        plan_batch(lengths, num_ranks=2, cost_model=CM, micro_batches=3)
