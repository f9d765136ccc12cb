"""The check of a registered solver's plan for one micro-batch (:func:`check_micro_batch`, see
:mod:`fcp_data.plan.registry`): every sequence exactly once, ranks in range and disjoint, memory, each group's
time the §4/§4.1 time on its ranks, makespan the slowest group."""

from __future__ import annotations

from typing import Any

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.placement import placed_times
from fcp_data.plan.types import MicroBatchPlan

__all__ = ["InvalidPlanError", "check_micro_batch"]

_TIME_RTOL = 1e-6


class InvalidPlanError(ValueError):
    """A registered solver returned a plan the executor cannot run (or times off the cost model)."""


def check_micro_batch(spec: Any, result: Any, lengths: np.ndarray, etas: np.ndarray, num_ranks: int,
                      cost_model: CostModel, visual: np.ndarray | None = None) -> tuple[MicroBatchPlan, bool | None]:
    """``result`` of ``spec.solve`` on one micro-batch, checked (module doc); :class:`InvalidPlanError`
    names the solver and the first broken invariant."""
    def bad(why: str) -> InvalidPlanError:
        return InvalidPlanError(f"solver {spec.name!r} returned an invalid plan for a micro-batch of {lengths.size} "
                                f"sequences on {num_ranks} ranks: {why}")

    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], MicroBatchPlan)
            and (result[1] is None or isinstance(result[1], bool))):
        raise bad(f"expected (MicroBatchPlan, True|False|None), got {type(result).__name__}")
    mb, optimal = result
    if not mb.groups:
        raise bad("no CP group")
    ids = np.fromiter(mb.seq_ids, dtype=np.int64, count=len(mb.seq_ids))
    if ids.size and (ids.min() < 0 or ids.max() >= lengths.size):
        raise bad(f"seq_id {int(ids.min() if ids.min() < 0 else ids.max())} is not in 0..{lengths.size - 1}")
    counts = np.bincount(ids, minlength=lengths.size)
    if (counts != 1).any():
        k = int(np.flatnonzero(counts != 1)[0])
        raise bad(f"sequence {k} is {'missing' if counts[k] == 0 else f'in {int(counts[k])} places'}; every "
                  "sequence must be in exactly one group")
    used = [r for g in mb.groups for r in g.ranks]
    if len(set(used)) != len(used):
        raise bad("ranks overlap: a rank is in two CP groups of one micro-batch")
    low, top = min(used), max(used)
    if low < 0 or top >= num_ranks:  # a prechecked plan skipped CPGroup's own check
        raise bad(f"rank {low if low < 0 else top} does not exist (ranks are 0..{num_ranks - 1})")
    s, q, b, v = sequence_terms(lengths, etas, visual)
    for g in mb.groups:
        if not g.seq_ids:
            raise bad(f"the group on ranks {g.ranks} holds no sequence")
        tokens = float(s[list(g.seq_ids)].sum())
        if tokens > g.degree * cost_model.tokens_per_rank:
            raise bad(f"the group on ranks {g.ranks} holds {tokens:.0f} tokens, more than its memory "
                      f"{g.degree} × tokens_per_rank = {g.degree * cost_model.tokens_per_rank}")
    agg = [np.array([float(x[list(g.seq_ids)].sum()) for g in mb.groups]) for x in (s, q, b, v)]
    want = placed_times(agg[0], agg[1], [g.ranks for g in mb.groups], cost_model, agg[2], agg[3])
    for g, t in zip(mb.groups, want):
        if not abs(g.time - t) <= _TIME_RTOL * max(abs(t), 1e-300):
            raise bad(f"the group on ranks {g.ranks} reports time {g.time!r} s but the cost model gives {float(t)!r} "
                      "s on those ranks (fcp_data.plan.placement.placed_times)")
    if not abs(mb.makespan - max(g.time for g in mb.groups)) <= _TIME_RTOL * max(mb.makespan, 1e-300):
        raise bad(f"makespan {mb.makespan!r} is not the slowest group's time {max(g.time for g in mb.groups)!r}")
    return mb, optimal
