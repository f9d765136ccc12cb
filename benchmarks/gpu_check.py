"""The prepared check for one GPU (issue 11): kernels, ring schedule, timings, NCCL; JSON results.

``python benchmarks/gpu_check.py --out DIR [--device cuda|cpu] [--quick] [--perturb]``

Sections, each entry written to ``DIR/results.json`` as soon as it is known (so a run cut short
still leaves its results), and printed as one line:

0. ``versions``: python, torch, CUDA, cuDNN, NCCL, flash-attn (installed / importable), the
   device, and what ``auto`` resolves to (``CudaKernel("auto").backend``, probed with one call).
   ``backends_run`` is filled from the kernel checks that actually ran, never from what is
   installed. Also in ``DIR/versions.json``.
1. ``kernel``: the kernel contract per backend (``cuda`` = auto and ``sdpa`` on a GPU, deduplicated
   when auto resolves to sdpa; ``cpu``, ``cpu_block_diag``, ``reference`` on CPU) for every dtype ×
   head dim (64, 128) × GQA ratio (1, 4) × mask: ``causal``, ``full``, and the two unequal-length
   blocks of the ring (all queries × first key halves, second query halves × all keys). Every
   case packs documents of 1, 0, 2, an odd number and ``--long-doc`` tokens (> 4096 on a GPU).
   Forward and backward are compared with a per-document fp64 autograd reference on the same
   rounded inputs (itself checked against ``fcp_exec.testing.dense_attention``); rows without keys
   must have ``lse = -inf``, ``out = 0`` and ``dq = 0`` exactly. ``autocast[...]``: per backend, degree-1
   ``ring_attention`` inside bf16 autocast with fp32 q/k and a bf16 v (a Hugging Face layer under ``bf16=True``)
   must equal the explicit bf16 call bit for bit (autocast must not reach the kernel's fp32 math).
   ``window``: degree-1 ``ring_attention(..., window=W)`` (the sliding-window path every kernel shares) in
   float32 on the device against dense fp64 windowed attention, forward and backward, windows shorter and longer
   than the documents. ``sinks``: the same with attention sinks (gpt-oss), with and without a window; ``softcap``:
   logit soft-capping (Gemma 2; bf16 on a GPU, where flash-attn caps in its kernel).
2. ``ring``: the real schedule of ``fcp_exec.ring_attention`` for degrees 2, 4, 8 with one thread
   per virtual rank and an in-process communicator (see ``_gpu_check_ring.py`` for why and how):
   zigzag shard → forward/backward → unshard, against the fp64 reference; an fp64 run per
   degree/mask checks the schedule tightly, the low-precision runs check it with each backend.
3. ``timing``: degree-1 ``ring_attention`` forward+backward (autograd) of one causal document
   of 32K and 128K tokens, heads 32/8, dim 128, bf16 (smaller on CPU); CUDA events, median ms,
   TFLOP/s (forward 4·H·D·pairs, backward 2.5× forward) next to the device's dense bf16 peak,
   and the host syncs of one step counted with ``torch.cuda.set_sync_debug_mode("warn")``.
4. ``multiprocess``: 2 then 3 NCCL processes (and as many as there are GPUs, up to 8, when more) running
   ``ring_attention`` causal and with a 37-token sliding window (on GPUs the fused band per chunk pair), against
   fp64 (optional, hard time limit). Each rank gets its own GPU when there are enough, else all share GPU 0, which
   NCCL refuses ("Duplicate GPU detected"): recorded as skipped with its message; wrong numbers after a
   successful start are a failure. On CPU the same worker runs once with gloo (2 processes) so the code path is
   tested without a GPU.

Tolerances (``TOL``): ``out`` and ``lse`` against the reference, relative to max |reference|
(``lse``: absolute, finite rows), and the gradients ``dq``/``dk``/``dv`` likewise. An entry's
``max_error``/``tolerance`` are those of its worst component (``worst``); all are in ``errors``.

``--perturb`` or ``FCP_GPU_CHECK_PERTURB=1`` scales every kernel output by 1.05: the run must
then fail, which ``tests/exec/test_gpu_check.py`` checks. Exit code: 0 all passed or skipped with a
reason, 1 any check failed, 2 the script itself could not run.
"""
from __future__ import annotations

import argparse
import collections
import importlib.metadata
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import warnings

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]  # the helper module, and fcp_exec of this checkout
from _args import names, output_dir, parser, positive_float, positive_int, run  # noqa: E402
from fcp_exec.kernels.base import AttentionKernel  # noqa: E402
from _gpu_check_ring import (  # noqa: E402  (benchmarks/ is not a package)
    multiprocess_checks,
    reference_attention,
    rel_error,
    ring_inputs,
    ring_section,
)

