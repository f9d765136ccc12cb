"""A sample that fails to read is recorded and skipped (``FCPDataset(on_error="skip")``), never the end of a run.

References: the collator's packing of a skipped sample equals, tensor for tensor, the packing of a real sample of
the same planned length made of pad tokens with every label masked (the ``sample_labels=True`` path, tested against
transformers elsewhere), for degrees 1–3, truncated or not, text and visual batches; ``num_skipped_labels`` equals
the label tokens the sampler counted for the sample (its ``num_tokens − 1``, minus its visual targets when those are
masked), on the group's first rank only. The error budget against a hand-computed sequence of outcomes. Real
multi-process training with a skipped sample against the stock model trained on the rest of each global batch:
``tests/exec/test_hf_train.py``.
"""

from __future__ import annotations

import json
import logging
import pickle

import pytest
import torch

from fcp_data import FCPCollator
from fcp_data.read_errors import ReadErrorBudget, SampleReadError, SkippedSample
from fcp_data.slots import FCPDataset, MicroBatchMeta, SampleSlot, SlotList

PAD, IGNORE, VIS = 0, -100, 7


def _meta(degree: int, cp_rank: int, total: int = 100, text: int | None = None) -> MicroBatchMeta:
    return MicroBatchMeta(epoch=0, global_batch=3, micro_batch=0, num_micro_batches=1, num_tokens_global=total,
                          num_text_labels_global=text, ranks=tuple(range(degree)), cp_rank=cp_rank)


