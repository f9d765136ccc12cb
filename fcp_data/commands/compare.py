"""``fcp compare``: FCP against its 2-D DP variant, the exact references and the baselines on one batch.

The batch is ``--lengths FILE [--visual FILE]`` or ``--index DIR`` (a length index from ``fcp index``:
lengths, visual tokens and η from its columns); see :mod:`fcp_data.commands.plan`.
"""

from __future__ import annotations

import argparse
import json

from fcp_data.commands.plan import BASELINES, add_input_args, parse_baselines, parse_micro_batches, positive_seconds

__all__ = ["register"]


def run(args: argparse.Namespace) -> int:
    from fcp_data.commands.plan import degree_summary, load_inputs, solver_options
    from fcp_data.plan import plan_batch

    lengths, cm, report, visual, etas = load_inputs(args)
    names = ["fcp", "fcp-dp"]
    if args.ilp:
        names.append("ilp")
    if args.exhaustive:
        names.append("exhaustive")
    names += list(args.baselines)
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
    if args.json:
        out = {k: (v.to_dict() if not isinstance(v, str) else {"error": v}) for k, v in results.items()}
        for k in ("ilp", "exhaustive"):
            if k in out and "error" not in out[k]:
                out[k].setdefault("optimal", False)
        print(json.dumps(out))
        return 0
    ok = {k: v for k, v in results.items() if not isinstance(v, str)}
    best = min(p.makespan for p in ok.values())
    if report.num_overlong:
        print(report.summary())
    print(f"{len(lengths)} sequences, {int(lengths.sum())} tokens on {args.ranks} ranks")
    print(f"{'solver':<17} {'makespan [s]':>13} {'vs best':>8} {'solve [ms]':>11} {'optimal':>8}  groups")
    for name, p in results.items():
        if isinstance(p, str):
            print(f"{name:<17} {'no plan':>13}  {p}")
            continue
        opt = "" if p.optimal is None else ("yes" if p.optimal else "no")
        groups = " | ".join(degree_summary(mb.degrees) for mb in p.micro_batches)
        print(f"{name:<17} {p.makespan:>13.4f} {p.makespan / best:>8.3f} {p.solve_ms:>11.1f} {opt:>8}  {groups}")
    return 0


EPILOG = """examples:
  fcp compare --lengths lengths.txt --ranks 8 --preset Qwen3-8B --hardware h100
  fcp compare --lengths small.txt --ranks 4 --cost cost.json --ilp --exhaustive --time-limit 10
  fcp compare --lengths lengths.txt --ranks 16 --preset Qwen3-4B --hardware h200 --baselines static-cp,fcp-pow2 --json
  fcp compare --index my-index --ranks 8 --cost cost.json --micro-batches auto   (an index from `fcp index`)"""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("compare", help=summary, description=summary + ".", epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--ilp", action="store_true", help="also solve the exact ILP (cvxpy + HiGHS; small batches)")
    p.add_argument("--exhaustive", action="store_true", help="also enumerate every partition (at most 7 sequences)")
    p.add_argument("--baselines", type=parse_baselines, default=BASELINES, metavar="a,b,...",
                   help=f"baselines to run (default all: {','.join(BASELINES)})")
    p.add_argument("--time-limit", type=positive_seconds, default=30.0,
                   help="ILP time budget in seconds for the whole batch, all micro-batches and 'auto' candidates "
                        "together (default 30)")
    p.add_argument("--micro-batches", type=parse_micro_batches, default=1, metavar="auto|M",
                   help="one micro-batch (default), exactly M, or 'auto'")
    p.add_argument("--json", action="store_true", help="one §6 plan object per solver, keyed by solver name")
    p.set_defaults(func=run)
