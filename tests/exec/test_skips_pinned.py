"""``fcp_exec.skips.agree_skips`` must leave the *group's* read statuses in the batch, not this rank's own: after it,
a document that failed on some rank of the CP group is skipped on every rank, and what reads ``read_status`` later
must see that — ``fcp_exec.step.padding_mask`` (the token counts of MoE routers), the Hugging Face Trainer's
``num_input_tokens_seen`` (``hf_trainer_data.input_tokens``, counted on CP rank 0) and the prediction path. The
existing agreement test compares labels, the denominators and the ids with the all-failed reference, not the
statuses, so leaving ``read_status`` unagreed went unnoticed.

2 real gloo processes, a degree-2 group; reference: the batch collated on each rank as if every rank of the group had
failed on the union of the failures (so every rank packs those documents as skipped itself).
"""

from __future__ import annotations

import pytest
import torch

LENGTHS = [9, 14, 7, 12]


def _collate(rank: int, failed: set[int]) -> dict:
    from fcp_data import FCPCollator
    from fcp_data.read_errors import SkippedSample
    from fcp_data.slots import MicroBatchMeta, SampleSlot

    meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=100,
                          ranks=(0, 1), cp_rank=rank)
    items = []
    for i, n in enumerate(LENGTHS):
        slot = SampleSlot(index=10 + i, num_tokens=n, length=n, meta=meta)
        sample = {"input_ids": torch.arange(n) % 7 + 1}
        if i in failed:
            sample = SkippedSample(10 + i, None, "OSError", "flaky")
        items.append((sample, slot))
    return FCPCollator(pad_token_id=0)(items)


def _worker(failed_by_rank):
    import torch.distributed as dist

    from fcp_exec.skips import agree_skips
    from fcp_exec.step import padding_mask

    rank = dist.get_rank()
    got = agree_skips(_collate(rank, failed_by_rank[rank]), "cpu")
    ref = _collate(rank, set().union(*failed_by_rank.values()))
    return {"status": (tuple(got["read_status"]), tuple(ref["read_status"])),
            "mask": (padding_mask(got).tolist(), padding_mask(ref).tolist())}


@pytest.mark.parametrize("failed", [{0: {1}, 1: set()}, {0: set(), 1: {0, 2}}])
def test_agreed_read_statuses_are_the_groups(failed):
    from fcp_exec.launch import launch

    for rank, out in enumerate(launch(_worker, 2, failed, timeout=120)):
        got, want = out["status"]
        assert got == want, (rank, got, want)
        got, want = out["mask"]
        assert got == want, rank
