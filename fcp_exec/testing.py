"""Test helper: :func:`dense_attention`, the single-process ground truth ring attention is compared against.

Processes for multi-rank tests come from the one launcher, :mod:`fcp_exec.launch` (``WorkerPool`` / ``launch``).
"""
from __future__ import annotations

import torch

__all__ = ["dense_attention"]


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens, *, causal: bool = True,
                    softmax_scale: float | None = None, window: int | None = None,
                    sinks: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """Plain dense attention of packed documents (``[T, H, D]``, GQA), differentiable, in float64.

    Builds the full ``[T, T]`` block-diagonal (and causal) mask, so it is for small tests only. ``window``: query
    ``i`` sees keys ``j`` with ``i - j < window`` too (a sliding window, the Hugging Face rule). ``sinks`` ``[H_q]``:
    one more logit per head in every row's softmax, dropped after it (gpt-oss's attention sinks, as its eager
    attention computes them: the sink appended as a column). ``softcap``: scores ``c·tanh(s/c)`` before the mask
    (Gemma 2's logit soft-capping, its eager rule).
    """
    cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    t, h_q, d = q.shape
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    groups = h_q // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    doc = torch.zeros(t, dtype=torch.long)
    for i in range(len(cu) - 1):
        doc[cu[i]:cu[i + 1]] = i
    pos = torch.arange(t)
    allowed = doc[:, None] == doc[None, :]
    if causal:
        allowed &= pos[:, None] >= pos[None, :]
    if window is not None:
        allowed &= (pos[:, None] - pos[None, :]) < window
    s = torch.einsum("qhd,khd->hqk", q64, k64) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        column = sinks.double()[:, None, None].expand(h_q, t, 1)
        p = torch.softmax(torch.cat([s, column], dim=-1), dim=-1)[..., :-1]
        return torch.einsum("hqk,khd->qhd", p, v64)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v64)
