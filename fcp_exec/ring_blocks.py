"""One block of the ring (:mod:`fcp_exec.ring_attention`) on the attention kernel, or with a sliding window or soft-capped
logits on the fused banded kernel (:mod:`fcp_exec.kernels.window_band`) or the masked math path
(:mod:`fcp_exec.kernels.window`); and the ring's local block (step 0) alone, what :mod:`fcp_exec.ring_halo` runs next
to its neighbours' tails."""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import lse_dtype_for
from fcp_exec.kernels.window import NO_WINDOW, windowed_backward, windowed_forward
from fcp_exec.kernels.window_band import band_backward, band_forward, plan_band

__all__ = ["block_forward", "block_backward", "local_forward", "local_backward"]


def _fused_cap(plan, kernel, q, window, softcap):
    """The window a kernel that soft-caps logits itself runs a capped block with (None: no window), or False when
    the block goes the masked way: no cap, or a real window it cannot take at this degree."""
    if softcap is None or not kernel.fused_softcap(q):
        return False
    if window == NO_WINDOW:
        return None
    return window if plan.degree == 1 and kernel.fused_window(q) else False


def _route(plan, kernel, step: int, q, window, softcap):
    """How a block runs: ``("kernel", its extra keyword arguments)``, ``("band", the band plan)`` (a fused banded
    kernel per chunk pair at degree > 1) or ``("masked", None)`` (the masked math path, which alone soft-caps logits
    where the kernel does not)."""
    if window is None:
        return "kernel", {}
    fused = _fused_cap(plan, kernel, q, window, softcap)
    if fused is not False:
        return "kernel", {"window": fused, "softcap": softcap}
    if softcap is None and plan.degree == 1 and kernel.fused_window(q):
        return "kernel", {"window": window}
    if softcap is None and plan.degree > 1 and kernel.fused_band(q):
        return "band", plan_band(plan, step, window)
    return "masked", None


def block_forward(plan, kernel, step: int, args, causal: bool, scale: float, max_q, max_k, window, softcap=None):
    """``(out, lse)`` of ``plan.block(step)`` (``args``: its q, k, v rows and bounds), by the kernel or, with a
    sliding window, by its fused banded kernel (whole documents at degree 1, per chunk pair above) or the masked
    math path of :mod:`fcp_exec.kernels.window` (:func:`_route`)."""
    how, extra = _route(plan, kernel, step, args[0], window, softcap)
    if how == "kernel":
        return kernel.forward(*args, causal, scale, max_q=max_q, max_k=max_k, **extra)
    if how == "band":
        return band_forward(kernel, *args[:3], extra, scale)
    return windowed_forward(*args, scale, window, *plan.positions(step), softcap=softcap)


def block_backward(plan, kernel, step: int, args, causal: bool, scale: float, max_q, max_k, window, softcap=None):
    """``(dq, dk, dv)`` of ``plan.block(step)`` against the final ``out``/``lse`` (as :func:`block_forward`)."""
    how, extra = _route(plan, kernel, step, args[1], window, softcap)
    if how == "kernel":
        return kernel.backward(*args, causal, scale, max_q=max_q, max_k=max_k, **extra)
    if how == "band":
        return band_backward(kernel, *args[:6], extra, scale)
    return windowed_backward(*args, scale, window, *plan.positions(step), softcap=softcap)


def local_backward(dout, q, k, v, out, lse, plan, kernel, scale, window, softcap):
    """``(dq, dk, dv)`` of :func:`local_forward`."""
    if not q.shape[0]:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    q_rows, k_rows, cu_q, cu_k, causal, max_q, max_k = plan.block(0)
    return block_backward(plan, kernel, 0, (dout, q, k, v, out, lse, cu_q, cu_k), causal, scale, max_q, max_k,
                           window, softcap)


def local_forward(q, k, v, plan, kernel, scale, window, softcap):
    """Step 0 of the ring: the local block, every query row (an empty shard: zeros and lse −inf)."""
    if not q.shape[0]:
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device), torch.full(
            (q.shape[1], 0), float("-inf"), dtype=lse_dtype_for(q.dtype), device=q.device)
    q_rows, k_rows, cu_q, cu_k, causal, max_q, max_k = plan.block(0)
    return block_forward(plan, kernel, 0, (q, k, v, cu_q, cu_k), causal, scale, max_q, max_k, window, softcap)
