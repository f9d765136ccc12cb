"""Exact ring attention over zigzag-sharded packed documents, forward and backward.

Layout (see :mod:`fcp_data.layout`): every document is cut into ``2·d`` chunks and CP rank ``r``
holds chunks ``r`` and ``2d−1−r`` of every document, so each local document is
``[first half | second half]``. At ring step ``j`` rank ``r`` holds the key/value shard of rank
``s = (r − j) mod d``, i.e. chunks ``s`` and ``2d−1−s`` of every document. For a causal mask,
chunk ``a`` of a document sees chunk ``b`` of the same document fully if ``b < a``, on the
diagonal if ``b == a`` and not at all if ``b > a``; per document pair this gives:

* ``s == r`` (step 0): causal attention of the local shard on itself (the local concatenation
  ``[r | 2d−1−r]`` is in global order, so a plain causal mask is exact);
* ``s < r``: every local query (chunks ``r`` and ``2d−1−r``) sees chunk ``s`` fully and chunk
  ``2d−1−s`` not at all → all queries against the *first halves* of the keys, no mask;
* ``s > r``: chunk ``r`` sees nothing; chunk ``2d−1−r`` sees chunks ``s`` and ``2d−1−s`` fully →
  the *second halves* of the queries against all keys, no mask.

The same holds for every document at once (only chunk sizes differ), so each step is one varlen kernel call (with
a sliding window: see ``ring_attention``; a window no longer than the chunks needs no ring, :mod:`fcp_exec.ring_halo`). With a full mask every step is all queries against all keys. Partial
results are merged in fp32 (fp64 for fp64 inputs) by log-sum-exp. Backward re-runs each block against the final
``out``/``lse``; dQ stays local while dK/dV travel round the ring with the key/value blocks and arrive back at
their owner after ``d`` hops. The next block's send/recv is posted before the current block is computed.

Before the first block travels, every rank swaps a 14-integer header (local tokens, heads, head dim, dtype,
mask, softmax scale, degree, checksums of ``ranks`` and of the local ``cu_seqlens``, soft-capping, attention sinks:
:func:`fcp_exec.ring_args.peer_header`) with both ring neighbours — one batched P2P round trip — and raises
``ValueError`` naming the peer and both shapes when they differ. Without it a shard-size mismatch is a receive of
the wrong size: gloo aborts the process (``gloo::EnforceNotMet``), NCCL/HCCL may hang or read garbage.
"""
from __future__ import annotations

import torch

from fcp_exec.comm import RingComm
from fcp_exec.kernels import AttentionKernel
from fcp_exec.kernels.base import add_sinks, lse_dtype_for, merge_block, sink_grad
from fcp_exec.kernels.window import NO_WINDOW
from fcp_exec.ring_args import autocast_inputs as _autocast_inputs
from fcp_exec.ring_args import autocast_off as _autocast_off
from fcp_exec.ring_args import check_mask_options as _check_mask_options
from fcp_exec.ring_args import checked_args as _checked_args
from fcp_exec.ring_args import WINDOW_CAP as _WINDOW_CAP
from fcp_exec.ring_args import check_peers as _check_peers
from fcp_exec.ring_args import padded_values as _padded_values
from fcp_exec.ring_args import peer_header as _header
from fcp_exec.ring_blocks import block_backward, block_forward, local_backward, local_forward
from fcp_exec.ring_halo import halo_backward, halo_forward, halo_plan, split_documents
from fcp_data.layout import check_cu_seqlens

__all__ = ["RingBatch", "ring_attention"]


