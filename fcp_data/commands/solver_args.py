"""Solver options shared by ``fcp plan``, ``compare`` and ``simulate``, all derived from the solver registry
(:mod:`fcp_data.plan.registry`): the ``--solver``/``--solvers``/``--baselines`` choices, the per-solver
keyword options built from the CLI's values, and the list of solvers in ``--help``.

The choices are live views of the registry, so a solver registered by a plugin module
(``FCP_SOLVER_PLUGINS=module``, imported by :func:`fcp_cli.main.main` before the parser is built) is a valid
choice of every command.
"""

from __future__ import annotations

import argparse
from typing import Any

from fcp_data.plan.registry import BASELINE_NAMES, SOLVER_NAMES, solver_specs
from fcp_data.strict import did_you_mean

__all__ = ["SOLVER_CHOICES", "BASELINES", "solver_options", "parse_baselines", "parse_solvers", "solvers_epilog",
           "add_robust_arg", "check_options_apply"]

# live views of the registry: a solver registered later (FCP_SOLVER_PLUGINS) is a valid choice too
SOLVER_CHOICES = SOLVER_NAMES
BASELINES = BASELINE_NAMES


def solver_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per-solver keyword options, each solver getting those of the CLI's values its registry spec declares:
    ``num_heads``/``num_kv_heads`` (Ulysses; from the preset unless given by ``--heads``/``--kv-heads``) and
    ``time_limit`` (``--time-limit``, when given) and ``robust_tol`` (``--robust-tol``, when > 0)."""
    heads, kv = 32, 8
    if getattr(args, "preset", None):
        from fcp_data.presets import model_heads

        heads, kv = model_heads(args.preset)
    pool: dict[str, Any] = {"num_heads": args.heads if args.heads is not None else heads,
                            "num_kv_heads": args.kv_heads if args.kv_heads is not None else kv}
    if getattr(args, "time_limit", None) is not None:
        pool["time_limit"] = args.time_limit
    if getattr(args, "robust_tol", 0.0):
        pool["robust_tol"] = args.robust_tol
    out = {s.name: {k: v for k, v in pool.items() if k in s.options} for s in solver_specs()}
    return {name: opts for name, opts in out.items() if opts}


def check_options_apply(args: argparse.Namespace, names) -> None:
    """``--time-limit`` / ``--robust-tol`` given while none of the solvers ``names`` that run takes it (its registry
    spec does not declare the option): a ``UsageError``, never an option silently ignored."""
    from fcp_data.commands import UsageError

    given = (("time_limit", "--time-limit", getattr(args, "time_limit", None) is not None),
             ("robust_tol", "--robust-tol", bool(getattr(args, "robust_tol", 0.0))))
    for key, flag, on in given:
        takers = [s.name for s in solver_specs() if key in s.options]
        if on and not set(takers) & set(names):
            raise UsageError(f"{flag} applies to {' / '.join(takers)} only; the solvers run here: {', '.join(names)}")


def _tolerance(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.01, got {text!r}") from None
    if not 0 <= v < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return v


def add_robust_arg(p: argparse.ArgumentParser) -> None:
    """``--robust-tol TOL`` for the solvers that declare ``robust_tol`` (fcp, fcp-dp)."""
    p.add_argument("--robust-tol", type=_tolerance, default=0.0, metavar="TOL",
                   help="fcp/fcp-dp robust mode: among plans within (1+TOL) of the best predicted makespan, run the "
                        "one of least mean regret when every cost coefficient may be off by up to 20 %% (plans once "
                        "per scenario, ~30x slower; TOL in [0, 1), default 0 = off; see BENCHMARKS.md 'Robustness')")


def parse_baselines(text: str) -> tuple[str, ...]:
    """A comma-separated list of registered baselines (``baseline=True`` in the registry)."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in BASELINES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown baseline(s) {', '.join(bad)}{did_you_mean(bad[0], BASELINES)}; "
                                         f"valid: {', '.join(BASELINES)}")
    return names


def parse_solvers(text: str) -> tuple[str, ...]:
    """A comma-separated list of registered solvers (each once, in the order given)."""
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    bad = [n for n in names if n not in SOLVER_NAMES]
    if bad or not names:
        hint = did_you_mean(bad[0], SOLVER_NAMES) if bad else ""
        raise argparse.ArgumentTypeError(f"unknown solver(s) {', '.join(bad) or repr(text)}{hint}; valid: "
                                         f"{', '.join(SOLVER_NAMES)}")
    return names


def solvers_epilog() -> str:
    """The registered solvers, one line each (name, kind, help), for the commands' ``--help``."""
    lines = ["solvers (fcp_data.plan.registry; FCP_SOLVER_PLUGINS=module adds yours, see README 'Adding a solver'):"]
    width = max(len(s.name) for s in solver_specs())
    for s in solver_specs():
        kind = ", ".join(k for k, on in (("exact", s.exact), ("baseline", s.baseline), ("fixed degree", s.fixed_degree),
                                         ("time-limited", s.time_limited)) if on)
        lines.append(f"  {s.name:<{width}}  {s.help}" + (f" [{kind}]" if kind else ""))
    return "\n".join(lines)
