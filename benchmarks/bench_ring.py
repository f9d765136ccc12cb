"""CPU: ring attention of degree 2 vs single-process attention, and per-document vs block-diagonal.

Two gloo worker processes with one torch thread each, same packed documents, same run:

1. ``single``: rank 0 alone runs attention forward+backward over all ``T`` tokens (degree 1,
   CPU flash kernel) while rank 1 waits;
2. ``ring``: both ranks run ``ring_attention`` of degree 2 on their zigzag shards (``T/2`` each);
3. ``kernels``: rank 0 times the CPU flash kernel per document vs one block-diagonal call on
   document mixes from many short to few long documents.

Times are medians of ``--iters`` forward+backward passes; "per token" divides the wall time by
the ``T`` tokens of the whole batch (ideal ring speed-up on two cores: 2x).

Usage: ``python benchmarks/bench_ring.py [--tokens 8192] [--iters 5] [--dtype float32]``
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from _args import parser, positive_int, run
from fcp_exec import ring_attention, zigzag_shard
from fcp_exec.kernels import CpuFlashKernel
from fcp_exec.launch import WorkerPool


def _docs(total: int, mult: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    cu = [0]
    while cu[-1] < total:
        n = int(torch.randint(1, 2048, (1,), generator=gen))
        n = min(n + (-n) % mult, total - cu[-1])
        cu.append(cu[-1] + n)
    return cu


def _time(fn, iters: int, warmup: int = 1) -> tuple[float, float]:
    """Median wall time and median CPU time of this process (the latter is robust to other load)."""
    for _ in range(warmup):
        fn()
    wall, cpu = [], []
    for _ in range(iters):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall), statistics.median(cpu)


def _fwd_bwd(q, k, v, cu, ranks, kernel):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = ring_attention(q, k, v, cu, ranks=ranks, kernel=kernel)
    out.backward(torch.ones_like(out))


def _kernel_fwd_bwd(kernel, q, k, v, cu):
    out, lse = kernel.forward(q, k, v, cu, cu, True, q.shape[-1] ** -0.5)
    kernel.backward(torch.ones_like(out), q, k, v, out, lse, cu, cu, True, q.shape[-1] ** -0.5)


def bench_worker(rank: int, tokens: int, heads: tuple, dtype_name: str, iters: int) -> dict:
    dtype = getattr(torch, dtype_name)
    hq, hkv, d = heads
    cu = _docs(tokens, 4, seed=0)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(cu[-1], h, d, generator=gen).to(dtype) for h in (hq, hkv, hkv))
    kernel = CpuFlashKernel("per_doc")
    res: dict = {"tokens": cu[-1], "docs": len(cu) - 1}
    dist.barrier()
    if rank == 0:
        res["single"] = _time(lambda: _fwd_bwd(q, k, v, torch.tensor(cu), [0], kernel), iters)
    dist.barrier()
    shards = [zigzag_shard(x, cu, 2, rank)[0] for x in (q, k, v)]
    cu_local = torch.tensor(cu) // 2
    res["ring"] = _time(lambda: _fwd_bwd(*shards, cu_local, [0, 1], kernel), iters)
    dist.barrier()
    if rank == 0:
        mixes = {"64 docs x 64": [64] * 64, "16 docs x 256": [256] * 16, "4 docs x 1024": [1024] * 4,
                 "1 doc x 4096": [4096], "mixed (this batch)": None}
        res["kernels"] = {}
        for name, lengths in mixes.items():
            if lengths is not None and sum(lengths) > cu[-1]:
                continue  # the fixed mixes hold 4096 tokens: with a smaller --tokens only the batch's own mix runs
            cu_m = cu if lengths is None else [0] + [sum(lengths[:i + 1]) for i in range(len(lengths))]
            qm, km, vm = (x[:cu_m[-1]] for x in (q, k, v))
            times = {mode: _time(lambda m=mode: _kernel_fwd_bwd(CpuFlashKernel(m), qm, km, vm, cu_m), iters)[0]
                     for mode in ("per_doc", "block_diag")}
            res["kernels"][name] = (cu_m[-1], times)
    dist.barrier()
    return res


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=positive_int, default=8192,
                    help="tokens of the packed batch, a multiple of 4 (every document is: a zigzag over 2 ranks)")
    ap.add_argument("--heads", type=positive_int, nargs=3, default=(8, 2, 64), metavar=("HQ", "HKV", "D"),
                    help="query heads, key/value heads (dividing HQ) and head dim (default 8 2 64)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"], help="tensor dtype")
    ap.add_argument("--iters", type=positive_int, default=3,
                    help="timed forward+backward passes (median), after 1 warm-up")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    hq, hkv, _ = args.heads
    if args.tokens % 4:
        ap.error(f"--tokens {args.tokens}: a multiple of 4 (every document is: a zigzag over 2 ranks)")
    if hq % hkv:
        ap.error(f"--heads {hq} {hkv}: the key/value heads must divide the query heads")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with WorkerPool(2, backend="gloo", pg_timeout=600, num_threads=1) as pool:
        r0, r1 = pool.run(bench_worker, args.tokens, tuple(args.heads), args.dtype, args.iters, timeout=3000)
    t = r0["tokens"]
    ring = max(r0["ring"][0], r1["ring"][0])
    ring_cpu = max(r0["ring"][1], r1["ring"][1])
    single, single_cpu = r0["single"]
    print(f"{t} tokens in {r0['docs']} causal docs, heads {tuple(args.heads)}, {args.dtype}, fwd+bwd, "
          f"1 thread per process, median of {args.iters}")
    print("                                wall ms   wall us/token   CPU ms (slowest rank)")
    print(f"  single process (degree 1)   : {single * 1e3:8.1f}  {single / t * 1e6:9.2f}      {single_cpu * 1e3:8.1f}")
    print(f"  ring attention degree 2     : {ring * 1e3:8.1f}  {ring / t * 1e6:9.2f}      {ring_cpu * 1e3:8.1f}")
    print(f"  speed-up of the ring: wall {single / ring:.2f}x, CPU time {single_cpu / ring_cpu:.2f}x (ideal 2x)")
    print("  CPU flash kernel, fwd+bwd   :   per_doc ms  block_diag ms  block_diag/per_doc")
    for name, (tokens, times) in r0["kernels"].items():
        print(f"    {name:<22} ({tokens:5d} tok): {times['per_doc'] * 1e3:9.1f}  {times['block_diag'] * 1e3:12.1f}"
              f"  {times['block_diag'] / times['per_doc']:8.2f}x")
    return 0


if __name__ == "__main__":
    run(main)
