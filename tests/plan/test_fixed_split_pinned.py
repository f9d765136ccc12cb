"""Behaviour a mutation review (stop 60) found unpinned in fcp_data/plan/fixed_split.py."""
from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch
from fcp_data.plan.fixed_split import fallback_splits
from fcp_data.plan.microbatch import split_micro_batches

CM = CostModel(alpha1=1e-9, alpha2=1e-6, alpha3=1e3, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
               bandwidth_inter=1e10, ranks_per_node=1, tokens_per_rank=10)


def test_fixed_count_uses_the_exhaustive_split_when_only_an_exact_fit_exists():
    """[5, 4, 3, 2, 2, 2, 2] into 2 micro-batches of 1 rank × 10 tokens: the work-balanced LPT split, token-balanced
    and first-fit decreasing all fail; only the exact fits 5+3+2 | 4+2+2+2 exist (found by brute force), so the
    exhaustive fallback must find them (mutant: ``load + s < cap`` in the exhaustive enumeration survived)."""
    L = np.array([5, 4, 3, 2, 2, 2, 2])
    assert split_micro_batches(L, np.zeros(7), 1, CM, 2) is None  # the premise: LPT fails
    plan = plan_batch(L, num_ranks=1, cost_model=CM, micro_batches=2)
    sums = sorted(int(L[list(mb.seq_ids)].sum()) for mb in plan.micro_batches)
    assert sums == [10, 10]
    assert sorted(plan.seq_ids) == list(range(7))


def test_first_fit_split_refills_an_empty_micro_batch_from_the_fullest():
    """First-fit decreasing of [6, 3, 5, 4] into 3 micro-batches of 10 leaves one empty (6+4 | 5+3 | -); the module
    docstring: the smallest sequence of the *fullest* multi-sequence micro-batch moves there: 6 | 5+3 | 4 (mutant:
    taking it from the emptiest survived the suite)."""
    splits = {}
    for method, split in fallback_splits(np.array([6, 3, 5, 4]), 3, 10.0):
        splits.setdefault(method, [s.tolist() for s in split])
    assert splits["first-fit decreasing"] == [[0], [1, 2], [3]]


def test_token_balanced_split_puts_each_sequence_where_most_room_is():
    """"token-balanced": heaviest first into the micro-batch with the most token room (module docstring):
    [6, 3, 5, 4] into 3 x 10 gives 6 | 5 | 4+3 (mutant: least room that fits survived the suite)."""
    splits = {}
    for method, split in fallback_splits(np.array([6, 3, 5, 4]), 3, 10.0):
        splits.setdefault(method, [s.tolist() for s in split])
    assert splits["token-balanced"] == [[0], [2], [1, 3]]
