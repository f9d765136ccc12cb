"""Exhaustive reference for tiny micro-batches (≤ 7 sequences, DESIGN §5).

Enumerates every set partition of the sequences (restricted-growth strings; Bell(7) = 877) and gives
each partition its exact optimal degrees with :func:`~fcp_data.plan.allocate.allocate_fast` (degree any
integer, memory enforced, intra-node time for groups of at most one node). The best partition is placed
on real ranks. On one node that is the exact optimum of the §4/§4.1 model (``visual``: visual tokens per
sequence); the plan is marked ``optimal``
when the placed makespan equals that bound (always on one node).
"""

from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.allocate import allocate_fast, time_table
from fcp_data.plan.inputs import check_count_option
from fcp_data.plan.placement import build_micro_batch
from fcp_data.plan.types import MicroBatchPlan

__all__ = ["set_partitions", "partition_labels", "partition_count", "solve_exhaustive", "MAX_EXHAUSTIVE"]

MAX_EXHAUSTIVE = 7


def set_partitions(n: int, max_blocks: int | None = None):
    """Yield every partition of ``range(n)`` as a label array (restricted growth: label[0] = 0,
    label[i] ≤ 1 + max(label[:i])), in lexicographic order; at most ``max_blocks`` blocks."""
    limit = n if max_blocks is None else max_blocks
    labels = [0] * n

    def rec(i: int, used: int):
        if i == n:
            yield np.array(labels, dtype=np.int64), used
            return
        for b in range(min(used + 1, limit)):
            labels[i] = b
            yield from rec(i + 1, max(used, b + 1))

    if n == 0:
        return
    yield from rec(1, 1)


def partition_count(n: int, max_blocks: int) -> int:
    """Partitions of ``n`` items into at most ``max_blocks`` blocks (Σ_k Stirling numbers of the second kind)."""
    row = [1] + [0] * max_blocks  # S(i, k) for k = 0 … max_blocks, i = 0
    for i in range(1, n + 1):
        row = [0] + [k * row[k] + row[k - 1] for k in range(1, max_blocks + 1)]
    return sum(row)


def partition_labels(n: int, max_blocks: int) -> np.ndarray:
    """Every partition of ``range(n)`` (``n ≥ 1``) into at most ``max_blocks`` blocks as rows of restricted-growth
    labels, the order of :func:`set_partitions` (built a column at a time with numpy; ``partition_count`` rows)."""
    labels, used = np.zeros((1, 1), dtype=np.int64), np.ones(1, dtype=np.int64)
    for _ in range(1, n):
        k = np.minimum(used + 1, max_blocks)  # choices of the next item: an existing block or a new one
        parent = np.repeat(np.arange(labels.shape[0]), k)
        choice = np.arange(parent.size) - np.repeat(np.cumsum(k) - k, k)
        labels = np.concatenate([labels[parent], choice[:, None]], axis=1)
        used = np.maximum(used[parent], choice + 1)
    return labels


def solve_exhaustive(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                     *, max_sequences: int = MAX_EXHAUSTIVE, visual: np.ndarray | None = None,
                     **_: object) -> tuple[MicroBatchPlan, bool]:
    """Best partition × degrees by enumeration; ``(plan, optimal)``. ``max_sequences``: an int from 1 to
    :data:`MAX_EXHAUSTIVE` (Bell(n) partitions: 8 sequences are ~5x the work of 7, 11 take minutes)."""
    max_sequences = check_count_option("max_sequences", max_sequences, MAX_EXHAUSTIVE,
                                       " (the exhaustive solver enumerates every partition; use the ILP for more)")
    n = int(lengths.size)
    if n > max_sequences:
        raise ValueError(f"the exhaustive solver handles at most {max_sequences} sequences per micro-batch, got {n}; "
                         "use the ILP (--ilp) for larger cases")
    s, q, b, v = sequence_terms(lengths, etas, visual)
    best_val, best_labels, best_deg = np.inf, None, None
    for labels, k in set_partitions(n, num_ranks):
        S = np.bincount(labels, weights=s, minlength=k)
        Q = np.bincount(labels, weights=q, minlength=k)
        B = np.bincount(labels, weights=b, minlength=k)
        V = np.bincount(labels, weights=v, minlength=k)
        val, deg = allocate_fast(time_table(S, Q, num_ranks, cost_model, B=B, V=V), num_ranks)
        if deg is not None and val < best_val:
            best_val, best_labels, best_deg = val, labels.copy(), deg
    if best_labels is None:
        raise ValueError(f"no feasible plan for {n} sequences on {num_ranks} ranks at tokens_per_rank="
                         f"{cost_model.tokens_per_rank}")
    k = int(best_labels.max()) + 1
    groups = [[int(i) for i in np.flatnonzero(best_labels == b)] for b in range(k)]
    S = np.bincount(best_labels, weights=s, minlength=k)
    Q = np.bincount(best_labels, weights=q, minlength=k)
    B = np.bincount(best_labels, weights=b, minlength=k)
    V = np.bincount(best_labels, weights=v, minlength=k)
    mb = build_micro_batch(groups, best_deg, S, Q, num_ranks, cost_model, B=B, V=V)
    return mb, bool(mb.makespan <= best_val * (1 + 1e-12))
