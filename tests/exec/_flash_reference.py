"""A stand-in for flash-attn's varlen entry points (the 2.7 signatures of ``_flash_attn_varlen_forward`` /
``_flash_attn_varlen_backward``), implementing their *documented* semantics in float64 on CPU tensors — a reference
of flash-attn's contract, not flash-attn. It lets the tests run ``CudaKernel(flash_attn_module=...)`` — our side of
the call: argument names, head-dim padding, cumulative bounds, the causal / sliding-window / band arguments — on a
machine without a GPU.

Documented rule (flash-attn's README and docstrings): per document with ``Sq`` queries and ``Sk`` keys, query ``i``
sees key ``j`` iff ``i + Sk − Sq − left <= j <= i + Sk − Sq + right`` where ``(left, right)`` is
``(window_size_left, window_size_right)`` and ``-1`` is unbounded; ``causal=True`` sets ``right = 0`` (the mask is
aligned to the bottom-right corner). The log-sum-exp is returned as float32 ``[H, T_q]``; a row that sees no key
gets ``out = 0`` and ``lse = -inf``. GQA: query head ``h`` uses key/value head ``h // (H_q / H_kv)``. ``softcap > 0``
caps the scaled scores, ``softcap·tanh(s/softcap)``, before the mask and the softmax (the log-sum-exp is of the capped
scores; the backward includes the cap's derivative).
"""
from __future__ import annotations

import types

import torch


class _CustomOpLike:
    """flash-attn >= 2.7 wraps its entry points as ``torch.library.custom_op`` objects that hide the signature and
    keep the function as ``_init_fn``; this mimics that wrapper."""

    def __init__(self, fn, calls: list):
        self._init_fn, self._calls = fn, calls

    def __call__(self, *args, **kwargs):
        self._calls.append(kwargs)
        return self._init_fn(*args, **kwargs)


def visible(sq: int, sk: int, causal: bool, left: int, right: int) -> torch.Tensor:
    """``[sq, sk]`` bool: the documented rule above."""
    i = torch.arange(sq)[:, None]
    j = torch.arange(sk)[None, :]
    off = sk - sq
    right = 0 if causal else right
    m = torch.ones(sq, sk, dtype=torch.bool)
    if right >= 0:
        m &= j <= i + off + right
    if left >= 0:
        m &= j >= i + off - left
    return m


def _capped(s: torch.Tensor, softcap: float):
    """``(scores, tanh(s / softcap) or None)``."""
    if not softcap:
        return s, None
    t = torch.tanh(s / softcap)
    return softcap * t, t


def _doc_probs(q, k, cq, ck, scale, causal, left, right, softcap=0.0):
    """Per document: ``(rows, keys, p [H, sq, sk], lse [H, sq], k expanded)`` in float64."""
    for a, b, c, d in zip(cq[:-1], cq[1:], ck[:-1], ck[1:]):
        qd, kd = q[a:b].double(), k[c:d].double()
        kd = kd.repeat_interleave(q.shape[1] // k.shape[1], 1)
        s = _capped(torch.einsum("ihd,jhd->hij", qd, kd) * scale, softcap)[0]
        s = s.masked_fill(~visible(b - a, d - c, causal, left, right), float("-inf"))
        lse = torch.logsumexp(s, dim=-1) if d > c else torch.full(s.shape[:2], float("-inf"), dtype=s.dtype)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0) if d > c else s
        yield slice(a, b), slice(c, d), p, lse


def varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal,
                   window_size_left=-1, window_size_right=-1, softcap=0.0, alibi_slopes=None, return_softmax=False,
                   block_table=None, leftpad_k=None, seqused_k=None):
    assert cu_seqlens_q.dtype == torch.int32 and dropout_p == 0.0 and q.shape[-1] % 8 == 0
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    assert max_seqlen_q == max(b - a for a, b in zip(cq[:-1], cq[1:]))
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    for rows, keys, p, lse_d in _doc_probs(q, k, cq, ck, softmax_scale, causal, window_size_left, window_size_right,
                                           softcap):
        if p.shape[-1]:
            out[rows] = torch.einsum("hij,jhd->ihd", p, v[keys].double().repeat_interleave(groups, 1))
        lse[:, rows] = lse_d
    return out.to(q.dtype), lse.float(), None, None


def varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                    max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
                    alibi_slopes, deterministic, rng_state=None):
    """The gradients against the given ``out`` and ``softmax_lse`` (recomputing the probabilities from them)."""
    assert softmax_lse.dtype == torch.float32 and softmax_lse.shape == (q.shape[1], q.shape[0])
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    groups, h_kv = q.shape[1] // k.shape[1], k.shape[1]
    gq = torch.zeros(q.shape, dtype=torch.float64)
    gk = torch.zeros(k.shape, dtype=torch.float64)
    gv = torch.zeros(v.shape, dtype=torch.float64)
    lse_all = softmax_lse.double()
    for rows, keys, _, _ in _doc_probs(q, k, cq, ck, softmax_scale, causal, window_size_left, window_size_right):
        if keys.stop == keys.start:
            continue
        qd, kd = q[rows].double(), k[keys].double().repeat_interleave(groups, 1)
        vd, do, od = v[keys].double().repeat_interleave(groups, 1), dout[rows].double(), out[rows].double()
        s, t = _capped(torch.einsum("ihd,jhd->hij", qd, kd) * softmax_scale, softcap)
        s = s.masked_fill(~visible(qd.shape[0], kd.shape[0], causal, window_size_left, window_size_right),
                          float("-inf"))
        p = torch.exp(s - lse_all[:, rows][..., None]).nan_to_num(0.0)
        dp = torch.einsum("ihd,jhd->hij", do, vd)
        ds = p * (dp - (do * od).sum(-1).t()[..., None])
        if t is not None:
            ds = ds * (1 - t * t)
        gq[rows] = torch.einsum("hij,jhd->ihd", ds, kd) * softmax_scale
        t = kd.shape[0]
        gk[keys] = (torch.einsum("hij,ihd->jhd", ds, qd) * softmax_scale).reshape(t, h_kv, groups, -1).sum(2)
        gv[keys] = torch.einsum("hij,ihd->jhd", p, do).reshape(t, h_kv, groups, -1).sum(2)
    for buf, g in zip((dq, dk, dv), (gq, gk, gv)):
        buf.copy_(g)


def module(calls: list | None = None):
    """An object with flash-attn's two varlen entry points (for ``CudaKernel(flash_attn_module=...)``); each call's
    keyword arguments are appended to ``calls``."""
    calls = [] if calls is None else calls
    return types.SimpleNamespace(_flash_attn_varlen_forward=_CustomOpLike(varlen_forward, calls),
                                 _flash_attn_varlen_backward=_CustomOpLike(varlen_backward, calls))
