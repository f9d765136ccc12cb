"""The fp64 math reference kernel: plain matmul + softmax per document, any device, any dtype.

It computes in float64 whatever the input dtype (outputs are cast back), handles GQA, causal and
full masks, documents with no keys (``lse = -inf``, ``out = 0``) and unequal query/key lengths.
Slow (materialises ``[H, L_q, L_k]`` per document) and meant for tests and small checks.
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

__all__ = ["ReferenceKernel"]

_F64 = torch.float64


def _scores(q_d, k_d, causal: bool, scale: float) -> torch.Tensor:
    """Scaled scores ``[H, L_q, L_k]`` in float64 with masked entries at ``-inf``."""
    s = torch.einsum("qhd,khd->hqk", q_d.to(_F64), k_d.to(_F64)) * scale
    if causal:
        lq, lk = s.shape[1], s.shape[2]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


class ReferenceKernel(AttentionKernel):
    """Exact float64 attention; see :mod:`fcp_exec.kernels.base` for the contract."""

    name = "reference"

    def forward(self, q, k, v, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, _ = check_block_inputs(q, k, v, cq, ck, causal)
        out = torch.zeros(q.shape, dtype=_F64, device=q.device)
        lse = torch.full((h_q, q.shape[0]), float("-inf"), dtype=_F64, device=q.device)
        for i in range(len(cq) - 1):
            qs, qe, ks, ke = cq[i], cq[i + 1], ck[i], ck[i + 1]
            if qe == qs or ke == ks:
                continue
            s = _scores(q[qs:qe], expand_kv(k[ks:ke], h_q), causal, scale)
            lse_d = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - lse_d.unsqueeze(-1))
            out[qs:qe] = torch.einsum("hqk,khd->qhd", p, expand_kv(v[ks:ke], h_q).to(_F64))
            lse[:, qs:qe] = lse_d
        return out.to(q.dtype), lse.to(lse_dtype_for(q.dtype))

    def backward(self, dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, h_kv = check_block_inputs(q, k, v, cq, ck, causal)
        dq = torch.zeros(q.shape, dtype=_F64, device=q.device)
        dk = torch.zeros((k.shape[0], h_q, k.shape[2]), dtype=_F64, device=q.device)
        dv = torch.zeros((v.shape[0], h_q, v.shape[2]), dtype=_F64, device=q.device)
        for i in range(len(cq) - 1):
            qs, qe, ks, ke = cq[i], cq[i + 1], ck[i], ck[i + 1]
            if qe == qs or ke == ks:
                continue
            k_d = expand_kv(k[ks:ke], h_q).to(_F64)
            v_d = expand_kv(v[ks:ke], h_q).to(_F64)
            q_d = q[qs:qe].to(_F64)
            do_d = dout[qs:qe].to(_F64)
            s = _scores(q_d, k_d, causal, scale)
            p = torch.exp(s - lse[:, qs:qe].to(_F64).unsqueeze(-1))
            dv[ks:ke] = torch.einsum("hqk,qhd->khd", p, do_d)
            dp = torch.einsum("qhd,khd->hqk", do_d, v_d)
            delta = (do_d * out[qs:qe].to(_F64)).sum(-1).transpose(0, 1)  # [H, L_q]
            ds = p * (dp - delta.unsqueeze(-1))
            dq[qs:qe] = torch.einsum("hqk,khd->qhd", ds, k_d) * scale
            dk[ks:ke] = torch.einsum("hqk,qhd->khd", ds, q_d) * scale
        return dq.to(q.dtype), reduce_kv(dk, h_kv).to(k.dtype), reduce_kv(dv, h_kv).to(v.dtype)
