"""Plan value types and their JSON form (DESIGN.md §6).

A :class:`Plan` is what every solver returns: for each micro-batch, the CP groups (global ranks in ring
order, the input sequences they hold, their §4 time) and the micro-batch makespan. ``seq_ids`` index the
lengths given to the solver; a step's makespan is the sum over its micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fcp_data.strict import strict_keys

__all__ = ["CPGroup", "MicroBatchPlan", "Plan"]


def _int_tuple(values) -> tuple[int, ...]:
    """``values`` as a tuple of Python ints; a tuple or list of ints passes through without a per-item
    conversion (planners build hundreds of thousands of groups per global batch)."""
    if type(values) in (tuple, list) and set(map(type, values)) <= {int}:
        return tuple(values)
    return tuple(int(v) for v in values)


@dataclass(frozen=True, kw_only=True, slots=True)
class CPGroup:
    """One context-parallel group of one micro-batch.

    ``ranks``: global ranks in ring order (``cp_rank`` i is ``ranks[i]``); ``seq_ids``: indices of the
    sequences it holds, in packing order; ``time``: its §4 time on exactly these ranks.
    """

    ranks: tuple[int, ...]
    seq_ids: tuple[int, ...]
    time: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", _int_tuple(self.ranks))
        object.__setattr__(self, "seq_ids", _int_tuple(self.seq_ids))
        object.__setattr__(self, "time", float(self.time))
        if not self.ranks:
            raise ValueError("a CPGroup needs at least one rank")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"a CPGroup's ranks must be distinct, got {self.ranks}")
        if min(self.ranks) < 0:
            raise ValueError(f"ranks must be >= 0, got {self.ranks}")
        if not math.isfinite(self.time) or self.time < 0:
            raise ValueError(f"group time must be a finite number >= 0, got {self.time}")

    @classmethod
    def prechecked(cls, ranks: tuple[int, ...], seq_ids: tuple[int, ...], time: float) -> "CPGroup":
        """A group from values that already meet :meth:`__post_init__`'s rules (tuples of Python ints, distinct
        ranks ≥ 0, a finite time ≥ 0), without re-checking them: for the planner's candidate plans (hundreds per
        micro-batch) built from placement's ranks and the cost model's times. Every plan a solver returns is
        rebuilt through the checking constructor when its ids are mapped back (``microbatch._solve_split``)."""
        group = object.__new__(cls)
        object.__setattr__(group, "ranks", ranks)
        object.__setattr__(group, "seq_ids", seq_ids)
        object.__setattr__(group, "time", time)
        return group

    @property
    def degree(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "seq_ids": list(self.seq_ids), "time": self.time}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CPGroup":
        return cls(**strict_keys(d, ("ranks", "seq_ids", "time"), what="a CP group"))


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroBatchPlan:
    """The CP groups of one micro-batch; ``makespan`` = max group time. Groups' ranks are disjoint."""

    groups: tuple[CPGroup, ...]
    makespan: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(self.groups))
        object.__setattr__(self, "makespan", float(self.makespan))
        seen: set[int] = set()
        for g in self.groups:
            if not isinstance(g, CPGroup):
                raise TypeError(f"groups must hold CPGroup objects, got {type(g).__name__}")
            dup = seen.intersection(g.ranks)
            if dup:
                raise ValueError(f"rank(s) {sorted(dup)} appear in two CP groups of one micro-batch")
            seen.update(g.ranks)

    @classmethod
    def prechecked(cls, groups: tuple[CPGroup, ...], makespan: float) -> "MicroBatchPlan":
        """A micro-batch from a tuple of :class:`CPGroup` whose ranks are already known disjoint (placement's rank
        sets, or a subset of a checked plan's groups on their ranks) and a float makespan, without re-checking:
        for the planner's candidate plans, like :meth:`CPGroup.prechecked` (the plan a solver returns is rebuilt
        through the checking constructor when its ids are mapped back)."""
        plan = object.__new__(cls)
        object.__setattr__(plan, "groups", groups)
        object.__setattr__(plan, "makespan", makespan)
        return plan

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(s for g in self.groups for s in g.seq_ids)

    @property
    def degrees(self) -> tuple[int, ...]:
        return tuple(g.degree for g in self.groups)

    def group_of_rank(self, rank: int) -> CPGroup | None:
        for g in self.groups:
            if rank in g.ranks:
                return g
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"makespan": self.makespan, "groups": [g.to_dict() for g in self.groups]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "MicroBatchPlan":
        kw = strict_keys(d, ("makespan", "groups"), what="a micro-batch")
        return cls(makespan=kw["makespan"], groups=tuple(CPGroup.from_dict(g) for g in kw["groups"]))


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A solver's answer for one global batch: its micro-batches in execution order.

    ``makespan`` is the step time, the sum of the micro-batch makespans. ``solve_ms`` is the wall time
    the solver took. ``optimal`` is set by exact solvers (True when optimality was proved), else None.
    """

    num_ranks: int
    solver: str
    solve_ms: float
    makespan: float
    micro_batches: tuple[MicroBatchPlan, ...]
    optimal: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "micro_batches", tuple(self.micro_batches))
        object.__setattr__(self, "num_ranks", int(self.num_ranks))
        object.__setattr__(self, "solve_ms", float(self.solve_ms))
        object.__setattr__(self, "makespan", float(self.makespan))
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        for mb in self.micro_batches:
            for g in mb.groups:
                if max(g.ranks) >= self.num_ranks:
                    raise ValueError(f"group ranks {g.ranks} out of range for num_ranks={self.num_ranks}")

    @property
    def seq_ids(self) -> tuple[int, ...]:
        return tuple(s for mb in self.micro_batches for s in mb.seq_ids)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "num_ranks": self.num_ranks,
            "solver": self.solver,
            "solve_ms": self.solve_ms,
            "makespan": self.makespan,
            "micro_batches": [mb.to_dict() for mb in self.micro_batches],
        }
        if self.optimal is not None:
            d["optimal"] = self.optimal
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        kw = strict_keys(d, ("num_ranks", "solver", "solve_ms", "makespan", "micro_batches"), ("optimal",), what="a plan")
        kw["micro_batches"] = tuple(MicroBatchPlan.from_dict(m) for m in kw["micro_batches"])
        return cls(**kw)
