"""``FCPDataset(vocab_size=V)`` must turn exactly the samples the model's embedding cannot take into failed reads
(``MalformedSampleError``). Reference: ``torch.nn.Embedding(V, 2)`` itself — it raises on an id ≥ V (on a GPU a
device-side assert that ends the run) and takes every id in ``[0, V)``. The boundary id ``V`` is the case that matters.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data.slots import FCPDataset, MalformedSampleError, SampleSlot, _checked

V = 50


def _embedding_takes(ids: torch.Tensor) -> bool:
    try:
        torch.nn.Embedding(V, 2)(ids)
    except (IndexError, RuntimeError):
        return False
    return True


@pytest.mark.parametrize("top", [V - 1, V, V + 1])
def test_vocab_check_refuses_exactly_what_the_embedding_refuses(top):
    ids = torch.tensor([1, 2, top, 3])
    slot = SampleSlot(index=0, num_tokens=4, length=4, ranks=(0,), cp_rank=0, epoch=0, global_batch=0, micro_batch=0,
                      num_micro_batches=1, num_tokens_global=3)
    if _embedding_takes(ids):
        assert _checked({"input_ids": ids}, slot, True, V, -100)["input_ids"] is ids
    else:
        with pytest.raises(MalformedSampleError, match="outside the model's vocabulary"):
            _checked({"input_ids": ids}, slot, True, V, -100)
        sample, _ = FCPDataset([{"input_ids": ids}], vocab_size=V, retries=0)[slot]
        assert type(sample).__name__ == "SkippedSample"
