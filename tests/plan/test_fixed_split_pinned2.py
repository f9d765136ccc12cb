"""Mutation review (fixed_split.py), second pass: behaviour the suite left unpinned. References: brute force over
all labelings, and the module docstring's rules."""
from __future__ import annotations

import itertools

import numpy as np

from fcp_data.plan.fixed_split import (EXACT_MAX_SEQUENCES, EXACT_MAX_SPLITS, FALLBACK_METHODS, fallback_methods,
                                       fallback_splits)

# 12 sequences, 2 micro-batches of 23 tokens (Σ = 46): token-balanced and first-fit decreasing both fail, exact fits exist
HARD12 = np.array([8, 2, 2, 3, 2, 6, 4, 8, 3, 3, 3, 2])


def _brute_two_way(L, cap):
    """Unordered 2-way splits (both parts non-empty) with both parts ≤ cap: sequence 0 always in part 0."""
    out = set()
    n = L.size
    for bits in itertools.product((0, 1), repeat=n - 1):
        lab = np.array((0,) + bits)
        if lab.all() or not lab.any():
            continue
        if L[lab == 0].sum() <= cap and L[lab == 1].sum() <= cap:
            out.add(tuple(lab.tolist()))
    return out


def _check(split, L, M, cap):
    assert len(split) == M and all(len(s) for s in split)
    assert sorted(np.concatenate(split).tolist()) == list(range(L.size))
    assert all(L[s].sum() <= cap for s in split)


def test_empty_micro_batch_is_refilled_from_a_multi_sequence_one():
    """[9, 3, 3] into 3 micro-batches of 10: first-fit decreasing gives 9 | 3+3 | - ; the refill must take from the
    fullest micro-batch *holding more than one sequence* (9 alone is fuller but moving it empties it again). Every
    split handed out is into exactly 3 non-empty micro-batches within memory."""
    L = np.array([9, 3, 3])
    got = list(fallback_splits(L, 3, 10.0))
    assert got
    for _, split in got:
        _check(split, L, 3, 10.0)
    # "distinct": first-fit's refilled 9 | 3 | 3 is token-balanced's split with two micro-batches swapped
    parts = [frozenset(frozenset(s.tolist()) for s in split) for _, split in got]
    assert len(parts) == len(set(parts))


def test_exhaustive_fallback_runs_at_exactly_the_documented_size_and_hands_the_first_64():
    """At n = EXACT_MAX_SEQUENCES (12) the exhaustive split is tried (``at most 12 sequences``) and named by
    fallback_methods; it hands out exactly EXACT_MAX_SPLITS distinct feasible splits when more exist (brute force:
    100). At n = 13 it is neither tried nor named."""
    assert HARD12.size == EXACT_MAX_SEQUENCES
    cap = 23.0
    feasible = _brute_two_way(HARD12, cap)
    assert len(feasible) > EXACT_MAX_SPLITS
    got = list(fallback_splits(HARD12, 2, cap))
    assert [m for m, _ in got] == [FALLBACK_METHODS[2]] * EXACT_MAX_SPLITS  # both greedy splits fail here
    seen = set()
    for _, split in got:
        _check(split, HARD12, 2, cap)
        lab = np.empty(HARD12.size, dtype=np.int64)
        for j, s in enumerate(split):
            lab[s] = j
        key = tuple((lab != lab[0]).astype(int).tolist())
        assert key in feasible and key not in seen
        seen.add(key)
    assert fallback_methods(EXACT_MAX_SEQUENCES) == list(FALLBACK_METHODS)
    assert fallback_methods(EXACT_MAX_SEQUENCES + 1) == list(FALLBACK_METHODS[:2])
    L13 = np.concatenate((HARD12, [1]))
    assert all(m != FALLBACK_METHODS[2] for m, _ in fallback_splits(L13, 2, 23.5))
