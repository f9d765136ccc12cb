"""Sliding-window attention for every kernel: a masked math path, exact, shared by the CPU, reference, CUDA and
NPU kernels.

A sliding window ``W`` (Mistral, Gemma 2/3, Phi-3, Cohere 2, Qwen2 with ``use_sliding_window``) lets query position
``i`` of a document see key positions ``j`` with ``0 <= i - j < W`` (the Hugging Face masks' rule,
``kv_idx > q_idx - W``). Under ring attention a block pairs this rank's query rows with another rank's key rows, so
the rule needs each row's position in its document: ``pos_q`` / ``pos_k`` (``fcp_exec.ring_attention`` computes
them from the zigzag layout). Ring attention with ``window=`` hands every block to :func:`windowed_forward` / :func:`windowed_backward`, whatever
the kernel: per document, query rows a window at a time, the keys some of them can see (their positions within the
window behind the rows' first position), scores ``q·kᵀ``, the mask, the log-sum-exp and the gradients from the
final ``out``/``lse`` (the kernel contract of :mod:`fcp_exec.kernels.base`); a document whose rows in this block
are all out of each other's window is skipped (``lse = -inf``, ``out = 0``, no gradient). Accumulation in float32
(float64 for float64 inputs).

Logit soft-capping (Gemma 2: scores ``c·tanh(s/c)`` before the mask and the softmax) runs here too, with or without
a window (then :data:`NO_WINDOW`): the backward multiplies the score gradient by ``1 − tanh²(s/c)``.

Cost: about ``L·2W`` scores per document instead of ``L²/2``, but in unfused matmuls (``benchmarks/bench_window.py``
measures it against the fused causal kernel). Where a kernel has a fused banded kernel ring attention uses it
instead: ``fused_window`` at degree 1 (the CUDA kernel's flash backends on fp16/bf16, the NPU's band mode),
``fused_band`` per pair of zigzag chunks at degree > 1 (the CUDA flash backends: :mod:`fcp_exec.kernels.window_band`);
every other block comes here.
"""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import doc_bounds, expand_kv, lse_dtype_for, reduce_kv

__all__ = ["NO_WINDOW", "windowed_forward", "windowed_backward", "check_window"]

_CHUNK_ELEMS = 1 << 25
# the window of a block that takes this path for its logit soft-capping alone (Gemma 2): longer than any document,
# so the mask is plain causal by position
NO_WINDOW = 1 << 40


