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
    ({"seed": "a"}, "seed must be an integer"),
    ({"global_batch_size": True}, "global_batch_size must be a positive integer"),
    ({"global_batch_size": 100, "drop_last": True}, "every epoch would be empty"),
    ({"global_batch_size": None, "global_batch_tokens": 10**9, "drop_last": True}, "every epoch would be empty"),
])
def test_sampler_rejects_at_construction(kw, match):
    """These were accepted: a bad solver failed only on the planning thread, drop_last with a batch larger than
    the data gave an empty epoch (a training loop that silently does nothing)."""
    with pytest.raises(ValueError, match=match):
        _sampler(**kw)


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
