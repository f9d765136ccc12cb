"""``fcp compare``: FCP against its 2-D DP variant, the exact references and the baselines on one batch.

The batch is ``--lengths FILE [--visual FILE]`` or ``--index DIR`` (a length index from ``fcp index``:
lengths, visual tokens and η from its columns); see :mod:`fcp_data.commands.plan`.

The solvers come from the registry (:mod:`fcp_data.plan.registry`): by default every registered solver that
is neither exact nor a baseline (``fcp``, ``fcp-dp``, and a plugin's), the exact ones asked for by ``--ilp`` /
``--exhaustive``, then ``--baselines`` (default: every registered baseline); ``--solvers a,b`` runs exactly
those instead. A solver that cannot plan the batch is reported, not fatal (``fcp`` excepted). ``--plot OUT.png``
writes the makespans as bars next to the Gantt charts of FCP's plan and of the best other solver's
(:mod:`fcp_data.commands.plots`).
"""

from __future__ import annotations

import argparse
import json
import sys

from fcp_data.commands.plan import add_input_args, parse_micro_batches, positive_seconds
from fcp_data.commands.plots import check_plot_path, plot_bars_and_gantts
from fcp_data.commands.solver_args import (BASELINES, check_options_apply, parse_baselines, parse_solvers,
                                          solvers_epilog)

__all__ = ["register"]

_DEFAULT_TIME_LIMIT = 30.0  # seconds of the ILP (the exact solvers that take --time-limit) when not given


