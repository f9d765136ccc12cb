"""FCP's ring attention as one opaque torch op, ``torch.ops.fcp.ring_attention``, so ``torch.compile`` can take a
whole transformer block (``fullgraph=True``: torchtitan's) or a whole Hugging Face model with the ring inside,
activation checkpointing included.

Dynamo cannot trace the ring (point-to-point exchanges within each micro-batch's CP group, host-side plans); as a
custom op it is one node of the graph whose inputs are tensors: q, k, v and a 0-d *handle* naming the micro-batch's
:class:`~fcp_exec.ring_attention.RingBatch` in a process-local registry (:func:`register`, done in eager code before
the model runs, e.g. by the integration's ``batch_inputs``). A new micro-batch is a new handle *value*, not a new
constant, so nothing recompiles for it; its lengths change the shapes, which dynamic shapes absorb. The op returns
``(out, lse)``; its backward is a second op (``torch.ops.fcp.ring_attention_backward``) registered as its autograd
formula, so activation checkpointing may recompute the forward, exchanges included, in the backward as it would
eagerly. Both ops compute exactly what :func:`fcp_exec.ring_attention.ring_attention` computes (the same
``ring_forward`` / ``ring_backward``), sliding windows and attention sinks included (the sinks' gradient from the
backward op too); logit soft-capping and non-default kernels stay on the eager path.
"""

import itertools
import weakref
from typing import Optional

import torch

from fcp_exec.kernels.base import lse_dtype_for, sink_grad
from fcp_exec.ring_args import (WINDOW_CAP, autocast_inputs, autocast_off, check_mask_options, checked_args,
                              padded_values)
from fcp_exec.ring_attention import RingBatch, ring_backward, ring_forward

__all__ = ["register", "ring_attention_op"]

_RINGS: "weakref.WeakValueDictionary[int, RingBatch]" = weakref.WeakValueDictionary()
_NEXT = itertools.count(1)


def register(ring: RingBatch) -> torch.Tensor:
    """The 0-d int64 handle of ``ring`` (registered once). The registry holds it weakly: eagerly the autograd graph
    keeps it alive until the backward; under ``torch.compile`` keep the micro-batch that carries it alive until its
    backward ran (a trainer's step holds its micro-batches: FCPTitanTrainer's does; the Hugging Face ``batch_inputs``
    stores the ring in the collator's batch, which ``train_step`` holds through the backward)."""
    handle = getattr(ring, "op_handle", None)
    if handle is None:
        n = next(_NEXT)
        _RINGS[n] = ring
        handle = ring.op_handle = torch.tensor(n, dtype=torch.int64)
    return handle


def _ring(handle: torch.Tensor) -> RingBatch:
    ring = _RINGS.get(int(handle))
    if ring is None:
        raise RuntimeError(f"fcp ring handle {int(handle)} names no live RingBatch (the micro-batch that carried it "
                           "was released before its forward or backward ran)")
    return ring


@torch.library.custom_op("fcp::ring_attention", mutates_args=())
def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, handle: torch.Tensor, causal: bool,
             scale: float, window: int = 0, sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    ring = _ring(handle)
    scale, kernel = checked_args(q, k, v, causal, scale, None)
    if ring.cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens ends at {ring.cu[-1]} but the tensor has {q.shape[0]} tokens")
    span = ring.acting_window(window)  # none where no document is longer than it
    ring.check(q, k, causal, scale, span, sinks)
    with autocast_off(q.device):
        out, lse = ring_forward(q, k, v, ring.plan(causal, q.device), ring.comm, scale, kernel, span, sinks)
    return out.clone() if out.data_ptr() == q.data_ptr() else out, lse


@_forward.register_fake
def _(q, k, v, handle, causal, scale, window=0, sinks=None):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=lse_dtype_for(q.dtype))


@torch.library.custom_op("fcp::ring_attention_backward", mutates_args=())
def _backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, handle: torch.Tensor, causal: bool, scale: float, window: int = 0,
                 sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ring = _ring(handle)
    scale, kernel = checked_args(q, k, v, causal, scale, None)
    with autocast_off(q.device):
        dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, ring.plan(causal, q.device), ring.comm,
                                   scale, kernel, ring.acting_window(window))
        dsinks = q.new_zeros(0) if sinks is None else sink_grad(dout, out, lse, sinks)
    return dq, dk, dv, dsinks


@_backward_op.register_fake
def _(dout, q, k, v, out, lse, handle, causal, scale, window=0, sinks=None):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            q.new_empty(0) if sinks is None else torch.empty_like(sinks))


def _setup(ctx, inputs, output) -> None:
    from torch._subclasses.fake_tensor import is_fake

    q, k, v, handle, causal, scale, window, sinks = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, handle, sinks)
    ctx.causal, ctx.scale, ctx.window = causal, scale, window
    # eagerly (a plain tensor: not fake, not a tracing wrapper), the graph keeps the micro-batch's RingBatch alive
    if type(handle) is torch.Tensor and not is_fake(handle):  # until the backward
        ctx.ring = _ring(handle)


def _grads(ctx, dout, dlse):
    q, k, v, out, lse, handle, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = torch.ops.fcp.ring_attention_backward(dout, q, k, v, out, lse, handle, ctx.causal, ctx.scale,
                                                               ctx.window, sinks)
    return dq, dk, dv, None, None, None, None, (None if sinks is None else dsinks)


_forward.register_autograd(_grads, setup_context=_setup)


def ring_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: RingBatch, *, causal: bool = True,
                      softmax_scale: float | None = None, window: int | None = None,
                      sinks: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`fcp_exec.ring_attention.ring_attention` over ``ring`` through the op (module docstring): traceable
    by ``torch.compile`` when ``ring`` was :func:`register`-ed outside the compiled code. Values with a smaller head
    dim than the keys (MLA) are padded (:func:`fcp_exec.ring_args.padded_values`); ``window`` (keys per query, the
    Hugging Face rule ``i − j < window``) and ``sinks`` (``[H_q]`` logits, gpt-oss) as in ``ring_attention``."""
    q, k, v = autocast_inputs(q, k, v)
    v, dv = padded_values(k, v)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    check_mask_options(q, causal, window, sinks, None)
    handle = ring.op_handle if getattr(ring, "op_handle", None) is not None else register(ring)
    window = min(int(window or 0), WINDOW_CAP)  # longer than any document: the same mask, and it fits the op's int
    out = torch.ops.fcp.ring_attention(q, k, v, handle, bool(causal), scale, window, sinks)[0]
    return out if dv is None else out[..., :dv]
