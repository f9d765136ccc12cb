"""FCP with and without the in-node packing of a stranded slowest group (issue 12), side by side in one process.

Best fit placement can strand a group that fits in one node across two nodes although a packing with every such
group inside a node exists; :func:`fcp_data.plan.placement.pack_in_nodes` finds one, and FCP uses it on its own
``packed`` track and on every refined plan (:func:`~fcp_data.plan.placement.repack_stranded`). ``off`` is the
planner with both switched off (the functions replaced by identities), ``on`` is FCP as shipped. Instances:

* ``tight``: the generator of ``bench_search_escalation.py`` (random v1/v2 presets and coefficients, 4-32
  sequences, 2-64 ranks — most with a partial last node — in three tightness bins), the same stream;
* ``wikipedia``: random Wikipedia batches (capped at 128K) of 8 sequences per rank, Qwen3-8B / ascend-910c (16
  ranks per node), on 64 ranks and on 40 / 56 ranks (a partial last node).

Prints, per set: instances, how many got faster / slower, the largest gain, the mean change, CPU per plan.

    .venv/bin/python benchmarks/bench_placement_packing.py              # ~5 min on 2 cores
    .venv/bin/python benchmarks/bench_placement_packing.py --per-bin 10 --batches 10
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fcp_data.plan.solvers as solvers  # noqa: E402
from _args import WIKIPEDIA, count, existing_file, parser, positive_int, run  # noqa: E402
from bench_plan_quality import random_instance  # noqa: E402
from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.plan.solvers import fcp_micro_batch  # noqa: E402
from fcp_data.workloads import apply_cap, load_lengths  # noqa: E402

BINS = ((0.5, 0.8), (0.8, 0.95), (0.95, 1.0))


@contextlib.contextmanager
def _packing(on: bool):
    """FCP as shipped (``on``) or with the in-node packing switched off."""
    saved = solvers.packed_placement, solvers.repack_stranded
    if not on:
        solvers.packed_placement = lambda *a, **k: None
        solvers.repack_stranded = lambda mb, *a, **k: mb
    try:
        yield
    finally:
        solvers.packed_placement, solvers.repack_stranded = saved


def _both(L, e, N, cm) -> tuple[float, float, float, float]:
    """``(off makespan, on makespan, off CPU s, on CPU s)``."""
    out = []
    for on in (False, True):
        with _packing(on):
            t0 = time.process_time()
            span = fcp_micro_batch(L, e, N, cm).makespan
            out.append((span, time.process_time() - t0))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def _row(name: str, rows: list) -> None:
    off, on, t_off, t_on = (np.array(c, dtype=float) for c in zip(*rows))
    r = on / off - 1
    print(f"| {name} | {len(r)} | {int(np.sum(r < -1e-12))} | {int(np.sum(r > 1e-12))} | {r.min():+.2%} | "
          f"{r.mean():+.3%} | {np.median(t_off) * 1e3:.0f} / {np.median(t_on) * 1e3:.0f} |", flush=True)


def build_parser():
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--per-bin", type=positive_int, default=20, help="tight instances per bin and cost-model version")
    ap.add_argument("--batches", type=positive_int, default=30, help="Wikipedia batches per rank count")
    ap.add_argument("--seed", type=count, default=0, help="random seed of the instances and batches")
    ap.add_argument("--workload", type=existing_file, default=str(WIKIPEDIA),
                    help="one sequence length per line, at least 512 of them (default: "
                         "../shared/workloads/wikipedia_flexsp.txt next to the repository)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    workload, _ = apply_cap(load_lengths(args.workload), 131072, "truncate")  # read first: a bad file before the work
    if workload.size < 8 * 64:
        raise ValueError(f"--workload {args.workload}: {workload.size} lengths; the Wikipedia rows draw 512")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| instances | n | faster | slower | largest gain | mean change | CPU median off / on [ms] |")
    print("|---|---:|---:|---:|---:|---:|---|")
    rng = np.random.default_rng(args.seed)
    for v2 in (False, True):
        for lo, hi in BINS:
            rows = [_both(*random_instance(rng, lo, hi, v2, max_ranks=64, max_sequences=32)) for _ in range(args.per_bin)]
            _row(f"tight {'v2' if v2 else 'v1'} {lo:.0%}–{hi:.0%}", rows)
    cm = CostModel.preset("Qwen3-8B", "ascend-910c")
    for N in (64, 40, 56):
        wrng = np.random.default_rng(args.seed + N)
        rows = []
        for _ in range(args.batches):
            L = workload[wrng.choice(workload.size, 8 * N, replace=False)]
            rows.append(_both(L, np.zeros(L.size), N, cm))
        _row(f"Wikipedia, {N} ranks, {8 * N} sequences", rows)
    return 0


if __name__ == "__main__":
    run(main)
