"""``fcp simulate``: step times of every solver over global batches drawn from a workload.

Each step draws ``--global-batch-size`` sequences (seeded), every solver plans the same batch with the
micro-batch planner (``micro_batches="auto"``), and the step time is the sum of the micro-batch
makespans under the §4/§4.1 cost model. The workload is ``--lengths FILE`` (``--visual FILE``: visual
tokens per sequence, as in ``fcp plan``) or ``--index DIR``, a length index built by ``fcp index``: lengths
from its ``num_tokens`` column, visual tokens from ``num_visual_tokens`` and η from its ``eta`` column (the
spec's attention kind), so "will FCP help on my data?" is one command after ``fcp index``. ``--cap`` and
``--on-overlong`` apply to either, visual tokens and η following their sequence. The solvers compared with
FCP are ``--baselines`` (default: every registered baseline) or ``--solvers a,b`` (any registered solvers,
plugins included). A fixed-degree solver (registry ``fixed_degree``: ``static-cp``, ``ulysses``) keeps one
degree for the whole run (the best one over all steps, swept over its spec's ``degrees``). Prints the mean step time per solver and FCP's speedup over it;
``--json`` prints ``{"<solver>": {"mean_step_s": float, "steps": [...]}}``; ``--plot`` writes a bar chart of
the mean step times and Gantt charts (ranks × time, one colour per CP group) of the first step's first micro-batch
under FCP and under the fastest other solver.
"""

from __future__ import annotations

import argparse
import json
import sys

from fcp_data.commands.plan import add_cost_args, add_source_args, add_visual_args, positive_seconds
from fcp_data.commands.plots import check_plot_path, plot_bars_and_gantts
from fcp_data.commands.solver_args import (BASELINES, check_options_apply, parse_baselines, parse_solvers,
                                          solvers_epilog)
from fcp_data.plan.simulate import simulate

__all__ = ["register", "plot_simulation", "check_plot_path", "MAX_STEPS"]  # check_plot_path: from .plots

MAX_STEPS = 100_000  # every solver plans every step: more is hours of planning, not a simulation


def plot_simulation(path: str, means: dict[str, float], plan, title: str, other: tuple[str, object] | None = None
                    ) -> None:
    """Bar chart of mean step times and Gantt charts of the first micro-batch of ``plan`` (FCP's first step) and,
    given, of ``other = (solver, its plan of the same step)`` into ``path``."""
    plot_bars_and_gantts(path, means, "mean step time [s]", title, [("FCP", plan)] + ([other] if other else []))


