"""Sliding windows on a fused banded kernel at ring degree > 1 (kernels with ``fused_band``: flash-attn, torch's
flash varlen).

Under ring attention a block pairs this rank's query rows with one rank's key rows. Per document both are *runs* of
consecutive positions — the zigzag chunks ``r`` and ``2d−1−r`` of the padded document, or one of them — so between
a query run starting at position ``pq`` and a key run starting at ``pk`` the window rule ``0 <= (pq + i) − (pk + j)
< W`` is a band of constant offset ``Δ = pq − pk``: row ``i`` sees keys ``j`` in ``[i + Δ − W + 1, i + Δ]``.
:func:`band_calls` trims each pair of runs to the rows that see some key and the keys some of them see, and states
the band in flash-attn's documented convention — query ``i`` of ``Sq`` rows sees keys ``[i + Sk − Sq − left,
i + Sk − Sq + right]``, ``-1`` unbounded — so that every row of a call sees at least one key. One non-causal kernel
call per pair (``kernel.forward(..., window=(left, right))``); :func:`band_forward` merges the calls of a block by
log-sum-exp, :func:`band_backward` gives each call the final ``out``/``lse`` of its rows (the kernel contract of
:mod:`fcp_exec.kernels.base`), so the gradients of the calls add up. Degree 1 needs none of this: whole documents,
one varlen call with ``window=W`` (``ring_attention``).
"""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import lse_dtype_for, merge_block

__all__ = ["band_calls", "band_forward", "band_backward", "block_runs", "plan_band"]


def block_runs(cu: list[int], degree: int, cp_rank: int, step: int) -> list[tuple[list, list]]:
    """Per document of a causal ring block (``ring_attention._Plan.block(step)``): ``(query runs, key runs)``, each
    run ``(first row in the block, rows, first position in the document)``. ``cu``: this rank's local document
    bounds; the local rows of a document are its chunk ``r`` then chunk ``2d−1−r`` (``h`` rows each)."""
    src = (cp_rank - step) % degree
    out = []
    for a, b in zip(cu[:-1], cu[1:]):
        h = (b - a) // 2

        def own(rank: int, base: int) -> list:
            return [(base, h, rank * h), (base + h, h, (2 * degree - 1 - rank) * h)]

        if step == 0:
            out.append((own(cp_rank, a), own(cp_rank, a)))
        elif src < cp_rank:  # all query rows × the source's first chunk (block rows: cu, cu_half)
            out.append((own(cp_rank, a), [(a // 2, h, src * h)]))
        else:  # the second query chunk (block rows: cu_half) × all the source's rows
            out.append(([(a // 2, h, (2 * degree - 1 - cp_rank) * h)], own(src, a)))
    return out


def band_calls(runs: list[tuple[list, list]], window: int) -> list[tuple[int, int, int, int, int, int]]:
    """``(q_start, q_rows, k_start, k_rows, left, right)`` per pair of runs that has any visible key (module
    docstring); ``left``/``right`` -1 where that side of the band never binds."""
    calls = []
    for q_runs, k_runs in runs:
        for qa, nq, pq in q_runs:
            for ka, nk, pk in k_runs:
                if nq == 0 or nk == 0:
                    continue
                delta = pq - pk
                r0, r1 = max(0, -delta), min(nq - 1, nk - 1 - delta + window - 1)
                if r0 > r1:
                    continue
                k_lo, k_hi = max(0, r0 + delta - window + 1), min(nk - 1, r1 + delta)
                sq, sk = r1 - r0 + 1, k_hi - k_lo + 1
                lower0, upper0 = r0 + delta - window + 1 - k_lo, r0 + delta - k_lo  # row 0's bounds, sub-indices
                left = -1 if lower0 + sq - 1 <= 0 else (sk - sq) - lower0
                right = -1 if upper0 >= sk - 1 else upper0 - (sk - sq)
                calls.append((qa + r0, sq, ka + k_lo, sk, left, right))
    return calls


def plan_band(plan, step: int, window: int) -> list:
    """:func:`band_calls` of ``plan.block(step)`` (a ``ring_attention._Plan``), cached on the plan per step and
    window (a plan lives for one call: its layers reuse it)."""
    cache = plan.__dict__.setdefault("_band_cache", {})
    if (step, window) not in cache:
        cache[(step, window)] = band_calls(block_runs(plan.cu, plan.degree, plan.cp_rank, step), window)
    return cache[(step, window)]


def band_forward(kernel, q, k, v, calls, scale: float):
    """``(out, lse)`` of one block from its band calls (rows no call covers: ``out = 0``, ``lse = -inf``)."""
    acc = lse_dtype_for(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=acc, device=q.device)
    for qa, nq, ka, nk, left, right in calls:
        o, lo = kernel.forward(q[qa:qa + nq], k[ka:ka + nk], v[ka:ka + nk], [0, nq], [0, nk], False, scale,
                               window=(left, right))
        merge_block(out, lse, o, lo, slice(qa, qa + nq))
    return out, lse


def band_backward(kernel, dout, q, k, v, out, lse, calls, scale: float):
    """``(dq, dk, dv)`` of one block from its band calls, against the final ``out``/``lse`` rows."""
    acc = lse_dtype_for(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)
    for qa, nq, ka, nk, left, right in calls:
        rows, keys = slice(qa, qa + nq), slice(ka, ka + nk)
        g = kernel.backward(dout[rows].contiguous(), q[rows], k[keys], v[keys], out[rows].contiguous(),
                            lse[:, rows].contiguous(), [0, nq], [0, nk], False, scale, window=(left, right))
        dq[rows] += g[0].to(acc)
        dk[keys] += g[1].to(acc)
        dv[keys] += g[2].to(acc)
    return dq, dk, dv
