"""How long does the training loop wait for the FCP planner, with and without background prefetch?

Workload: Wikipedia document lengths (``workloads/wikipedia_flexsp.txt``, 1M docs) truncated at ``--cap``
tokens (default 128K), global batches of ``--batch`` sequences, ``--ranks`` ranks, cost model preset
``--model``/``--hardware``. For each setting the consumer iterates rank 0's lists of the first ``--steps``
global batches and simulates the training step by sleeping ``--step-time`` seconds per global batch
(spread over its micro-batches). The wait for global batch ``g`` is the time ``next()`` blocked on the
planner for it (``FCPSampler.planner_waits``). The first global batch of an iterator always waits (nothing
was planned before the first ``next()``), so it is reported apart.

    .venv/bin/python benchmarks/bench_sampler.py [--steps 16 --step-time 0.5 --prefetch 2]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from _args import (count, existing_file, hardware_preset, model_preset, nonnegative_float, parser,
                   positive_int, run)
from fcp_data.presets import preset_cost_model
from fcp_data.sampler import FCPSampler
from fcp_data.workloads import load_lengths

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKLOAD = ROOT.parent / "shared" / "workloads" / "wikipedia_flexsp.txt"


def _consume(sampler: FCPSampler, steps: int, step_time: float) -> tuple[list[float], float]:
    sampler.planner_waits.clear()
    t0 = time.perf_counter()
    it = iter(sampler)
    for lst in it:
        if lst.global_batch >= steps:
            break
        time.sleep(step_time / lst.num_micro_batches)
    it.close()
    return list(sampler.planner_waits)[:steps], time.perf_counter() - t0


def _stats(x: list[float]) -> str:
    a = np.asarray(x) * 1e3
    return f"median {np.median(a):7.2f} ms  p90 {np.percentile(a, 90):7.2f} ms  max {a.max():7.2f} ms  sum {a.sum():8.1f} ms"


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--workload", type=existing_file, default=str(DEFAULT_WORKLOAD),
                    help="one document length per line (default: ../shared/workloads/wikipedia_flexsp.txt next to "
                         "the repository)")
    ap.add_argument("--cap", type=positive_int, default=131072, help="documents truncated at this many tokens")
    ap.add_argument("--ranks", type=positive_int, default=64, help="ranks (rank 0's lists are consumed)")
    ap.add_argument("--batch", type=positive_int, default=512, help="global batch size (sequences)")
    ap.add_argument("--model", type=model_preset, default="Qwen3-8B", help="model preset of the cost model")
    ap.add_argument("--hardware", type=hardware_preset, default="ascend-910c", help="hardware preset of the cost model")
    ap.add_argument("--steps", type=positive_int, default=16,
                    help="global batches consumed per setting, at least 2 (the first is reported apart)")
    ap.add_argument("--step-time", type=nonnegative_float, default=0.5,
                    help="simulated training step [s] per global batch (a sleep)")
    ap.add_argument("--prefetch", type=count, default=2,
                    help="background prefetch depth compared with prefetch=0")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: at least 2 (the first global batch's wait is reported apart from the rest)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)

    lengths = np.minimum(load_lengths(args.workload), args.cap)
    cm = preset_cost_model(args.model, args.hardware)
    mk = dict(num_ranks=args.ranks, rank=0, cost_model=cm, global_batch_size=args.batch, on_overlong="truncate")
    print(f"workload {Path(args.workload).name}: {lengths.size} docs truncated at {args.cap} tokens; "
          f"{args.ranks} ranks x tokens_per_rank {cm.tokens_per_rank} ({args.model} / {args.hardware}); "
          f"global batch {args.batch} sequences; {args.steps} global batches; simulated step {args.step_time} s")

    probe = FCPSampler(lengths, **mk, prefetch=0)
    plan_ms, makespans, num_mb = [], [], []
    for g in range(args.steps):
        t = time.perf_counter()
        plan = probe.plan_global_batch(g)
        plan_ms.append(time.perf_counter() - t)
        makespans.append(plan.makespan)
        num_mb.append(len(plan.micro_batches))
    print(f"planning one global batch (synchronous): {_stats(plan_ms)}")
    print(f"predicted step time (§4 makespan): median {np.median(makespans):.3f} s; "
          f"micro-batches per global batch: median {np.median(num_mb):.0f}, max {max(num_mb)}")

    rows = {}
    for prefetch in (0, args.prefetch):
        waits, wall = _consume(FCPSampler(lengths, **mk, prefetch=prefetch), args.steps, args.step_time)
        rows[prefetch] = waits
        print(f"prefetch={prefetch}: first global batch wait {waits[0] * 1e3:7.2f} ms; later: {_stats(waits[1:])}; "
              f"wall {wall:.2f} s (ideal {args.steps * args.step_time:.2f} s)")
    w0, wp = np.asarray(rows[0][1:]), np.asarray(rows[args.prefetch][1:])
    print(f"wait per step after the first, prefetch={args.prefetch} vs 0: "
          f"{wp.sum() * 1e3:.1f} ms vs {w0.sum() * 1e3:.1f} ms total "
          f"({(wp.sum() / max(w0.sum(), 1e-12)):.4f}x); steps with wait > 1 ms: {(wp > 1e-3).sum()} vs {(w0 > 1e-3).sum()}")


if __name__ == "__main__":
    run(main)