class Flaky:
    """A map-style dataset whose samples in ``bad`` raise; ``transient`` ones fail only on their first read."""

    def __init__(self, n: int, bad=(), transient=()):
        self.n, self.bad, self.transient, self.calls = n, set(bad), set(transient), {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.calls[i] = self.calls.get(i, 0) + 1
        if i in self.bad:
            raise OSError(f"sample {i}: decoder says no\nsecond line")
        if i in self.transient and self.calls[i] == 1:
            raise TimeoutError("mount hiccup")
        return {"input_ids": torch.arange(1, 11) + i}


def _slot(i: int, meta: MicroBatchMeta, n: int = 10, length: int = 10, vt: int = 0) -> SampleSlot:
    return SampleSlot(index=i, num_tokens=n, length=length, meta=meta, visual_targets=vt)


def test_skip_records_and_replaces_only_the_failing_sample(tmp_path, caplog):
    out = tmp_path / "read_errors.jsonl"
    ds = FCPDataset(Flaky(6, bad={2}, transient={4}), errors_path=out)
    meta = _meta(1, 0)
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        items = ds.__getitems__(SlotList([_slot(i, meta) for i in range(6)], meta=meta))
    assert isinstance(items, SlotList) and items.meta is meta
    kinds = [type(s).__name__ for s, _ in items]
    assert kinds == ["dict", "dict", "SkippedSample", "dict", "dict", "dict"]  # 4: retried once, read
    assert ds.base.calls == {0: 1, 1: 1, 2: 2, 3: 1, 4: 2, 5: 1}
    sk = items[2][0]
    assert (sk.index, sk.key, sk.reason, sk.detail) == (2, None, "OSError", "sample 2: decoder says no")
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert lines == [{"index": 2, "key": None, "reason": "OSError", "detail": "sample 2: decoder says no",
                      "epoch": 0, "global_batch": 3, "rank": 0}]
    assert len(caplog.records) == 1 and "skipped sample 2" in caplog.records[0].getMessage()


def test_raise_names_the_sample_and_retries_zero_skips_a_transient_failure():
    with pytest.raises(SampleReadError, match="sample 1: OSError: sample 1: decoder says no") as info:
        FCPDataset(Flaky(3, bad={1}), on_error="raise")[_slot(1, _meta(1, 0))]
    assert isinstance(info.value.__cause__, OSError)
    ds = FCPDataset(Flaky(3, transient={1}), on_error="raise")  # a retry that succeeds is no error in either mode
    assert ds[_slot(1, _meta(1, 0))][0]["input_ids"][0] == 2
    ds = FCPDataset(Flaky(3, transient={1}), retries=0)
    assert isinstance(ds[_slot(1, _meta(1, 0))][0], SkippedSample)


def test_budget_ends_the_run_when_the_dataset_is_broken():
    # consecutive: the 3rd failure in a row raises, naming the last failure
    b = ReadErrorBudget(max_consecutive_errors=3, max_error_rate=1.0)
    sk = SkippedSample(5, "clip-5", "VideoDecodeError", "cannot decode")
    b.failed(sk)
    b.failed(sk)
    with pytest.raises(SampleReadError, match=r"3 samples in a row .* sample 5 \(clip-5\): VideoDecodeError"):
        b.failed(sk)
    # rate: failures spread out (never 2 in a row) end it once >= 2 failed in all and > 25 % of reads failed
    b = ReadErrorBudget(max_consecutive_errors=2, max_error_rate=0.25)
    outcomes = [True, True, False, True, True, True, True, False, True, False]  # reads 3, 8 (2/8 ok), 10 (3/10 > .25)
    raised_at = None
    for k, ok in enumerate(outcomes, 1):
        try:
            b.ok() if ok else b.failed(sk)
        except SampleReadError:
            raised_at = k
            break
    assert raised_at == 10
    # a DataLoader worker starts its own counts
    b2 = pickle.loads(pickle.dumps(b))
    assert (b2.reads, b2.errors, b2.consecutive, b2.max_error_rate) == (0, 0, 0, 0.25)


@pytest.mark.parametrize("kwargs, match", [
    ({"on_error": "ignore"}, "on_error must be one of skip, raise"),
    ({"retries": -1}, "retries must be an int >= 0"),
    ({"max_consecutive_errors": 0}, "max_consecutive_errors must be an int >= 1"),
    ({"max_error_rate": 1.5}, r"max_error_rate must be a number in \[0, 1\]"),
    ({"vocab_size": 0}, "vocab_size must be an int >= 1 or None"),
])
def test_bad_arguments_are_one_clear_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FCPDataset([], **kwargs)


def test_errors_path_checked_at_construction_and_a_failed_write_loses_no_sample(tmp_path, caplog):
    """Found by a CLI fuzz: an errors_path in a missing folder, or a folder itself, was found out at the first
    skipped sample, as an OSError that ended the run — the one bad sample ended it. Now: a ValueError when the
    dataset is built; a write that fails later (the folder removed, a full disk) is logged with the record and the
    run goes on."""
    (tmp_path / "adir").mkdir()
    for path, says in [(tmp_path / "nope" / "e.jsonl", "does not exist"), (tmp_path / "adir", "is a folder"),
                       ("", "empty path"), ("a\0b", "NUL byte")]:
        with pytest.raises(ValueError, match=says):
            FCPDataset(Flaky(3), errors_path=path)
    with pytest.raises(TypeError, match="errors_path must be a path"):
        FCPDataset(Flaky(3), errors_path=3)
    sub = tmp_path / "sub"
    sub.mkdir()
    ds = FCPDataset(Flaky(6, bad={1, 4}), errors_path=sub / "e.jsonl")
    meta = _meta(1, 0)
    ds.__getitems__(SlotList([_slot(i, meta) for i in range(3)], meta=meta))
    assert len((sub / "e.jsonl").read_text().splitlines()) == 1
    (sub / "e.jsonl").unlink()
    sub.rmdir()  # the folder goes away mid-run
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        items = ds.__getitems__(SlotList([_slot(i, meta) for i in range(3, 6)], meta=meta))
    assert [type(s).__name__ for s, _ in items] == ["dict", "SkippedSample", "dict"]
    lost = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lost) == 1 and "could not append" in lost[0].getMessage() and '"index": 4' in lost[0].getMessage()