def run(args: argparse.Namespace) -> int:
    from fcp_data.commands import UsageError
    from fcp_data.commands.plan import check_heads, check_ranks, check_source, load_cost, load_source, solver_options, \
        source_visual
    from fcp_data.workloads import apply_cap

    check_ranks(args.ranks)
    check_heads(args)
    check_source(args)
    if args.global_batch_size < 1:
        raise UsageError(f"--global-batch-size must be >= 1, got {args.global_batch_size}")
    if not 1 <= args.steps <= MAX_STEPS:
        raise UsageError(f"--steps must be between 1 and {MAX_STEPS}, got {args.steps}")
    if args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.cap < 1:
        raise UsageError(f"--cap must be >= 1 token, got {args.cap}")
    if args.solvers is not None and args.baselines is not None:
        raise UsageError("give either --baselines or --solvers (the solvers to compare with FCP), not both")
    others = args.solvers if args.solvers is not None else BASELINES if args.baselines is None else args.baselines
    check_options_apply(args, ["fcp", *others])  # --time-limit without a time-limited solver: refused, not ignored
    solvers = ["fcp"] + [b for b in others if b != "fcp"]
    if args.plot:
        check_plot_path(args.plot)
    cm = load_cost(args)
    work = load_source(args)
    cap = min(args.cap, args.ranks * cm.tokens_per_rank)
    lengths, report = apply_cap(work.lengths, cap, args.on_overlong)
    visual = source_visual(args, work, lengths, report)
    etas = None if work.etas is None else work.etas[report.kept]
    times, first, fixed = simulate(lengths, num_ranks=args.ranks, cost_model=cm, global_batch_size=args.global_batch_size,
                            steps=args.steps, seed=args.seed, solvers=solvers, options=solver_options(args),
                            progress=not args.no_progress, visual=visual, etas=etas)
    means = {n: sum(t) / len(t) for n, t in times.items()}
    if args.plot:  # FCP's first step next to the same step under the fastest other solver
        best = min((n for n in solvers if n != "fcp"), key=lambda n: (means[n], n), default=None)
        plot_simulation(args.plot, means, first["fcp"], f"{args.ranks} ranks, GBS {args.global_batch_size}",
                        (f"{best}, same step", first[best]) if best else None)
    if args.json:
        if report.num_overlong:  # on stderr: stdout stays one JSON object
            print(report.summary(), file=sys.stderr)
        print(json.dumps({n: {"mean_step_s": means[n], "steps": times[n]} for n in solvers}))
        return 0
    if args.index is not None:
        print(work.source)
    print(f"{args.steps} steps of {args.global_batch_size} sequences on {args.ranks} ranks ({report.summary()})")
    print(f"{'solver':<17} {'mean step [s]':>14} {'FCP speedup':>12}")
    for n in solvers:
        note = f"  (best fixed degree {fixed[n]})" if fixed[n] else ""
        print(f"{n:<17} {means[n]:>14.4f} {means[n] / means['fcp']:>11.3f}x{note}")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


EPILOG = """examples:
  fcp simulate --lengths lengths.txt --ranks 64 --global-batch-size 512 --steps 10 \\
      --preset Qwen3-8B --hardware h100
  fcp simulate --lengths lens.csv --column num_tokens --ranks 16 --global-batch-size 128 --cost cost.json \\
      --baselines static-cp,fcp-pow2 --plot sim.png --json
  fcp index shards/*.tar --spec qwen2-vl --out my-index    # then, straight from the index:
  fcp simulate --index my-index --ranks 8 --global-batch-size 64 --cost cost.json --plot sim.png"""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("simulate", help=summary, description=summary + ".", epilog=EPILOG + "\n" + solvers_epilog(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_args(p)
    add_visual_args(p)
    p.add_argument("--ranks", type=int, required=True, metavar="N", help="number of ranks (devices)")
    p.add_argument("--global-batch-size", type=int, required=True, metavar="B",
                   help="sequences per global batch (drawn without replacement; at most the workload's size)")
    p.add_argument("--steps", type=int, default=20, metavar="S", help="global batches to simulate (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the batch draws (default 0)")
    p.add_argument("--cap", type=int, default=131072, help="length cap (default 131072; also at most ranks × tokens_per_rank)")
    p.add_argument("--on-overlong", choices=("error", "truncate", "drop"), default="truncate",
                   help="sequences over the cap: truncate (default), drop or error")
    p.add_argument("--baselines", type=parse_baselines, default=None, metavar="a,b,...",
                   help=f"baselines to compare with FCP (default all: {','.join(BASELINES)})")
    p.add_argument("--solvers", type=parse_solvers, default=None, metavar="a,b,...",
                   help="registered solvers to compare with FCP instead of --baselines (see the list below)")
    p.add_argument("--time-limit", type=positive_seconds, default=None, metavar="S",
                   help="budget in seconds of a time-limited solver (--solvers ilp) per global batch (default: the "
                        "solver's own, 30 for the ILP: S × --steps bounds the run)")
    p.add_argument("--plot", metavar="OUT.png", help="write a bar chart of the mean step times and Gantt charts of "
                   "the first step under FCP and under the fastest other solver")
    p.add_argument("--json", action="store_true", help='print {"<solver>": {"mean_step_s": ..., "steps": [...]}}')
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_cost_args(p)
    p.set_defaults(func=run)
