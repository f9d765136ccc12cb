"""Sliding windows on a fused banded kernel at ring degree > 1 (kernels with ``fused_band``: flash-attn, torch's
flash varlen).

Under ring attention a block pairs this rank's query rows with one rank's key rows. Per document both are *runs* of
consecutive positions — the zigzag chunks ``r`` and ``2d−1−r`` of the padded document, or one of them — so between
a query run starting at position ``pq`` and a key run starting at ``pk`` the window rule ``0 <= (pq + i) − (pk + j)
< W`` is a band of constant offset ``Δ = pq − pk``: row ``i`` sees keys ``j`` in ``[i + Δ − W + 1, i + Δ]``.
:func:`band_calls` trims each pair of runs to the rows that see some key and the keys some of them see, and states
the band in flash-attn's documented convention — query ``i`` of ``Sq`` rows sees keys ``[i + Sk − Sq − left,
i + Sk − Sq + right]``, ``-1`` unbounded — so that every row of a call sees at least one key. Pairs with the same
band and disjoint query rows share one non-causal varlen call (:func:`band_groups`; each pair one sequence of it,
``kernel.forward(..., window=(left, right))``); :func:`band_forward` merges the calls of a block by log-sum-exp,
:func:`band_backward` gives each call the final ``out``/``lse`` of its rows (the kernel contract of
:mod:`fcp_exec.kernels.base`), so the gradients of the calls add up. Degree 1 needs none of this: whole documents,
one varlen call with ``window=W`` (``ring_attention``).
"""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import lse_dtype_for, merge_block

__all__ = ["BandGroup", "band_calls", "band_groups", "band_forward", "band_backward", "block_runs", "plan_band"]


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


class BandGroup:
    """Pairs of runs with one band ``(left, right)`` and disjoint query rows: one varlen kernel call (each pair a
    sequence of it; flash aligns every sequence's band to its own bottom-right corner)."""

    __slots__ = ("band", "q_rows", "k_rows", "cu_q", "cu_k", "max_q", "max_k", "_index")

    def __init__(self, band: tuple[int, int], pairs: list) -> None:
        self.band = band
        self.q_rows = [r for qa, sq, *_ in pairs for r in range(qa, qa + sq)]
        self.k_rows = [r for _, _, ka, sk, *_ in pairs for r in range(ka, ka + sk)]
        self.cu_q, self.cu_k = [0], [0]
        for _, sq, _, sk, *_ in pairs:
            self.cu_q.append(self.cu_q[-1] + sq)
            self.cu_k.append(self.cu_k[-1] + sk)
        self.max_q, self.max_k = max(p[1] for p in pairs), max(p[3] for p in pairs)
        self._index: dict = {}

    def index(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's query and key row indices on ``device`` (built once per device)."""
        key = str(device)
        if key not in self._index:
            self._index[key] = (torch.tensor(self.q_rows, dtype=torch.long, device=device),
                                torch.tensor(self.k_rows, dtype=torch.long, device=device))
        return self._index[key]


def band_groups(calls) -> list[BandGroup]:
    """The calls of :func:`band_calls` gathered into as few varlen calls as possible: a pair joins the first group
    of its band whose query rows it does not overlap (a query row's results from two pairs are merged by
    log-sum-exp, so they must come from different calls)."""
    groups: list[tuple[tuple[int, int], list, list]] = []  # (band, pairs, query spans)
    for call in calls:
        qa, sq, band = call[0], call[1], (call[4], call[5])
        for g_band, pairs, spans in groups:
            if g_band == band and all(qa + sq <= a or b <= qa for a, b in spans):
                pairs.append(call)
                spans.append((qa, qa + sq))
                break
        else:
            groups.append((band, [call], [(qa, qa + sq)]))
    return [BandGroup(band, pairs) for band, pairs, _ in groups]


def plan_band(plan, step: int, window: int) -> list[BandGroup]:
    """:func:`band_groups` of ``plan.block(step)`` (a ``ring_attention._Plan``), cached on the plan per step and
    window (a plan lives for one micro-batch: its layers reuse it)."""
    cache = plan.__dict__.setdefault("_band_cache", {})
    if (step, window) not in cache:
        cache[(step, window)] = band_groups(band_calls(block_runs(plan.cu, plan.degree, plan.cp_rank, step), window))
    return cache[(step, window)]


def band_forward(kernel, q, k, v, groups, scale: float):
    """``(out, lse)`` of one block from its band groups (rows no group covers: ``out = 0``, ``lse = -inf``)."""
    acc = lse_dtype_for(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=acc, device=q.device)
    for g in groups:
        qi, ki = g.index(q.device)
        o, lo = kernel.forward(q.index_select(0, qi), k.index_select(0, ki), v.index_select(0, ki), g.cu_q, g.cu_k,
                               False, scale, max_q=g.max_q, max_k=g.max_k, window=g.band)
        merge_block(out, lse, o, lo, qi)
    return out, lse


def band_backward(kernel, dout, q, k, v, out, lse, groups, scale: float):
    """``(dq, dk, dv)`` of one block from its band groups, against the final ``out``/``lse`` rows."""
    acc = lse_dtype_for(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dk = torch.zeros(k.shape, dtype=acc, device=k.device)
    dv = torch.zeros(v.shape, dtype=acc, device=v.device)
    for g in groups:
        qi, ki = g.index(q.device)
        grads = kernel.backward(dout.index_select(0, qi), q.index_select(0, qi), k.index_select(0, ki),
                                v.index_select(0, ki), out.index_select(0, qi), lse.index_select(1, qi).contiguous(),
                                g.cu_q, g.cu_k, False, scale, max_q=g.max_q, max_k=g.max_k, window=g.band)
        dq.index_add_(0, qi, grads[0].to(acc))
        dk.index_add_(0, ki, grads[1].to(acc))  # a key row of several pairs: their gradients add up
        dv.index_add_(0, ki, grads[2].to(acc))
    return dq, dk, dv
