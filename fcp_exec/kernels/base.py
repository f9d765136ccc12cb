"""The attention-kernel interface shared by the CPU, reference, CUDA and NPU kernels.

A kernel computes attention of packed variable-length documents in ``[T, H, D]`` (``TND``) layout:

``forward(q, k, v, cu_q, cu_k, causal, scale) -> (out, lse)``
    ``q`` is ``[T_q, H_q, D]``, ``k``/``v`` are ``[T_k, H_kv, D]`` with ``H_q % H_kv == 0`` (GQA: query
    head ``h`` reads key/value head ``h // (H_q // H_kv)``). ``cu_q``/``cu_k`` are the cumulative
    document boundaries (same number of documents; document ``i`` of ``q`` attends only to document
    ``i`` of ``k``). ``causal=True`` requires equal query and key lengths per document and masks key
    ``j > i`` of query ``i``. ``out`` has the dtype of ``q``; ``lse`` is the natural-log
    log-sum-exp of the scaled scores, ``[H_q, T_q]`` in float32 (float64 for float64 inputs), with
    ``-inf`` (and ``out == 0``) for a row that sees no key.

``backward(dout, q, k, v, out, lse, cu_q, cu_k, causal, scale) -> (dq, dk, dv)``
    Gradients of this block, given the *final* ``out`` and ``lse`` of the rows (which may include
    contributions of other blocks). With the global ``out``/``lse`` the block gradients are exactly
    the block's share of the full-attention gradients, which is what ring attention needs.

Optional keyword arguments ``max_q``/``max_k`` (the longest document) spare a device sync on
kernels that need them.
"""
from __future__ import annotations

import abc
from typing import ClassVar

import torch

__all__ = [
    "AttentionKernel",
    "add_sinks",
    "check_block_inputs",
    "doc_bounds",
    "empty_rows_fixup",
    "expand_kv",
    "lse_dtype_for",
    "reduce_kv",
    "sink_grad",
]


class AttentionKernel(abc.ABC):
    """Attention over packed documents; see the module docstring for the exact contract."""

    name: ClassVar[str] = "abstract"

    @abc.abstractmethod
    def forward(self, q, k, v, cu_q, cu_k, causal: bool, scale: float, *,
                max_q: int | None = None, max_k: int | None = None):
        """Return ``(out, lse)`` for one block."""

    @abc.abstractmethod
    def backward(self, dout, q, k, v, out, lse, cu_q, cu_k, causal: bool, scale: float, *,
                 max_q: int | None = None, max_k: int | None = None):
        """Return ``(dq, dk, dv)`` for one block, against the final ``out``/``lse``."""

    def fused_window(self, q) -> bool:
        """Whether ``forward``/``backward`` take ``window=W`` themselves (a fused banded kernel, causal) for blocks
        like ``q`` whose query and key rows are whole documents (ring attention's degree 1). Default: no — the shared
        masked path of :mod:`fcp_exec.kernels.window` runs."""
        return False

    def fused_band(self, q) -> bool:
        """Whether ``forward``/``backward`` take ``window=(left, right)`` (flash-attn's band convention: query ``i``
        of ``Sq`` sees keys ``[i + Sk − Sq − left, i + Sk − Sq + right]``, -1 unbounded; non-causal): one pair of
        zigzag chunks of a ring block of degree > 1 (:mod:`fcp_exec.kernels.window_band`). Default: no."""
        return False

    def fused_softcap(self, q) -> bool:
        """Whether ``forward``/``backward`` take ``softcap=c`` (attention logits ``c·tanh(s/c)``, flash-attn's
        ``softcap``) for blocks like ``q``. Default: no — the masked path of :mod:`fcp_exec.kernels.window` caps."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def lse_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """float64 inputs keep float64 statistics; everything else uses float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def doc_bounds(cu) -> list[int]:
    """Document boundaries as a Python list (one host sync for device tensors)."""
    if isinstance(cu, torch.Tensor):
        return [int(x) for x in cu.tolist()]
    return [int(x) for x in cu]


