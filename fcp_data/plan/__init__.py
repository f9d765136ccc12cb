"""Planning: stage 1 BFD grouping, stage 2 degree allocation, placement, micro-batch planner,
exact references (ILP, exhaustive) and baselines. numpy only; cvxpy is imported lazily by the ILP."""

from fcp_data.plan.types import CPGroup, MicroBatchPlan, Plan

__all__ = ["CPGroup", "MicroBatchPlan", "Plan"]
