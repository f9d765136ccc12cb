"""Sliding windows on a fused banded kernel at ring degree > 1 (``fcp_exec.kernels.window_band``).

1. ``band_calls`` exactly (and ``band_groups``: each varlen call one band, disjoint query rows, every pair once): for every degree 2–4, CP rank, ring step, chunk size and window (exhaustive over small
   ones), the calls' bands — expanded with flash-attn's documented rule (``_flash_attn_reference.visible``) — cover
   every (query row, key row) pair of the block that the window rule ``0 <= pos_q − pos_k < W`` allows exactly once,
   and no other pair; every row of a call sees at least one key (a flash call never has an empty row). Reference:
   the rows' positions from ``ring_attention._Plan.positions`` (the masked path's own, tested against dense
   attention in ``test_ring_attention.py``).
2. End to end on real gloo processes: ``ring_attention(..., window=W)`` with ``CudaKernel`` calling the flash-attn
   stand-in of documented semantics (``_flash_reference.py``; so every block goes through ``band_forward`` /
   ``band_backward``) at degrees 2, 3 and 4 against dense float64 windowed attention: out, dq, dk, dv within 2e-6
   (the stand-in's log-sum-exp is float32, as flash-attn's).
3. Logit soft-capping on the same stand-in (flash-attn's ``softcap``): ``ring_attention(..., softcap=c)`` sends every
   block to the kernel with the cap (degrees 1–4; at degree 1 with a sliding window too) — the stand-in records each
   call's ``softcap`` — and equals dense float64 capped attention within 2e-6.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import _flash_reference as FR
from fcp_exec.kernels import CudaKernel
from fcp_exec.kernels.window_band import band_calls, band_groups, block_runs
from fcp_exec.launch import WorkerPool
from fcp_exec.ring_attention import _Plan


def _expand(calls, nq: int, nk: int) -> torch.Tensor:
    """How many calls cover each (query row, key row) pair of the block."""
    cover = torch.zeros(nq, nk, dtype=torch.long)
    for qa, sq, ka, sk, left, right in calls:
        m = FR.visible(sq, sk, False, left, right)
        assert m.any(1).all(), f"a call with a row that sees no key: {(qa, sq, ka, sk, left, right)}"
        cover[qa:qa + sq, ka:ka + sk] += m.long()
    return cover


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_band_calls_cover_the_window_exactly(degree):
    checked = 0
    for chunk_lens in ([1], [3], [2, 5], [4, 1, 3]):
        cu = [0]
        for h in chunk_lens:
            cu.append(cu[-1] + 2 * h)
        for cp_rank, step in itertools.product(range(degree), range(degree)):
            plan = _Plan(cu, degree, cp_rank, True, "cpu")
            pos_q, pos_k = plan.positions(step)
            q_rows, k_rows, cu_q, cu_k = plan.block(step)[:4]
            doc_q = torch.repeat_interleave(torch.arange(len(cu_q) - 1), torch.tensor(cu_q).diff())
            doc_k = torch.repeat_interleave(torch.arange(len(cu_k) - 1), torch.tensor(cu_k).diff())
            runs = block_runs(cu, degree, cp_rank, step)
            for window in (1, 2, 3, 5, 8, 13, 100):
                diff = pos_q[:, None] - pos_k[None, :]
                want = (doc_q[:, None] == doc_k[None, :]) & (diff >= 0) & (diff < window)
                got = _expand(band_calls(runs, window), len(pos_q), len(pos_k))
                assert torch.equal(got, want.long()), (chunk_lens, cp_rank, step, window)
                checked += 1
    assert checked == 4 * degree * degree * 7


def test_band_groups_gather_pairs_into_few_calls():
    """Pairs with one band and disjoint query rows share a varlen call: the groups hold every pair exactly once, one
    band each, no query row twice; a block of 12 equal documents needs a handful of calls, not one per pair."""
    for degree, cp_rank, step in itertools.product((2, 3), range(3), range(3)):
        if cp_rank >= degree or step >= degree:
            continue
        cu = [0]
        for h in [40] * 12 + [3, 9]:
            cu.append(cu[-1] + 2 * h)
        calls = band_calls(block_runs(cu, degree, cp_rank, step), 16)
        groups = band_groups(calls)
        pairs = sorted((g.q_rows[a], ga - a, g.k_rows[k], gk - k, *g.band) for g in groups
                       for a, ga, k, gk in zip(g.cu_q[:-1], g.cu_q[1:], g.cu_k[:-1], g.cu_k[1:]))
        assert pairs == sorted(calls)  # every pair once, in a group of its own band
        for g in groups:
            assert len(set(g.q_rows)) == len(g.q_rows), "a query row twice in one call"
        bands = {(c[4], c[5]) for c in calls}
        assert len(groups) <= 2 * len(bands)
        if len(calls) >= 12:
            assert 3 * len(groups) <= len(calls), (len(groups), len(calls))


def _stand_in_kernel():
    return CudaKernel(flash_attn_module=FR.module())


@pytest.fixture(scope="module")
def pool4():
    with WorkerPool(4, backend="gloo", pg_timeout=60) as pool:
        yield pool


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_ring_with_a_fused_band_kernel_matches_dense(pool4, degree):
    import test_ring_attention as T

    groups = [tuple(range(degree))] + [(r,) for r in range(degree, 4)]
    lengths = [[[2 * degree * 3, 0, 2 * degree * 7, 2 * degree] if len(g) > 1 else [6, 10] for g in groups]]
    for k, window in enumerate((1, 4, 9, 30)):
        reports = pool4.run(T.ring_case, [groups], lengths, (4, 2, 8), "float64", True, 500 + 10 * degree + k,
                            _stand_in_kernel, window)
        for rep in (r for per_rank in reports for r in per_rank):
            assert max(rep[n] for n in ("out", "dq", "dk", "dv")) <= 2e-6, (window, rep)


_CALLS: list = []  # the stand-in's calls in this process (a worker's own)


def _capping_kernel():
    return CudaKernel(flash_attn_module=FR.module(_CALLS))


def capped_case(rank, *args):
    """``test_ring_attention.ring_case`` on the recording stand-in; also the set of ``softcap`` values it was called
    with on this rank."""
    import test_ring_attention as T

    _CALLS.clear()
    report = T.ring_case(rank, *args)
    return report, sorted({c.get("softcap") for c in _CALLS})


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_softcapping_runs_in_a_kernel_that_caps_and_matches_dense(pool4, degree):
    """Every block of a capped ring goes to flash-attn's ``softcap`` (no call without it), fwd and bwd; the result
    equals dense fp64 attention with the cap within 2e-6. Degree 1 also with a 9-token window (flash's band)."""
    groups = [tuple(range(degree))] + [(r,) for r in range(degree, 4)]
    lengths = [[[2 * degree * 3, 0, 2 * degree * 7, 2 * degree] if len(g) > 1 else [6, 10] for g in groups]]
    for k, window in enumerate((None, 9) if degree == 1 else (None,)):
        out = pool4.run(capped_case, [groups], lengths, (4, 2, 8), "float64", True, 700 + 10 * degree + k,
                        _capping_kernel, window, False, 1.5)
        for report, caps in out:
            assert caps == [1.5], caps  # every call capped: none went the masked way, none uncapped
            for rep in report:
                assert max(rep[n] for n in ("out", "dq", "dk", "dv")) <= 2e-6, (window, rep)
