"""Python API misuse found in review: FCPSampler / FCPCollator / ring_attention / zigzag_shard must answer a
wrong argument with a ValueError or TypeError that says how to fix it, at construction or call time, not an
AttributeError/KeyError deep inside, a silently empty epoch, or a failure later on the planning thread.

A failure means a user gets a confusing error (or none) for that mistake.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler

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
    # found by a fuzz of every argument: prefetch=inf was an OverflowError from int(); drop_last="no" was True
    ({"prefetch": float("inf")}, "prefetch must be an integer from 0 to"),
    ({"drop_last": "no"}, "drop_last must be True or False"),
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
    with pytest.raises(TypeError if "drop_last" in kw and "True or False" in match else ValueError, match=match):
        _sampler(**kw)


def test_micro_batches_no_global_batch_can_fit_are_refused_at_construction():
    """An int ``micro_batches`` too small for any global batch was accepted and failed at the first batch, on the
    planning thread (in a DataLoader worker, after the model was built). Now refused at construction when even the
    ``global_batch_size`` shortest samples exceed ``M·num_ranks·tokens_per_rank`` — a bound, so never a config that
    could plan: at the boundary (exactly full) it is accepted, and the refused batch does not plan either."""
    from fcp_data.plan import plan_batch

    tight = CM.replace(tokens_per_rank=100)  # 4 ranks: one micro-batch holds 400 tokens; the 8 shortest hold 800
    with pytest.raises(ValueError, match=r"micro_batches=1: even the 8 shortest samples hold 800 tokens.*"
                                         r"\(400\).*micro_batches='auto' or at least 2"):
        _sampler(cost_model=tight, micro_batches=1)
    with pytest.raises(ValueError, match="does not fit in 1 micro-batch"):  # the reference: the planner refuses too
        plan_batch([100] * 8, num_ranks=4, cost_model=tight, micro_batches=1)
    assert plan_batch([100] * 8, num_ranks=4, cost_model=tight, micro_batches=2).micro_batches
    _sampler(cost_model=tight, micro_batches=2)  # exactly full for the shortest batch: not refused
    _sampler(cost_model=tight, micro_batches="auto")


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


def test_ring_attention_argument_values():
    """Found by fuzzing: kernel=3 gave AttributeError, head dim 0 a ZeroDivisionError, softmax_scale NaN a NaN
    output and 'a' a bare float() error, causal='no' ran causal (a string is truthy), ranks left out a message
    saying "got None". Reference for the accepted call: the same call with the defaults spelled out."""
    from fcp_exec import ring_attention

    q = torch.randn(8, 2, 4)
    for kw, match in (({"kernel": 3}, "kernel must be an AttentionKernel or a kernel name, got int 3"),
                      ({"softmax_scale": float("nan")}, "softmax_scale must be a finite number > 0"),
                      ({"softmax_scale": "a"}, "softmax_scale must be a finite number > 0"),
                      ({"softmax_scale": 0.0}, "softmax_scale must be a finite number > 0"),
                      ({"causal": "no"}, "causal must be True or False, got 'no'")):
        with pytest.raises(ValueError, match=match):
            ring_attention(q, q, q, [0, 8], ranks=[0], **kw)
    with pytest.raises(ValueError, match="head dim must be >= 1"):
        z = torch.randn(8, 2, 0)
        ring_attention(z, z, z, [0, 8], ranks=[0])
    with pytest.raises(ValueError, match=r"ranks is required: this rank's CP group .*batch\['ranks'\]"):
        ring_attention(q, q, q, [0, 8])
    ref = ring_attention(q, q, q, [0, 8], ranks=[0], causal=True, softmax_scale=0.5, kernel="cpu")
    assert torch.equal(ring_attention(q, q, q, [0, 8], ranks=[0], softmax_scale=0.5), ref)


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


@pytest.mark.parametrize("kw, error, match", [
    # found by reading the fuzz's accepted cases: each was taken without a word and failed later, or meant otherwise
    # -1: an IndexError in the embedding; 2**70: an OverflowError filling a tensor
    ({"pad_token_id": -1}, ValueError, r"pad_token_id must be an int in \[0, 2\*\*63\)"),
    ({"pad_token_id": 2**70}, ValueError, "pad_token_id must be an int in"),
    ({"ignore_index": 2**70}, ValueError, r"ignore_index must be an int in \[-2\*\*63, 2\*\*63\)"),
    ({"visual_token_id": b"a"}, TypeError, "visual_token_id must be an int token id or a list"),  # was id 97
    ({"visual_token_id": ""}, TypeError, "visual_token_id must be an int token id or a list"),  # was no id
    ({"visual_token_id": {}}, TypeError, "visual_token_id must be an int token id or a list"),
    ({"visual_token_id": [5, -1]}, ValueError, "visual_token_id must be an int in"),
    ({"strict_lengths": "no"}, TypeError, "strict_lengths must be True or False"),  # bool("no") is True
    ({"mask_visual_labels": [], "visual_token_id": 5}, TypeError, "mask_visual_labels must be True or False"),
    ({"mrope": "yes", "visual_token_id": 5}, TypeError, "mrope must be True or False"),
    ({"sample_labels": 2}, TypeError, "sample_labels must be True or False"),
])
def test_collator_refuses_values_it_used_to_take(kw, error, match):
    with pytest.raises(error, match=match):
        FCPCollator(**kw)
    for ok in ({"strict_lengths": 0}, {"mrope": np.bool_(True), "visual_token_id": 5}, {"ignore_index": -100}):
        FCPCollator(**ok)  # numpy bools and 0/1 are flags; a negative ignore_index is the usual one


@pytest.mark.parametrize("base", [None, 1.5, "data.jsonl", b"x"])
def test_dataset_needs_a_map_style_base(base):
    """Found by reading the fuzz's accepted cases: FCPDataset(None) was taken and every read was recorded as a
    damaged sample (the data blamed for the caller's mistake); FCPDataset("data.jsonl") returned the path's
    characters as samples."""
    with pytest.raises(TypeError, match="base must be a map-style dataset"):
        FCPDataset(base)


def test_float16_lengths_plan_without_an_overflow_warning():
    """float16 lengths (whole values) plan like ints; the range check cast the 2**31−1 limit to float16 and numpy
    warned 'overflow encountered in cast' on every call."""
    import warnings

    from fcp_data import plan_batch

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        half = plan_batch(np.array([100, 200, 300], dtype=np.float16), num_ranks=2, cost_model=CM)
    assert half.to_dict()["micro_batches"] == plan_batch([100, 200, 300], num_ranks=2, cost_model=CM).to_dict()["micro_batches"]


def test_collator_refuses_what_it_would_drop_or_misread():
    """Found by fuzzing: input_ids None / a string / a ragged list gave torch's bare RuntimeError or TypeError;
    a sample's own ``labels`` (an SFT prompt mask) and a Hugging Face processor's ``image_grid_thw`` /
    ``video_grid_thw`` / ``pixel_values_videos`` were dropped in silence (the labels are derived from input_ids,
    the vision tower never saw the videos); the labels now need ``sample_labels=True`` (named in the error).
    Reference for the accepted cases: the batch of the plain sample."""
    col = FCPCollator(pad_token_id=0)
    slot = next(s for lst in _sampler() for s in lst)
    ids = torch.arange(slot.length)
    ref = col([({"input_ids": ids}, slot)])
    for bad in (None, "hello", [[1, 2], [3]]):
        with pytest.raises(ValueError, match=r"input_ids must be a 1-D integer tensor or list, got"):
            col([({"input_ids": bad}, slot)])
    masked = ids.clone()
    masked[:3] = -100
    with pytest.raises(ValueError, match=r"labels differ from its input_ids \(a prompt mask, as in SFT\?\).*"
                                         r"FCPCollator\(sample_labels=True\)"):
        col([({"input_ids": ids, "labels": masked}, slot)])
    same = col([({"input_ids": ids, "labels": ids.clone()}, slot)])  # the causal-LM convention: labels = input_ids
    assert all(torch.equal(same[k], ref[k]) for k in ("input_ids", "labels", "position_ids"))
    for key in ("image_grid_thw", "video_grid_thw", "pixel_values_videos"):
        with pytest.raises(ValueError, match=rf"has {key} \(a Hugging Face processor's output\)"):
            col([({"input_ids": ids, key: torch.ones(1, 3)}, slot)])
    for grid, match in (("x", "grid_thw must be n rows of"), ([[1, -2, 2]], "grid_thw entries must be >= 1")):
        with pytest.raises(ValueError, match=match):
            col([({"input_ids": ids, "grid_thw": grid}, slot)])


def test_collator_constructor_ids():
    """visual_token_id: one id or any iterable of ids (numpy / torch included), never a float, bool or string;
    spatial_merge_size: an int (the string '2' was accepted and used as 2 without a word)."""
    for v, want in ((5, (5,)), (np.int64(5), (5,)), (torch.tensor(5), (5,)), ([5, 6], (5, 6)),
                    (np.array([5, 6]), (5, 6)), (torch.tensor([5, 6]), (5, 6))):
        assert FCPCollator(visual_token_id=v).visual_ids == want
    for v in (1.5, ["a"], True, "ab"):
        with pytest.raises(TypeError, match="visual_token_id must be an int token id or a list of them"):
            FCPCollator(visual_token_id=v)
    with pytest.raises(ValueError, match="spatial_merge_size must be an int >= 1"):
        FCPCollator(spatial_merge_size="2")


def test_cost_model_preset_names_must_be_strings():
    """CostModel.preset(None, None) / (3, 4) gave AttributeError: 'NoneType' object has no attribute 'lower'."""
    for model, hw in ((None, "h100"), (3, "h100"), ("qwen3-8b", None)):
        with pytest.raises(ValueError, match=r"preset must be a name \(str\)"):
            CostModel.preset(model, hw)


@pytest.mark.parametrize("kw, match", [
    ({"tokenizer": ""}, "tokenizer must be None or the path"),  # ran with the bundled tokenizer
    ({"tokenizer": 0}, "tokenizer must be None or the path"),
    ({"roots": ""}, "roots must be None or a dict"),  # relocated nothing
    ({"roots": [("/a", "/b")]}, "roots must be None or a dict"),
    ({"roots": {"": "/b"}}, "roots must be None or a dict"),  # would prefix every path
    ({"check_fingerprint": "no"}, "check_fingerprint must be True or False"),  # bool("no") is True
])
def test_indexed_dataset_refuses_values_it_used_to_take(kw, match):
    """Found by reading the fuzz's accepted cases: an empty or non-path tokenizer and roots that are not a dict of
    prefixes were read as "none" without a word."""
    from fcp_data import bundled_index
    from fcp_data.readers import IndexedDataset

    with pytest.raises(TypeError, match=match):
        IndexedDataset(bundled_index("text"), **kw)
    assert len(IndexedDataset(bundled_index("text"), roots={"/nowhere": "/else"})) > 0
