"""Sliding-window attention at ring degree > 1 without the ring: a halo exchange with the two zigzag neighbours.

A window of ``W`` keys (query ``i`` sees keys ``i − W + 1 .. i``) over documents whose zigzag chunks (``h`` rows:
the padded document over ``2·d``) all have ``h ≥ W − 1`` rows: a query of chunk ``c`` then sees keys of chunk
``c`` and of the last ``W − 1`` rows of chunk ``c − 1`` only. Rank ``r`` holds chunks ``r`` and ``2d−1−r``, so it
needs the tail of chunk ``r − 1`` — rank ``r − 1``'s first chunk, for ``r ≥ 1`` — and the tail of chunk ``2d−2−r``
— rank ``r + 1``'s second chunk, for ``r ≤ d − 2`` (for ``r = d − 1`` it is its own first chunk). Instead of
``d − 1`` ring steps that each carry the whole K/V shard, every rank sends the last ``W − 1`` K/V rows of its first
chunk of every document to its next rank and those of its second chunks to its previous rank (one batched P2P
round), and computes its local block (step 0 of the ring, unchanged) plus one block of all its query rows against
the received rows (the masked math path of :mod:`fcp_exec.kernels.window`, at most ``2·(W − 1)`` keys per
document), merged by log-sum-exp. The backward re-runs both blocks against the final ``out``/``lse`` and sends the
received rows' dK/dV back to their owners the same way. Per layer and pass the traffic is ``2·(W − 1)`` rows per
document instead of ``(d − 1)/d`` of the shard, in one round instead of ``d − 1``; every rank of the group derives
the same choice from the shared ``cu_seqlens`` (:func:`halo_plan`). A group that also holds shorter documents splits
the call (:func:`split_documents`): the long documents' rows as a halo, the short ones' as a ring of their rows only.
"""

from __future__ import annotations

import os

import torch

from fcp_exec.kernels.base import merge_block
from fcp_exec.kernels.window import windowed_backward, windowed_forward

__all__ = ["HaloPlan", "halo_plan", "halo_forward", "halo_backward", "split_documents"]

_TAG_FWD, _TAG_BWD = 12, 16  # K/V tails, then their dK/dV (the ring's tags are 0-3, its header 8-9)


class HaloPlan:
    """Which local rows go to each neighbour and where the received ones sit, for one call (pure, per cp_rank)."""

    def __init__(self, cu: list[int], degree: int, cp_rank: int, window: int, device) -> None:
        tail, r, d = window - 1, cp_rank, degree
        send_next, send_prev, keys, key_pos, cu_k = [], [], [], [], [0]
        docs, n = sum(b > a for a, b in zip(cu[:-1], cu[1:])), 0  # an empty document sends and needs nothing
        for a, b in zip(cu[:-1], cu[1:]):
            h = (b - a) // 2
            if h:
                send_next.append(torch.arange(a + h - tail, a + h))  # first chunk's tail -> rank r + 1 (chunk r)
                send_prev.append(torch.arange(b - tail, b))  # second chunk's tail -> rank r - 1 (chunk 2d-1-r)
            if h and r >= 1:  # chunk r - 1 from the previous rank: the n-th tail of what it sends forward
                keys.append(torch.arange(n * tail, (n + 1) * tail))
                key_pos.append(torch.arange(r * h - tail, r * h))
            if h and r <= d - 2:  # chunk 2d-2-r from the next rank: after the previous rank's rows
                keys.append(docs * tail + torch.arange(n * tail, (n + 1) * tail))
                key_pos.append(torch.arange((2 * d - 1 - r) * h - tail, (2 * d - 1 - r) * h))
            cu_k.append(cu_k[-1] + (tail * ((r >= 1) + (r <= d - 2)) if h else 0))
            n += bool(h)
        cat = (lambda xs: torch.cat(xs).to(device) if xs else torch.zeros(0, dtype=torch.long, device=device))
        self.send_next, self.send_prev, self.keys, self.key_pos = cat(send_next), cat(send_prev), cat(keys), \
            cat(key_pos)
        self.cu_k, self.window = cu_k, window


def _windowed_ring(plan, window: int | None) -> bool:
    """A causal ring of degree > 1 with a window, the halo not switched off (``FCP_WINDOW_HALO=0``)."""
    return window is not None and plan.degree > 1 and plan.causal and os.environ.get("FCP_WINDOW_HALO", "1") != "0"