def _reference_batch(collator_kwargs: dict, items: list, bad: int) -> list:
    """The same batch with the failed sample replaced by pads of its planned length whose labels are all masked."""
    out = []
    for sample, slot in items:
        if slot.index == bad:
            sample = {"input_ids": torch.full((slot.length,), PAD), "labels": torch.full((slot.length,), IGNORE)}
        elif "labels" not in sample:
            sample = dict(sample, labels=sample["input_ids"])
        out.append((sample, slot))
    return out


@pytest.mark.parametrize("degree", [1, 2, 3])
@pytest.mark.parametrize("truncate", [False, True])
def test_collated_skip_equals_masked_padding_of_the_planned_length(degree, truncate):
    lengths = [9, 14, 5]
    cut = 11 if truncate else 14
    for cp_rank in range(degree):
        meta = _meta(degree, cp_rank)
        slots = [_slot(i, meta, n=(cut if i == 1 else n), length=n) for i, n in enumerate(lengths)]
        samples = [{"input_ids": torch.arange(1, n + 1) * (i + 1)} for i, n in enumerate(lengths)]
        items = [(s, sl) for s, sl in zip(samples, slots)]
        items[1] = (SkippedSample(1, "k1", "OSError", "gone"), slots[1])
        got = FCPCollator(pad_token_id=PAD)(items)
        ref = FCPCollator(pad_token_id=PAD, sample_labels=True)(_reference_batch({}, items, bad=1))
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(got[key], ref[key]), (key, degree, cp_rank)
        assert got["num_tokens_global"] == 100
        assert got["skipped_samples"] == ({"index": 1, "key": "k1", "reason": "OSError", "detail": "gone",
                                           "epoch": 0, "global_batch": 3, "rank": cp_rank},)
        assert got["num_skipped_labels"] == (cut - 1 if cp_rank == 0 else 0)
        # sample_labels batches count their own labels exactly: nothing to take out
        assert FCPCollator(pad_token_id=PAD, sample_labels=True)(items)["num_skipped_labels"] == 0


def test_visual_batch_skip_keeps_the_planned_shape_and_counts_text_labels_only():
    """Qwen-VL style batch (3-D positions, placeholder id VIS): a skipped video sample packs as text pads (no
    visual rows, no grid), the other sample's pixels and grid stay, and the skipped label count leaves out the
    sample's visual targets exactly as the sampler's text-label denominator did."""
    meta = _meta(2, 0, total=40, text=30)
    good = {"input_ids": torch.tensor([1, VIS, VIS, VIS, VIS, 2, 3, 4]), "grid_thw": torch.tensor([[1, 4, 4]]),
            "pixel_values": torch.randn(16, 6)}
    slots = [_slot(0, meta, n=8, length=8, vt=4), _slot(1, meta, n=12, length=12, vt=5)]
    items = [(good, slots[0]), (SkippedSample(1, None, "VideoDecodeError", "bad frame"), slots[1])]
    coll = FCPCollator(pad_token_id=PAD, visual_token_id=VIS, mrope=True)
    got = coll(items)
    ref = FCPCollator(pad_token_id=PAD, visual_token_id=VIS, mrope=True, sample_labels=True)(
        _reference_batch({}, items, bad=1))
    for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "mrope_position_ids", "visual_pos",
                "visual_index", "pixel_values", "grid_thw"):
        assert torch.equal(got[key], ref[key]), key
    assert got["num_tokens_global"] == 30 and got["num_skipped_labels"] == 12 - 1 - 5
    got1 = coll([(s, _slot(sl.index, _meta(2, 1, 40, 30), sl.num_tokens, sl.length, sl.visual_targets))
                 for s, sl in items])
    assert got1["num_skipped_labels"] == 0 and len(got1["skipped_samples"]) == 1


