"""The configuration of an :class:`~fcp_data.sampler.FCPSampler`: one frozen dataclass, validated once.

Every field that decides which lists the sampler yields is part of the resume fingerprint
(:meth:`SamplerConfig.fingerprint`, stored in ``state_dict()["config"]``); a field marked
``metadata={"fingerprint": False}`` (only ``prefetch``: how far ahead the planner runs) does not change the
result. The fingerprint is derived from the fields, so a new option can never escape the resume check.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fcp_data.cost import MAX_RANKS, CostModel
from fcp_data.sampler_inputs import check_solver_options
from fcp_data.strict import flag

__all__ = ["SamplerConfig", "OVERLONG_CHOICES"]

OVERLONG_CHOICES = ("error", "truncate", "drop")
MAX_COUNT = 1 << 40  # the largest batch / token / step count accepted: beyond it numpy's int64 arithmetic overflows


def _index(name: str, v: Any) -> int:
    """An integer argument as a Python int: ints, numpy and 0-d torch integers (anything with ``__index__``);
    a bool, float or string is refused rather than rounded or parsed."""
    if isinstance(v, (bool, np.bool_)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    try:
        return operator.index(v)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(v).__name__} {v!r:.40}") from None


def _positive_int_or_none(name: str, v: Any) -> int | None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if v is not None and v > MAX_COUNT:
        raise ValueError(f"{name}={v} is beyond any real run (at most {MAX_COUNT}); check the value")
    return None if v is None else int(v)


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """What :class:`~fcp_data.sampler.FCPSampler` plans with besides the data (its docstring explains each)."""

    num_ranks: int
    rank: int
    cost_model: CostModel
    global_batch_size: int | None = None
    global_batch_tokens: int | None = None
    seed: int = 0
    drop_last: bool = False
    on_overlong: str = "error"
    solver: str = "fcp"
    micro_batches: str | int = "auto"
    solver_options: dict[str, Any] = field(default_factory=dict)
    prefetch: int = field(default=2, metadata={"fingerprint": False})

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise once, here
        put(self, "num_ranks", _index("num_ranks", self.num_ranks))
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if self.num_ranks > MAX_RANKS:
            raise ValueError(f"num_ranks={self.num_ranks} is more than the planner supports ({MAX_RANKS}); plan the "
                             "context-parallel ranks of one data-parallel replica, not the whole cluster")
        put(self, "rank", _index("rank", self.rank))
        if not 0 <= self.rank < self.num_ranks:
            raise ValueError(f"rank must be in [0, num_ranks={self.num_ranks}), got {self.rank}")
        cm = CostModel.from_dict(self.cost_model) if isinstance(self.cost_model, dict) else self.cost_model
        if not isinstance(cm, CostModel):
            raise TypeError(f"cost_model must be a CostModel (or its dict), got {type(cm).__name__}")
        put(self, "cost_model", cm)
        if (self.global_batch_size is None) == (self.global_batch_tokens is None):
            raise ValueError("give exactly one of global_batch_size (sequences) or global_batch_tokens")
        put(self, "global_batch_size", _positive_int_or_none("global_batch_size", self.global_batch_size))
        put(self, "global_batch_tokens", _positive_int_or_none("global_batch_tokens", self.global_batch_tokens))
        if self.on_overlong not in OVERLONG_CHOICES:
            raise ValueError(f"on_overlong must be 'error', 'truncate' or 'drop', got {self.on_overlong!r}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, (int, float, np.integer, np.floating)) \
                or not 0 <= self.prefetch <= MAX_COUNT or int(self.prefetch) != self.prefetch:
            raise ValueError(f"prefetch must be an integer from 0 to {MAX_COUNT} (global batches planned ahead), "
                             f"got {self.prefetch!r}")
        put(self, "prefetch", int(self.prefetch))
        mb = self.micro_batches
        if not (isinstance(mb, str) and mb == "auto" or (isinstance(mb, (int, np.integer)) and not isinstance(mb, bool)
                                                         and 1 <= mb <= MAX_COUNT)):
            raise ValueError(f"micro_batches must be 'auto' or an int from 1 to {MAX_COUNT}, got {mb!r}")
        put(self, "micro_batches", mb if isinstance(mb, str) else int(mb))  # a numpy int, as num_ranks takes one
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0 (numpy seeds its generator with [seed, epoch]), "
                             f"got {self.seed!r}")
        put(self, "seed", int(self.seed))
        put(self, "drop_last", flag("drop_last", self.drop_last))  # bool("no") is True: no guess
        self._check_solver()

    def _check_solver(self) -> None:
        from fcp_data.plan.registry import get_solver

        spec = get_solver(self.solver)  # unknown: ValueError listing the registered solvers
        if not spec.deterministic:  # every rank plans on its own: e.g. the ILP's result depends on wall-clock time
            why = "time-limited" if spec.time_limited else "registered as non-deterministic"
            raise ValueError(f"solver={self.solver!r} is {why}, so ranks could compute different plans; use 'fcp' "
                             f"(or 'exhaustive' for tiny batches) in the sampler and {self.solver!r} for offline checks")
        object.__setattr__(self, "solver", str(self.solver))
        object.__setattr__(self, "solver_options", check_solver_options(self.solver_options, self.solver,
                                                                        self.num_ranks, self.cost_model))

    @classmethod
    def fingerprint_fields(cls) -> tuple[str, ...]:
        """The fields a resumed sampler must share with the one that saved the state."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("fingerprint", True))

    def fingerprint(self) -> dict[str, Any]:
        """The fingerprint fields as plain JSON types (the cost model as its dict)."""
        out: dict[str, Any] = {}
        for name in self.fingerprint_fields():
            v = getattr(self, name)
            out[name] = v.to_dict() if isinstance(v, CostModel) else dict(v) if isinstance(v, dict) else v
        return out
