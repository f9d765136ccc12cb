"""Sliding-window layers at ring degree > 1: the halo exchange (``fcp_exec.ring_halo``) against the ring it replaces.

``--degree`` gloo processes (one CP group, default 2), one document of ``--tokens`` tokens zigzag-sharded over them
(8 query heads, 2 key/value heads, head dim 64, float32), ``ring_attention(..., window=W)`` forward + backward for each
``--windows`` value, with the halo (the default where every chunk is at least ``W − 1`` rows) and with
``FCP_WINDOW_HALO=0`` (the ring: the whole K/V shard travels, and dK/dV back), alternating, medians of ``--repeats``
(the slower rank's time of each call). Also the K/V bytes each rank sends per call, forward + backward. Both paths
compute the same result (``tests/exec/test_ring_attention.py`` holds both to dense fp64 attention).

    .venv/bin/python benchmarks/bench_window_halo.py
    .venv/bin/python benchmarks/bench_window_halo.py --tokens 32768 --windows 128,4096 --repeats 7
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _args import parser, positive_int, positive_int_list, run  # noqa: E402


def _call(rank: int, degree: int, tokens: int, window: int, halo: bool, seed: int) -> float:
    import torch.distributed as dist

    from fcp_exec import ring_attention, zigzag_shard

    os.environ["FCP_WINDOW_HALO"] = "1" if halo else "0"
    gen = torch.Generator().manual_seed(seed)
    full = [torch.randn(tokens, h, 64, generator=gen) for h in (8, 2, 2, 8)]
    q, k, v, dout = (zigzag_shard(x, [0, tokens], degree, rank)[0] for x in full)
    cu = zigzag_shard(full[0], [0, tokens], degree, rank)[1]
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    dist.barrier()
    t0 = time.perf_counter()
    out = ring_attention(q, k, v, cu, ranks=tuple(range(degree)), window=window, timeout=120)
    out.backward(dout)
    return time.perf_counter() - t0


def build_parser():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=positive_int, default=16384,
                    help="document length, a multiple of 2 × --degree (default 16384)")
    ap.add_argument("--windows", type=positive_int_list, default="128,1024",
                    help="comma-separated windows (default 128,1024)")
    ap.add_argument("--repeats", type=positive_int, default=5, help="alternating pairs per window (default 5)")
    ap.add_argument("--degree", type=positive_int, default=2, help="CP degree = processes, at least 2 (default 2; more "
                    "than the cores oversubscribes them)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.degree < 2:
        ap.error(f"--degree {args.degree}: at least 2 (the halo exchange runs between ranks)")
    if args.tokens % (2 * args.degree):
        ap.error(f"--tokens {args.tokens}: a multiple of 2 × --degree = {2 * args.degree} (the zigzag's chunks)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from fcp_exec.launch import WorkerPool

    d = args.degree
    print(f"one document of {args.tokens} tokens, degree {d} ({d} gloo processes, {os.cpu_count()} cores), 8/2 heads "
          f"× 64, float32, fwd + bwd; load {os.getloadavg()[0]:.1f}\n")
    print("| window | ring [s] | halo [s] | ring / halo | K/V bytes sent per rank: ring / halo |")
    print("|---:|---:|---:|---:|---|")
    with WorkerPool(d, backend="gloo", pg_timeout=300) as pool:
        for w in args.windows:
            times = {True: [], False: []}
            for rep in range(args.repeats + 1):
                for halo in ((True, False) if rep % 2 else (False, True)):
                    t = max(pool.run(_call, d, args.tokens, w, halo, rep))
                    if rep:  # the first pair warms up
                        times[halo].append(t)
            ring, halo = statistics.median(times[False]), statistics.median(times[True])
            row = 2 * 64 * 4  # one K/V row of 2 heads × 64, float32
            shard = args.tokens // d
            # the ring: K, V at d-1 forward steps; K, V again at d-1 backward steps and dK, dV at all d (home)
            ring_bytes = (2 * (d - 1) + 2 * (d - 1) + 2 * d) * shard * row
            # the halo: K, V tails to both neighbours forward, again in the backward, then their dK, dV back
            halo_bytes = 3 * 4 * (w - 1) * row
            print(f"| {w} | {ring:.3f} | {halo:.3f} | {ring / halo:.2f}× | {ring_bytes / 1e6:.1f} MB / "
                  f"{halo_bytes / 1e6:.2f} MB |", flush=True)
    return 0


if __name__ == "__main__":
    run(main)