def halo_plan(plan, window: int | None, device) -> HaloPlan | None:
    """The halo plan of a causal ring ``plan`` (:class:`fcp_exec.ring_attention._Plan`) for ``window``, or None where
    the ring is needed: no window, degree 1, full attention, or a document whose chunks are shorter than ``W − 1``
    (``FCP_WINDOW_HALO=0`` in the environment: always the ring, for comparisons; set alike on every rank)."""
    if not _windowed_ring(plan, window):
        return None
    cache = plan.__dict__.setdefault("_halo_plans", {})  # the plan lives for a micro-batch: every layer reuses it
    if window not in cache:
        cu = plan.cu
        short = any(0 < (b - a) // 2 < window - 1 for a, b in zip(cu[:-1], cu[1:]))
        cache[window] = None if short else HaloPlan(cu, plan.degree, plan.cp_rank, window, device)
    return cache[window]


def split_documents(plan, window: int | None, make_plan):
    """A window over documents of both kinds: ``[(rows, plan)]`` of the documents whose chunks hold ``W − 1`` rows
    (run as a halo) and of the others (a ring of their rows only), ``make_plan(cu)`` building each part's plan; None
    where all are of one kind (or there is no window, the degree is 1 or the halo is switched off)."""
    if not _windowed_ring(plan, window):
        return None
    cache = plan.__dict__.setdefault("_halo_splits", {})
    if window not in cache:
        docs = [(a, b) for a, b in zip(plan.cu[:-1], plan.cu[1:]) if b > a]
        long_docs = [(a, b) for a, b in docs if (b - a) // 2 >= window - 1]
        cache[window] = None
        if long_docs and len(long_docs) < len(docs):
            short_docs = [(a, b) for a, b in docs if (b - a) // 2 < window - 1]
            cache[window] = [_part(part, plan.device, make_plan) for part in (long_docs, short_docs)]
    return cache[window]


def _part(docs: list[tuple[int, int]], device, make_plan):
    """(local rows, plan) of some documents (their local bounds ``(a, b)``), packed in their order."""
    cu = [0]
    for a, b in docs:
        cu.append(cu[-1] + b - a)
    return torch.cat([torch.arange(a, b) for a, b in docs]).to(device), make_plan(cu)


def _post(halo: HaloPlan, k, v, comm):
    """Post the swap of K/V tails with both neighbours (None where there is nothing to swap: window 1 or no document,
    the same on every rank of the group); :func:`_received` waits for it."""
    if not halo.send_next.numel():
        return None
    return comm.swap_with_neighbours([k.index_select(0, halo.send_next), v.index_select(0, halo.send_next)],
                                     [k.index_select(0, halo.send_prev), v.index_select(0, halo.send_prev)],
                                     tag=_TAG_FWD, what="k/v tails")


def _received(halo: HaloPlan, pending, k, v):
    """The neighbours' K/V tails this rank's queries see, gathered per document (``halo.keys`` order)."""
    if pending is None:
        return k[:0], v[:0]
    got = pending.wait()
    k_all, v_all = torch.cat([got[0], got[2]]), torch.cat([got[1], got[3]])
    return k_all.index_select(0, halo.keys), v_all.index_select(0, halo.keys)


def halo_forward(q, k, v, plan, halo: HaloPlan, comm, scale: float, softcap, local_block):
    """``(out, lse)`` of the local block (``local_block()``: the ring's step 0) merged with all local query rows
    against the neighbours' K/V tails."""
    pending = _post(halo, k, v, comm)  # in flight while the local block runs
    out, lse = local_block()
    k_h, v_h = _received(halo, pending, k, v)
    if q.shape[0] and k_h.shape[0]:
        pos_q = plan.positions(0)[0]
        out_h, lse_h = windowed_forward(q, k_h, v_h, plan.cu, halo.cu_k, scale, halo.window, pos_q, halo.key_pos,
                                        softcap=softcap)
        out, lse = out.to(lse.dtype), lse.clone()
        merge_block(out, lse, out_h, lse_h, None)
    return out, lse


def halo_backward(dout, q, k, v, out, lse, plan, halo: HaloPlan, comm, scale: float, softcap, local_block):
    """``(dq, dk, dv)`` of :func:`halo_forward`: the local block's (``local_block()``), plus the halo block's dQ and
    the dK/dV the neighbours computed for the tails this rank sent them (sent back in one P2P round)."""
    pending = _post(halo, k, v, comm)
    dq, dk, dv = local_block()
    k_h, v_h = _received(halo, pending, k, v)
    if not k_h.shape[0]:
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    acc = lse.dtype
    dq_h, dk_h, dv_h = windowed_backward(dout, q, k_h, v_h, out, lse, plan.cu, halo.cu_k, scale, halo.window,
                                         plan.positions(0)[0], halo.key_pos, softcap=softcap)
    n = halo.send_next.numel()  # rows received from each neighbour: scatter the gradients back into those layouts
    dk_all = torch.zeros((2 * n, *k.shape[1:]), dtype=acc, device=k.device).index_add_(0, halo.keys, dk_h.to(acc))
    dv_all = torch.zeros((2 * n, *v.shape[1:]), dtype=acc, device=v.device).index_add_(0, halo.keys, dv_h.to(acc))
    got = comm.swap_with_neighbours([dk_all[n:], dv_all[n:]], [dk_all[:n], dv_all[:n]], tag=_TAG_BWD,
                                    what="dk/dv of k/v tails").wait()
    # got: the dK, dV the previous rank computed for our second chunks' tails (we sent them to it), then those the
    # next rank computed for our first chunks' tails
    dk = dk.to(acc).index_add_(0, halo.send_prev, got[0]).index_add_(0, halo.send_next, got[2])
    dv = dv.to(acc).index_add_(0, halo.send_prev, got[1]).index_add_(0, halo.send_next, got[3])
    return (dq.to(acc) + dq_h.to(acc)).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
