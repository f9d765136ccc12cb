"""Sliding windows on the device: the fused banded kernel (degree 1) against dense fp64, and what it saves.

``python benchmarks/gpu_check_window.py --out DIR [--device cuda|cpu]``

1. ``window[backend,dtype] W=…``: degree-1 ``ring_attention(..., window=W)`` on documents of 1, 0, 40, 257 and a long
   one (4,099 tokens on a GPU), forward and backward, against ``fcp_exec.testing.dense_attention(window=W)`` in
   float64 on the same rounded inputs; tolerances of ``gpu_check.TOL`` (out / gradients relative to the largest
   reference entry, absolute where that is below 1). Each entry records whether the kernel's fused banded path ran (``fused``: ``kernel.fused_window``
   — flash-attn / torch's flash varlen on fp16/bf16 CUDA tensors) or the shared masked math path. Backends: the
   device's ``auto`` kernel and, on a GPU, ``CudaKernel("sdpa")`` (which has no fused window: the masked path).
2. ``ring_window[...] d=… W=…``: the ring schedule at degree 2 and 4 (one thread per virtual rank, in one process)
   with windows 7, 300 and 5,000 against dense fp64: on a GPU every block goes through the fused banded kernel, one
   call per pair of zigzag chunks (``fcp_exec.kernels.window_band``).
3. ``window_timing``: one causal document of ``--tokens`` (GPU 32,768; heads 32/8, head dim 128, bf16), forward +
   backward, CUDA events, median of ``--iters``: full causal, window 4,096 and 512 fused, and window 4,096 on the
   masked path — the cost before the fused path existed.

Writes ``DIR/results_window.json`` (``gpu_check.py``'s entry format). Exit 0 all passed, 1 a check failed.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]
from _args import output_dir, parser, positive_int, run  # noqa: E402
from gpu_check import TOL, Results, elapsed_ms  # noqa: E402  (benchmarks/ is not a package)


def check(kernel, dtype_name: str, window: int, lens, device) -> dict:
    from fcp_exec import ring_attention
    from fcp_exec.testing import dense_attention

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(window)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    q, k, v, dout = (torch.randn(cu[-1], h, 64, generator=gen).to(dtype) for h in (8, 2, 2, 8))
    leaves = [x.to(device, copy=True).requires_grad_() for x in (q, k, v)]
    fused = bool(kernel.fused_window(leaves[0]))
    out = ring_attention(*leaves, cu, ranks=(0,), kernel=kernel, window=window)
    out.backward(dout.to(device))
    ref_leaves = [x.to(torch.float64, copy=True).requires_grad_() for x in (q, k, v)]
    ref = dense_attention(*ref_leaves, cu, window=window)
    ref.backward(dout.double())
    errors = {}
    for name, got, want in [("out", out, ref)] + [(n, a.grad, b.grad) for n, a, b in
                                                  zip(("dq", "dk", "dv"), leaves, ref_leaves)]:
        want = want.detach()
        # relative to the largest reference entry, absolute below 1 (W = 1: each row sees only itself, dq is 0)
        errors[name] = float((got.detach().double().cpu() - want).abs().max()) / max(float(want.abs().max()), 1.0)
    t_out, t_grad, _ = TOL[dtype_name]
    return {"errors": errors, "tolerances": {"out": t_out, "dq": t_grad, "dk": t_grad, "dv": t_grad},
            "fused": fused, "kernel": repr(kernel), "documents": list(lens)}


def check_ring(kernel, dtype_name: str, window: int, degree: int, device) -> dict:
    """The ring schedule at ``degree`` (one thread per virtual rank, ``_gpu_check_ring.run_ring_threads``) with
    ``window``: a fused banded kernel runs one call per pair of zigzag chunks (``fcp_exec.kernels.window_band``)."""
    from _gpu_check_ring import run_ring_threads

    from fcp_exec.testing import dense_attention

    dtype = getattr(torch, dtype_name)
    lens = [2 * degree * n for n in (3, 0, 20, 260 if device.type == "cuda" else 40)]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    gen = torch.Generator().manual_seed(100 * degree + window)
    q, k, v, dout = (torch.randn(cu[-1], h, 64, generator=gen).to(dtype) for h in (8, 2, 2, 8))
    fused = bool(kernel.fused_band(q.to(device)))
    got = run_ring_threads(*(x.to(device) for x in (q, k, v, dout)), cu, degree, True, 64 ** -0.5, kernel,
                           window=window)
    ref_leaves = [x.to(torch.float64, copy=True).requires_grad_() for x in (q, k, v)]
    ref = dense_attention(*ref_leaves, cu, window=window)
    ref.backward(dout.double())
    errors = {}
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, (ref, *(x.grad for x in ref_leaves))):
        w = w.detach()
        errors[name] = float((g.double().cpu() - w).abs().max()) / max(float(w.abs().max()), 1.0)
    t_out, t_grad, _ = TOL[dtype_name]
    return {"errors": errors, "tolerances": {"out": t_out, "dq": t_grad, "dk": t_grad, "dv": t_grad},
            "fused": fused, "kernel": repr(kernel), "documents": lens, "degree": degree}


def timing(kernels: dict, tokens: int, heads, device, iters: int, dtype) -> dict:
    from fcp_exec import ring_attention

    hq, hkv, d = heads
    q, k, v = (torch.randn(tokens, h, d, device=device, dtype=dtype).requires_grad_() for h in (hq, hkv, hkv))
    dout = torch.randn(tokens, hq, d, device=device, dtype=dtype)
    cu = [0, tokens]
    cases = {"full causal": (kernels["auto"], None), "window 4096 fused": (kernels["auto"], 4096),
             "window 512 fused": (kernels["auto"], 512), "window 4096 masked path": (kernels["masked"], 4096)}
    times = {name: [] for name in cases}
    fused = {}
    for r in range(iters + 1):
        for name, (kernel, window) in cases.items():
            fused[name] = window is not None and bool(kernel.fused_window(q))

            def step(kernel=kernel, window=window):
                for x in (q, k, v):
                    x.grad = None
                ring_attention(q, k, v, cu, ranks=(0,), kernel=kernel, window=window).backward(dout)

            ms = elapsed_ms(step, device)
            if r:
                times[name].append(ms)
    med = {name: statistics.median(t) for name, t in times.items()}
    return {"passed": True, "median_ms_by_case": med, "fused_by_case": fused, "tokens": tokens, "heads": list(heads),
            "iters": iters, "vs_full_causal": {n: m / med["full causal"] for n, m in med.items()}}


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=output_dir, required=True, help="folder for results_window.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the checks run (default cuda when torch sees a GPU, else cpu)")
    ap.add_argument("--tokens", type=positive_int, help="timing document (default: GPU 32768, CPU 1024)")
    ap.add_argument("--iters", type=positive_int, help="timed iterations (default: GPU 5, CPU 1)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_window: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    from fcp_exec.kernels import CudaKernel, default_kernel

    device, cuda, t0 = torch.device(args.device), args.device == "cuda", time.monotonic()
    if not cuda:
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    res = Results(args.out, {"script": "benchmarks/gpu_check_window.py", "device": args.device,
                             "torch": torch.__version__}, file_name="results_window.json")
    auto = default_kernel(device)
    kernels = {"auto": auto, "masked": CudaKernel("sdpa") if cuda else auto}
    lens = (1, 0, 40, 257, 4099) if cuda else (1, 0, 40, 257)
    for label, kernel in ([("auto", auto), ("sdpa", kernels["masked"])] if cuda else [("auto", auto)]):
        for dtype_name in ("bfloat16", "float16") if cuda else ("float32", "bfloat16"):
            for window in (1, 7, 64, 300, 5000):
                res.run(f"window[{label},{dtype_name}] W={window} vs dense fp64", "window", check, kernel,
                        dtype_name, window, lens, device)
    for degree in (2, 4):
        for window in (7, 300, 5000):
            res.run(f"ring_window[auto,{'bfloat16' if cuda else 'float32'}] d={degree} W={window} vs dense fp64",
                    "ring_window", check_ring, auto, "bfloat16" if cuda else "float32", window, degree, device)
    tokens = args.tokens or (32768 if cuda else 1024)
    heads = (32, 8, 128) if cuda else (4, 1, 64)
    res.run(f"window_timing degree 1 fwd+bwd {tokens} tokens heads {heads[0]}/{heads[1]} d{heads[2]}", "window_timing",
            timing, kernels, tokens, heads, device, args.iters or (5 if cuda else 1),
            torch.bfloat16 if cuda else torch.float32)
    c = res.checks[-1]
    print(f"  window_timing: median ms {c.get('median_ms_by_case')}; fused {c.get('fused_by_case')}", flush=True)
    res.meta["wall_s"] = round(time.monotonic() - t0, 1)
    res.write()
    failed = res.failed()
    n_fused = sum(bool(c.get("fused")) for c in res.checks if c["section"] in ("window", "ring_window"))
    print(f"gpu_check_window: {len(res.checks)} checks, {len(failed)} failed, {n_fused} on a fused banded kernel; "
          f"{res.meta['wall_s']} s")
    for c in failed:
        print(f"  FAILED {c['name']}: {c.get('reason') or c.get('worst')}")
    return 1 if failed else 0


if __name__ == "__main__":
    run(main, bug_status=2)  # exit 1 is a failed check