def check_window(window, pos_q, pos_k, q, k) -> int:
    """The window as an int >= 1, with position vectors for the block's rows; ``ValueError`` otherwise."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1 (the sliding window in tokens), got {window!r}")
    if pos_q is None or pos_k is None or pos_q.shape != (q.shape[0],) or pos_k.shape != (k.shape[0],):
        raise ValueError("a windowed block needs pos_q [T_q] and pos_k [T_k], each row's position in its document")
    return window


def _allowed(pq: torch.Tensor, pk: torch.Tensor, window: int) -> torch.Tensor:
    diff = pq[:, None] - pk[None, :]
    return (diff >= 0) & (diff < window)


def _docs(cu_q, cu_k, pos_q, pos_k, window):
    """``(qs, qe, ks, ke)`` of the documents with at least one query/key pair inside the window (host check on the
    position extremes: a key block entirely more than ``window`` behind, or after, the queries is skipped)."""
    cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
    for i in range(len(cq) - 1):
        qs, qe, ks, ke = cq[i], cq[i + 1], ck[i], ck[i + 1]
        if qe == qs or ke == ks:
            continue
        q_lo, q_hi = int(pos_q[qs:qe].min()), int(pos_q[qs:qe].max())
        k_lo, k_hi = int(pos_k[ks:ke].min()), int(pos_k[ks:ke].max())
        if q_lo - k_hi >= window or q_hi < k_lo:
            continue
        yield qs, qe, ks, ke


def _chunks(qs: int, qe: int, h: int, lk: int, window: int):
    """Query row ranges ``[a, b)``: a window's worth of rows at a time (their keys then span about two windows),
    fewer when that many scores would pass ≈128 MiB."""
    step = max(1, min(max(window, 64), _CHUNK_ELEMS // max(1, h * lk)))
    for a in range(qs, qe, step):
        yield a, min(qe, a + step)


def _keys(pq: torch.Tensor, pk: torch.Tensor, window: int) -> torch.Tensor | None:
    """Indices of the keys (of ``pk``) that some query of ``pq`` can see, or None when that is all of them."""
    near = (pk > int(pq.min()) - window) & (pk <= int(pq.max()))
    return None if bool(near.all()) else near.nonzero().flatten()


def _scores(qd, kc, scale: float, softcap: float | None):
    """``(scores, tanh of the scores / softcap or None)`` of a chunk, soft-capped when ``softcap``."""
    s = torch.matmul(qd, kc.transpose(1, 2)) * scale
    if not softcap:
        return s, None
    t = torch.tanh(s / softcap)
    return t * softcap, t


def windowed_forward(q, k, v, cu_q, cu_k, scale: float, window: int, pos_q, pos_k, softcap: float | None = None):
    """``(out, lse)`` of one block with the sliding-window causal mask (module docstring), the scores soft-capped at
    ``softcap`` first when given."""
    window = check_window(window, pos_q, pos_k, q, k)
    h_q, acc = q.shape[1], lse_dtype_for(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full((h_q, q.shape[0]), float("-inf"), dtype=acc, device=q.device)
    for qs, qe, ks, ke in _docs(cu_q, cu_k, pos_q, pos_k, window):
        kd = expand_kv(k[ks:ke], h_q).transpose(0, 1).to(acc)  # [H, Lk, D]
        vd = expand_kv(v[ks:ke], h_q).transpose(0, 1).to(acc)
        for a, b in _chunks(qs, qe, h_q, ke - ks, window):
            sel = _keys(pos_q[a:b], pos_k[ks:ke], window)
            kc, vc, pk = (kd, vd, pos_k[ks:ke]) if sel is None else \
                (kd.index_select(1, sel), vd.index_select(1, sel), pos_k[ks:ke].index_select(0, sel))
            s, _ = _scores(q[a:b].transpose(0, 1).to(acc), kc, scale, softcap)
            s = s.masked_fill(~_allowed(pos_q[a:b], pk, window), float("-inf"))
            m = torch.logsumexp(s, dim=-1)  # [H, rows]; -inf where a row sees no key here
            p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)).unsqueeze(-1))
            out[a:b] = torch.matmul(p, vc).transpose(0, 1)
            lse[:, a:b] = m
    return out.to(q.dtype), lse


def windowed_backward(dout, q, k, v, out, lse, cu_q, cu_k, scale: float, window: int, pos_q, pos_k,
                      softcap: float | None = None):
    """``(dq, dk, dv)`` of one windowed block against the final ``out``/``lse`` (module docstring)."""
    window = check_window(window, pos_q, pos_k, q, k)
    h_q, h_kv, acc = q.shape[1], k.shape[1], lse_dtype_for(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros((k.shape[0], h_q, k.shape[2]), dtype=acc, device=q.device)
    dv = torch.zeros_like(dk)
    for qs, qe, ks, ke in _docs(cu_q, cu_k, pos_q, pos_k, window):
        kd = expand_kv(k[ks:ke], h_q).transpose(0, 1).to(acc)
        vd = expand_kv(v[ks:ke], h_q).transpose(0, 1).to(acc)
        for a, b in _chunks(qs, qe, h_q, ke - ks, window):
            sel = _keys(pos_q[a:b], pos_k[ks:ke], window)
            kc, vc, pk = (kd, vd, pos_k[ks:ke]) if sel is None else \
                (kd.index_select(1, sel), vd.index_select(1, sel), pos_k[ks:ke].index_select(0, sel))
            qd, do = q[a:b].transpose(0, 1).to(acc), dout[a:b].transpose(0, 1).to(acc)
            s, t = _scores(qd, kc, scale, softcap)
            s = s.masked_fill(~_allowed(pos_q[a:b], pk, window), float("-inf"))
            m = lse[:, a:b].to(acc)
            p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)).unsqueeze(-1))
            delta = (do * out[a:b].transpose(0, 1).to(acc)).sum(-1, keepdim=True)
            ds = p * (torch.matmul(do, vc.transpose(1, 2)) - delta)
            if t is not None:  # d(c·tanh(x/c))/dx
                ds = ds * (1 - t * t)
            dq[a:b] = (torch.matmul(ds, kc) * scale).transpose(0, 1)
            dk_c = (torch.matmul(ds.transpose(1, 2), qd) * scale).transpose(0, 1)
            dv_c = torch.matmul(p.transpose(1, 2), do).transpose(0, 1)
            if sel is None:
                dk[ks:ke] += dk_c
                dv[ks:ke] += dv_c
            else:
                dk[ks:ke].index_add_(0, sel, dk_c)
                dv[ks:ke].index_add_(0, sel, dv_c)
    return dq.to(q.dtype), reduce_kv(dk, h_kv).to(k.dtype), reduce_kv(dv, h_kv).to(v.dtype)
