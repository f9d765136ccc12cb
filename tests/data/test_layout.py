"""Zigzag layout helpers, checked for every rank of every degree in one process."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from fcp_exec import zigzag_index, zigzag_shard, zigzag_unshard
from fcp_data.layout import check_cu_seqlens, zigzag_chunk_ids


def _random_cu(rng: random.Random, degree: int, num_docs: int, max_chunk: int = 5) -> torch.Tensor:
    lengths = [2 * degree * rng.randint(0, max_chunk) for _ in range(num_docs)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32)


@pytest.mark.parametrize("degree", range(1, 9))
def test_round_trip_every_rank(degree):
    """shard then unshard is the identity for random packed documents (including empty ones).

    A failure means some token is lost, duplicated or put back in the wrong place."""
    rng = random.Random(degree)
    for trial in range(20):
        cu = _random_cu(rng, degree, rng.randint(1, 6))
        total = int(cu[-1])
        x = torch.randn(total, 3, dtype=torch.float64)
        shards, locals_cu = [], []
        for r in range(degree):
            xl, cul = zigzag_shard(x, cu, degree, r)
            assert xl.shape == (total // degree, 3)
            shards.append(xl)
            locals_cu.append(cul)
        for cul in locals_cu:
            assert cul.dtype == torch.int32
            assert torch.equal(cul, cu // degree)
        assert torch.equal(zigzag_unshard(shards, cu, degree), x)


@pytest.mark.parametrize("degree", range(1, 9))
def test_index_is_a_partition_with_zigzag_chunks(degree):
    """The per-rank indices partition [0, T); rank r holds exactly chunks r and 2d-1-r of every doc,
    in document order. Checked against a direct per-token chunk computation."""
    rng = random.Random(100 + degree)
    cu = _random_cu(rng, degree, 5)
    cu_list = cu.tolist()
    total = cu_list[-1]
    seen = torch.zeros(total, dtype=torch.long)
    for r in range(degree):
        idx = zigzag_index(cu, degree, r)
        assert idx.dtype == torch.long
        seen[idx] += 1
        expected = []
        for s, e in zip(cu_list[:-1], cu_list[1:]):
            c = (e - s) // (2 * degree)
            for chunk in zigzag_chunk_ids(degree, r):
                expected.extend(range(s + chunk * c, s + (chunk + 1) * c))
        assert idx.tolist() == expected
    assert torch.all(seen == 1)


def test_known_small_example():
    """degree 2, one doc of 8 tokens: rank 0 keeps chunks 0,3 and rank 1 chunks 1,2 (hand-derived)."""
    cu = [0, 8, 12]
    assert zigzag_index(cu, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert zigzag_index(cu, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    x = torch.arange(12)
    xl, cul = zigzag_shard(x, cu, 2, 1)
    assert xl.tolist() == [2, 3, 4, 5, 9, 10]
    assert cul.tolist() == [0, 4, 6]


def test_trailing_dims_and_integer_dtypes():
    """Works on [T, ...] of integer dtype (input_ids/labels) and keeps the trailing shape."""
    cu = torch.tensor([0, 12, 24], dtype=torch.int64)
    x = torch.arange(24 * 2 * 2).reshape(24, 2, 2)
    shards = [zigzag_shard(x, cu, 3, r)[0] for r in range(3)]
    assert all(s.shape == (8, 2, 2) for s in shards)
    assert zigzag_shard(x, cu, 3, 0)[1].dtype == torch.int64
    assert torch.equal(zigzag_unshard(shards, cu, 3), x)


def test_errors_name_the_document():
    """Bad inputs raise ValueError with a message that says which document and how to fix it."""
    x = torch.zeros(14)
    with pytest.raises(ValueError, match=r"document 1 .* length 6, not divisible by 2\*degree=4"):
        zigzag_shard(x, [0, 8, 14], 2, 0)
    with pytest.raises(ValueError, match="ends at 12 but the tensor has 14"):
        zigzag_shard(x, [0, 8, 12], 2, 0)
    with pytest.raises(ValueError, match="cp_rank"):
        zigzag_index([0, 8], 2, 2)
    with pytest.raises(ValueError, match="degree"):
        zigzag_index([0, 8], 0, 0)
    with pytest.raises(ValueError, match="start with 0"):
        check_cu_seqlens([1, 8])
    with pytest.raises(ValueError, match="decreases"):
        check_cu_seqlens([0, 8, 4])
    with pytest.raises(ValueError, match="expected 2 shards"):
        zigzag_unshard([torch.zeros(4)], [0, 8], 2)


@settings(max_examples=60, deadline=None)
@given(degree=st.integers(1, 8), chunks=st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_round_trip_property(degree, chunks):
    """Hypothesis: for any degree 1..8 and any document chunk counts, unshard(shard) is the
    identity, every rank gets T/degree tokens, and the local cu_seqlens is cu_seqlens // degree."""
    cu = [0]
    for c in chunks:
        cu.append(cu[-1] + 2 * degree * c)
    x = torch.arange(cu[-1] * 2).reshape(cu[-1], 2)
    shards = []
    for r in range(degree):
        xl, cul = zigzag_shard(x, cu, degree, r)
        assert xl.shape[0] == cu[-1] // degree and cul.tolist() == [c // degree for c in cu]
        shards.append(xl)
    assert torch.equal(zigzag_unshard(shards, cu, degree), x)
