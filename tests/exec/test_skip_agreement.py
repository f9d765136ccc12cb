"""A document that failed to read on only some ranks of its CP group is skipped on all of them (``agree_skips``).

Reference: the same micro-batch collated with the document failing on *every* rank of the group (the skip whose
step is proven equal to training on the rest of the global batch in ``tests/exec/test_hf_train.py``). After the
agreement, on 2 real gloo processes, each rank's labels, ``num_skipped_labels`` and ``num_label_tokens_local``
equal the reference's exactly — whichever rank failed (the group's CP rank 0, which counts the sampler's labels,
or the other), with the sampler's label count and with the samples' own labels; so do the multi-token-prediction
targets (``future_labels``, ``FCPCollator(future_tokens=2)``). A visual document packed as plain
pads on one rank (no skeleton) and read with pixels on the other raises the same ``SampleReadError`` on both ranks
instead of hanging in the frame exchange. End to end (tiny-mllm, 3 steps): ``tests/exec/test_read_skip.py``.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data import FCPCollator
from fcp_data.read_errors import SampleReadError, SkippedSample
from fcp_data.slots import MicroBatchMeta, SampleSlot
from fcp_exec.launch import launch
from fcp_exec.skips import agree_skips

PAD, IGNORE, VIS = 0, -100, 9
LENGTHS = (10, 13, 7, 16)


def _sample(i: int, n: int, sft: bool, visual: bool) -> dict:
    ids = torch.arange(1, n + 1, dtype=torch.long) + 10 * i
    out = {"input_ids": ids}
    if sft:  # the first third is a prompt
        out["labels"] = torch.where(torch.arange(n) < n // 3, IGNORE, ids)
    if visual and i == 1:  # four visual tokens of a 1x2x2 grid (merge 1)
        ids[2:6] = VIS
        out.update(grid_thw=torch.tensor([[1, 2, 2]]), pixel_values=torch.full((4, 6), float(i)))
    return out


def _collate(rank: int, failed: set[int], *, sft: bool = False, visual: bool = False, skeleton: bool = False) -> dict:
    """This rank's batch of a degree-2 group (global ranks 0, 1) where the documents in ``failed`` did not read."""
    meta = MicroBatchMeta(epoch=0, global_batch=5, micro_batch=0, num_micro_batches=1, num_tokens_global=200,
                          ranks=(0, 1), cp_rank=rank)
    coll = FCPCollator(pad_token_id=PAD, ignore_index=IGNORE, visual_token_id=VIS if visual else None,
                       spatial_merge_size=1, mask_visual_labels=False, sample_labels=sft, future_tokens=2)
    items = []
    for i, n in enumerate(LENGTHS):
        slot = SampleSlot(index=100 + i, num_tokens=n, length=n, meta=meta)
        real = _sample(i, n, sft, visual)
        if i in failed:
            sk = {k: (torch.zeros_like(v) if k == "pixel_values" else v) for k, v in real.items() if k != "labels"}
            real = SkippedSample(100 + i, None, "OSError", "flaky mount", sk if skeleton else None)
        items.append((real, slot))
    return coll(items)


CASES = [  # (name, documents failed per global rank, sft)
    ("cp rank 0 fails", {0: {1}, 1: set()}, False),
    ("cp rank 1 fails", {0: set(), 1: {1}}, False),
    ("different documents fail", {0: {0}, 1: {2, 3}}, False),
    ("cp rank 1 fails, own labels", {0: set(), 1: {1}}, True),
    ("cp rank 0 fails, own labels", {0: {1, 3}, 1: {3}}, True),
]
KEYS = ("labels", "future_labels", "num_skipped_labels", "num_label_tokens_local", "input_ids", "cu_seqlens")


def _agree_on_two_ranks() -> dict:
    import torch.distributed as dist

    rank = dist.get_rank()
    out = {}
    for name, failed, sft in CASES:
        got = agree_skips(_collate(rank, failed[rank], sft=sft), "cpu")
        every = set().union(*failed.values())
        ref = _collate(rank, every, sft=sft)
        out[name] = {k: (got.get(k), ref.get(k)) for k in KEYS}
    clean = _collate(rank, set())
    out["nothing failed"] = agree_skips(clean, "cpu")["labels"] is clean["labels"]
    out["skeleton"] = agree_skips(_collate(rank, {1} if rank == 0 else set(), visual=True, skeleton=True), "cpu")[
        "labels"].tolist()
    out["skeleton ref"] = _collate(rank, {1}, visual=True, skeleton=True)["labels"].tolist()
    out["pads everywhere"] = agree_skips(_collate(rank, {1}, visual=True), "cpu")["num_skipped_labels"]
    try:
        agree_skips(_collate(rank, {1} if rank == 0 else set(), visual=True), "cpu")
        out["no skeleton"] = None
    except SampleReadError as e:
        out["no skeleton"] = str(e)
    return out


@pytest.mark.timeout(300)
def test_a_partial_failure_equals_the_failure_on_every_rank():
    res = launch(_agree_on_two_ranks, 2, timeout=240.0, pg_timeout=60.0)
    for rank, out in enumerate(res):
        for name, _, _ in CASES:
            got = out[name]
            for key in ("labels", "future_labels", "num_skipped_labels", "num_label_tokens_local"):
                a, b = got[key]
                same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                assert same, (name, rank, key, a, b)
        assert out["nothing failed"], rank  # no copy when the group read everything
        assert out["skeleton"] == out["skeleton ref"], rank
    # the labels of a skipped document are counted once per group: on CP rank 0
    assert res[0]["cp rank 1 fails"]["num_skipped_labels"][0] == LENGTHS[1] - 1
    assert res[1]["cp rank 1 fails"]["num_skipped_labels"][0] == 0
    assert res[0]["pads everywhere"] == LENGTHS[1] - 1
    msg = res[0]["no skeleton"]
    assert msg is not None and msg == res[1]["no skeleton"], res
    assert "sample 101 failed to read on rank(s) [0] but was read, with images/videos, on rank(s) [1]" in msg
    assert "skeleton(i)" in msg


