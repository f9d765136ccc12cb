"""Ring attention with mismatched calls across a CP group: a Python error naming the peer, never a crash.

Before the shape check, a rank whose shard had a different size than its neighbour's posted a receive
of the wrong size and gloo aborted the process (``gloo::EnforceNotMet``) — no message naming the rank,
and a dead worker. Now every rank swaps a small header with both ring neighbours first. Each case runs
on real gloo processes (one pool of 3 for the module) and checks that every rank next to the odd one
raises ``ValueError`` naming the peer rank, the differing field and both shapes, that nobody hangs or
dies, and that the pool is usable afterwards (no K/V block was left in flight): a correct call right
after matches dense attention in fp64 to 1e-9.
"""
from __future__ import annotations

import re

import pytest
import torch

from fcp_exec import ring_attention, zigzag_shard
from fcp_exec.launch import WorkerPool
from fcp_exec.testing import dense_attention


@pytest.fixture(scope="module")
def pool3():
    with WorkerPool(3, backend="gloo", pg_timeout=60) as pool:
        yield pool


def mismatch_case(rank, ranks, odd_rank, change):
    """Worker: every rank in ``ranks`` calls ring_attention; ``odd_rank`` changes one thing."""
    if rank not in ranks:
        return None
    T, hq, hkv, d, dtype, causal, cu, scale = 8, 2, 1, 4, torch.float64, True, [0, 8], None
    if rank == odd_rank:
        if change == "tokens":
            T, cu = 6, [0, 6]
        elif change == "heads":
            hkv = 2
        elif change == "head_dim":
            d = 8
        elif change == "dtype":
            dtype = torch.float32
        elif change == "mask":
            causal = False
        elif change == "cu_seqlens":
            cu = [0, 4, 8]
        elif change == "scale":
            scale = 0.1
    gen = torch.Generator().manual_seed(rank)
    q = torch.randn(T, hq, d, generator=gen, dtype=dtype)
    kv = torch.randn(T, hkv, d, generator=gen, dtype=dtype)
    try:
        ring_attention(q, kv, kv, cu, ranks=ranks, causal=causal, softmax_scale=scale, timeout=20)
    except (ValueError, RuntimeError) as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


CHANGES = {  # what the odd rank changes -> the field the message must name
    "tokens": "local tokens", "heads": "key/value heads", "head_dim": "head dim", "dtype": "dtype",
    "mask": "mask", "cu_seqlens": "local cu_seqlens", "scale": "softmax scale",
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_degree3_mismatch_names_peer_on_every_rank(pool3, change):
    """Ring (0, 1, 2), rank 1 differs: ranks 0 and 2 (its neighbours) and rank 1 itself raise ValueError
    naming the differing field, the peer and both shapes."""
    out = pool3.run(mismatch_case, [0, 1, 2], 1, change, timeout=60)
    for rank, (kind, msg) in enumerate(out):
        assert kind == "ValueError", (rank, kind, msg)
        assert CHANGES[change] in msg, msg
        assert f"rank {rank} (cp_rank {rank}" in msg, msg
        assert re.search(r"peer rank [02]" if rank == 1 else r"peer rank 1", msg), msg
        assert msg.count("q [") == 2, msg  # both shapes
    if change == "tokens":
        assert "q [6, 2, 4]" in out[0][1] and "q [8, 2, 4]" in out[0][1]


def test_degree2_mismatch_both_ranks_raise(pool3):
    """Ring (2, 0) (not in rank order), rank 0's shard is shorter: both raise, rank 1 is not involved."""
    out = pool3.run(mismatch_case, [2, 0], 0, "tokens", timeout=60)
    assert out[1] is None
    for rank, peer in ((0, 2), (2, 0)):
        kind, msg = out[rank]
        assert kind == "ValueError" and f"peer rank {peer}" in msg, msg
        assert "q [6, 2, 4]" in msg and "q [8, 2, 4]" in msg, msg


def dense_case(rank, ranks, check_shapes=True):
    """Worker: a correct degree-3 call (fp64) against dense attention; returns the max error."""
    cu = [0, 12, 24]
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(24, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    ref = dense_attention(q, k, v, cu, causal=True)
    d, cp = len(ranks), ranks.index(rank)
    ql, cul = zigzag_shard(q, cu, d, cp)
    kl, vl = zigzag_shard(k, cu, d, cp)[0], zigzag_shard(v, cu, d, cp)[0]
    out = ring_attention(ql, kl, vl, cul, ranks=ranks, timeout=20, check_shapes=check_shapes)
    return (out - zigzag_shard(ref, cu, d, cp)[0]).abs().max().item()


def test_pool_is_clean_after_a_mismatch(pool3):
    """After a mismatch no K/V block is in flight: the same workers run a correct ring to 1e-9."""
    pool3.run(mismatch_case, [0, 1, 2], 2, "heads", timeout=60)
    errs = pool3.run(dense_case, [0, 1, 2], timeout=60)
    assert max(errs) <= 1e-9, errs
    errs = pool3.run(dense_case, [2, 0, 1], False, timeout=60)  # check_shapes=False on every rank: no header
    assert max(errs) <= 1e-9, errs


def test_ring_order_disagreement_is_caught(pool3):
    """Ranks 0 and 1 disagree on the ring order ((0, 1) vs (1, 0)): same neighbours, but both would take
    cp_rank 0 and silently compute the wrong chunks. The ranks checksum makes both raise ValueError."""
    out = pool3.run(ring_order_case, timeout=60)
    assert out[2] is None
    for rank in (0, 1):
        kind, msg = out[rank]
        assert kind == "ValueError" and "ranks (ring order)" in msg and f"peer rank {1 - rank}" in msg, msg


def ring_order_case(rank):
    if rank == 2:
        return None
    q = torch.randn(8, 2, 4, dtype=torch.float64)
    try:
        ring_attention(q, q, q, [0, 8], ranks=[0, 1] if rank == 0 else [1, 0], timeout=20)
    except (ValueError, RuntimeError) as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def test_a_group_without_this_process_is_refused_without_a_process_group():
    """No process group: a world of one, this process rank 0. ``ranks=[1]`` ran as if this process were rank 1 (found
    by a review of the executor); with a process group the same mistake was refused already."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    q = torch.randn(8, 2, 4, dtype=torch.float64)
    cu = torch.tensor([0, 8])
    with pytest.raises(ValueError, match=r"this process is rank 0, which is not in its CP group ranks=\[1\]"):
        ring_attention(q, q, q, cu, ranks=[1])
    assert ring_attention(q, q, q, cu, ranks=[0]).shape == q.shape