def check_block_inputs(q, k, v, cu_q: list[int], cu_k: list[int], causal: bool) -> tuple[int, int]:
    """Validate one kernel call; returns ``(H_q, H_kv)``. Raises ``ValueError`` on misuse."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"q, k, v must be [T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k head dims differ: {q.shape[2]} vs {k.shape[2]}")
    h_q, h_kv = q.shape[1], k.shape[1]
    if h_q < 1 or h_kv < 1:
        raise ValueError(f"q has {h_q} heads and k/v have {h_kv}: need H_q >= 1 and H_kv >= 1")
    if h_q % h_kv:
        raise ValueError(f"H_q={h_q} must be a multiple of H_kv={h_kv} (GQA)")
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_q and cu_k describe {len(cu_q) - 1} and {len(cu_k) - 1} documents")
    if cu_q[-1] != q.shape[0] or cu_k[-1] != k.shape[0]:
        raise ValueError(
            f"cu_q ends at {cu_q[-1]} (q has {q.shape[0]} rows), cu_k ends at {cu_k[-1]} "
            f"(k has {k.shape[0]} rows)")
    if causal:
        for i in range(len(cu_q) - 1):
            if cu_q[i + 1] - cu_q[i] != cu_k[i + 1] - cu_k[i]:
                raise ValueError(
                    f"causal blocks need equal query and key lengths per document; document {i} "
                    f"has {cu_q[i + 1] - cu_q[i]} queries and {cu_k[i + 1] - cu_k[i]} keys")
    return h_q, h_kv


def expand_kv(x: torch.Tensor, h_q: int) -> torch.Tensor:
    """``[T, H_kv, D] -> [T, H_q, D]`` by repeating each key/value head ``H_q // H_kv`` times."""
    groups = h_q // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def reduce_kv(dx: torch.Tensor, h_kv: int) -> torch.Tensor:
    """Inverse of :func:`expand_kv` for gradients: sum the query-head group of every kv head."""
    t, h_q, d = dx.shape
    if h_q == h_kv:
        return dx
    return dx.view(t, h_kv, h_q // h_kv, d).sum(dim=2)


def empty_rows_fixup(out: torch.Tensor, lse: torch.Tensor, cu_q: list[int], cu_k: list[int]) -> None:
    """In place: rows of documents with queries but no keys get ``out = 0`` and ``lse = -inf``."""
    for i in range(len(cu_q) - 1):
        if cu_q[i + 1] > cu_q[i] and cu_k[i + 1] == cu_k[i]:
            out[cu_q[i]:cu_q[i + 1]] = 0
            lse[:, cu_q[i]:cu_q[i + 1]] = float("-inf")


def merge_block(out_acc: torch.Tensor, lse_acc: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
                rows=None) -> None:
    """In place: fold one block's result (``out_b`` ``[n, H, D]``, ``lse_b`` ``[H, n]``) into the running
    ``out_acc``/``lse_acc`` at ``rows`` (None: all rows; a slice; or an index tensor) by the log-sum-exp update.
    Rows where both are ``-inf`` stay ``out = 0``, ``lse = -inf``."""
    index = isinstance(rows, torch.Tensor)
    sel = slice(None) if rows is None else rows
    lse_old = lse_acc.index_select(1, rows) if index else lse_acc[:, sel]
    out_old = out_acc.index_select(0, rows) if index else out_acc[sel]
    lse_b = lse_b.to(lse_acc.dtype)
    new = torch.logaddexp(lse_old, lse_b)
    finite = torch.isfinite(new)
    base = torch.where(finite, new, torch.zeros_like(new))
    w_old = torch.where(finite, torch.exp(lse_old - base), torch.zeros_like(new))
    w_b = torch.where(finite, torch.exp(lse_b - base), torch.zeros_like(new))
    merged = out_old * w_old.t().unsqueeze(-1) + out_b.to(out_acc.dtype) * w_b.t().unsqueeze(-1)
    if index:
        out_acc.index_copy_(0, rows, merged)
        lse_acc.index_copy_(1, rows, new)
    else:
        out_acc[sel] = merged
        lse_acc[:, sel] = new


def add_sinks(out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention sinks (gpt-oss's ``s_aux``): one extra logit ``sinks[h]`` per head in every query's softmax, with a
    zero value. The ring's exact ``(out [T, H, D], lse [H, T])`` become ``lse' = logaddexp(lse, sink)`` and
    ``out' = out · exp(lse − lse')``. The backward needs nothing else: with ``out'``/``lse'`` in place of
    ``out``/``lse`` every kernel's backward yields the gradients of the softmax that includes the sink (its
    probabilities are ``exp(s − lse')`` and ``rowsum(dO ∘ out')`` is that softmax's ``D`` term, the sink adding a
    zero value), and the sink's own gradient is :func:`sink_grad`."""
    new = torch.logaddexp(lse, sinks.to(lse.dtype)[:, None])
    return out * torch.exp(lse - new).t().unsqueeze(-1), new


def sink_grad(dout: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """``dL/dsinks [H]`` of :func:`add_sinks` over this rank's queries: ``−Σ_t p_sink(t) · rowsum(dO ∘ out')(t)``
    with ``p_sink = exp(sink − lse')``."""
    acc = lse.dtype
    d = (dout.to(acc) * out.to(acc)).sum(-1)  # [T, H]
    return -(torch.exp(sinks.to(acc)[:, None] - lse) * d.t()).sum(1).to(sinks.dtype)
