"""The stage-1 search on tight micro-batches of up to 32 sequences and 64 ranks, with and without the longer
second search (issue 12). Prints a markdown table.

Instances: the generator of ``bench_plan_quality.py`` (presets with a redrawn intra-node bandwidth and random
v1/v2 coefficients; lengths a Dirichlet split of the bin's share of ``N·E``, 25 % full attention) with 4-32
sequences on 2-64 ranks — the sizes the search runs on, and too large for the ILP to prove an optimum in
minutes. Reference: the best plan any of three planners finds on the instance — FCP with one search (``off``:
``escalate=False``), FCP as shipped (``on``) and the robust mode (``robust_tol=0.02``: 33
plans under perturbed models, judged by this one; used here only as a multi-start reference) — and the
micro-batch lower bound ``split_lower_bound(...)(1)``. Gap = makespan / best known − 1. CPU time per
micro-batch (``time.process_time``) of ``off`` and ``on`` side by side, same instances, same process.

    .venv/bin/python benchmarks/bench_search_escalation.py            # ~4 min on 2 cores
    .venv/bin/python benchmarks/bench_search_escalation.py --per-bin 40
    .venv/bin/python benchmarks/bench_search_escalation.py --max-sequences 9 --ablate-enumeration
    .venv/bin/python benchmarks/bench_search_escalation.py --ablate-units
    .venv/bin/python benchmarks/bench_search_escalation.py --ablate-placed

``--ablate-enumeration`` adds a third planner, the shipped one with the second search's enumeration of every
grouping (``ESCALATE_ENUMERATE``) switched off, and prints how many instances it ends slower / faster than ``on``;
``--ablate-units`` the same for the third search, from wider BFD bins (``ESCALATE_UNITS``; 1 = off), with its CPU;
``--ablate-placed`` for the descent on the placed makespan after it (``PLACED_MAX_EVALS``; 0 = off).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _args import count, parser, positive_int, run  # noqa: E402
from bench_plan_quality import random_instance  # noqa: E402
from fcp_data.plan.microbatch import split_lower_bound  # noqa: E402
import fcp_data.plan.solvers as solvers  # noqa: E402
from fcp_data.plan.solvers import fcp_micro_batch  # noqa: E402

BINS = ((0.5, 0.8), (0.8, 0.95), (0.95, 1.0))


def _plan(L, e, N, cm, escalate: bool) -> tuple[float, float]:
    t0 = time.process_time()
    span = fcp_micro_batch(L, e, N, cm, escalate=escalate).makespan
    return span, time.process_time() - t0


def _ablated(L, e, N, cm, name: str, value) -> tuple[float, float]:
    """:func:`_plan` (as shipped) with the solver constant ``name`` set to ``value`` for this one plan."""
    saved = getattr(solvers, name)
    setattr(solvers, name, value)
    try:
        return _plan(L, e, N, cm, True)
    finally:
        setattr(solvers, name, saved)


def build_parser():
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--per-bin", type=positive_int, default=20,
                    help="instances per tightness bin and cost-model version")
    ap.add_argument("--seed", type=count, default=0, help="random seed of the instances")
    ap.add_argument("--max-sequences", type=positive_int, default=32, help="most sequences of an instance, at least 3")
    ap.add_argument("--max-ranks", type=positive_int, default=64, help="most ranks of an instance, at least 2")
    ap.add_argument("--ablate-enumeration", action="store_true",
                    help="also plan without the second search's enumeration of every grouping (ESCALATE_ENUMERATE = 0)")
    ap.add_argument("--ablate-units", action="store_true",
                    help="also plan without the third search from wider BFD bins (ESCALATE_UNITS = 1: the planner before it)")
    ap.add_argument("--ablate-placed", action="store_true",
                    help="also plan without the descent on the placed makespan (PLACED_MAX_EVALS = 0: the planner before it)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.max_sequences < 3 or args.max_ranks < 2:
        ap.error(f"--max-sequences {args.max_sequences} / --max-ranks {args.max_ranks}: need --max-sequences >= 3 "
                 "and --max-ranks >= 2")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.per_bin} instances per bin and "
          f"model version, 4-{args.max_sequences} sequences, 2-{args.max_ranks} ranks\n")
    print("| model | tightness | off: mean / max gap | on: mean / max gap | on worse than off | on / LB median | "
          "off CPU median / p90 / max [ms] | on CPU median / p90 / max [ms] |")
    print("|---|---|---|---|---:|---:|---|---|")
    rng = np.random.default_rng(args.seed)
    for v2 in (False, True):
        for lo, hi in BINS:
            rows, ablated, unitless, unplaced = [], [], [], []
            for i in range(args.per_bin):
                L, e, N, cm = random_instance(rng, lo, hi, v2, max_ranks=args.max_ranks,
                                              max_sequences=args.max_sequences)
                off, t_off = _plan(L, e, N, cm, False)
                on, t_on = _plan(L, e, N, cm, True)
                for wanted, name, off_value, runs in ((args.ablate_enumeration, "ESCALATE_ENUMERATE", 0, ablated),
                                                      (args.ablate_units, "ESCALATE_UNITS", 1, unitless),
                                                      (args.ablate_placed, "PLACED_MAX_EVALS", 0, unplaced)):
                    if wanted:
                        span, cpu = _ablated(L, e, N, cm, name, off_value)
                        runs.append((span / on - 1, cpu))
                robust = fcp_micro_batch(L, e, N, cm, robust_tol=0.02).makespan
                best = min(off, on, robust)
                rows.append((off / best - 1, on / best - 1, on > off * (1 + 1e-9),
                             on / split_lower_bound(L, e, N, cm)(1), t_off, t_on))
                print(f"  {'v2' if v2 else 'v1'} {lo:.0%}-{hi:.0%} {i + 1}/{args.per_bin}", end="\r", file=sys.stderr,
                      flush=True)
            g_off, g_on, worse, lb, t_off, t_on = (np.array(c, dtype=float) for c in zip(*rows))

            def ms(t):
                return f"{np.median(t) * 1e3:.0f} / {np.percentile(t, 90) * 1e3:.0f} / {t.max() * 1e3:.0f}"

            print(f"| {'v2' if v2 else 'v1'} | {lo:.0%}–{hi:.0%} | {g_off.mean():.2%} / {g_off.max():.1%} | "
                  f"{g_on.mean():.2%} / {g_on.max():.1%} | {int(worse.sum())} | {np.median(lb):.3f} | {ms(t_off)} | "
                  f"{ms(t_on)} |", flush=True)
            if ablated:
                a = np.array([r[0] for r in ablated])
                print(f"|   without the enumeration: {int(np.sum(a > 1e-12))} slower, {int(np.sum(a < -1e-12))} faster "
                      f"than on (at most {a.max():+.2%}) | | | | | | |", flush=True)
            for what, runs in (("the third search (wider bins)", unitless), ("the placed descent", unplaced)):
                if runs:
                    a, cpu = (np.array(c) for c in zip(*runs))
                    print(f"|   without {what}: {int(np.sum(a > 1e-12))} slower, {int(np.sum(a < -1e-12))} faster than on "
                          f"(at most {a.max():+.2%}, mean {a.mean():+.2%}); CPU {ms(cpu)} | | | | | | |", flush=True)
    return 0


if __name__ == "__main__":
    run(main)
