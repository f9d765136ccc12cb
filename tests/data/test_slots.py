"""Micro-batch metadata is held once (issue 13): the sampler's list and its slots share one
:class:`MicroBatchMeta` object — also after pickling (DataLoader workers) and through ``FCPDataset`` — and the
collator reads it from there. The earlier flat constructors and attributes still work (read-only).

References: the micro-batch fields written out by hand; the sampler's own plan (``plan_global_batch``) for
which ranks are idle; object identity for "held once".
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from fcp_data.collator import FCPCollator
from fcp_data.cost import CostModel
from fcp_data.sampler import FCPDataset, FCPSampler, MicroBatchMeta, SampleSlot, SlotList

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)
FLAT = dict(epoch=1, global_batch=2, micro_batch=0, num_micro_batches=3, num_tokens_global=40,
            num_text_labels_global=30, ranks=(4, 6), cp_rank=1)


@pytest.mark.usefixtures("no_local_search")
def test_sampler_lists_share_one_meta_with_their_slots_also_after_pickling():
    """Every list of an epoch on every rank: each slot's meta *is* the list's meta, whose fields match the plan
    (idle rank: ranks () and cp_rank -1; else this rank's group); pickling a list (what a DataLoader does to
    send it to a worker) keeps one shared meta; FCPDataset passes that same object on."""
    lengths = np.clip(np.random.default_rng(2).lognormal(5.0, 1.1, size=60), 1, 2000).astype(np.int64)
    seen_idle = seen_busy = 0
    for rank in range(8):  # 8 ranks, 3 sequences a global batch: some ranks idle
        s = FCPSampler(lengths, num_ranks=8, rank=rank, cost_model=CM, global_batch_size=3, prefetch=0)
        for lst in s:
            plan = s.plan_global_batch(lst.global_batch)
            group = plan.micro_batches[lst.micro_batch].group_of_rank(rank)
            meta = lst.meta
            assert isinstance(meta, MicroBatchMeta) and all(slot.meta is meta for slot in lst)
            assert (meta.ranks, meta.cp_rank) == (((), -1) if group is None else
                                                  (tuple(group.ranks), tuple(group.ranks).index(rank)))
            assert meta.num_micro_batches == len(plan.micro_batches)
            seen_idle += group is None
            seen_busy += group is not None
            back = pickle.loads(pickle.dumps(lst))
            assert back == lst and back.meta == meta and all(slot.meta is back.meta for slot in back)
            pairs = FCPDataset(list(range(100))).__getitems__(back)
            assert isinstance(pairs, SlotList) and pairs.meta is back.meta
    assert seen_idle and seen_busy  # both kinds of lists were checked


def test_flat_constructors_build_the_meta_and_fields_read_through_it():
    """SampleSlot(..., ranks=, epoch=, ...) and SlotList(epoch=, ...) still work (a meta is built); the fields
    read on slot and list equal the hand-written ones and cannot be assigned; dataclasses.replace(slot, cp_rank=)
    still works; a slot without a CP group and inconsistent metas are refused."""
    slot = SampleSlot(index=7, num_tokens=5, length=9, **FLAT)
    lst = SlotList([slot], **FLAT)
    for obj in (slot, lst, slot.meta):
        assert {k: getattr(obj, k) for k in FLAT} == FLAT
    assert (slot.degree, slot.rank, slot.truncated) == (2, 6, True)
    assert slot.meta == lst.meta and slot == SampleSlot(index=7, num_tokens=5, length=9, meta=lst.meta)
    with pytest.raises(AttributeError):
        lst.epoch = 3
    with pytest.raises(AttributeError):
        slot.ranks = (1,)
    moved = dataclasses.replace(slot, cp_rank=0)  # meta= plus a field: that field of the meta replaced
    assert (moved.rank, moved.index, moved.meta.epoch, slot.cp_rank) == (4, 7, 1, 1)
    assert pickle.loads(pickle.dumps(slot)) == slot and hash(slot) == hash(SampleSlot(index=7, num_tokens=5, length=9,
                                                                                       **FLAT))
    with pytest.raises(ValueError, match="CP group"):
        SampleSlot(index=0, num_tokens=1, length=1, meta=MicroBatchMeta(**{**FLAT, "ranks": (), "cp_rank": -1}))
    with pytest.raises(ValueError, match="cp_rank"):
        MicroBatchMeta(**{**FLAT, "cp_rank": 2})
    with pytest.raises(ValueError, match="num_text_labels_global"):
        MicroBatchMeta(**{**FLAT, "num_text_labels_global": 41})
    assert MicroBatchMeta(**{**FLAT, "epoch": np.int64(1)}).epoch.__class__ is int


def test_collator_reads_the_shared_meta_and_refuses_mixed_micro_batches():
    """The batch dict's metadata entries are the meta's; slots of one group but another micro-batch (a
    different meta) are a ValueError naming that, another group one naming the group."""
    meta = MicroBatchMeta(**FLAT)
    slots = [SampleSlot(index=i, num_tokens=4, length=4, meta=meta) for i in range(2)]
    batch = FCPDataset([{"input_ids": [1, 2, 3, 4]}] * 2).__getitems__(SlotList(slots, meta=meta))
    out = FCPCollator()(batch)
    keys = ("epoch", "global_batch", "micro_batch", "num_micro_batches", "ranks", "cp_rank", "num_tokens_global")
    assert {k: out[k] for k in keys} == {k: FLAT[k] for k in keys}
    other = SampleSlot(index=3, num_tokens=4, length=4, **{**FLAT, "micro_batch": 1})
    with pytest.raises(ValueError, match="different micro-batches"):
        FCPCollator()([batch[0], ({"input_ids": [1, 2, 3, 4]}, other)])
    foreign = SampleSlot(index=3, num_tokens=4, length=4, **{**FLAT, "cp_rank": 0})
    with pytest.raises(ValueError, match="one CP group"):
        FCPCollator()([batch[0], ({"input_ids": [1, 2, 3, 4]}, foreign)])
    equal = SampleSlot(index=3, num_tokens=4, length=4, **FLAT)  # built apart, same facts: accepted
    assert FCPCollator()([batch[0], ({"input_ids": [1, 2, 3, 4]}, equal)])["sample_indices"] == (0, 3)