def run(args: argparse.Namespace) -> int:
    from fcp_data.commands.plan import degree_summary, load_inputs, solver_options
    from fcp_data.plan import get_solver, plan_batch

    names = _chosen_solvers(args)
    check_options_apply(args, names)  # an option for solvers that do not run: refused, not ignored
    args.time_limit = _DEFAULT_TIME_LIMIT if args.time_limit is None else args.time_limit
    if args.plot:
        check_plot_path(args.plot)  # before any solving: a bad path fails at once
    lengths, cm, report, visual, etas = load_inputs(args)
    opts = solver_options(args)
    results: dict[str, object] = {}
    for name in names:
        try:
            results[name] = plan_batch(lengths, num_ranks=args.ranks, cost_model=cm, solver=name, etas=etas,
                                       micro_batches=args.micro_batches, visual=visual, **opts.get(name, {}))
        except ValueError as e:
            if name == "fcp":
                raise
            results[name] = str(e)  # a reference or baseline that cannot plan this batch: reported, not fatal
    ok = {k: v for k, v in results.items() if not isinstance(v, str)}
    if not ok:  # with --json too: exit 2, not a JSON object of errors
        raise ValueError("no solver could plan this batch: " + "; ".join(f"{k}: {v}" for k, v in results.items()))
    if report.num_overlong:  # beside --json on stderr: its stdout stays one JSON object
        print(report.summary(), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        out = {k: (report.to_input(v.to_dict()) if not isinstance(v, str) else {"error": v}) for k, v in results.items()}
        for k in out:
            if get_solver(k).exact and "error" not in out[k]:
                out[k].setdefault("optimal", False)
        print(json.dumps(out))
        return 0
    best = min(p.makespan for p in ok.values())
    print(f"{len(lengths)} sequences, {int(lengths.sum())} tokens on {args.ranks} ranks")
    print(f"{'solver':<17} {'makespan [s]':>13} {'vs best':>8} {'solve [ms]':>11} {'optimal':>8}  groups")
    for name, p in results.items():
        if isinstance(p, str):
            print(f"{name:<17} {'no plan':>13}  {p}")
            continue
        opt = "" if p.optimal is None else ("yes" if p.optimal else "no")
        groups = " | ".join(degree_summary(mb.degrees) for mb in p.micro_batches)
        print(f"{name:<17} {p.makespan:>13.4f} {p.makespan / best:>8.3f} {p.solve_ms:>11.1f} {opt:>8}  {groups}")
    if args.plot:
        _plot(args, ok)
        print(f"plot written to {args.plot}")
    return 0


def _plot(args: argparse.Namespace, plans: dict) -> None:
    """Makespans of every solver that planned, next to the Gantt charts of FCP's plan and of the reference it is
    measured against: the best exact solver's (``--ilp``/``--exhaustive``), else the best baseline's, else the best
    other solver's (``--solvers`` without ``fcp``: the two best by that order)."""
    from fcp_data.plan import get_solver

    def rank(n: str) -> tuple:
        spec = get_solver(n)
        return (0 if spec.exact else 1 if spec.baseline else 2, plans[n].makespan, n)

    main = "fcp" if "fcp" in plans else min(plans, key=rank)  # --solvers without fcp: the reference first
    other = min((n for n in plans if n != main), key=rank, default=None)
    gantts = [("FCP" if main == "fcp" else main, plans[main])] + ([(other, plans[other])] if other else [])
    plot_bars_and_gantts(args.plot, {n: p.makespan for n, p in plans.items()}, "makespan [s]",
                         f"{args.ranks} ranks, {len(plans[main].micro_batches)} micro-batch(es)", gantts)


def _chosen_solvers(args: argparse.Namespace) -> list[str]:
    """The solvers to run, in order (module doc); ``--solvers`` with ``--ilp``/``--exhaustive``/``--baselines``
    is a ``UsageError``."""
    from fcp_data.commands import UsageError
    from fcp_data.plan import solver_specs

    if args.solvers is not None:
        if args.ilp or args.exhaustive or args.baselines is not None:
            raise UsageError("--solvers lists every solver to run; do not combine it with --ilp, --exhaustive or "
                             "--baselines")
        return list(args.solvers)
    asked = {"ilp": args.ilp, "exhaustive": args.exhaustive}
    specs = solver_specs()
    names = [s.name for s in specs if not s.exact and not s.baseline]
    names += [s.name for s in specs if s.exact and asked.get(s.name)]
    return names + list(BASELINES if args.baselines is None else args.baselines)


EPILOG = """examples:
  fcp compare --lengths lengths.txt --ranks 8 --preset Qwen3-8B --hardware h100
  fcp compare --lengths small.txt --ranks 4 --cost cost.json --ilp --exhaustive --time-limit 10
  fcp compare --lengths lengths.txt --ranks 16 --preset Qwen3-4B --hardware h200 --baselines static-cp,fcp-pow2 --json
  fcp compare --index my-index --ranks 8 --cost cost.json --micro-batches auto   (an index from `fcp index`)
  fcp compare --lengths lengths.txt --ranks 16 --preset Qwen3-8B --hardware h100 --plot compare.png
  FCP_SOLVER_PLUGINS=my_solver fcp compare --lengths lengths.txt --ranks 8 --cost cost.json --solvers fcp,mine"""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("compare", help=summary, description=summary + ".", epilog=EPILOG + "\n" + solvers_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--ilp", action="store_true", help="also solve the exact ILP (cvxpy + HiGHS; small batches)")
    p.add_argument("--exhaustive", action="store_true", help="also enumerate every partition (at most 7 sequences)")
    p.add_argument("--baselines", type=parse_baselines, default=None, metavar="a,b,...",
                   help=f"baselines to run (default all: {','.join(BASELINES)})")
    p.add_argument("--solvers", type=parse_solvers, default=None, metavar="a,b,...",
                   help="run exactly these registered solvers instead of the default set (see the list below)")
    p.add_argument("--time-limit", type=positive_seconds, default=None,
                   help="ILP time budget in seconds for the whole batch, all micro-batches and 'auto' candidates "
                        "together (default 30)")
    p.add_argument("--micro-batches", type=parse_micro_batches, default=1, metavar="auto|M",
                   help="one micro-batch (default), exactly M, or 'auto'")
    p.add_argument("--json", action="store_true", help="one §6 plan object per solver, keyed by solver name")
    p.add_argument("--plot", metavar="OUT.png", help="write a bar chart of every solver's makespan and Gantt charts "
                   "(ranks × time, one colour per CP group) of FCP's plan and the best other solver's")
    p.set_defaults(func=run)