# per dtype: (out, gradients, lse) — out and gradients relative to max |reference|, lse absolute
TOL = {
    "float64": (1e-9, 1e-9, 1e-9),
    "float32": (2e-5, 5e-5, 2e-5),
    "bfloat16": (2e-2, 5e-2, 1e-3),
    "float16": (5e-3, 1e-2, 1e-3),
}
MASKS = ("causal", "full", "q_all_k_first_half", "q_second_half_k_all")
_SHORT = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}



class Results:
    """Entries of one run; ``DIR/results.json`` is rewritten at most once a second while checks run
    (after every failure at once) and at the end, so a run cut short still leaves its results."""

    def __init__(self, out_dir: str, meta: dict, file_name: str = "results.json"):
        self.out_dir, self.meta, self.checks, self.file_name = out_dir, meta, [], file_name
        self.late_reason = "time limit reached"  # reason of checks skipped for --time-limit
        self._written = 0.0
        os.makedirs(out_dir, exist_ok=True)

    def add(self, name: str, section: str, *, passed=None, skipped=False, reason=None, errors=None,
            tolerances=None, max_error=None, tolerance=None, **details) -> dict:
        worst = None
        if errors:
            worst = max(errors, key=lambda n: errors[n] / tolerances[n])
            max_error, tolerance = errors[worst], tolerances[worst]
            if passed is None:
                passed = all(errors[n] <= tolerances[n] for n in errors)
        entry = {"name": name, "section": section, "passed": None if skipped else bool(passed),
                 "skipped": bool(skipped), "reason": reason, "max_error": max_error,
                 "tolerance": tolerance, "worst": worst, "errors": errors, "tolerances": tolerances, **details}
        self.checks.append(entry)
        line = f"{'SKIP' if skipped else 'PASS' if passed else 'FAIL'}  {name}"
        if max_error is not None:
            line += f" max_err={max_error:.2e} tol={tolerance:.0e} ({worst})"
        if "median_ms" in details:
            line += (f": {details['median_ms']:.2f} ms, {details['tflops']:.2f} TFLOP/s (peak "
                     f"{details['peak_bf16_tflops']}), host syncs {details.get('host_syncs_per_step', 'not counted')}")
        print(line + (f": {reason}" if reason and not passed else ""), flush=True)
        self.write(force=not skipped and not passed)
        return entry

    def run(self, name: str, section: str, fn, *args, implementation=None, **kwargs) -> dict:
        """Call ``fn`` (returning ``add`` keyword arguments); an exception is a failed entry.
        ``implementation`` is the kernel implementation under test; it counts as run
        (``backends_run``) only when ``fn`` returned, i.e. the kernel produced results."""
        t = time.monotonic()
        try:
            kw = {"implementation": implementation, **fn(*args, **kwargs)}
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            kw = {"passed": False, "reason": f"{type(exc).__name__}: {exc}"[:2000], "implementation": None,
                  "implementation_attempted": implementation, "traceback": traceback.format_exc(limit=-3)[-3000:]}
        return self.add(name, section, seconds=round(time.monotonic() - t, 3), **kw)

    def add_all(self, names, section: str, **kwargs) -> None:
        for name in names:
            self.add(name, section, **kwargs)

    def failed(self) -> list:
        return [c for c in self.checks if not c["skipped"] and not c["passed"]]

    def write(self, force: bool = True) -> None:
        if not force and time.monotonic() - self._written < 1.0:
            return
        self._written = time.monotonic()
        # only implementations of checks that ran, never what is merely installed
        ran = sorted({c["implementation"] for c in self.checks if c.get("implementation") and not c["skipped"]})
        self.meta["backends_run"] = ran
        if self.checks and self.checks[0]["name"] == "versions":
            self.checks[0].update(backends_run=ran, auto_ran=self.checks[0]["auto_kernel"]["resolved"] in ran)
            self.meta["versions"].update(backends_run=ran, auto_ran=self.checks[0]["auto_ran"])
        doc = {**self.meta, "checks": self.checks,
               "summary": {"total": len(self.checks), "failed": len(self.failed()),
                           "skipped": sum(c["skipped"] for c in self.checks)}}
        _dump(doc, os.path.join(self.out_dir, self.file_name))


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)  # "inf"/"nan": keeps results.json valid JSON
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _dump(doc, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_json_safe(doc), f, indent=1)
    os.replace(tmp, path)