class _Plan:
    """Per-call block plan: which query/key rows each ring step uses (pure, per cp_rank)."""

    def __init__(self, cu: list[int], degree: int, cp_rank: int, causal: bool, device):
        self.cu, self.degree, self.cp_rank, self.causal, self.device = cu, degree, cp_rank, causal, device
        self._pos_cache: dict[int, torch.Tensor] = {}  # rank -> its rows' positions (sliding windows only)
        lengths = [b - a for a, b in zip(cu[:-1], cu[1:])]
        self.max_full = max(lengths, default=0)
        self.cu_half = [c // 2 for c in cu]
        self.max_half = self.max_full // 2
        if degree > 1 and causal:
            first, second = [], []
            for a, n in zip(cu[:-1], lengths):
                h = n // 2
                first.append(torch.arange(a, a + h))
                second.append(torch.arange(a + h, a + n))
            cat = (lambda xs: torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long))
            self.first = cat(first).to(device)
            self.second = cat(second).to(device)

    def sub(self, cu: list[int]) -> "_Plan":
        """The plan of some of this call's documents (``cu``: their local bounds, packed)."""
        return _Plan(cu, self.degree, self.cp_rank, self.causal, self.device)

    def positions(self, step: int):
        """``(pos_q, pos_k)``: the position in its document of every query and key row of ``block(step)`` (the
        zigzag layout: this rank's chunks ``cp_rank`` and ``2·degree−1−cp_rank`` of each padded document, the key
        rows from rank ``cp_rank − step``), for a sliding window."""
        q_rows, k_rows = self.block(step)[:2]
        src = (self.cp_rank - step) % self.degree
        return _rows(self._pos(self.cp_rank), q_rows), _rows(self._pos(src), k_rows)

    def _pos(self, rank: int) -> torch.Tensor:
        cache = self._pos_cache
        if rank not in cache:
            parts = []
            for a, b in zip(self.cu[:-1], self.cu[1:]):
                n = b - a
                if self.degree == 1:
                    parts.append(torch.arange(n))
                else:
                    h = n // 2
                    parts += [rank * h + torch.arange(h), (2 * self.degree - 1 - rank) * h + torch.arange(h)]
            cache[rank] = (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)).to(self.device)
        return cache[rank]

    def block(self, step: int):
        """``(q_rows, k_rows, cu_q, cu_k, causal, max_q, max_k)``; rows ``None`` mean all rows."""
        full = (None, None, self.cu, self.cu, False, self.max_full, self.max_full)
        if not self.causal:
            return full
        if step == 0:
            return (None, None, self.cu, self.cu, True, self.max_full, self.max_full)
        src = (self.cp_rank - step) % self.degree
        if src < self.cp_rank:
            return (None, self.first, self.cu, self.cu_half, False, self.max_full, self.max_half)
        return (self.second, None, self.cu_half, self.cu, False, self.max_half, self.max_full)


def _rows(x: torch.Tensor, idx):
    return x if idx is None else x.index_select(0, idx)


def ring_forward(q, k, v, plan: _Plan, comm, scale: float, kernel: AttentionKernel, window: int | None = None,
                 sinks: torch.Tensor | None = None, softcap: float | None = None):
    """``(out, lse)`` of the ring over ``plan``'s blocks (K/V passed around ``comm``); lse ``[H, T]`` in the
    accumulation dtype. The forward of :class:`_RingAttentionFn` and of ``torch.ops.fcp.ring_attention``. With
    ``sinks`` (``[H]`` logits): the result of :func:`fcp_exec.kernels.base.add_sinks`."""
    acc = lse_dtype_for(q.dtype)
    parts = split_documents(plan, window, plan.sub)
    if parts is not None:  # documents long enough for a halo next to shorter ones: each kind on its own
        out_acc = torch.zeros((*q.shape[:2], v.shape[2]), dtype=q.dtype, device=q.device)
        lse_acc = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=acc, device=q.device)
        for rows, sub in parts:
            out_r, lse_r = ring_forward(q[rows], k[rows], v[rows], sub, comm, scale, kernel, window, None, softcap)
            out_acc.index_copy_(0, rows, out_r)
            lse_acc.index_copy_(1, rows, lse_r)
        return _sunk(out_acc, lse_acc, sinks, q.dtype)
    halo = halo_plan(plan, window, q.device)
    if halo is not None:  # every document longer than the window: its neighbours' tails, no ring
        out_acc, lse_acc = halo_forward(q, k, v, plan, halo, comm, scale, softcap, lambda: local_forward(
            q, k, v, plan, kernel, scale, window, softcap))
        return _sunk(out_acc, lse_acc, sinks, q.dtype)
    # step 0's block has every query row: its result starts the running result (no zero-fill, no merge)
    out_acc = torch.zeros(q.shape, dtype=acc, device=q.device) if not q.shape[0] else None
    lse_acc = torch.full((q.shape[1], 0), float("-inf"), dtype=acc, device=q.device) if not q.shape[0] else None
    k_cur, v_cur = k, v
    for step in range(plan.degree):
        pending = None
        if step + 1 < plan.degree:
            pending = comm.send_recv([k_cur, v_cur], tag=0, what="k/v")
        q_rows, k_rows, cu_q, cu_k, causal, max_q, max_k = plan.block(step)
        if q.shape[0]:
            args = (_rows(q, q_rows), _rows(k_cur, k_rows), _rows(v_cur, k_rows), cu_q, cu_k)
            out_b, lse_b = block_forward(plan, kernel, step, args, causal, scale, max_q, max_k, window, softcap)
            if out_acc is None:  # step 0: all rows
                out_acc, lse_acc = out_b.to(acc), lse_b.to(acc)
            else:
                merge_block(out_acc, lse_acc, out_b, lse_b, q_rows)
        if pending is not None:
            k_cur, v_cur = pending.wait()
    return _sunk(out_acc, lse_acc, sinks, q.dtype)