def test_degree_one_and_idle_batches_are_left_alone():
    """No peer, no exchange (this runs without a process group): the batch comes back as it was."""
    meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=20,
                          ranks=(0,), cp_rank=0)
    coll = FCPCollator(pad_token_id=PAD)
    b = coll([(SkippedSample(3, None, "OSError", "x"), SampleSlot(index=3, num_tokens=8, length=8, meta=meta))])
    assert b["read_status"] == (1,) and b["planned_labels"] == (7,)
    assert agree_skips(b) is b
    idle = dict(b, ranks=(), cp_rank=-1)
    assert agree_skips(idle) is idle


def test_leave_out_later_never_ends_a_run_by_emptying_an_epoch(caplog):
    """One process, a step's micro-batch dicts: the skipped samples are left out of the next epoch; with
    ``drop_last=True`` and so few samples that leaving them all out would leave an epoch without a global batch, as
    many as can go go and the rest stay (read and skipped again: a warning), instead of a ValueError that would end
    the run. With ``same_num_global_batches`` (FCPTrainer) the same holds for an epoch's number of global batches."""
    import numpy as np

    from fcp_data.cost import CostModel
    from fcp_data.sampler import FCPSampler
    from fcp_exec.skips import leave_out_later

    cm = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
                   bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)
    skipped = [{"micro_batch": 0, "epoch": 0, "skipped_samples": ({"index": 1}, {"index": 2})}]
    plain = FCPSampler(np.full(8, 100), num_ranks=1, rank=0, cost_model=cm, global_batch_size=4, drop_last=True)
    assert leave_out_later(plain, skipped) == 2 and plain.num_global_batches(1) == 1  # 6 samples: one batch of 4
    tight = FCPSampler(np.full(5, 100), num_ranks=1, rank=0, cost_model=cm, global_batch_size=4, drop_last=True)
    with caplog.at_level("WARNING", logger="fcp_exec"):
        assert leave_out_later(tight, skipped) == 1  # both out: 3 samples left, no global batch of 4
    assert tight.num_global_batches(1) == 1 and "1 of the 2 skipped sample(s) stay in later epochs" in caplog.text
    assert tight.state_dict()["excluded_later"] == [[1, [1]]]
    many = [{"micro_batch": 0, "epoch": 0, "skipped_samples": tuple({"index": i} for i in (9, 3, 5, 0, 7))}]
    hf = FCPSampler(np.full(10, 100), num_ranks=1, rank=0, cost_model=cm, global_batch_size=4)  # 4 + 4 + 2
    assert leave_out_later(hf, many, same_num_global_batches=True) == 1  # a 2nd would make it 2 batches of 4
    assert hf.num_global_batches(1) == 3 and hf.state_dict()["excluded_later"] == [[1, [0]]]
    assert leave_out_later(hf, many) == 4 and hf.num_global_batches(1) == 2  # fcp train: all of them
    with pytest.raises(ValueError, match="no micro-batch given"):
        leave_out_later(plain, [])


def test_a_checkpoints_exclusions_round_trip_and_a_damaged_file_is_one_error(tmp_path):
    """``fcp_sampler.json`` (FCPTrainer's checkpoints): what one sampler left out, another sampler at the start of
    epoch 0 leaves out alike; no file changes nothing; a damaged one is one ValueError naming it and the way out."""
    import numpy as np

    from fcp_data.cost import CostModel
    from fcp_data.sampler import FCPSampler
    from fcp_exec.integrations.hf_trainer_data import EXCLUSIONS_FILE, load_skip_exclusions, save_skip_exclusions

    cm = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
                   bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)

    def sampler():
        return FCPSampler(np.full(12, 100), num_ranks=1, rank=0, cost_model=cm, global_batch_size=4, prefetch=0)

    first = sampler()
    save_skip_exclusions(first, str(tmp_path))
    assert not (tmp_path / EXCLUSIONS_FILE).exists()  # nothing left out: no file
    assert load_skip_exclusions(sampler(), str(tmp_path)) == 0 and load_skip_exclusions(sampler(), None) == 0
    first.exclude_later([3, 7], 1)
    first.exclude_later([5], 2)
    save_skip_exclusions(first, str(tmp_path))
    second = sampler()
    assert load_skip_exclusions(second, str(tmp_path)) == 3
    assert second.state_dict()["excluded_later"] == first.state_dict()["excluded_later"] == [[1, [3, 7]], [2, [5]]]
    for damaged in ('{"excluded_later": [[1, [3]]', '{"other": 1}', '[1, 2]', '{"excluded_later": [[1]]}',
                    '{"excluded_later": [[1, "x"]]}', '{"excluded_later": [[0, [3]]]}', '{"excluded_later": 5}'):
        (tmp_path / EXCLUSIONS_FILE).write_text(damaged)
        with pytest.raises(ValueError, match=f"{EXCLUSIONS_FILE} is damaged .* delete it to resume"):
            load_skip_exclusions(sampler(), str(tmp_path))
