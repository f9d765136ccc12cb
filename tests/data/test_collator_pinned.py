"""FCPCollator / SampleSlot facts pinned against a brute force, in one process (cheap).

* The label tokens a *skipped* document is taken out of the denominator with (``planned_labels``, and
  ``num_skipped_labels`` on CP rank 0) must be the labels the same document yields when it reads: the count of
  non-ignored labels of the real document collated in the same slot (brute force: collate it and count, summed over
  every CP rank). With visual placeholders, ``mask_visual_labels=True`` drops the labels whose target is a
  placeholder (the sampler's ``visual_targets``) and ``False`` keeps them — the existing tests only skip MLLM
  documents with ``mask_visual_labels=False`` and ``visual_targets=0``, so swapping the two went unnoticed.
* A slot crossing a DataLoader worker (pickle) keeps every field, ``visual_targets`` included (the count above).
"""

from __future__ import annotations

import pickle

import pytest
import torch

from fcp_data import FCPCollator
from fcp_data.read_errors import SkippedSample
from fcp_data.slots import MicroBatchMeta, SampleSlot

VIS, PAD, IGNORE = 99, 0, -100


def _doc(n: int) -> torch.Tensor:
    ids = (torch.arange(n) * 5) % 40 + 2
    ids[3:9] = VIS  # six placeholders, the first at position 3
    ids[14:16] = VIS
    return ids


def _visual_targets(ids: torch.Tensor, kept: int) -> int:
    """Brute force: positions t < kept − 1 whose target ids[t + 1] is a placeholder."""
    return sum(int(ids[t + 1]) == VIS for t in range(kept - 1))


@pytest.mark.parametrize("mask", [True, False])
@pytest.mark.parametrize("degree,kept", [(1, 20), (2, 13), (3, 20)])
def test_a_skipped_documents_planned_labels_are_its_real_label_count(mask, degree, kept):
    n = 20
    ids = _doc(n)
    vt = _visual_targets(ids, kept)
    total = 500  # the global batch's count (other documents); text count: the same minus this document's targets
    coll = FCPCollator(pad_token_id=PAD, ignore_index=IGNORE, visual_token_id=VIS, spatial_merge_size=1,
                       mask_visual_labels=mask)
    real_labels, skipped = 0, None
    for cp in range(degree):
        meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=total,
                              num_text_labels_global=total - vt, ranks=tuple(range(degree)), cp_rank=cp)
        slot = SampleSlot(index=7, num_tokens=kept, length=n, meta=meta, visual_targets=vt)
        real = coll([({"input_ids": ids}, slot)])
        real_labels += int((real["labels"] != IGNORE).sum())
        out = coll([(SkippedSample(7, None, "OSError", "gone"), slot)])
        assert int((out["labels"] != IGNORE).sum()) == 0
        if cp == 0:
            skipped = out
        else:
            assert out["num_skipped_labels"] == 0
    assert skipped["planned_labels"] == (real_labels,)
    assert skipped["num_skipped_labels"] == real_labels


def test_a_slot_keeps_every_field_through_pickle():
    meta = MicroBatchMeta(epoch=1, global_batch=2, micro_batch=0, num_micro_batches=1, num_tokens_global=50,
                          num_text_labels_global=40, ranks=(3, 1), cp_rank=1)
    slot = SampleSlot(index=4, num_tokens=9, length=12, meta=meta, visual_targets=5)
    back = pickle.loads(pickle.dumps(slot))
    for name in ("index", "num_tokens", "length", "visual_targets", "meta"):
        assert getattr(back, name) == getattr(slot, name), name


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_visual_rows_count_every_placeholder_of_truncated_documents(degree):
    """``visual_index``: the row of each kept placeholder in the group's visual embeddings, i.e. its rank among the
    placeholders of *all* documents, untruncated, in slot order (the vision tower encodes whole images). Brute force:
    walk the untruncated documents and number their placeholders; the collated local tokens at ``visual_pos`` are
    mapped back to (document, position) through the zigzag layout (``position_ids`` + ``cu_seqlens``)."""
    docs = [(_doc(20), 12), (_doc(24), 24), (_doc(20), 7)]  # (ids, kept): the first and last cut inside a block
    row_of, row = {}, 0
    for d, (ids, _) in enumerate(docs):
        for t in range(ids.numel()):
            if int(ids[t]) == VIS:
                row_of[(d, t)] = row
                row += 1
    coll = FCPCollator(pad_token_id=PAD, ignore_index=IGNORE, visual_token_id=VIS, spatial_merge_size=1,
                       mask_visual_labels=False)
    seen = {}
    for cp in range(degree):
        meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=100,
                              ranks=tuple(range(degree)), cp_rank=cp)
        pairs = [({"input_ids": ids}, SampleSlot(index=d, num_tokens=k, length=ids.numel(), meta=meta))
                 for d, (ids, k) in enumerate(docs)]
        out = coll(pairs)
        cu = out["cu_seqlens"].tolist()
        for p, r in zip(out["visual_pos"].tolist(), out["visual_index"].tolist()):
            d = max(j for j in range(len(docs)) if cu[j] <= p)
            t = int(out["position_ids"][p])
            assert int(out["input_ids"][p]) == VIS
            seen[(d, t)] = r
    want = {(d, t): r for (d, t), r in row_of.items() if t < docs[d][1]}
    assert seen == want


class _VisualText:
    """Documents with placeholder runs (brute-force data for the denominator test)."""

    def __init__(self, lengths):
        self.docs = []
        for i, n in enumerate(lengths):
            ids = (torch.arange(n) * 3 + i) % 40 + 2
            if i % 2 == 0:
                ids[2:2 + min(8, n - 3)] = VIS
            self.docs.append(ids)

    def __len__(self):
        return len(self.docs)

    def __getitem__(self, i):
        return {"input_ids": self.docs[i]}

    def layout(self, i, n):
        """Placeholders among positions 1..n-1 of document i (what FCPSampler(visual_layout=) takes)."""
        return int((self.docs[i][1:n] == VIS).sum())


@pytest.mark.parametrize("mask", [True, False])
def test_the_denominator_is_the_global_batchs_label_count_over_every_rank(mask):
    """DESIGN §7: ``num_tokens_global`` is the token count of the whole global batch for loss normalisation, i.e.
    exactly the non-ignored labels every rank's collated micro-batches hold together. Brute force: simulate all ranks
    in one process (a sampler per rank, same seed), collate every list, count the labels per global batch. With
    ``mask_visual_labels`` the count leaves out the labels whose target is a placeholder (sampler's visual layout)."""
    from fcp_data import CostModel, FCPDataset, FCPSampler

    lengths = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58]
    data = _VisualText(lengths)
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=48)
    coll = FCPCollator(pad_token_id=PAD, ignore_index=IGNORE, visual_token_id=VIS, spatial_merge_size=1,
                       mask_visual_labels=mask)
    counts, denominators = {}, {}
    for rank in range(3):
        sampler = FCPSampler(lengths, num_ranks=3, rank=rank, global_batch_size=5, seed=0, cost_model=cost,
                             visual_layout=data.layout)
        ds = FCPDataset(data)
        for lst in sampler:
            b = coll(ds.__getitems__(lst))
            g = int(b["global_batch"])
            counts[g] = counts.get(g, 0) + int((b["labels"] != IGNORE).sum())
            denominators.setdefault(g, set()).add(int(b["num_tokens_global"]))
    assert counts and all(len(d) == 1 for d in denominators.values())
    assert {g: d.pop() for g, d in denominators.items()} == counts