def _sunk(out, lse, sinks, dtype):
    if sinks is not None:
        out, lse = add_sinks(out.to(lse.dtype), lse, sinks)
    return out.to(dtype), lse


def ring_backward(dout, q, k, v, out, lse, plan: _Plan, comm, scale: float, kernel: AttentionKernel,
                  window: int | None = None, softcap: float | None = None):
    """``(dq, dk, dv)`` of :func:`ring_forward` (dK/dV travel back around the ring to their owners)."""
    dout = dout.contiguous()
    acc = lse.dtype
    parts = split_documents(plan, window, plan.sub)
    if parts is not None:
        grads = [torch.zeros_like(x) for x in (q, k, v)]
        for rows, sub in parts:
            got = ring_backward(dout[rows], q[rows], k[rows], v[rows], out[rows], lse[:, rows], sub, comm, scale,
                                kernel, window, softcap)
            for g, part in zip(grads, got):
                g.index_copy_(0, rows, part)
        return tuple(grads)
    halo = halo_plan(plan, window, q.device)
    if halo is not None:
        return halo_backward(dout, q, k, v, out, lse, plan, halo, comm, scale, softcap, lambda: local_backward(
            dout, q, k, v, out, lse, plan, kernel, scale, window, softcap))
    dq = torch.zeros(q.shape, dtype=acc, device=q.device) if plan.degree > 1 or not q.shape[0] else None
    k_cur, v_cur = k, v
    dkv_pending = None
    dk_blk = dv_blk = None
    for step in range(plan.degree):
        kv_pending = None
        if step + 1 < plan.degree:
            kv_pending = comm.send_recv([k_cur, v_cur], tag=0, what="k/v")
        q_rows, k_rows, cu_q, cu_k, causal, max_q, max_k = plan.block(step)
        full_keys = k_rows is None and q.shape[0]  # this block's dK/dV are the kernel's, whole
        dk_blk = None if full_keys else torch.zeros(k.shape, dtype=acc, device=k.device)
        dv_blk = None if full_keys else torch.zeros(v.shape, dtype=acc, device=v.device)
        if q.shape[0]:
            lse_rows = lse if q_rows is None else lse.index_select(1, q_rows)
            args = (_rows(dout, q_rows), _rows(q, q_rows), _rows(k_cur, k_rows), _rows(v_cur, k_rows),
                    _rows(out, q_rows), lse_rows, cu_q, cu_k)
            dq_b, dk_b, dv_b = block_backward(plan, kernel, step, args, causal, scale, max_q, max_k, window, softcap)
            if dq is None:  # degree 1: the one block's dQ
                dq = dq_b.to(acc)
            elif q_rows is None:
                dq += dq_b.to(acc)
            else:
                dq.index_add_(0, q_rows, dq_b.to(acc))
            if full_keys:  # (in place below: never two names for one buffer a kernel might return twice)
                dk_blk, dv_blk = dk_b.to(acc), dv_b.to(acc)
                dv_blk = dv_blk.clone() if dv_blk.data_ptr() == dk_blk.data_ptr() else dv_blk
            else:
                dk_blk.index_copy_(0, k_rows, dk_b.to(acc))
                dv_blk.index_copy_(0, k_rows, dv_b.to(acc))
        if dkv_pending is not None:
            dk_prev, dv_prev = dkv_pending.wait()
            dk_blk += dk_prev
            dv_blk += dv_prev
        if plan.degree > 1:
            dkv_pending = comm.send_recv([dk_blk, dv_blk], tag=2, what="dk/dv")
        if kv_pending is not None:
            k_cur, v_cur = kv_pending.wait()
    if dkv_pending is not None:
        dk_blk, dv_blk = dkv_pending.wait()
    return dq.to(q.dtype), dk_blk.to(k.dtype), dv_blk.to(v.dtype)


