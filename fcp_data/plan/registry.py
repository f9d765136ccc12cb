"""The solver registry: one :class:`SolverSpec` per solver, the single list every other part derives from.

``plan_batch``'s dispatch and its "unknown solver" message, ``SOLVER_NAMES``/``SOLVERS``, the ``--solver``/
``--solvers``/``--baselines`` choices of ``fcp plan/compare/simulate``, the fixed-degree sweep of ``fcp
simulate``, ``fcp train --planner`` and the sampler's refusal of non-deterministic solvers all read this
registry, so adding a solver is one :func:`register_solver` call.

A solver plans **one micro-batch**: ``solve(lengths, etas, num_ranks, cost_model, *, visual=None, **options)
-> (MicroBatchPlan, optimal)`` with ``seq_ids`` indexing ``lengths``, ``optimal`` True/False for an exact
solver (proved optimal or not) and None otherwise; it raises ``ValueError`` when the micro-batch does not fit
(the micro-batch planner then tries another split). ``visual`` is None for text-only batches.

Plugins: ``FCP_SOLVER_PLUGINS=pkg.mod1,mod2`` names modules that call :func:`register_solver` when imported;
they are imported on the first registry lookup of a process (the CLI, the sampler, ``plan_batch``), so the
same variable reaches ``fcp train``'s worker processes.

Plans of registered solvers are checked (:func:`check_micro_batch`): every sequence exactly once, ranks in
range and disjoint, memory ``Σ s ≤ d · tokens_per_rank``, each group's time the §4/§4.1 time on its ranks,
makespan the slowest group. A broken plan raises :class:`InvalidPlanError` naming the solver. The built-ins
skip the check (it is what ``tests/plan/test_plan_solvers.py`` proves for each of them, and FCP's planning
latency matters).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from fcp_data.cost import MAX_RANKS
from fcp_data.plan import baselines, exhaustive
from fcp_data.plan.inputs import OptionError
from fcp_data.plan.plan_check import InvalidPlanError, check_micro_batch
from fcp_data.plan.types import MicroBatchPlan
from fcp_data.strict import did_you_mean

__all__ = ["SolverSpec", "register_solver", "unregister_solver", "get_solver", "solver_specs", "solver_names",
           "SolverNames", "SolverCalls", "SOLVER_NAMES", "BASELINE_NAMES", "InvalidPlanError", "check_micro_batch",
           "load_plugins", "PLUGINS_ENV", "TIME_LIMIT_OPTION", "MAX_DP_RANKS"]

SolveFn = Callable[..., "tuple[MicroBatchPlan, bool | None]"]
PLUGINS_ENV = "FCP_SOLVER_PLUGINS"
# an option with this name is a wall-clock budget for the whole plan_batch call (see plan_batch); a solver
# that takes it can return different plans for the same input, so it must be registered deterministic=False
TIME_LIMIT_OPTION = "time_limit"
_RESERVED = ("lengths", "etas", "num_ranks", "cost_model", "visual", "solver", "micro_batches")
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*\Z")  # no ':' (fcp train's NAME:D) and no ',' (CLI lists)
MAX_DP_RANKS = 512  # fcp-dp runs Algorithm 1, O(K·N²) per grouping: a reference, not a production solver


@dataclass(frozen=True, kw_only=True, slots=True)
class SolverSpec:
    """One registered solver.

    ``name``: lower-case, digits, ``-_.`` (used on the CLI); ``solve``: the per-micro-batch function (module
    doc); ``help``: one line for ``--help``; ``exact``: proves optimality (``compare`` runs it only on request:
    ``--ilp``/``--exhaustive``/``--solvers``); ``deterministic``: identical input → identical plan (the sampler
    computes the plan on every rank without communication, so it refuses a solver that is not); ``fixed_degree``:
    one CP degree for every group, chosen by the ``degree`` option (``fcp simulate`` sweeps it,
    ``fcp train --planner NAME:D`` fixes it); ``degree_choices(num_ranks, options)``: the degrees swept (default:
    the divisors of ``num_ranks``); ``baseline``: a system FCP is compared against (the default
    ``--baselines``); ``max_degree(num_ranks, options)``: the largest degree one group can get (a flexible solver held to
    some degrees: powers of two; default ``num_ranks``; :meth:`largest_degree`); ``max_ranks``: the most ranks it plans; ``options``: keyword options it accepts besides
    ``visual`` (anything else is a ``TypeError``; ``time_limit`` is the whole-call budget); ``validate``:
    check every plan it returns (:func:`check_micro_batch`).
    """

    name: str
    solve: SolveFn
    help: str
    exact: bool = False
    deterministic: bool = True
    fixed_degree: bool = False
    degree_choices: Callable[[int, Mapping[str, Any]], Sequence[int]] | None = None
    baseline: bool = False
    max_degree: Callable[[int, Mapping[str, Any]], int] | None = None
    max_ranks: int = MAX_RANKS
    options: tuple[str, ...] = ()
    validate: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", tuple(self.options))
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"solver name {self.name!r}: use lower-case letters, digits and '-', '_' or '.', "
                             "starting with a letter or digit (no ':' or ',')")
        if not callable(self.solve):
            raise ValueError(f"solver {self.name!r}: solve must be a function (lengths, etas, num_ranks, "
                             f"cost_model, *, visual=None, **options) -> (MicroBatchPlan, optimal), got {self.solve!r}")
        if not isinstance(self.help, str) or not self.help.strip() or "\n" in self.help.strip():
            raise ValueError(f"solver {self.name!r}: help must be one non-empty line")
        if isinstance(self.max_ranks, bool) or not isinstance(self.max_ranks, int) or not 1 <= self.max_ranks <= MAX_RANKS:
            raise ValueError(f"solver {self.name!r}: max_ranks must be an int in 1..{MAX_RANKS}, got {self.max_ranks!r}")
        bad = [o for o in self.options if not isinstance(o, str) or not o.isidentifier() or o in _RESERVED]
        if bad:
            raise ValueError(f"solver {self.name!r}: options {bad} are not keyword names or are plan_batch's own "
                             f"({', '.join(_RESERVED)})")
        if self.fixed_degree and "degree" not in self.options:
            raise ValueError(f"solver {self.name!r}: a fixed-degree solver takes the option 'degree'")
        if self.degree_choices is not None and not (self.fixed_degree and callable(self.degree_choices)):
            raise ValueError(f"solver {self.name!r}: degree_choices is a function, for fixed_degree=True only")
        if self.max_degree is not None and not callable(self.max_degree):
            raise ValueError(f"solver {self.name!r}: max_degree is a function (num_ranks, options) -> int")
        if TIME_LIMIT_OPTION in self.options and self.deterministic:
            raise ValueError(f"solver {self.name!r} takes a {TIME_LIMIT_OPTION}: its plans depend on wall-clock "
                             "time, register it with deterministic=False")
        _check_signature(self)

    @property
    def time_limited(self) -> bool:
        """Takes a wall-clock ``time_limit`` (one budget for the whole ``plan_batch`` call)."""
        return TIME_LIMIT_OPTION in self.options

    def degrees(self, num_ranks: int, options: Mapping[str, Any] | None = None) -> tuple[int, ...]:
        """The degrees a fixed-degree sweep tries on ``num_ranks`` ranks (empty for a flexible solver)."""
        if not self.fixed_degree:
            return ()
        if self.degree_choices is None:
            return tuple(d for d in range(1, num_ranks + 1) if num_ranks % d == 0)
        return tuple(int(d) for d in self.degree_choices(num_ranks, dict(options or {})))

    def largest_degree(self, num_ranks: int, options: Mapping[str, Any] | None = None) -> int:
        """The largest CP degree one group of this solver gets on ``num_ranks`` ranks: a fixed-degree solver's
        ``degree`` option (None: not fixed) or the largest it sweeps, else ``max_degree`` (default ``num_ranks``)."""
        opts = dict(options or {})
        if self.fixed_degree:
            fixed = opts.get("degree")
            return int(fixed) if fixed is not None else max(self.degrees(num_ranks, opts), default=0)
        return int(num_ranks if self.max_degree is None else self.max_degree(num_ranks, opts))


def _check_signature(spec: SolverSpec) -> None:
    """``solve`` must take the four positional inputs, ``visual=`` and every declared option."""
    try:
        sig = inspect.signature(spec.solve)
    except (TypeError, ValueError):
        return  # a builtin or C function without a signature: trust it
    try:
        sig.bind(None, None, None, None, visual=None, **{o: None for o in spec.options})
    except TypeError as e:
        raise ValueError(f"solver {spec.name!r}: solve{sig} cannot be called as solve(lengths, etas, num_ranks, "
                         f"cost_model, visual=..., {', '.join(o + '=...' for o in spec.options) or '(no options)'}): "
                         f"{e}") from None


_REGISTRY: dict[str, SolverSpec] = {}


def register_solver(name: str, solve: SolveFn, *, help: str, exact: bool = False, deterministic: bool = True,
                    fixed_degree: bool = False, degree_choices: Callable[[int, Mapping[str, Any]], Sequence[int]] | None = None,
                    baseline: bool = False, max_ranks: int = MAX_RANKS, options: Sequence[str] = (),
                    validate: bool = True, replace: bool = False,
                    max_degree: Callable[[int, Mapping[str, Any]], int] | None = None) -> SolverSpec:
    """Register a solver under ``name`` (fields: :class:`SolverSpec`) and return its spec. A name that is
    registered already is a ``ValueError`` unless ``replace=True``; the order of registration is the order
    of ``SOLVER_NAMES`` (a replaced solver keeps its place)."""
    spec = SolverSpec(name=name, solve=solve, help=help, exact=bool(exact), deterministic=bool(deterministic),
                      fixed_degree=bool(fixed_degree), degree_choices=degree_choices, baseline=bool(baseline), max_degree=max_degree,
                      max_ranks=max_ranks, options=tuple(options), validate=bool(validate))
    if name in _REGISTRY and not replace:
        raise ValueError(f"a solver named {name!r} is registered already; pass replace=True to replace it, or "
                         "choose another name")
    _REGISTRY[name] = spec
    return spec


def unregister_solver(name: str) -> SolverSpec:
    """Remove ``name`` from the registry and return its spec (``ValueError`` if it is not registered)."""
    if name not in _REGISTRY:
        raise ValueError(f"no solver named {name!r} is registered; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY.pop(name)


def load_plugins() -> None:
    """Import the modules named in ``$FCP_SOLVER_PLUGINS`` (comma-separated) that are not imported yet; each
    registers its solvers when imported. A module that fails to import is a ``ValueError`` naming it."""
    for mod in (m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",")):
        if not mod or mod in sys.modules:  # imported (or being imported: a plugin's own register_solver calls)
            continue
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any failure of a plugin is reported as one line
            sys.modules.pop(mod, None)
            raise ValueError(f"{PLUGINS_ENV}: cannot import solver plugin {mod!r}: {type(e).__name__}: {e}") from e


def get_solver(name: str) -> SolverSpec:
    """The spec of ``name`` (plugins loaded first); an unknown name is a ``ValueError`` listing the valid ones."""
    load_plugins()
    spec = _REGISTRY.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown solver {name!r}{did_you_mean(name, _REGISTRY)}; valid: {', '.join(_REGISTRY)}")
    return spec


def solver_specs() -> tuple[SolverSpec, ...]:
    """Every registered spec, in registration order (plugins loaded first)."""
    load_plugins()
    return tuple(_REGISTRY.values())


def solver_names(**flags: bool) -> tuple[str, ...]:
    """Registered names whose spec has every given flag, e.g. ``solver_names(baseline=True)`` or
    ``solver_names(deterministic=True, exact=False)``."""
    bad = [k for k in flags if k not in ("exact", "deterministic", "fixed_degree", "baseline", "time_limited")]
    if bad:
        raise TypeError(f"solver_names() has no flag {bad[0]!r}")
    return tuple(s.name for s in solver_specs() if all(getattr(s, k) == bool(v) for k, v in flags.items()))


class SolverNames(Sequence):
    """A live, read-only tuple-like view of the registered names (optionally only those with ``flags``):
    a solver registered later appears in it. ``tuple(view)`` is a snapshot; equal to any sequence with the
    same names in the same order."""

    __slots__ = ("_flags",)

    def __init__(self, **flags: bool) -> None:
        self._flags = flags

    def _names(self) -> tuple[str, ...]:
        return solver_names(**self._flags)

    def __getitem__(self, i):  # type: ignore[override]
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (SolverNames, tuple, list)):
            return self._names() == tuple(other)
        return NotImplemented

    def __add__(self, other: Sequence[str]) -> tuple[str, ...]:  # as the tuple it used to be
        return self._names() + tuple(other)

    def __radd__(self, other: Sequence[str]) -> tuple[str, ...]:
        return tuple(other) + self._names()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names())


class SolverCalls(Mapping):
    """``SOLVERS``: a live mapping ``name → plan_batch`` with the solver fixed (keyword ``solver`` set)."""

    __slots__ = ("_plan_batch",)

    def __init__(self, plan_batch: Callable[..., Any]) -> None:
        self._plan_batch = plan_batch

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name not in SOLVER_NAMES:
            raise KeyError(name)
        return functools.partial(self._plan_batch, solver=name)

    def __iter__(self) -> Iterator[str]:
        return iter(SOLVER_NAMES)

    def __len__(self) -> int:
        return len(SOLVER_NAMES)


SOLVER_NAMES = SolverNames()
BASELINE_NAMES = SolverNames(baseline=True)


# ---------------------------------------------------------------- the built-in solvers (DESIGN §5)

def _check_fcp_options(opts: Mapping[str, Any]) -> None:
    """``search``/``escalate`` are booleans, ``robust_tol`` a finite share >= 0: anything else would be read as
    its truth value or compared silently (``robust_tol=-1`` or NaN would just switch the robust mode off)."""
    for name in ("search", "escalate"):
        if name in opts and not isinstance(opts[name], (bool, np.bool_)):
            raise OptionError(f"{name} must be True or False, got {opts[name]!r}")
    if "robust_tol" in opts:
        tol = opts["robust_tol"]
        if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.integer, np.floating)) \
                or not 0 <= tol < math.inf:
            raise OptionError(f"robust_tol must be a finite number >= 0 (a share of the best predicted makespan, "
                             f"e.g. 0.01; 0 turns the robust choice off), got {tol!r}")


def _fcp(**fixed: Any) -> SolveFn:
    def run(lengths, etas, num_ranks, cost_model, *, visual=None, **opts):
        from fcp_data.plan.solvers import fcp_micro_batch  # solvers imports this module

        _check_fcp_options(opts)
        return fcp_micro_batch(lengths, etas, num_ranks, cost_model, visual=visual, **fixed, **opts), None

    return run


def _plain(fn: Callable[..., MicroBatchPlan]) -> SolveFn:
    def run(lengths, etas, num_ranks, cost_model, **opts):
        return fn(lengths, etas, num_ranks, cost_model, **opts), None

    return run


def _ilp(lengths, etas, num_ranks, cost_model, **opts):
    from fcp_data.plan.ilp import solve_ilp  # numpy-only module; cvxpy itself is imported inside

    return solve_ilp(lengths, etas, num_ranks, cost_model, **opts)


def _ulysses_degrees(num_ranks: int, options: Mapping[str, Any]) -> list[int]:
    return baselines.ulysses_degrees(num_ranks, options.get("num_heads", 32))


def _pow2_floor(num_ranks: int, options: Mapping[str, Any]) -> int:
    return 1 << (int(num_ranks).bit_length() - 1)  # the largest power of two <= num_ranks


_FCP_OPTIONS = ("search", "robust_tol", "escalate")  # fcp_micro_batch: stage-1 local search, robust choice, longer search

_BUILTINS = (
    SolverSpec(name="fcp", solve=_fcp(), options=_FCP_OPTIONS, validate=False,
               help="FCP: flexible CP groups of any degree per micro-batch"),
    SolverSpec(name="fcp-dp", solve=_fcp(allocator="dp"), options=_FCP_OPTIONS, max_ranks=MAX_DP_RANKS, validate=False,
               help="FCP with the paper's O(K·N²) 2-D DP as stage 2: a reference, same optimum as fcp, slower"),
    SolverSpec(name="ilp", solve=_ilp, exact=True, deterministic=False, options=("time_limit", "max_sequences"),
               validate=False, help="exact ILP (cvxpy + HiGHS), time-limited; small batches"),
    SolverSpec(name="exhaustive", solve=exhaustive.solve_exhaustive, exact=True, options=("max_sequences",),
               validate=False, help="exact enumeration of every partition (at most 7 sequences)"),
    SolverSpec(name="static-cp", solve=_plain(baselines.static_cp), fixed_degree=True, baseline=True,
               options=("degree",), validate=False, help="Megatron-LM CP: one ring degree dividing N for every group"),
    SolverSpec(name="ulysses", solve=_plain(baselines.ulysses), fixed_degree=True, baseline=True,
               degree_choices=_ulysses_degrees, options=("num_heads", "num_kv_heads", "degree"), validate=False,
               help="DeepSpeed-Ulysses: one power-of-two all-to-all degree dividing N and the head count"),
    SolverSpec(name="megatron-dynamic", solve=_plain(baselines.megatron_dynamic), baseline=True, validate=False,
               max_degree=_pow2_floor,
               help="Megatron dynamic CP: power-of-two degree per long sequence, greedy balance"),
    SolverSpec(name="fcp-pow2", solve=_fcp(degrees="pow2", with_baselines=False), baseline=True, validate=False,
               max_degree=_pow2_floor,
               help="FCP restricted to power-of-two degrees (FlexSP-like)"),
)
_REGISTRY.update((s.name, s) for s in _BUILTINS)
