"""One short GPU check of the CUDA attention path against the dense reference, plus timings.

Without a CUDA device it prints ``no CUDA device`` and exits 0. With one it:

1. checks ``CudaKernel`` (flash-attn varlen if importable, else SDPA + math lse) forward and
   backward in bf16 against dense fp64 attention on packed documents (causal and full, GQA),
   including a split-key merge with backward against the merged out/lse (what the ring does);
2. checks ``ring_attention`` of degree 1 on the GPU against the same reference;
3. times kernel forward+backward on a larger packed batch with CUDA events.

Usage: ``python benchmarks/gpu_check.py [--tokens 32768] [--heads 16 4 128]``
"""
from __future__ import annotations

import argparse
import sys

import torch


def _rel(got, want) -> float:
    return ((got.double().cpu() - want.double().cpu()).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _check(kernel, causal: bool, dev) -> dict:
    from fcp_exec import ring_attention
    from fcp_exec.testing import dense_attention

    cu = [0, 100, 100, 356, 357, 612]
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(cu[-1], h, 64, generator=gen, dtype=torch.float64) for h in (8, 2, 2, 8))
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = dense_attention(qr, kr, vr, cu, causal=causal, softmax_scale=0.125)
    rg = torch.autograd.grad(ref, (qr, kr, vr), dout)
    qb, kb, vb, db = (x.to(dev, torch.bfloat16) for x in (q, k, v, dout))
    out, lse = kernel.forward(qb, kb, vb, cu, cu, causal, 0.125)
    grads = kernel.backward(db, qb, kb, vb, out, lse, cu, cu, causal, 0.125)
    errs = {"out": _rel(out, ref)}
    errs.update({n: _rel(g, w) for n, g, w in zip(("dq", "dk", "dv"), grads, rg)})
    ql, kl, vl = (x.clone().requires_grad_() for x in (qb, kb, vb))
    ro = ring_attention(ql, kl, vl, torch.tensor(cu, device=dev), ranks=[0], causal=causal,
                        softmax_scale=0.125, kernel=kernel)
    ro.backward(db)
    errs["ring1_out"] = _rel(ro, ref)
    errs["ring1_dq"] = _rel(ql.grad, rg[0])
    if not causal:  # split keys of every doc in two blocks, merge, backward against merged stats
        la_n = [(e - s) // 2 for s, e in zip(cu[:-1], cu[1:])]
        half = [sum(la_n[:i]) for i in range(len(cu))]
        a = torch.cat([torch.arange(s, s + (e - s) // 2) for s, e in zip(cu[:-1], cu[1:])]).to(dev)
        b = torch.cat([torch.arange(s + (e - s) // 2, e) for s, e in zip(cu[:-1], cu[1:])]).to(dev)
        cu_b = [c - h for c, h in zip(cu, half)]  # the rest of every document
        oa, la = kernel.forward(qb, kb[a], vb[a], cu, half, False, 0.125)
        ob, lb = kernel.forward(qb, kb[b], vb[b], cu, cu_b, False, 0.125)
        lse_m = torch.logaddexp(la, lb)
        om = oa.float() * torch.exp(la - lse_m).t()[..., None] + ob.float() * torch.exp(lb - lse_m).t()[..., None]
        errs["split_merge_out"] = _rel(om, ref)
        ga = kernel.backward(db, qb, kb[a], vb[a], om.to(torch.bfloat16), lse_m, cu, half, False, 0.125)
        gb = kernel.backward(db, qb, kb[b], vb[b], om.to(torch.bfloat16), lse_m, cu, cu_b, False, 0.125)
        errs["split_merge_dq"] = _rel(ga[0].float() + gb[0].float(), rg[0])
    return errs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--heads", type=int, nargs=3, default=(16, 4, 128), metavar=("HQ", "HKV", "D"))
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 0
    from fcp_exec.kernels import CudaKernel

    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    failures = 0
    for backend in ("auto", "sdpa"):
        kernel = CudaKernel(backend)
        for causal in (True, False):
            errs = _check(kernel, causal, dev)
            ok = all(e <= 3e-2 for e in errs.values())
            failures += not ok
            print(f"{kernel!r:<32} {'causal' if causal else 'full':<6} {'OK  ' if ok else 'FAIL'} "
                  + " ".join(f"{n}={e:.2e}" for n, e in errs.items()))
    hq, hkv, d = args.heads
    cu, n = [0], 0
    gen = torch.Generator().manual_seed(1)
    while cu[-1] < args.tokens:
        n = min(int(torch.randint(256, 8192, (1,), generator=gen)), args.tokens - cu[-1])
        cu.append(cu[-1] + n)
    q, k, v = (torch.randn(cu[-1], h, d, device=dev, dtype=torch.bfloat16) for h in (hq, hkv, hkv))
    for backend in ("auto", "sdpa"):
        kernel = CudaKernel(backend)
        for causal in (True, False):
            def step():
                out, lse = kernel.forward(q, k, v, cu, cu, causal, d ** -0.5)
                kernel.backward(torch.ones_like(out), q, k, v, out, lse, cu, cu, causal, d ** -0.5)
            step()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            times = []
            for _ in range(args.iters):
                start.record()
                step()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            times.sort()
            print(f"timing {kernel!r:<32} {'causal' if causal else 'full':<6} {cu[-1]} tok, {len(cu) - 1} docs, "
                  f"heads {tuple(args.heads)}: fwd+bwd median {times[len(times) // 2]:.2f} ms")
    print("gpu_check:", "PASS" if failures == 0 else f"{failures} FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