class PerturbedKernel(AttentionKernel):
    """A deliberately broken kernel: the wrapped kernel's ``out`` times 1.05 (``--perturb``)."""

    name = "perturbed"

    def __init__(self, inner):
        self.inner = inner

    def forward(self, *args, **kwargs):
        out, lse = self.inner.forward(*args, **kwargs)
        return out * 1.05, lse

    def backward(self, *args, **kwargs):
        return self.inner.backward(*args, **kwargs)

    def fused_window(self, q) -> bool:
        return self.inner.fused_window(q)

    def fused_band(self, q) -> bool:
        return self.inner.fused_band(q)

    def __repr__(self) -> str:
        return f"PerturbedKernel({self.inner!r})"


# ---------------------------------------------------------------------------- 0. versions, backends
def _impl(kernel) -> str:
    """The implementation a kernel object runs (what "auto" resolved to, for CudaKernel)."""
    from fcp_exec.kernels import CpuFlashKernel, CudaKernel, ReferenceKernel

    if isinstance(kernel, CudaKernel):
        return kernel.backend
    if isinstance(kernel, CpuFlashKernel):
        return f"cpu_flash({kernel.mode})"
    if isinstance(kernel, ReferenceKernel):
        return "reference"
    return type(kernel).__name__


def kernel_backends(device):
    """``(backends, tight, skipped)``: ``(label, kernel, implementation)`` per distinct backend, the
    kernel for the fp64 ring runs, and ``(name, reason)`` of backends not run twice."""
    from fcp_exec.kernels import CpuFlashKernel, CudaKernel, ReferenceKernel

    if device.type == "cuda":
        auto = CudaKernel("auto")
        backends = [(f"cuda(auto:{auto.backend})", auto, auto.backend)]
        skipped = []
        if auto.backend != "sdpa":
            backends.append(("sdpa", CudaKernel("sdpa"), "sdpa"))
        else:
            skipped.append(("kernel[sdpa]", "same implementation as kernel[cuda(auto:sdpa)] (flash-attn is not "
                            "importable, so auto resolved to sdpa); checked once, not reported twice"))
        return backends, ("sdpa", CudaKernel("sdpa"), "sdpa"), skipped  # fp64 always takes the sdpa path
    backends = [(name, k, _impl(k)) for name, k in (("cpu", CpuFlashKernel("per_doc")),
                                                     ("cpu_block_diag", CpuFlashKernel("block_diag")),
                                                     ("reference", ReferenceKernel()))]
    return backends, backends[0], []


