"""Split a CP group's vision work by whole frames and route every visual embedding to the rank that holds
its token — with exact gradients.

Every rank of a CP group receives the group's ``pixel_values``/``grid_thw`` (the collator packs the same
documents on all of them) and, for its own zigzag tokens, ``visual_index`` (rows of the group's visual
embeddings). The protocol, identical on every rank of the group, P2P on the world communicator with
global ranks (no process group is created):

1. **Shares.** The group's frames (one temporal patch of one image/video each) are cut into ``degree``
   contiguous shares of about equal patch count (:func:`frame_shares`); CP rank ``r`` encodes share ``r``,
   whose visual rows ``[row_lo, row_hi)`` are contiguous. Every frame is encoded exactly once per group.
2. **Requests.** Each rank tells every peer how many, then which, of that peer's rows it needs.
3. **Rows.** Owners send the requested rows; each rank assembles its rows in ``visual_index`` order.
4. **Backward.** The gradient of every received row travels back to its owner and is summed there with
   the gradients of rows it used itself, so the owner's encoder sees exactly the single-process gradient
   of its frames (up to summation order).

A rank whose share is empty, or which holds no visual token, still takes part (it may owe rows to peers,
or receive their gradients), so the caller must run the exchange on every rank of a group with frames, and
``encode_share`` must return a tensor that requires grad even for an empty share.

Ordering: connect the returned rows to the model's input embeddings (even when empty, e.g. ``x + 0·rows.sum()``)
so that on every rank the exchange's backward runs after all ring-attention backward traffic; if the rows only
reached the loss directly, a rank could block in the gradient exchange while its peer still waits for ring K/V.
Users: :mod:`fcp_exec.models.tiny_mllm` and :mod:`fcp_exec.integrations.hf`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist

__all__ = ["frame_table", "frame_shares", "exchange_rows"]

_TAG = 7100


def frame_table(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """One row per frame of the group's images: ``[row_start, num_rows, patch_start, h, w]`` (int64).

    ``row_start`` indexes the group's visual-embedding rows (= ``visual_index`` values), ``patch_start``
    the rows of ``pixel_values``."""
    g = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3).cpu()
    rows, row0, patch0 = [], 0, 0
    for t, h, w in g.tolist():
        if h % merge or w % merge:
            raise ValueError(f"grid (t={t}, h={h}, w={w}) is not divisible by merge_size={merge}")
        per = h * w // (merge * merge)
        for _ in range(t):
            rows.append((row0, per, patch0, h, w))
            row0 += per
            patch0 += h * w
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 5)


def frame_shares(table: torch.Tensor, degree: int) -> torch.Tensor:
    """Share (CP rank) of every frame: contiguous, balanced by patch count (frame midpoint rule)."""
    if table.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    patches = table[:, 3] * table[:, 4]
    end = torch.cumsum(patches, 0)
    mid2 = 2 * end - patches  # 2 × midpoint, integers
    total = int(end[-1])
    return torch.clamp(mid2 * degree // (2 * total), max=degree - 1).to(torch.long)


def _p2p(sends: dict[int, torch.Tensor], recvs: dict[int, torch.Tensor], tag: int) -> None:
    ops = [dist.P2POp(dist.isend, t.contiguous(), peer, tag=tag) for peer, t in sends.items() if t.numel()]
    ops += [dist.P2POp(dist.irecv, t, peer, tag=tag) for peer, t in recvs.items() if t.numel()]
    if ops:
        for req in dist.batch_isend_irecv(ops):
            req.wait()


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, own: torch.Tensor, send_idx: dict, recv_count: dict, local_idx: torch.Tensor,
                order: torch.Tensor) -> torch.Tensor:
        width = own.shape[1]
        recvs = {p: own.new_empty((n, width)) for p, n in recv_count.items()}
        _p2p({p: own.index_select(0, i) for p, i in send_idx.items()}, recvs, _TAG + 2)
        peers = sorted(recv_count)
        cat = torch.cat([own.index_select(0, local_idx)] + [recvs[p] for p in peers], dim=0)
        ctx.send_idx, ctx.recv_count, ctx.peers = send_idx, recv_count, peers
        ctx.save_for_backward(local_idx, order)
        ctx.num_own = own.shape[0]
        return cat.index_select(0, order)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        local_idx, order = ctx.saved_tensors
        grad_cat = torch.zeros_like(grad_out).index_copy(0, order, grad_out)  # rows of one rank are distinct
        parts = torch.split(grad_cat, [local_idx.numel()] + [ctx.recv_count[p] for p in ctx.peers])
        back = {p: part for p, part in zip(ctx.peers, parts[1:])}
        got = {p: grad_out.new_empty((i.numel(), grad_out.shape[1])) for p, i in ctx.send_idx.items()}
        _p2p(back, got, _TAG + 3)
        grad_own = grad_out.new_zeros((ctx.num_own, grad_out.shape[1])).index_add(0, local_idx, parts[0])
        for p, i in ctx.send_idx.items():
            if i.numel():
                grad_own = grad_own.index_add(0, i, got[p])
        return grad_own, None, None, None, None


def exchange_rows(encode_share: Callable[[int, int], torch.Tensor], table: torch.Tensor, visual_index: torch.Tensor,
                  ranks: Sequence[int], cp_rank: int, device) -> torch.Tensor:
    """Rows ``visual_index`` of the group's visual embeddings on this rank (module docstring).

    ``encode_share(f_lo, f_hi)`` encodes frames ``[f_lo, f_hi)`` (rows in frame order); ``table`` is
    :func:`frame_table` of the group."""
    degree = len(ranks)
    share = frame_shares(table, degree)
    frames = torch.nonzero(share == cp_rank).flatten()
    f_lo = int(frames[0]) if frames.numel() else 0
    f_hi = int(frames[-1]) + 1 if frames.numel() else 0
    own = encode_share(f_lo, f_hi)  # [rows of the share, hidden], requires grad
    row_lo = int(table[f_lo, 0]) if frames.numel() else 0
    starts = table[:, 0].contiguous()
    idx = visual_index.to(torch.long).cpu()
    owner = share[torch.searchsorted(starts, idx, right=True) - 1] if idx.numel() else idx
    peers = [p for p in range(degree) if p != cp_rank]
    need = {p: idx[owner == p] for p in peers}
    # requests: counts, then the row ids (int64 on the communication device)
    counts_out = {ranks[p]: torch.tensor([need[p].numel()], dtype=torch.long, device=device) for p in peers}
    counts_in = {ranks[p]: torch.zeros(1, dtype=torch.long, device=device) for p in peers}
    _p2p(counts_out, counts_in, _TAG)
    asked = {ranks[p]: torch.empty(int(counts_in[ranks[p]]), dtype=torch.long, device=device) for p in peers}
    _p2p({ranks[p]: need[p].to(device) for p in peers}, asked, _TAG + 1)
    send_idx = {g: (a - row_lo).to(own.device) for g, a in asked.items()}
    recv_count = {ranks[p]: need[p].numel() for p in peers}
    mine = owner == cp_rank
    local_idx = (idx[mine] - row_lo).to(own.device)
    # position of every requested row inside cat([local rows] + [rows from peers in global-rank order])
    pos = torch.empty(idx.numel(), dtype=torch.long)
    pos[mine] = torch.arange(int(mine.sum()))
    offset = int(mine.sum())
    for g in sorted(recv_count):
        p = ranks.index(g)
        sel = owner == p
        pos[sel] = offset + torch.arange(int(sel.sum()))
        offset += int(sel.sum())
    return _Exchange.apply(own, send_idx, recv_count, local_idx, pos.to(own.device))