def test_a_sample_whose_length_changed_since_indexing_is_a_failed_read():
    """A read that succeeds with another length than the planned one (a file edited since indexing) would end the
    run in the collator; FCPDataset records and skips it like a failed read (``strict_lengths``, the default), and
    leaves it to the collator with ``strict_lengths=False`` (both must then be told)."""
    meta = _meta(1, 0)
    base = Flaky(3)  # every sample has 10 tokens
    sk, _ = FCPDataset(base)[_slot(1, meta, n=9, length=9)]
    assert isinstance(sk, SkippedSample) and sk.reason == "StaleSampleError"
    assert sk.detail.startswith("has 10 tokens but the sampler planned it with 9")
    assert base.calls[1] == 2  # retried once, like any failed read
    ok, _ = FCPDataset(base)[_slot(1, meta)]
    assert isinstance(ok, dict)
    loose, _ = FCPDataset(base, strict_lengths=False)[_slot(1, meta, n=9, length=9)]
    assert isinstance(loose, dict)
    batch = FCPCollator(pad_token_id=PAD, strict_lengths=False)([(loose, _slot(1, meta, n=9, length=9))])
    assert batch["input_ids"].numel() == 10 and batch["skipped_samples"] == ()  # cut to 9, padded to 2·degree


@pytest.mark.parametrize("sample, detail", [
    ({"input_ids": [1, 2, 99, 4]}, "has input_ids 99 outside the model's vocabulary [0, 50)"),
    ({"input_ids": [1, -2, 3, 4]}, "has input_ids -2 outside the model's vocabulary [0, 50)"),
    ({"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 77]}, "has labels 77 outside the model's vocabulary [0, 50)"),
    ({"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3]}, "has 3 labels for 4 input_ids (they must align)"),
    ({"input_ids": "abcd"}, "input_ids must be a 1-D integer tensor or list, got str"),
    ({"input_ids": [1.5, 2.0, 3.0, 4.0]}, "input_ids must be a 1-D integer tensor or list, got shape (4,) dtype torch.float32"),
    ({"input_ids": [[1, 2], [3, 4]]}, "input_ids must be a 1-D integer tensor or list, got shape (2, 2)"),
    # found by a review of the data API: each of these passed FCPDataset and ended the run in the collator
    ({"input_ids": None}, "input_ids is None"),
    ({"input_ids": [1, 2, 3, 4], "labels": [-5, 2, 3, 4]}, "has label -5: labels are token ids >= 0 or the ignore "
                                                           "index -100"),
    ({"input_ids": [1, 2, 3, 4], "grid_thw": "abc"}, "grid_thw must be n rows of (t, h, w) integers, got str"),
    ({"input_ids": [1, 2, 3, 4], "grid_thw": [[0, 2, 2]]}, "grid_thw needs h, w >= 1 and t != 0, got [[0, 2, 2]]"),
    ({"input_ids": [1, 2, 3, 4], "pixel_values": "abc"}, "pixel_values must be an array of numbers, got str"),
    ({"input_ids": [1, 2, 3, 4], "pixel_values": [[1.0], [2.0, 3.0]]}, "pixel_values must be an array of numbers, "
                                                                      "got list"),
])
def test_a_sample_the_model_cannot_take_is_a_failed_read(sample, detail):
    """A tokenized sample that reads but cannot be trained on — token ids or labels outside the model's vocabulary
    (the embedding would raise deep in the forward; on a GPU a device-side assert ends the process), labels that do
    not align, ids that are not 1-D integers — is recorded and skipped (``MalformedSampleError``) like a sample that
    fails to read, instead of ending the run in the collator or the model; what the model can take passes as it was
    read (a custom collator keeps its types)."""
    meta = _meta(1, 0)
    sk, _ = FCPDataset([sample], vocab_size=50)[_slot(0, meta, n=4, length=4)]
    assert isinstance(sk, SkippedSample) and sk.reason == "MalformedSampleError", sk
    assert sk.detail.startswith(detail), sk.detail
    good = {"input_ids": [1, 2, 3, 49], "labels": [-100, 2, 3, 49], "text": "kept"}
    ok, _ = FCPDataset([good], vocab_size=50)[_slot(0, meta, n=4, length=4)]
    assert ok is good
    row, _ = FCPDataset([{"input_ids": torch.tensor([[1, 2, 3, 4]])}])[_slot(0, meta, n=4, length=4)]
    assert row["input_ids"].shape == (1, 4)  # [1, n] passes: the collator takes it
    if "outside" in detail:  # no vocabulary given: the ids are not judged
        assert isinstance(FCPDataset([sample])[_slot(0, meta, n=4, length=4)][0], dict)
    assert FCPDataset([5])[_slot(0, meta, n=4, length=4)][0] == 5  # not a tokenized sample: the collator's to read


def test_a_none_sample_is_a_failed_read_and_other_objects_are_the_collators():
    meta = _meta(1, 0)
    sk, _ = FCPDataset([None])[_slot(0, meta, n=4, length=4)]
    assert isinstance(sk, SkippedSample) and sk.reason == "MalformedSampleError" and sk.detail.startswith("is None")
    assert FCPDataset([{"text": "abc"}])[_slot(0, meta, n=4, length=4)][0] == {"text": "abc"}  # a custom collator's


@pytest.mark.parametrize("vocab_size", [None, 50])
def test_the_ignore_index_is_the_collators(vocab_size):
    """Labels masked with the collator's own ``ignore_index`` pass when the dataset is told the same value; any other
    negative label is this sample's error (the collator would end the run on it). Before: with ``vocab_size`` only -100
    passed, so a collator with ``ignore_index=-1`` lost every sample; without it, a label of -5 ended the run."""
    meta = _meta(1, 0)
    sample = {"input_ids": [1, 2, 3, 4], "labels": [-1, -1, 3, 4]}
    ok, _ = FCPDataset([sample], vocab_size=vocab_size, ignore_index=-1)[_slot(0, meta, n=4, length=4)]
    assert ok is sample
    sk, _ = FCPDataset([sample], vocab_size=vocab_size)[_slot(0, meta, n=4, length=4)]
    assert isinstance(sk, SkippedSample) and "ignore index -100" in sk.detail, sk
    batch = FCPCollator(pad_token_id=PAD, ignore_index=-1, sample_labels=True)([(ok, _slot(0, meta, n=4, length=4))])
    assert batch["labels"].tolist() == [-1, 3, 4, -1] and batch["skipped_samples"] == ()  # shifted: next-token targets
    with pytest.raises(TypeError, match="ignore_index must be an int token id"):
        FCPDataset([sample], ignore_index=1.5)


def test_a_sample_shorter_than_its_kept_tokens_is_a_failed_read_with_loose_lengths_too():
    """``strict_lengths=False`` (lengths that are estimates): a sample longer or shorter than its index length passes
    while it holds the tokens the sampler planned to keep; one with fewer is this sample's error (before: the collator
    raised "fewer than the slot's" and ended the run)."""
    meta = _meta(1, 0)
    base = Flaky(3)  # every sample has 10 tokens
    loose = FCPDataset(base, strict_lengths=False)
    assert isinstance(loose[_slot(0, meta, n=10, length=12)][0], dict)  # the index said 12: it holds the 10 kept
    sk, _ = loose[_slot(1, meta, n=11, length=12)]
    assert isinstance(sk, SkippedSample) and sk.reason == "StaleSampleError", sk
    assert sk.detail.startswith("has 10 tokens, fewer than the 11 the sampler planned to keep"), sk.detail
    batch = FCPCollator(pad_token_id=PAD, strict_lengths=False)([(sk, _slot(1, meta, n=11, length=12))])
    assert batch["input_ids"].numel() == 12 and len(batch["skipped_samples"]) == 1  # the planned 11, padded to 2