class _RingAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: _Plan, comm, scale: float, kernel: AttentionKernel, window: int | None = None,
                sinks: torch.Tensor | None = None, softcap: float | None = None):
        out, lse = ring_forward(q, k, v, plan, comm, scale, kernel, window, sinks, softcap)
        ctx.save_for_backward(q, k, v, out, lse, sinks)
        ctx.plan, ctx.comm, ctx.scale, ctx.kernel, ctx.window, ctx.softcap = plan, comm, scale, kernel, window, softcap
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sinks = ctx.saved_tensors
        with _autocast_off(dout.device):
            grads = ring_backward(dout, q, k, v, out, lse, ctx.plan, ctx.comm, ctx.scale, ctx.kernel, ctx.window,
                                  ctx.softcap)
            dsinks = None if sinks is None or not ctx.needs_input_grad[8] else sink_grad(dout, out, lse, sinks)
        return (*grads, None, None, None, None, None, dsinks, None)


class RingBatch:
    """Host metadata of one micro-batch, shared by every attention layer of the model: the validated local
    ``cu_seqlens`` as host ints (read once, never from the device per layer), the ring communicator, the
    block plans per (mask, device) and which call signatures already passed the neighbour shape check.

    Build it once per micro-batch from the collator's CPU ``cu_seqlens`` and pass it to :func:`ring_attention`
    in place of ``cu_seqlens`` (``ranks``, ``group`` and ``timeout`` then come from here). The first call with a
    given signature (shapes, dtype, mask, scale) checks the neighbours; later layers with the same signature skip
    the round trip — symmetric on every rank, since every rank of the group runs the same layers."""

    def __init__(self, cu_seqlens, ranks, *, group=None, timeout=None) -> None:
        self.comm = RingComm(ranks, group=group, timeout=timeout)
        if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device.type not in ("cpu", "meta"):
            cu_seqlens = cu_seqlens.cpu()  # once per micro-batch; pass the collator's CPU tensor to avoid even this
        degree = self.comm.degree
        self.cu = check_cu_seqlens(cu_seqlens, multiple=2 if degree > 1 else 1, local_degree=degree)
        self._plans: dict = {}
        self._checked: set = set()

    @property
    def degree(self) -> int:
        return self.comm.degree

    def acting_window(self, window: int | None) -> int | None:
        """``window`` (keys per query) if some document of the micro-batch is longer than it (its padded length in
        the ring, ``cu`` × degree, which can only over-estimate), else None: plain causal attention gives the same
        result, on the faster fused path."""
        if not window or window <= 0:
            return None
        longest = max((b - a for a, b in zip(self.cu[:-1], self.cu[1:])), default=0) * self.degree
        return int(window) if longest > int(window) else None

    def plan(self, causal: bool, device) -> "_Plan":
        key = (bool(causal), str(device))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(self.cu, self.comm.degree, self.comm.cp_rank, bool(causal), device)
        return plan

    def check(self, q, k, causal: bool, scale: float, window: int | None = None, sinks=None, softcap=None) -> None:
        if self.comm.degree == 1:
            return
        key = (tuple(q.shape), tuple(k.shape), q.dtype, bool(causal), scale, str(q.device), window, sinks is None,
               softcap)
        if key in self._checked:
            return
        _check_peers(self.comm, _header(q, k, self.cu, bool(causal), scale, self.comm.ranks, window, sinks, softcap),
                     q.device)
        self._checked.add(key)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens, *, ranks=None,
                   causal: bool = True, softmax_scale: float | None = None,
                   kernel: AttentionKernel | str | None = None, timeout=None, group=None,
                   check_shapes: bool = True, window: int | None = None,
                   sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Attention of zigzag-sharded packed documents across the logical CP group ``ranks``.

    ``q`` ``[T_local, H_q, D]``, ``k``/``v`` ``[T_local, H_kv, D]`` (GQA when ``H_kv < H_q``; ``v`` may have a smaller
    head dim than ``q``/``k``, multi-latent attention: zero-padded, :func:`fcp_exec.ring_args.padded_values`),
    ``cu_seqlens`` the *local* document boundaries (``zigzag_shard``'s second output; every local
    document length is even when ``degree > 1``), ``ranks`` the global ranks of this rank's CP
    group in ring order (this rank included; every member must make the same call with the same
    ``ranks`` and local ``cu_seqlens``). Returns ``out`` ``[T_local, H_q, D]`` in ``q``'s dtype,
    differentiable in ``q``, ``k``, ``v``. ``cu_seqlens`` may instead be a :class:`RingBatch` built once per
    micro-batch (every layer then reuses its host metadata and plans, and the neighbour check runs once per
    signature). ``degree == 1`` runs the local kernel with no
    communication. ``kernel`` (an :class:`AttentionKernel` or a name for
    :func:`fcp_exec.kernels.get_kernel`) defaults to :func:`fcp_exec.kernels.default_kernel`; ``timeout``
    (seconds) bounds every P2P wait (see :mod:`fcp_exec.comm`); ``group`` is the base process group
    the P2P runs on (default: world). With ``degree > 1`` the call first checks that both ring
    neighbours made a matching call (see the module docstring): a mismatch is a ``ValueError`` naming
    the peer rank and both shapes, raised on every rank next to the odd one before any K/V moves.
    The check costs one small P2P round trip per call (0.3-0.6 ms on gloo over loopback; on NCCL/HCCL
    also one device-to-host copy). ``check_shapes=False`` skips it — for the later layers of a model whose
    first layer already checked the same shards; it must then be False on every rank of the group in
    that call (a one-sided header would wait for its timeout). ``window``: a sliding window (query position
    ``i`` of a document sees key positions ``j`` with ``0 <= i - j < window``; causal only): by the kernel itself
    where it has a fused banded kernel (``kernel.fused_window``: flash-attn / torch's flash varlen on fp16/bf16
    CUDA tensors) — one varlen call at degree 1, one call per pair of zigzag chunks at degree > 1
    (:mod:`fcp_exec.kernels.window_band`) — else by the shared masked math path of :mod:`fcp_exec.kernels.window`;
    at degree > 1 with every document's zigzag chunks at least ``window − 1`` rows long there is no ring: each rank
    swaps its chunks' last ``window − 1`` K/V rows with its two neighbours (:mod:`fcp_exec.ring_halo`);
    ``None``: no window. ``sinks``: attention sinks (gpt-oss), a ``[H_q]`` tensor of per-head logits that join
    every query's softmax with a zero value (:func:`fcp_exec.kernels.base.add_sinks`); differentiable, its gradient
    summed over this rank's queries (a data-parallel reducer sums it over ranks like any weight's). ``softcap``:
    attention logit soft-capping (Gemma 2: scores ``c·tanh(s/c)``; causal only), computed by the masked math path of
    :mod:`fcp_exec.kernels.window` for every block (exact, unfused: slower than the kernels).
    """
    q, k, v = _autocast_inputs(q, k, v)
    v, dv = _padded_values(k, v)
    scale, kernel = _checked_args(q, k, v, causal, softmax_scale, kernel)
    _check_mask_options(q, causal, window, sinks, softcap)
    window = window if window is None else min(window, _WINDOW_CAP)  # longer than any document: the same mask
    if isinstance(cu_seqlens, RingBatch):
        rb = cu_seqlens
        if ranks is not None and tuple(int(r) for r in ranks) != rb.comm.ranks:
            raise ValueError(f"ranks={list(ranks)} differ from the RingBatch's {list(rb.comm.ranks)}")
    else:
        rb = RingBatch(cu_seqlens, ranks, group=group, timeout=timeout)
    if rb.cu[-1] != q.shape[0]:
        raise ValueError(f"cu_seqlens ends at {rb.cu[-1]} but the tensor has {q.shape[0]} tokens; "
                         "they must describe the same packed sequence")
    if check_shapes:
        rb.check(q, k, bool(causal), scale, window, sinks, softcap)
    with _autocast_off(q.device):
        span = window if window is not None or softcap is None else NO_WINDOW  # soft-capping: the masked path
        out = _RingAttentionFn.apply(q, k, v, rb.plan(bool(causal), q.device), rb.comm, scale, kernel, span, sinks,
                                     None if softcap is None else float(softcap))
    return out if dv is None else out[..., :dv]
