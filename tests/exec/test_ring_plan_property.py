"""The ring's block plan (``fcp_exec.ring_attention._Plan.block``, pure) covers exactly the attention of the
unsharded documents: for every CP rank, the (query, key) pairs of all ring steps — mapped back to global
positions through the zigzag layout — are exactly the pairs of the mask (same document, and key ≤ query when
causal), each once. Property test over degrees, document lengths (empty ones included) and both masks, in one
process (the ring steps are simulated by taking step ``s``'s keys from rank ``(r − s) mod d``, which is what
the executor's ring delivers). A failure means some rank computes a block twice, misses one, or attends across
a document boundary or into the future."""

from __future__ import annotations

from collections import Counter

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.layout import zigzag_index
from fcp_exec.ring_attention import _Plan


def _segments(rows: list[int], cu: list[int]):
    """Per document: the selected rows of that document (``rows`` are local row ids, ``cu`` their boundaries)."""
    return [rows[a:b] for a, b in zip(cu[:-1], cu[1:])]


def _block_pairs(plan: _Plan, step: int, q_global: torch.Tensor, k_global: torch.Tensor) -> list[tuple[int, int]]:
    q_rows, k_rows, cu_q, cu_k, causal, max_q, max_k = plan.block(step)
    q_sel = list(range(q_global.numel())) if q_rows is None else q_rows.tolist()
    k_sel = list(range(k_global.numel())) if k_rows is None else k_rows.tolist()
    assert cu_q[-1] == len(q_sel) and cu_k[-1] == len(k_sel), "block boundaries do not cover the selected rows"
    qs, ks = _segments(q_sel, cu_q), _segments(k_sel, cu_k)
    assert max_q >= max((len(s) for s in qs), default=0) and max_k >= max((len(s) for s in ks), default=0)
    pairs = []
    for q_seg, k_seg in zip(qs, ks):
        for i, qi in enumerate(q_seg):
            for j, kj in enumerate(k_seg):
                if not causal or j <= i:  # flash-attention's causal mask on equal-length segments
                    pairs.append((int(q_global[qi]), int(k_global[kj])))
    return pairs


@settings(max_examples=120, deadline=None)
@given(degree=st.integers(1, 6), chunks=st.lists(st.integers(0, 3), min_size=1, max_size=5), causal=st.booleans())
def test_block_plan_covers_the_mask_exactly_once(degree, chunks, causal):
    cu_global = [0]
    for c in chunks:
        cu_global.append(cu_global[-1] + 2 * degree * c)
    doc_of = {}
    for d, (a, b) in enumerate(zip(cu_global[:-1], cu_global[1:])):
        doc_of.update({p: d for p in range(a, b)})
    cu_local = [c // degree for c in cu_global]
    owned = [zigzag_index(cu_global, degree, r) for r in range(degree)]
    for r in range(degree):
        plan = _Plan(cu_local, degree, r, causal, torch.device("cpu"))
        got = Counter()
        for step in range(degree):
            got.update(_block_pairs(plan, step, owned[r], owned[(r - step) % degree]))
        want = Counter((q, k) for q in owned[r].tolist() for k in range(cu_global[-1])
                       if doc_of[k] == doc_of[q] and (not causal or k <= q))
        assert got == want, f"rank {r} of {degree}, docs {chunks}, causal={causal}: " \
                            f"{sum((got - want).values())} extra, {sum((want - got).values())} missing pairs"
