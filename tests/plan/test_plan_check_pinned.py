"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/plan_check.py.

The registry tests break plans grossly (everything on one rank: 2x memory; overlapping ranks through the checking
MicroBatchPlan constructor, which refuses before the checker runs), so a weakened checker survived them."""
from __future__ import annotations

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.plan import CPGroup, InvalidPlanError, MicroBatchPlan, plan_batch, register_solver, unregister_solver
from fcp_data.plan.placement import placed_times

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)


@pytest.fixture
def toy():
    names = []

    def add(name, fn):
        register_solver(name, fn, help="toy")
        names.append(name)

    yield add
    for n in names:
        unregister_solver(n)


def _time(lengths, ranks):
    s = np.asarray(lengths, dtype=np.float64)
    return float(placed_times([s.sum()], [(s * s).sum()], [tuple(ranks)], CM)[0])


def test_one_token_over_memory_is_an_invalid_plan(toy):
    """A group holding tokens_per_rank + 1 tokens on one rank breaks memory (mutant: the memory bound
    doubled survived, since the registry's overfull toy is > 2x over)."""
    lengths = [8000, 193]  # 8193 tokens = E + 1

    def one_rank(lengths, etas, num_ranks, cost_model, *, visual=None):
        t = _time(lengths, (0,))
        return MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=range(len(lengths)), time=t),), makespan=t), None

    toy("over-by-one", one_rank)
    with pytest.raises(InvalidPlanError, match="more than its memory"):
        plan_batch(lengths, num_ranks=2, cost_model=CM, solver="over-by-one")


def test_overlapping_ranks_from_a_prechecked_plan_are_named_by_the_checker(toy):
    """A solver that builds its plan with the unchecked constructors (MicroBatchPlan.prechecked, as the planner's own
    candidates do) and gives rank 1 to two groups: the checker must name the solver and the broken invariant
    (mutant: the checker's overlap test removed survived; the error then comes later, not naming the solver)."""
    lengths = [3000, 2000, 1000]

    def overlap(lengths, etas, num_ranks, cost_model, *, visual=None):
        t0, t1 = _time(lengths[:1], (0, 1)), _time(lengths[1:], (1, 2))
        groups = (CPGroup(ranks=(0, 1), seq_ids=(0,), time=t0), CPGroup(ranks=(1, 2), seq_ids=(1, 2), time=t1))
        return MicroBatchPlan.prechecked(groups, max(t0, t1)), None

    toy("overlap-prechecked", overlap)
    with pytest.raises(InvalidPlanError, match="solver 'overlap-prechecked'.*ranks overlap"):
        plan_batch(lengths, num_ranks=4, cost_model=CM, solver="overlap-prechecked")


def test_a_time_five_percent_off_is_an_invalid_plan(toy):
    """Group times must be the cost model's on the group's ranks (rtol 1e-6); the registry's toy is 2x off, so
    the checker's tolerance raised to 10 % survived. 5 % off must fail."""
    lengths = [3000, 2000, 1000]

    def slow_clock(lengths, etas, num_ranks, cost_model, *, visual=None):
        t = _time(lengths, range(num_ranks)) * 1.05
        return MicroBatchPlan(groups=(CPGroup(ranks=range(num_ranks), seq_ids=range(len(lengths)), time=t),),
                              makespan=t), None

    toy("slow-clock", slow_clock)
    with pytest.raises(InvalidPlanError, match="but the cost model gives"):
        plan_batch(lengths, num_ranks=4, cost_model=CM, solver="slow-clock")


def test_a_makespan_that_is_not_the_slowest_group_is_an_invalid_plan(toy):
    """The micro-batch makespan must be its slowest group's time (it is summed into Plan.makespan); the check
    removed survived the suite."""
    lengths = [3000, 2000, 1000]

    def half_span(lengths, etas, num_ranks, cost_model, *, visual=None):
        t = _time(lengths, range(num_ranks))
        return MicroBatchPlan(groups=(CPGroup(ranks=range(num_ranks), seq_ids=range(len(lengths)), time=t),),
                              makespan=t / 2), None

    toy("half-span", half_span)
    with pytest.raises(InvalidPlanError, match="is not the slowest group's time"):
        plan_batch(lengths, num_ranks=4, cost_model=CM, solver="half-span")


def test_an_empty_group_is_an_invalid_plan(toy):
    """A group with ranks but no sequence (its time correct: the fixed overheads) is refused; the check removed
    survived the suite."""
    lengths = [3000, 2000, 1000]

    def with_empty(lengths, etas, num_ranks, cost_model, *, visual=None):
        t = _time(lengths, (0, 1))
        t_empty = _time([], (2, 3))
        groups = (CPGroup(ranks=(0, 1), seq_ids=range(len(lengths)), time=t), CPGroup(ranks=(2, 3), seq_ids=(), time=t_empty))
        return MicroBatchPlan(groups=groups, makespan=max(t, t_empty)), None

    toy("with-empty", with_empty)
    with pytest.raises(InvalidPlanError, match="holds no sequence"):
        plan_batch(lengths, num_ranks=4, cost_model=CM, solver="with-empty")


def test_a_negative_rank_of_a_prechecked_plan_is_named_by_the_checker(toy):
    """A solver building its plan with the unchecked constructors puts a group on rank -1: the checker only compared
    the highest rank with ``num_ranks``, so the plan passed it and failed later with "ranks must be >= 0", naming no
    solver (found by the mutation review, stop 60)."""
    lengths = [3000, 2000]

    def negative(lengths, etas, num_ranks, cost_model, *, visual=None):
        t = _time(lengths, (-1, 0))
        return MicroBatchPlan.prechecked((CPGroup.prechecked((-1, 0), tuple(range(len(lengths))), t),), t), None

    toy("negative-rank", negative)
    with pytest.raises(InvalidPlanError, match=r"solver 'negative-rank'.*rank -1 does not exist \(ranks are 0..3\)"):
        plan_batch(lengths, num_ranks=4, cost_model=CM, solver="negative-rank")
