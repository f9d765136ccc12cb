"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/inputs.py and types.py."""
from __future__ import annotations

import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch
from fcp_data.plan.types import CPGroup, Plan

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)


def test_a_sequence_one_token_over_all_ranks_is_named_as_overlong():
    """validate_inputs names a sequence longer than N·tokens_per_rank (and suggests truncate/drop); at exactly
    N·E + 1 tokens too (mutant: ``arr > cap + 1`` survived: the solver then fails with a generic message)."""
    cap = 2 * CM.tokens_per_rank
    plan_batch([cap, 10], num_ranks=2, cost_model=CM, micro_batches="auto")  # exactly full: fine
    with pytest.raises(ValueError, match=r"sequence 0 has 16385 tokens but 2 ranks × 8192 tokens_per_rank hold at most 16384"):
        plan_batch([cap + 1, 10], num_ranks=2, cost_model=CM, micro_batches="auto")


def test_plan_json_with_a_repeated_rank_in_one_group_is_refused():
    """A CP group's ranks must be distinct (ring order over distinct ranks); a plan JSON repeating a rank inside one
    group is refused at load (mutant: the distinctness check removed survived the suite)."""
    with pytest.raises(ValueError, match="distinct"):
        CPGroup(ranks=(1, 1), seq_ids=(0,), time=1.0)
    d = {"num_ranks": 4, "solver": "x", "solve_ms": 0.0, "makespan": 1.0,
         "micro_batches": [{"makespan": 1.0, "groups": [{"ranks": [2, 2], "seq_ids": [0], "time": 1.0}]}]}
    with pytest.raises(ValueError, match="distinct"):
        Plan.from_dict(d)


def test_plan_json_with_rank_equal_to_num_ranks_is_refused():
    """Ranks are 0..num_ranks-1; a plan naming rank num_ranks is refused at load (mutant: ``>`` for ``>=`` survived)."""
    d = {"num_ranks": 4, "solver": "x", "solve_ms": 0.0, "makespan": 1.0,
         "micro_batches": [{"makespan": 1.0, "groups": [{"ranks": [3, 4], "seq_ids": [0], "time": 1.0}]}]}
    with pytest.raises(ValueError, match="out of range"):
        Plan.from_dict(d)
    Plan.from_dict({**d, "num_ranks": 5})  # in range: fine
