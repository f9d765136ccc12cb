"""``len(sampler)`` then one epoch, as a DataLoader-driven trainer does it: the plans ``len()`` makes are kept for the
iteration (``fcp_data.sampler._KEEP_PLANS``) against planning every global batch twice (``_KEEP_PLANS = 0``, the
behaviour before), side by side in one run, with the iteration alone (no ``len()``) as the floor.

Wikipedia document lengths (FlexSP's artifact), ``--batches`` global batches of ``--batch`` documents, ``--ranks``
ranks, a Qwen3-8B / ascend-910c preset, ``micro_batches="auto"``, no background prefetch (so the time is the
planning). After one untimed warm-up epoch, each repetition runs the three cases in turn on fresh samplers; medians
over ``--reps``.

Run: ``python benchmarks/bench_sampler_len.py [--ranks 64 --batch 512 --batches 8 --reps 3]``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _args import existing_file, parser, positive_int, run  # noqa: E402
from fcp_data import sampler as sampler_module  # noqa: E402
from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.sampler import FCPSampler  # noqa: E402

WORKLOAD = Path(__file__).resolve().parents[2] / "shared" / "workloads" / "wikipedia_flexsp.txt"


def _epoch(lengths, cm, args, *, call_len: bool, keep: int) -> float:
    old = sampler_module._KEEP_PLANS
    sampler_module._KEEP_PLANS = keep
    try:
        s = FCPSampler(lengths, num_ranks=args.ranks, rank=0, cost_model=cm, global_batch_size=args.batch, seed=0,
                       on_overlong="truncate", prefetch=0)
        t0 = time.perf_counter()
        n = len(s) if call_len else None
        got = sum(1 for _ in iter(s))
        dt = time.perf_counter() - t0
    finally:
        sampler_module._KEEP_PLANS = old
    if n is not None and n != got:
        sys.exit(f"bench_sampler_len: len() {n} != {got} lists")
    return dt


def build_parser():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=existing_file, default=str(WORKLOAD),
                    help="one token count per line (default: ../shared/workloads/wikipedia_flexsp.txt next to the "
                         "repository)")
    ap.add_argument("--ranks", type=positive_int, default=64, help="ranks of the sampler (rank 0 iterated)")
    ap.add_argument("--batch", type=positive_int, default=512, help="documents per global batch")
    ap.add_argument("--batches", type=positive_int, default=8, help="global batches in the epoch")
    ap.add_argument("--reps", type=positive_int, default=3, help="repetitions of the three cases (median)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    lengths = np.loadtxt(args.workload, dtype=np.int64, max_rows=args.batch * args.batches)
    cm = CostModel.preset("qwen3-8b", "ascend-910c")
    cases = {"len() + epoch, plans kept": dict(call_len=True, keep=sampler_module._KEEP_PLANS),
             "len() + epoch, planned twice (before)": dict(call_len=True, keep=0),
             "epoch alone (no len())": dict(call_len=False, keep=0)}
    times: dict[str, list[float]] = {k: [] for k in cases}
    print(f"{len(lengths)} Wikipedia documents, {args.batches} global batches of {args.batch}, {args.ranks} ranks; "
          f"load {os.getloadavg()[0]:.1f}")
    _epoch(lengths, cm, args, call_len=False, keep=0)  # warm-up: the planner's kernels load on first use
    for _ in range(args.reps):
        for name, kw in cases.items():
            times[name].append(_epoch(lengths, cm, args, **kw))
    base = statistics.median(times["epoch alone (no len())"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:<40} median {med:7.2f} s  ({med / base:.2f}x the epoch alone)  runs "
              + " ".join(f"{t:.2f}" for t in ts))
    print(f"load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    run(main)
