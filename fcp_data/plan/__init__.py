"""Planning: stage 1 BFD grouping, stage 2 degree allocation, placement, micro-batch planner,
exact references (ILP, exhaustive) and baselines. numpy only; cvxpy is imported lazily by the ILP.

Entry point: :func:`plan_batch` (``SOLVERS[name]`` is the same call with the solver fixed). Solvers are
registered in :mod:`fcp_data.plan.registry`; to add one, call :func:`register_solver` (or name a module that
does in ``$FCP_SOLVER_PLUGINS``).
"""

from fcp_data.plan.allocate import allocate_fast, pow2_mask, time_table
from fcp_data.plan.allocate_dp import allocate_dp
from fcp_data.plan.baselines import megatron_dynamic, static_cp, ulysses, ulysses_time
from fcp_data.plan.bfd import bfd_groups, candidate_units
from fcp_data.plan.inputs import validate_visual
from fcp_data.plan.microbatch import TimeBudgetExceeded, plan_micro_batches, split_micro_batches
from fcp_data.plan.placement import place_groups, placed_times
from fcp_data.plan.solvers import (MAX_DP_RANKS, MAX_RANKS, MAX_SEQUENCE_TOKENS, SOLVER_NAMES, SOLVERS, fcp_micro_batch,
                                   plan_batch, validate_inputs)
from fcp_data.plan.registry import (BASELINE_NAMES, InvalidPlanError, SolverSpec, get_solver, register_solver,
                                    solver_names, solver_specs, unregister_solver)
from fcp_data.plan.types import CPGroup, MicroBatchPlan, Plan

__all__ = [
    "CPGroup", "MicroBatchPlan", "Plan",
    "plan_batch", "SOLVERS", "SOLVER_NAMES", "validate_inputs", "validate_visual", "fcp_micro_batch",
    "MAX_RANKS", "MAX_DP_RANKS", "MAX_SEQUENCE_TOKENS", "TimeBudgetExceeded",
    "SolverSpec", "register_solver", "unregister_solver", "get_solver", "solver_names", "solver_specs",
    "BASELINE_NAMES", "InvalidPlanError",
    "bfd_groups", "candidate_units", "time_table", "allocate_fast", "allocate_dp", "pow2_mask",
    "place_groups", "placed_times", "plan_micro_batches", "split_micro_batches",
    "static_cp", "ulysses", "ulysses_time", "megatron_dynamic",
]
