"""Cost of re-forming CP groups every micro-batch: logical groups (µs) vs ``dist.new_group`` (ms).

Spawns a gloo world of ``--world`` CPU processes. Every iteration draws a fresh random partition
of the world into CP groups of mixed degrees (the same on every rank, from a shared seed) and
measures, side by side in the same run:

* ``logical``: building this rank's :class:`fcp_exec.comm.RingComm` (validation, neighbour map) —
  all that fcp does per micro-batch;
* ``new_group``: ``torch.distributed.new_group`` for every group of the partition (a collective
  every rank must join), which is what a per-micro-batch process group would cost;
* ``ring_exchange``: one 64 KiB send/recv round with the ring neighbours on the logical group, for
  scale (the data movement is the same whichever way the group was formed).

Usage: ``python benchmarks/bench_groups.py [--world 4] [--iters 20]``
"""
from __future__ import annotations

import random
import statistics
import time

import torch
import torch.distributed as dist

from _args import count, parser, positive_int, run
from fcp_exec.comm import RingComm
from fcp_exec.launch import WorkerPool


def _partition(rng: random.Random, world: int) -> list[tuple[int, ...]]:
    ranks = list(range(world))
    rng.shuffle(ranks)
    groups = []
    while ranks:
        size = rng.randint(1, len(ranks))
        groups.append(tuple(ranks[:size]))
        ranks = ranks[size:]
    return groups


def bench_worker(rank: int, iters: int, seed: int) -> dict:
    world = dist.get_world_size()
    rng = random.Random(seed)
    logical, new_group, exchange = [], [], []
    payload = torch.zeros(16384)  # 64 KiB
    for _ in range(iters):
        groups = _partition(rng, world)
        mine = next(g for g in groups if rank in g)
        t0 = time.perf_counter()
        comm = RingComm(mine)
        logical.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        for g in groups:
            dist.new_group(list(g))
        new_group.append(time.perf_counter() - t0)
        dist.barrier()
        if comm.degree > 1:
            t0 = time.perf_counter()
            comm.send_recv([payload], what="payload").wait()
            exchange.append(time.perf_counter() - t0)
        dist.barrier()
    return {"logical": logical, "new_group": new_group, "exchange": exchange}


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--world", type=positive_int, default=4, help="gloo CPU processes")
    ap.add_argument("--iters", type=positive_int, default=20, help="micro-batches, each a fresh random partition")
    ap.add_argument("--seed", type=count, default=0, help="random seed of the partitions (the same on every rank)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    with WorkerPool(args.world, backend="gloo", pg_timeout=120) as pool:
        results = pool.run(bench_worker, args.iters, args.seed, timeout=600)
    logical = [x for r in results for x in r["logical"]]
    new_group = [max(r["new_group"][i] for r in results) for i in range(args.iters)]
    exchange = [x for r in results for x in r["exchange"]]
    med_l, med_n = statistics.median(logical), statistics.median(new_group)
    print(f"world={args.world} gloo CPU, {args.iters} micro-batches, random partitions into CP groups")
    print(f"  logical groups (RingComm per rank) : median {med_l * 1e6:8.1f} us   (p90 "
          f"{sorted(logical)[int(0.9 * len(logical))] * 1e6:.1f} us)")
    print(f"  dist.new_group for every group     : median {med_n * 1e3:8.2f} ms   "
          f"({med_n / med_l:,.0f}x the logical cost)")
    if exchange:
        print(f"  one 64 KiB ring exchange (P2P)     : median {statistics.median(exchange) * 1e3:8.3f} ms")
    return 0


if __name__ == "__main__":
    run(main)
