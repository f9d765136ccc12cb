"""CPU kernel on ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward.

Two ways to cover packed documents, measured against each other in ``benchmarks/bench_ring.py``:

* ``per_doc`` (default): one flash call per document; work is ``Σ L_q·L_k``.
* ``block_diag``: one call over the whole block with an additive block-diagonal mask; work is
  ``T_q·T_k`` plus building the mask, so it only pays off for many very short documents.

The aten kernel returns the log-sum-exp ``[B, H, L]`` (float32, float64 for float64 inputs) and its
backward accepts an externally supplied ``out``/``logsumexp``, which is what ring attention needs.
It has no native GQA: key/value heads are repeated and their gradients summed.

Non-finite inputs (a NaN or an infinity in q, k, v — or, backward, in ``dout``, ``out`` or a NaN ``lse``) go to the
fp64 math of :class:`~fcp_exec.kernels.reference.ReferenceKernel` for that call: the aten kernel returns ``out = 0``,
``lse = 0`` for a NaN query row of a short document, and ``block_diag``'s additive ``-inf`` mask turns a NaN score into
NaN for every document; the math propagates NaN exactly as dense attention does. Finite input takes the fast path.
"""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import (
    AttentionKernel,
    check_block_inputs,
    doc_bounds,
    expand_kv,
    lse_dtype_for,
    reduce_kv,
)
from fcp_exec.kernels.reference import ReferenceKernel

__all__ = ["CpuFlashKernel"]


def _bhld(x: torch.Tensor) -> torch.Tensor:
    """``[L, H, D] -> [1, H, L, D]`` view."""
    return x.transpose(0, 1).unsqueeze(0)


def _all_finite(*ts: torch.Tensor) -> bool:
    """Whether every tensor holds only finite values (one host sync)."""
    return bool(torch.stack([torch.isfinite(t).all() for t in ts]).all())


def _block_diag_mask(cu_q: list[int], cu_k: list[int], causal: bool, dtype, device) -> torch.Tensor:
    """Additive mask ``[T_q, T_k]``: 0 where query and key share a document (and, if causal, the
    key is not after the query), ``-inf`` elsewhere."""
    lq = torch.tensor([b - a for a, b in zip(cu_q[:-1], cu_q[1:])], device=device)
    lk = torch.tensor([b - a for a, b in zip(cu_k[:-1], cu_k[1:])], device=device)
    docs = torch.arange(len(cu_q) - 1, device=device)
    doc_q = torch.repeat_interleave(docs, lq)
    doc_k = torch.repeat_interleave(docs, lk)
    allowed = doc_q[:, None] == doc_k[None, :]
    if causal:
        start_q = torch.tensor(cu_q[:-1], device=device)[doc_q]
        start_k = torch.tensor(cu_k[:-1], device=device)[doc_k]
        pos_q = torch.arange(cu_q[-1], device=device) - start_q
        pos_k = torch.arange(cu_k[-1], device=device) - start_k
        allowed &= pos_q[:, None] >= pos_k[None, :]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, float("-inf"))


class CpuFlashKernel(AttentionKernel):
    """Flash attention for CPU; ``mode`` is ``"per_doc"`` or ``"block_diag"``."""

    name = "cpu_flash"

    def __init__(self, mode: str = "per_doc"):
        if mode not in ("per_doc", "block_diag"):
            raise ValueError(f"mode must be 'per_doc' or 'block_diag', got {mode!r}")
        self.mode = mode

    def __repr__(self) -> str:
        return f"CpuFlashKernel(mode={self.mode!r})"

    @staticmethod
    def _has_keyless_rows(cq, ck) -> bool:
        return any(cq[i + 1] > cq[i] and ck[i + 1] == ck[i] for i in range(len(cq) - 1))

    def forward(self, q, k, v, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, _ = check_block_inputs(q, k, v, cq, ck, causal)
        fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        out = torch.zeros_like(q)
        lse = torch.full((h_q, q.shape[0]), float("-inf"), dtype=lse_dtype_for(q.dtype), device=q.device)
        if q.shape[0] == 0 or k.shape[0] == 0:
            return out, lse
        if not _all_finite(q, k, v):  # NaN/inf: the math path propagates them as dense attention does
            return ReferenceKernel().forward(q, k, v, cq, ck, causal, scale)
        ke, ve = expand_kv(k, h_q), expand_kv(v, h_q)
        if self.mode == "block_diag" and not self._has_keyless_rows(cq, ck):
            mask = _block_diag_mask(cq, ck, causal, q.dtype, q.device)
            o, l = fwd(_bhld(q), _bhld(ke), _bhld(ve), 0.0, False, attn_mask=mask, scale=scale)
            return o[0].transpose(0, 1).contiguous(), l[0].to(lse.dtype)
        for i in range(len(cq) - 1):
            qs, qe, ks, kend = cq[i], cq[i + 1], ck[i], ck[i + 1]
            if qe == qs or kend == ks:
                continue
            o, l = fwd(_bhld(q[qs:qe]), _bhld(ke[ks:kend]), _bhld(ve[ks:kend]), 0.0, causal, scale=scale)
            out[qs:qe] = o[0].transpose(0, 1)
            lse[:, qs:qe] = l[0]
        return out, lse

    def backward(self, dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, h_kv = check_block_inputs(q, k, v, cq, ck, causal)
        if q.shape[0] and k.shape[0] and not (_all_finite(dout, q, k, v, out) and not bool(torch.isnan(lse).any())):
            return ReferenceKernel().backward(dout, q, k, v, out, lse, cq, ck, causal, scale)
        bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        lse = lse.to(lse_dtype_for(q.dtype))
        ke, ve = expand_kv(k, h_q), expand_kv(v, h_q)
        dq = torch.zeros_like(q)
        dk = torch.zeros(ke.shape, dtype=k.dtype, device=k.device)
        dv = torch.zeros(ve.shape, dtype=v.dtype, device=v.device)
        if q.shape[0] == 0 or k.shape[0] == 0:
            return dq, reduce_kv(dk, h_kv), reduce_kv(dv, h_kv)
        if self.mode == "block_diag" and not self._has_keyless_rows(cq, ck):
            mask = _block_diag_mask(cq, ck, causal, q.dtype, q.device)
            g = bwd(_bhld(dout), _bhld(q), _bhld(ke), _bhld(ve), _bhld(out),
                    lse.unsqueeze(0).contiguous(), 0.0, False, attn_mask=mask, scale=scale)
            dq = g[0][0].transpose(0, 1)
            dk = g[1][0].transpose(0, 1)
            dv = g[2][0].transpose(0, 1)
            return dq.contiguous(), reduce_kv(dk.contiguous(), h_kv), reduce_kv(dv.contiguous(), h_kv)
        for i in range(len(cq) - 1):
            qs, qe, ks, kend = cq[i], cq[i + 1], ck[i], ck[i + 1]
            if qe == qs or kend == ks:
                continue
            g = bwd(_bhld(dout[qs:qe]), _bhld(q[qs:qe]), _bhld(ke[ks:kend]), _bhld(ve[ks:kend]),
                    _bhld(out[qs:qe]), lse[:, qs:qe].unsqueeze(0).contiguous(), 0.0, causal,
                    scale=scale)
            dq[qs:qe] = g[0][0].transpose(0, 1)
            dk[ks:kend] = g[1][0].transpose(0, 1)
            dv[ks:kend] = g[2][0].transpose(0, 1)
        return dq, reduce_kv(dk, h_kv), reduce_kv(dv, h_kv)
