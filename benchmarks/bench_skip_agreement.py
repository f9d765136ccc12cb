"""What the CP group's agreement on failed reads costs (``fcp_exec.skips.agree_skips``, run by ``train_step`` on
every micro-batch of a group of degree > 1: one int64 per document sent P2P to each peer, before the forward).

1. Latency of one ``agree_skips`` call on 2 gloo processes (a degree-2 batch of ``--docs`` documents, nothing
   failed: the common case), median of ``--calls``.
2. ``fcp train``'s Trainer (tiny-llm, 2 processes, FCP planner) with the agreement on and off (``agree_skips``
   replaced by the identity): two trainers with the same seed (the same global batches and plans), stepping in
   alternating order in the same processes so noise hits both alike; median step time of each, the median of the
   per-step ratios, and how many micro-batches had a group of degree > 1 (the only ones that exchange).

Run: ``python benchmarks/bench_skip_agreement.py`` (about a minute on 2 cores; prints a Markdown table).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import parser, positive_int, run  # noqa: E402


def _latency(docs: int, calls: int) -> float:
    import torch
    import torch.distributed as dist

    from fcp_data import FCPCollator
    from fcp_data.slots import MicroBatchMeta, SampleSlot
    from fcp_exec.skips import agree_skips

    rank = dist.get_rank()
    meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=10**6,
                          ranks=(0, 1), cp_rank=rank)
    items = [({"input_ids": torch.arange(1, 257)}, SampleSlot(index=i, num_tokens=256, length=256, meta=meta))
             for i in range(docs)]
    batch = FCPCollator()(items)
    times = []
    for _ in range(calls):
        dist.barrier()
        t0 = time.perf_counter()
        agree_skips(batch, "cpu")
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bench(docs: int, calls: int, steps: int) -> dict:
    import torch.distributed as dist

    import fcp_exec.step as step_mod
    from fcp_exec.train import TrainConfig, Trainer

    out = {"latency_s": _latency(docs, calls)}
    real = step_mod.agree_skips
    cfg = TrainConfig(model="tiny-llm", steps=steps, global_batch_size=16, verbose=False, max_tokens=1024,
                      tokens_per_rank=512, num_workers=0, prefetch=2)
    trainers = {"on": Trainer(cfg), "off": Trainer(cfg)}  # same seed: the same global batches and plans
    times, exchanged = {"on": [], "off": []}, 0
    for k in range(steps + 2):
        for mode in (("on", "off") if k % 2 == 0 else ("off", "on")):  # alternating order
            step_mod.agree_skips = real if mode == "on" else (lambda b, *a, **kw: b)
            dist.barrier()
            rec = trainers[mode].step()
            step_mod.agree_skips = real
            if k >= 2:  # the first two steps warm up (planner thread, allocator)
                times[mode].append(rec["step_time_s"])
                exchanged += mode == "on" and sum(1 for d in rec["degrees"] if max(d, default=1) > 1)
    ratios = [a / b for a, b in zip(times["on"], times["off"])]
    out.update(on=statistics.median(times["on"]), off=statistics.median(times["off"]), exchanged=exchanged,
               ratio=statistics.median(ratios))
    return out


def build_parser():
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--docs", type=positive_int, default=8, help="documents in the batch of part 1")
    p.add_argument("--calls", type=positive_int, default=500, help="agree_skips calls timed in part 1")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per mode in part 2")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    from fcp_exec.launch import launch

    res = launch(_bench, 2, args.docs, args.calls, args.steps)[0]
    print(f"| measure (2 gloo processes) | value |\n|---|---:|\n"
          f"| one `agree_skips` call, degree 2, {args.docs} documents, nothing failed | {res['latency_s'] * 1e6:.0f} µs |\n"
          f"| tiny-llm step, agreement on (median of {args.steps}) | {res['on'] * 1e3:.1f} ms |\n"
          f"| tiny-llm step, agreement off (median of {args.steps}) | {res['off'] * 1e3:.1f} ms |\n"
          f"| on / off, median of the per-step ratios (same global batch) | {res['ratio']:.3f}× |\n"
          f"| timed micro-batches with a group of degree > 1 | {res['exchanged']} |")


if __name__ == "__main__":
    run(main)
