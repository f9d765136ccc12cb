"""Python API misuse found in review: FCPSampler / FCPCollator / ring_attention / zigzag_shard must answer a
wrong argument with a ValueError or TypeError that says how to fix it, at construction or call time, not an
AttributeError/KeyError deep inside, a silently empty epoch, or a failure later on the planning thread.

A failure means a user gets a confusing error (or none) for that mistake.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcp_data import CostModel, FCPCollator, FCPSampler

CM = CostModel.preset("qwen3-8b", "h100")
L = np.array([100, 200, 300, 400] * 8)


def _sampler(**kw):
    args = dict(num_ranks=4, rank=0, cost_model=CM, global_batch_size=8)
    args.update(kw)
    return FCPSampler(L, **args)


@pytest.mark.parametrize("kw,match", [
    ({"solver": "nope"}, "unknown solver 'nope'; valid: fcp"),
    ({"solver": "ilp"}, "time-limited, so ranks could compute different plans"),
    ({"seed": "a"}, "seed must be an integer"),
    ({"global_batch_size": True}, "global_batch_size must be a positive integer"),
    # numpy int64 overflowed deep inside the epoch layout (OverflowError) on these
    ({"global_batch_size": 10**20}, r"global_batch_size=10+ is beyond any real run"),
    ({"global_batch_size": None, "global_batch_tokens": 10**20}, r"global_batch_tokens=10+ is beyond any real run"),
    ({"prefetch": 10**20}, "prefetch must be an integer from 0 to"),
    ({"micro_batches": 10**20}, "micro_batches must be 'auto' or an int from 1 to"),
    # found by fuzzing the API: num_ranks=10**20 overflowed (OverflowError); 1.5 / '2' / True were int()-ed to
    # 1 / 2 / 1 silently; seed=-1 gave numpy's bare "expected non-negative integer"; prefetch=None a bare int() error;
    # robust_tol=-1 or NaN switched the robust mode off without a word
    ({"num_ranks": 10**20}, r"num_ranks=10+ is more than the planner supports \(4096\)"),
    ({"num_ranks": 1.5}, "num_ranks must be an integer, got float 1.5"),
    ({"num_ranks": "2"}, "num_ranks must be an integer, got str"),
    ({"num_ranks": True}, "num_ranks must be an integer, got True"),
    ({"rank": 1.5}, "rank must be an integer, got float 1.5"),
    ({"seed": -1}, r"seed must be an integer >= 0"),
    ({"prefetch": None}, "prefetch must be an integer from 0 to"),
    ({"solver_options": {"robust_tol": -1}}, "robust_tol must be a finite number >= 0"),
    ({"solver_options": {"robust_tol": float("nan")}}, "robust_tol must be a finite number >= 0"),
    ({"solver_options": {"search": "no"}}, "search must be True or False"),
    ({"etas": ["a"] * 32}, "etas must be numbers, one η per sequence"),
    ({"global_batch_size": 100, "drop_last": True}, "every epoch would be empty"),
    ({"global_batch_size": None, "global_batch_tokens": 10**9, "drop_last": True}, "every epoch would be empty"),
])
def test_sampler_rejects_at_construction(kw, match):
    """These were accepted: a bad solver failed only on the planning thread, drop_last with a batch larger than
    the data gave an empty epoch (a training loop that silently does nothing)."""
    with pytest.raises(ValueError, match=match):
        _sampler(**kw)


def test_sampler_takes_numpy_and_torch_integer_ranks():
    """Integers computed with numpy or torch (``dist.get_world_size()`` as a tensor) are ints; the lists equal those
    of a sampler built with plain ints."""
    ref = [list(x) for x in _sampler()]
    assert [list(x) for x in _sampler(num_ranks=np.int64(4), rank=torch.tensor(0))] == ref


def test_collator_wrong_item_types():
    """Items that are not (sample, SampleSlot) pairs gave AttributeError/KeyError; empty input_ids was reported
    as a float dtype problem."""
    col = FCPCollator(pad_token_id=0)
    slot = next(s for lst in _sampler() for s in lst)
    for bad in (5, [(1, 2, 3)], [({"input_ids": [1, 2]}, "slot")], [{"input_ids": [1, 2]}]):
        with pytest.raises(TypeError, match=r"\(sample, SampleSlot\).*FCPDataset"):
            col(bad)
    with pytest.raises(ValueError, match="input_ids is empty"):
        col([({"input_ids": []}, slot)])
    with pytest.raises(ValueError, match=r"keys \['text'\]"):
        col([({"text": "x"}, slot)])
    out = col([({"input_ids": torch.arange(slot.length)}, slot)])  # the right shape still works
    assert int(out["input_ids"].numel()) > 0


def test_zigzag_shard_bad_cu_seqlens_and_numpy_degree():
    """A fractional cu_seqlens entry (4.5) was truncated by int() and sharded silently wrong; None / a string
    gave a bare TypeError; a numpy integer degree (common when computed with numpy) was refused."""
    from fcp_exec import zigzag_shard

    x = torch.arange(12)
    for cu in ([0, 4.5, 12], np.array([0.0, 4.5, 12.0]), None, "0,12", [0, "4", 12]):
        with pytest.raises(ValueError, match="cu_seqlens must be a 1-D sequence of integer"):
            zigzag_shard(x, cu, 2, 1)
    ref = zigzag_shard(x, [0, 4, 12], 2, 1)[0]
    for cu in ([0, 4.0, 12], np.array([0, 4, 12])):
        assert torch.equal(zigzag_shard(x, cu, np.int64(2), np.int64(1))[0], ref)
    assert ref.tolist() == [1, 2, 6, 7, 8, 9]  # chunks 1 and 2 of [0..3], chunks 1 and 2 of [4..11]


def test_ring_attention_rejects_integer_and_mixed_device_inputs():
    """Integer q/k/v reached the kernel and failed with an aten RuntimeError."""
    from fcp_exec import ring_attention

    q = torch.randn(8, 4, 16)
    with pytest.raises(ValueError, match="floating point"):
        ring_attention(q.long(), q.long(), q.long(), [0, 8], ranks=[0])
    with pytest.raises(ValueError, match="dtypes differ"):
        ring_attention(q, q.double(), q, [0, 8], ranks=[0])


def test_indexed_dataset_bounds_open_shard_handles(tmp_path):
    """IndexedDataset kept one open file per shard ever read and never closed them: random access over
    thousands of shards ran out of file descriptors. Now at most max_open_files stay open (LRU), reads are
    unchanged, and close() releases them."""
    from fcp_data._resources import data_path
    from fcp_data.index import build_index
    from fcp_data.readers import IndexedDataset

    shards = str(data_path("samples") / "wds" / "shard-{000000..000003}.tar")
    build_index([shards], "text", tmp_path / "ix", progress=False)
    ref = IndexedDataset(tmp_path / "ix", max_open_files=64)
    small = IndexedDataset(tmp_path / "ix", max_open_files=2)
    order = np.random.default_rng(0).permutation(len(ref))
    handles = []
    for i in order:
        assert torch.equal(small[i]["input_ids"], ref[i]["input_ids"])
        assert len(small._files) <= 2
        handles += list(small._files.values())
    assert len(set(small.index.shard.tolist())) == 4 and len(ref._files) == 4
    small.close()
    assert all(f.closed for f in handles) and not small._files
    with pytest.raises(ValueError, match="max_open_files"):
        IndexedDataset(tmp_path / "ix", max_open_files=0)


def test_collator_constructor_types():
    """pad_token_id='x' failed with int()'s bare 'invalid literal' message."""
    for kw in ({"pad_token_id": "x"}, {"pad_token_id": None}, {"ignore_index": 1.5}):
        with pytest.raises(TypeError, match="must be an int token id"):
            FCPCollator(**kw)
    assert FCPCollator(pad_token_id=np.int64(3)).pad_token_id == 3


def test_float16_lengths_plan_without_an_overflow_warning():
    """float16 lengths (whole values) plan like ints; the range check cast the 2**31−1 limit to float16 and numpy
    warned 'overflow encountered in cast' on every call."""
    import warnings

    from fcp_data import plan_batch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        half = plan_batch(np.array([100, 200, 300], dtype=np.float16), num_ranks=2, cost_model=CM)
    assert half.to_dict()["micro_batches"] == plan_batch([100, 200, 300], num_ranks=2, cost_model=CM).to_dict()["micro_batches"]