def collect_versions(device) -> dict:
    """Versions and the ``auto`` kernel; ``auto_kernel.probe`` is one tiny forward of it."""
    from fcp_exec.kernels import default_kernel, flash_attn_available

    fa_version = None
    for dist_name in ("flash-attn", "flash_attn"):
        try:
            fa_version = importlib.metadata.version(dist_name)
            break
        except importlib.metadata.PackageNotFoundError:
            pass
    v = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
         "cuda_runtime": torch.version.cuda, "cudnn": None, "nccl": None,
         "flash_attn": {"installed": fa_version, "varlen_importable": flash_attn_available()}}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        v["cudnn"] = torch.backends.cudnn.version()
        try:
            nccl = torch.cuda.nccl.version()
            v["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception as exc:  # noqa: BLE001 - a torch built without NCCL
            v["nccl"] = f"unavailable ({type(exc).__name__})"
        v["device"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                       "memory_gib": round(props.total_memory / 2 ** 30, 1), "count": torch.cuda.device_count()}
    else:
        v["device"] = {"name": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                       "torch_threads": torch.get_num_threads()}
    kernel = default_kernel(device)
    auto = {"default_kernel": repr(kernel), "resolved": _impl(kernel)}
    try:
        dt = torch.bfloat16 if device.type == "cuda" else torch.float32
        q = torch.randn(8, 2, 64, device=device, dtype=dt)
        kernel.forward(q, q, q, [0, 8], [0, 8], True, 0.125)
        auto["probe"] = "ok"
    except Exception as exc:  # noqa: BLE001 - recorded; the kernel checks then fail with details
        auto["probe"] = f"{type(exc).__name__}: {exc}"[:500]
    v["auto_kernel"] = auto
    return v


# ---------------------------------------------------------------------------- 1. kernel contract
def _halves(cu):
    """Row indices of the first and second half of every document, and their cu_seqlens."""
    first, second, cu_first, cu_second = [], [], [0], [0]
    for a, b in zip(cu[:-1], cu[1:]):
        h = (b - a) // 2
        first += range(a, a + h)
        second += range(a + h, b)
        cu_first.append(cu_first[-1] + h)
        cu_second.append(cu_second[-1] + (b - a - h))
    return torch.tensor(first, dtype=torch.long), torch.tensor(second, dtype=torch.long), cu_first, cu_second


def contract_case(lengths, heads, dtype, mask, device, seed):
    """Inputs of one kernel case: ``(q, k, v, dout, cu_q, cu_k, causal)`` rounded to ``dtype``."""
    cu, q, k, v, dout = ring_inputs(lengths, heads, dtype, device, seed)
    first, second, cu_first, cu_second = _halves(cu)
    if mask == "q_all_k_first_half":  # the ring's step with an earlier source rank
        first = first.to(device)
        return q, k[first], v[first], dout, cu, cu_first, False
    if mask == "q_second_half_k_all":  # the ring's step with a later source rank
        second = second.to(device)
        return q[second], k, v, dout[second], cu_second, cu, False
    return q, k, v, dout, cu, cu, mask == "causal"


def check_kernel(kernel, case, ref, scale, dtype_name):
    q, k, v, dout, cu_q, cu_k, causal = case
    r_out, r_lse, r_dq, r_dk, r_dv = ref
    t_out, t_grad, t_lse = TOL[dtype_name]
    out, lse = kernel.forward(q, k, v, cu_q, cu_k, causal, scale)
    grads = kernel.backward(dout, q, k, v, out, lse, cu_q, cu_k, causal, scale)
    want_lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    problems = []
    if out.shape != q.shape or out.dtype != q.dtype:
        problems.append(f"out is {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {q.dtype}")
    if lse.shape != (q.shape[1], q.shape[0]) or lse.dtype != want_lse_dtype:
        problems.append(f"lse is {tuple(lse.shape)} {lse.dtype}, expected {(q.shape[1], q.shape[0])} {want_lse_dtype}")
    for n, g, x in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        if g.shape != x.shape or g.dtype != x.dtype:
            problems.append(f"{n} is {tuple(g.shape)} {g.dtype}, expected {tuple(x.shape)} {x.dtype}")
    empty = torch.isinf(r_lse)  # [H, T_q]: rows that see no key
    finite = ~empty
    lse_err = (lse.double() - r_lse)[finite].abs().max().item() if finite.any() else 0.0
    num_empty_rows = int(empty[0].sum())
    if num_empty_rows:
        rows = empty[0]
        if not bool((lse[empty] == float("-inf")).all()):
            problems.append("lse is not -inf on rows without keys")
        if not bool((out[rows] == 0).all()):
            problems.append("out is not exactly 0 on rows without keys")
        if not bool((grads[0][rows] == 0).all()):
            problems.append("dq is not exactly 0 on rows without keys")
    errors = {"out": rel_error(out, r_out), "lse": lse_err if math.isfinite(lse_err) else float("inf"),
              "dq": rel_error(grads[0], r_dq), "dk": rel_error(grads[1], r_dk), "dv": rel_error(grads[2], r_dv)}
    tols = {"out": t_out, "lse": t_lse, "dq": t_grad, "dk": t_grad, "dv": t_grad}
    res = {"errors": errors, "tolerances": tols, "num_empty_rows": num_empty_rows}
    if problems:
        res.update(passed=False, reason="; ".join(problems))
    return res


def reference_self_check():
    """The per-document fp64 reference against ``fcp_exec.testing.dense_attention`` (autograd)."""
    from fcp_exec.testing import dense_attention

    errors = {}
    for causal in (True, False):
        cu, q, k, v, dout = ring_inputs([1, 0, 2, 7, 12], (4, 2, 8), torch.float64, "cpu", seed=3)
        ref = reference_attention(q, k, v, dout, cu, cu, causal, 0.3)
        qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
        dense = dense_attention(qr, kr, vr, cu, causal=causal, softmax_scale=0.3)
        grads = torch.autograd.grad(dense, (qr, kr, vr), dout)
        tag = "causal" if causal else "full"
        for n, got, want in zip(("out", "dq", "dk", "dv"), ref[:1] + ref[2:], (dense, *grads)):
            errors[f"{tag}_{n}"] = rel_error(got, want)
    return {"errors": errors, "tolerances": {n: 1e-12 for n in errors}}


def kernel_section(res: Results, cfg, backends, deadline) -> None:
    """Section 1: every backend on every case; one reference per case, shared by the backends."""
    res.run("kernel reference self-check (fp64 vs testing.dense_attention)", "kernel", reference_self_check)
    seed = 0
    for dtype_name in cfg.dtypes:
        dtype = getattr(torch, dtype_name)
        for head_dim in cfg.head_dims:
            for ratio in cfg.gqa_ratios:
                heads = (cfg.kv_heads * ratio, cfg.kv_heads, head_dim)
                for mask in MASKS:
                    seed += 1
                    lengths = [1, 0, 2, cfg.odd_doc, cfg.long_doc, 0]
                    tag = f"{_SHORT[dtype_name]} d{head_dim} gqa{ratio} {mask} docs={lengths}"
                    names = [f"kernel[{label}] {tag}" for label, _, _ in backends]
                    if time.monotonic() > deadline:
                        res.add_all(names, "kernel", skipped=True, reason=res.late_reason)
                        continue
                    try:
                        case = contract_case(lengths, heads, dtype, mask, cfg.device, seed)
                        ref = reference_attention(*case, head_dim ** -0.5)
                    except Exception as exc:  # noqa: BLE001 - e.g. out of memory: every backend's entry fails
                        res.add_all(names, "kernel", passed=False, reason=f"inputs/reference: {type(exc).__name__}: {exc}")
                        continue
                    for label, kernel, impl in backends:
                        res.run(f"kernel[{label}] {tag}", "kernel", check_kernel, kernel, case, ref,
                                head_dim ** -0.5, dtype_name, implementation=impl)
    for label, kernel, impl in backends:
        name = f"autocast[{label}] bf16 autocast, fp32 q/k + bf16 v"
        if isinstance(kernel, PerturbedKernel):  # not an AttentionKernel: ring_attention refuses it
            res.add(name, "kernel", skipped=True, reason="perturbed run: the check compares a kernel with itself")
        else:
            res.run(name, "kernel", check_autocast, kernel, cfg.device, implementation=impl)
    res.run("window sliding-window path fp32 vs dense fp64", "kernel", check_window, cfg.device)
    res.run("sinks attention sinks (gpt-oss) fp32 vs dense fp64", "kernel", check_sinks, cfg.device)
    res.run("softcap logit soft-capping (Gemma 2) vs dense fp64", "kernel", check_softcap, cfg.device)


def check_window(device) -> dict:
    """Degree-1 ``ring_attention(..., window=W)`` in float32 on ``device``, forward and backward, against
    ``fcp_exec.testing.dense_attention(window=W)`` in float64: out and the input gradients within 1e-5 of the largest
    reference entry (absolute when that is below 1), for windows 1, 7, 64 and 300 over documents of 1, 0, 40 and 257
    tokens."""
    return _degree1_vs_dense(device, 11, [(w, False, None) for w in (1, 7, 64, 300)])


def check_sinks(device) -> dict:
    """Degree-1 ``ring_attention(..., sinks=s)`` in float32 on ``device`` (the default kernel, and a 7-token window),
    forward and backward, against ``fcp_exec.testing.dense_attention(sinks=s)`` in float64 (the sink as a softmax
    column): out, the input gradients and the sinks' gradient within 1e-5 of the largest reference entry (absolute
    below 1). The sinks are applied to the kernel's ``(out, lse)``, so this checks the device kernel's lse."""
    return _degree1_vs_dense(device, 12, [(None, True, None), (7, True, None)])


def check_softcap(device) -> dict:
    """Degree-1 ``ring_attention(..., softcap=1.5)``, with and without a 7-token window, against dense fp64 with the
    cap: on a GPU in bfloat16 (where flash-attn caps in its kernel, ``fused_softcap``; else the masked path) within
    3e-2, on CPU in float32 (the masked path) within 1e-5, of the largest reference entry (absolute below 1)."""
    cuda = torch.device(device).type == "cuda"
    return _degree1_vs_dense(device, 13, [(None, False, 1.5), (7, False, 1.5)],
                             dtype=torch.bfloat16 if cuda else torch.float32, tol=3e-2 if cuda else 1e-5)


def _degree1_vs_dense(device, seed: int, cases, dtype=torch.float32, tol: float = 1e-5) -> dict:
    """``cases``: (window, with sinks, softcap) triples, run on documents of 1, 0, 40 and 257 tokens (heads 4/2,
    dim 32) in ``dtype``."""
    from fcp_exec import ring_attention
    from fcp_exec.testing import dense_attention

    gen = torch.Generator(device="cpu").manual_seed(seed)
    cu = [0, 1, 1, 41, 298]
    q, k, v, dout = (torch.randn(298, h, 32, generator=gen, dtype=torch.float64) for h in (4, 2, 2, 4))
    sinks = 2 * torch.randn(4, generator=gen, dtype=torch.float64)
    worst = 0.0
    for window, with_sinks, cap in cases:
        inputs = (q, k, v, sinks) if with_sinks else (q, k, v)
        leaves = [x.to(device, dtype).requires_grad_() for x in inputs]
        out = ring_attention(*leaves[:3], cu, ranks=(0,), window=window, sinks=leaves[3] if with_sinks else None,
                             softcap=cap)
        out.backward(dout.to(device, dtype))
        ref_leaves = [x.to(dtype).double().requires_grad_() for x in inputs]  # the same rounded inputs
        ref = dense_attention(*ref_leaves[:3], cu, window=window, sinks=ref_leaves[3] if with_sinks else None,
                              softcap=cap)
        ref.backward(dout)
        for got, want in [(out, ref)] + [(a.grad, b.grad) for a, b in zip(leaves, ref_leaves)]:
            # relative to the largest reference entry, absolute below 1 (window 1: dq is exactly 0)
            err = float((got.detach().double().cpu() - want.detach()).abs().max()) / max(float(want.detach().abs().max()), 1.0)
            worst = max(worst, err)
    ok = worst <= tol
    return {"passed": ok, "max_error": worst, "tolerance": tol,
            "reason": None if ok else f"largest relative difference {worst:.3e} > {tol:g}"}


def check_autocast(kernel, device) -> dict:
    """``ring_attention`` (degree 1) inside ``torch.autocast(device, bfloat16)`` with fp32 q/k and a bf16 v — what
    a Hugging Face layer hands over under the Trainer's ``bf16=True`` — backward inside autocast too: out and the
    input gradients must be bit-identical to the same call on bf16 inputs outside autocast (autocast must not reach
    the kernel's fp32 math), out bf16, each gradient in its input's dtype."""
    from fcp_exec import ring_attention

    gen = torch.Generator(device="cpu").manual_seed(7)
    cu = torch.tensor([0, 5, 64, 65, 193], dtype=torch.int32)
    q, k, v, dout = (torch.randn(193, h, 64, generator=gen).to(device) for h in (8, 2, 2, 8))
    leaves = [q.clone().requires_grad_(), k.clone().requires_grad_(), v.bfloat16().requires_grad_()]
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        out = ring_attention(*leaves, cu, ranks=(0,), kernel=kernel)
        out.backward(dout.bfloat16())
    plain = [x.detach().bfloat16().requires_grad_() for x in leaves]
    want = ring_attention(*plain, cu, ranks=(0,), kernel=kernel)
    want.backward(dout.bfloat16())
    pairs = [(out, want)] + [(a.grad, b.grad.to(a.dtype)) for a, b in zip(leaves, plain)]
    diff = max(float((x.detach().double() - y.detach().double()).abs().max()) for x, y in pairs)
    dtypes = [str(t.dtype) for t in (out, *(x.grad for x in leaves))]
    ok = diff == 0.0 and dtypes == ["torch.bfloat16", "torch.float32", "torch.float32", "torch.bfloat16"]
    return {"passed": ok, "max_error": diff, "tolerance": 0.0, "dtypes": dtypes,
            "reason": None if ok else f"largest difference {diff:.3e} (out, dq, dk, dv must be identical); {dtypes}"}


# ---------------------------------------------------------------------------- 3. timing
# dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s; first match wins
PEAK_BF16_TFLOPS = (("GH200", 989.5), ("H200 NVL", 835.5), ("H200", 989.5), ("H100 NVL", 835.5),
                    ("H100 PCIe", 756.5), ("H100", 989.5), ("H800", 989.5), ("GB200", 2500.0),
                    ("B200", 2250.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.05), ("L4", 121.0))


def _peak(cfg, versions) -> tuple:
    if cfg.peak_tflops:
        return cfg.peak_tflops, "--peak-tflops"
    if cfg.device.type != "cuda":
        return "n/a", "no dense bf16 peak for a CPU"
    name = versions["device"]["name"]
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops, f"datasheet ({key}, dense bf16)"
    return None, f"{name!r} is not in PEAK_BF16_TFLOPS; pass --peak-tflops"


def elapsed_ms(fn, device) -> float:
    """Milliseconds of one ``fn()``: CUDA events on a GPU, the wall clock elsewhere."""
    if device.type != "cuda":
        t = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _count_host_syncs(step) -> tuple:
    """Host syncs of one ``step()`` as warnings of ``torch.cuda.set_sync_debug_mode("warn")``
    (warnings of autograd's device thread reach the caller), with the code lines that caused them."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    where = collections.Counter(f"{os.path.basename(w.filename)}:{w.lineno}" for w in syncs)
    return len(syncs), dict(where.most_common(12))


def time_degree1(kernel, tokens: int, heads, device, iters: int, budget_s: float, peak, cuda: bool):
    """Median ms of degree-1 ``ring_attention`` forward+backward of one causal bf16 document;
    ``cuda``: time with CUDA events and count host syncs."""
    from fcp_exec import ring_attention

    hq, hkv, d = heads
    q, k, v = (torch.randn(tokens, h, d, device=device, dtype=torch.bfloat16).requires_grad_() for h in (hq, hkv, hkv))
    dout = torch.randn(tokens, hq, d, device=device, dtype=torch.bfloat16)

    def step():
        out = ring_attention(q, k, v, [0, tokens], ranks=[0], causal=True, kernel=kernel)
        return out, torch.autograd.grad(out, (q, k, v), dout)

    t = time.perf_counter()
    out, grads = step()
    finite = all(bool(torch.isfinite(x).all()) for x in (out, *grads))  # also syncs
    warmup_s = time.perf_counter() - t
    del out, grads
    n = max(1, min(iters, int(budget_s / max(warmup_s, 1e-6))))
    times = []
    for _ in range(n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3)
    ms = statistics.median(times)
    flops = 14 * hq * d * (tokens * (tokens + 1) // 2)
    tflops = flops / (ms * 1e-3) / 1e12
    res = {"passed": finite, "reason": None if finite else "non-finite output or gradient",
           "median_ms": round(ms, 3), "times_ms": [round(x, 3) for x in times], "iters": n,
           "warmup_s": round(warmup_s, 3), "tflops": round(tflops, 3), "peak_bf16_tflops": peak,
           "fraction_of_peak": round(tflops / peak, 4) if isinstance(peak, float) else None,
           "flops": flops, "flops_formula": "3.5 * 4 * H_q * D * T(T+1)/2 (causal pairs; backward = 2.5x forward)",
           "timer": "cuda events" if cuda else "time.perf_counter"}
    if cuda and warmup_s < 20:
        res["host_syncs_per_step"], res["host_sync_sites"] = _count_host_syncs(step)
    elif cuda:
        res["host_syncs_note"] = f"not counted: one step took {warmup_s:.1f} s"
    return res


def timing_section(res: Results, cfg, versions, deadline) -> None:
    from fcp_exec.kernels import default_kernel

    kernel = default_kernel(cfg.device)
    impl = _impl(kernel)
    peak, peak_source = _peak(cfg, versions)
    hq, hkv, d = cfg.timing_heads
    if cfg.device.type != "cuda":
        res.add("timing host syncs (torch.cuda.set_sync_debug_mode)", "timing", skipped=True,
                reason="CUDA only: set_sync_debug_mode counts CUDA host syncs; there are none on CPU")
    for i, tokens in enumerate(cfg.timing_tokens):
        name = f"timing[{impl}] degree 1 fwd+bwd causal {tokens} tokens heads {hq}/{hkv} d{d} bf16"
        left = deadline - time.monotonic()
        if left <= 0:
            res.add(name, "timing", skipped=True, reason=res.late_reason)
            continue
        budget = max(2.0, min(90.0, left / (len(cfg.timing_tokens) - i + 1)))
        res.run(name, "timing", time_degree1, kernel, tokens, cfg.timing_heads, cfg.device, cfg.iters, budget,
                peak, cfg.device.type == "cuda", implementation=impl)
        res.checks[-1]["peak_source"] = peak_source
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- main
def _config(args) -> argparse.Namespace:
    cuda = args.device == "cuda"
    quick = args.quick
    return argparse.Namespace(
        device=torch.device(args.device), time_limit=args.time_limit,
        dtypes=("bfloat16", "float16") if cuda else ("float32", "bfloat16")[: 1 if quick else 2],
        head_dims=(64,) if quick else (64, 128), gqa_ratios=(1, 4), kv_heads=2 if cuda else 1,
        odd_doc=333 if cuda else 33, long_doc=args.long_doc or (4099 if cuda else 600),
        degrees=(2, 4) if quick else (2, 4, 8), ring_heads=(4, 2, 64) if cuda else (4, 1, 32),
        ring_long_doc=4097 if cuda else 192, ring_timeout=120.0 if cuda else 60.0,
        timing_tokens=args.timing_tokens or ((32768, 131072) if cuda else ((256,) if quick else (512, 1024))),
        timing_heads=tuple(args.timing_heads or ((32, 8, 128) if cuda else (4, 1, 64))),
        iters=args.iters or (5 if cuda else 2), peak_tflops=args.peak_tflops,
        mp_worlds=() if quick else ((2, 3) if cuda else (2,)), mp_timeout=args.mp_timeout)


SECTIONS = ("kernel", "ring", "timing", "multiprocess")


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=output_dir, required=True, help="folder for results.json and versions.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the checks run (default cuda when torch sees a GPU, else cpu)")
    ap.add_argument("--quick", action="store_true", help="fewer cases (the test's perturbed run)")
    ap.add_argument("--perturb", action="store_true", help="break every kernel on purpose (must fail)")
    ap.add_argument("--sections", type=names(SECTIONS, "section"), default=",".join(SECTIONS),
                    help=f"comma list of {', '.join(SECTIONS)} (versions always run)")
    ap.add_argument("--long-doc", type=positive_int,
                    help="the long document of the kernel cases (default: GPU 4099, CPU 600)")
    ap.add_argument("--timing-tokens", type=positive_int, nargs="+",
                    help="timed document lengths (default: GPU 32768 131072; CPU 512 1024, 256 with --quick)")
    ap.add_argument("--timing-heads", type=positive_int, nargs=3, metavar=("HQ", "HKV", "D"),
                    help="heads and head dim of the timing (default: GPU 32 8 128, CPU 4 1 64)")
    ap.add_argument("--iters", type=positive_int, help="timed iterations per size (default: GPU 5, CPU 2)")
    ap.add_argument("--peak-tflops", type=positive_float,
                    help="dense bf16 peak if the device is not in the table (default: the table's)")
    ap.add_argument("--mp-timeout", type=positive_float, default=90.0, help="hard limit per multi-process attempt (s)")
    ap.add_argument("--time-limit", type=positive_float,
                    help="soft limit: later checks are skipped (default: GPU 400 s, CPU 110 s)")
    ap.add_argument("--threads", type=positive_int, help="torch CPU threads (default 1 with --device cpu: the small "
                    "cases gain nothing from more, and the ring's threads would oversubscribe the cores; torch's "
                    "own on a GPU)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.monotonic()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    args.time_limit = args.time_limit or (400.0 if args.device == "cuda" else 110.0)
    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)
    perturb = args.perturb or os.environ.get("FCP_GPU_CHECK_PERTURB", "") not in ("", "0")
    sections = set(args.sections)
    cfg = _config(args)
    res = Results(args.out, {"script": "benchmarks/gpu_check.py", "argv": sys.argv[1:] if argv is None else argv,
                             "device": args.device, "perturbed": perturb, "quick": args.quick})
    res.late_reason = f"time limit (--time-limit {cfg.time_limit:g} s) reached"
    try:
        return _run(res, cfg, sections, perturb, t0)
    except Exception:  # noqa: BLE001 - a bug of this script, not a failed check
        traceback.print_exc()
        res.add("gpu_check internal error", "script", passed=False, reason=traceback.format_exc(limit=-4)[-3000:])
        return 2


def _run(res: Results, cfg, sections, perturb: bool, t0: float) -> int:
    deadline = t0 + cfg.time_limit
    versions = collect_versions(cfg.device)
    fa, auto = versions["flash_attn"], versions["auto_kernel"]
    print(f"versions: torch {versions['torch']}, CUDA {versions['cuda_runtime']}, NCCL {versions['nccl']}, "
          f"flash-attn {fa['installed']} (varlen importable: {fa['varlen_importable']}), device "
          f"{versions['device']['name']}; auto -> {auto['resolved']} (probe: {auto['probe']})", flush=True)
    res.meta["versions"] = versions
    res.add("versions", "versions", passed=True, **versions)
    backends, tight, skipped = kernel_backends(cfg.device)
    for name, reason in skipped:
        res.add(name, "kernel", skipped=True, reason=reason)
    if perturb:
        print("gpu_check: PERTURBED run (--perturb / FCP_GPU_CHECK_PERTURB): every kernel output is scaled by 1.05")
        backends = [(f"{label}+perturbed", PerturbedKernel(k), impl) for label, k, impl in backends]
        tight = (f"{tight[0]}+perturbed", PerturbedKernel(tight[1]), tight[2])
    if "kernel" in sections:
        kernel_section(res, cfg, backends, deadline)
    if "ring" in sections:
        ring_section(res, cfg, backends, tight, deadline, TOL)
    if "timing" in sections:
        timing_section(res, cfg, versions, deadline)
    if "multiprocess" in sections:
        multiprocess_checks(res, cfg, deadline, TOL)
    res.meta["wall_s"] = round(time.monotonic() - t0, 1)
    res.write()
    ran = res.meta["backends_run"]
    _dump(versions, os.path.join(res.out_dir, "versions.json"))
    failed = res.failed()
    n_skip = sum(c["skipped"] for c in res.checks)
    print(f"gpu_check: {len(res.checks)} checks, {len(failed)} failed, {n_skip} skipped; backends run: "
          f"{', '.join(ran) or 'none'}; auto -> {versions['auto_kernel']['resolved']}; "
          f"{res.meta['wall_s']} s; results in {os.path.join(res.out_dir, 'results.json')}")
    for c in failed[:20]:
        why = c.get("reason") or f"{c['worst']} error {c['max_error']:.2e} > {c['tolerance']:.0e}"
        print(f"  FAILED {c['name']}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    run(main, bug_status=2)
