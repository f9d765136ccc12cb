"""A sample that fails to read on only some ranks of its CP group (a flaky mount, a file replaced mid-run) must
not hang the group: ``IndexedDataset.skeleton`` gives the failed rank the sample's visual layout from the index,
so the group's frame exchange still matches.

References: the sample read normally — the skeleton has its visual block token for token, its grid, its
``second_per_grid_ts`` and pixel values of its shape, and collated into a degree-2 group it gives every rank the
same visual positions, rows, grid and 3-D positions as the real sample (the inputs of the frame exchange). Then
tiny-mllm trains 3 steps on 2 real gloo processes with one video failing on rank 0 only, then on rank 1 only: the
run ends (a hang would hit the launch timeout), the failing rank records the skip, and the losses equal those of the
video failing on both ranks (the group agrees on the skip before the forward, :mod:`fcp_exec.skips`); and Hugging
Face InternVL on real 448-px tiles with a multi-tile image failing on one rank of its degree-2 group (and LLaVA-OneVision
on real 384-px frames with a video failing so): loss and every gradient equal the sample failing on both ranks (1e-12,
float64). Families: Qwen2-VL/2.5-VL/3-VL, InternVL3, LLaVA-Video.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from _requires import transformers_models

pytest.importorskip("decord")

from fcp_data import FCPCollator  # noqa: E402
from fcp_data.index.format import KIND_IMAGE, KIND_TEXT, KIND_VIDEO  # noqa: E402
from fcp_data.read_errors import SkippedSample  # noqa: E402
from fcp_data.slots import MicroBatchMeta, SampleSlot  # noqa: E402
from fcp_exec.launch import launch  # noqa: E402
from fcp_exec.train import TrainConfig, Trainer  # noqa: E402
from fcp_exec.train_data import _bundled_index  # noqa: E402


@pytest.fixture(scope="module", params=["qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl3", "llava-video"])
def reader(request, tmp_path_factory):
    from fcp_data import IndexedDataset

    return IndexedDataset(_bundled_index("hf", str(tmp_path_factory.mktemp("cache")), request.param))


def _checked(reader) -> list[int]:
    """The samples to compare with their skeletons: every one for Qwen-VL; for InternVL/LLaVA-Video (whose decoded
    tiles/frames cost more) every text and image sample, the first three videos and the one with most frames."""
    kinds = np.asarray(reader.index.kind)
    if reader.spec.family == "qwen-vl":
        return list(range(len(reader)))
    vids = [i for i in range(len(reader)) if kinds[i] not in (KIND_TEXT, KIND_IMAGE)]
    longest = max(vids, key=lambda i: int(reader.index.num_tokens[i]))
    return sorted({i for i in range(len(reader)) if kinds[i] in (KIND_TEXT, KIND_IMAGE)} | set(vids[:3]) | {longest})


def test_skeleton_has_the_samples_visual_layout(reader):
    """Qwen2-VL/2.5-VL/3-VL (patch grids, seconds per grid, timestamps), InternVL3 (tiles: an image's tile grid and
    thumbnail, a video's frames with their "FrameN:" text) and LLaVA-Video (frames): the skeleton is the sample's
    visual block token for token, pads for the caption, zero pixels of the real sample's shape and its grid."""
    from fcp_data import IndexedDataset

    kinds = np.asarray(reader.index.kind)
    assert (kinds == KIND_IMAGE).sum() >= 3 and (kinds == KIND_VIDEO).sum() >= 10
    captions = IndexedDataset(reader.index, caption_labels=True)
    for i in _checked(reader):
        sk = reader.skeleton(i)
        if kinds[i] == KIND_TEXT:
            assert sk is None
            continue
        real = reader[i]
        ids, sids = real["input_ids"], sk["input_ids"]
        assert sids.shape == ids.shape
        # the visual block (markers and timestamps included: what caption_labels masks) token for token, then pads
        block = int((captions[i]["labels"] == -100).long().cumprod(0).sum())
        assert 0 < block and torch.equal(sids[:block], ids[:block]), i
        assert bool((sids[block:] == reader.pad_token_id).all()), i
        assert torch.equal(sk["grid_thw"], real["grid_thw"]) and sk["pixel_values"].shape == real["pixel_values"].shape
        assert not sk["pixel_values"].any()
        assert ("second_per_grid_ts" in sk) == ("second_per_grid_ts" in real)
        if "second_per_grid_ts" in sk:
            assert torch.equal(sk["second_per_grid_ts"], real["second_per_grid_ts"])


def test_skeleton_of_video_conversations_is_the_sample_without_pixels(tmp_path):
    """LLaVA-style conversations (one video; two videos) indexed with qwen2.5-vl: the skeleton is the sample as read
    — the same ids (its text comes from the record), grid and seconds per grid — with zero pixels of the same shape
    and no labels (a skipped sample trains nothing)."""
    import json
    import tarfile

    from fcp_data import IndexedDataset, bundled_path
    from fcp_data.index import build_index

    with tarfile.open(sorted((bundled_path("samples") / "wds").glob("*.tar"))[0]) as t:
        names = [m for m in t.getnames() if m.endswith(".mp4")][:3]
        for m in names:
            (tmp_path / m).write_bytes(t.extractfile(m).read())
    turns = lambda q: [{"from": "human", "value": q}, {"from": "gpt", "value": "a cat on a mat."}]  # noqa: E731
    lines = [{"id": "one", "video": names[0], "conversations": turns("what is in <video> here?")},
             {"id": "two", "video": names[1:], "conversations": turns("<video> then <video>: what changed?")}]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, rc = build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "idx", chat_field="conversations",
                        progress=False)
    assert rc == 0
    ds = IndexedDataset(tmp_path / "idx")
    assert len(ds) == 2
    for i in range(2):
        real, sk = ds[i], ds.skeleton(i)
        assert torch.equal(sk["input_ids"], real["input_ids"]) and "labels" not in sk
        assert torch.equal(sk["grid_thw"], real["grid_thw"]) and len(sk["grid_thw"]) == i + 1
        assert torch.equal(sk["second_per_grid_ts"], real["second_per_grid_ts"])
        assert sk["pixel_values"].shape == real["pixel_values"].shape and not sk["pixel_values"].any()


def test_a_group_agrees_on_the_layout_when_one_rank_failed(reader):
    """Every rank of a degree-2 group collates the same visual positions, rows, grid, pixel shape and 3-D positions
    whether it read a video or only has its skeleton."""
    kinds = np.asarray(reader.index.kind)
    vids = [i for i in range(len(reader)) if kinds[i] != KIND_TEXT][:3]
    mrope = reader.spec.family == "qwen-vl"
    coll = FCPCollator(pad_token_id=reader.pad_token_id, visual_token_id=reader.placeholder_ids, mrope=mrope,
                       mask_visual_labels=False)
    for cp_rank in (0, 1):
        meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=10_000,
                              ranks=(0, 1), cp_rank=cp_rank)
        slots = [SampleSlot(index=i, num_tokens=int(reader.index.num_tokens[i]),
                            length=int(reader.index.num_tokens[i]), meta=meta) for i in vids]
        real = coll([(reader[i], s) for i, s in zip(vids, slots)])
        items = [(reader[i], s) for i, s in zip(vids, slots)]
        items[1] = (SkippedSample(vids[1], None, "OSError", "gone", reader.skeleton(vids[1])), slots[1])
        failed = coll(items)
        for key in ("visual_pos", "visual_index", "grid_thw", "cu_seqlens") + (("mrope_position_ids",) if mrope else ()):
            assert torch.equal(failed[key], real[key]), (key, cp_rank)
        assert failed["pixel_values"].shape == real["pixel_values"].shape


class _FailsOn:
    """``base`` whose sample ``bad`` raises on the global ranks ``ranks`` only (a read that fails on some ranks)."""

    def __init__(self, base, bad: int, ranks: tuple[int, ...]):
        self.base, self.bad, self.ranks = base, bad, ranks

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        import torch.distributed as dist

        if i == self.bad and dist.get_rank() in self.ranks:
            raise OSError("flaky mount")
        return self.base[i]

    def skeleton(self, i):
        return self.base.skeleton(i)


def _train_with_partial_failures(cfg: TrainConfig) -> dict:
    """The same 3 steps with one video failing on rank 0 only, on rank 1 only and on both."""
    out = {}
    for failing in ((0,), (1,), (0, 1)):
        tr = Trainer(cfg)
        first = tr.sampler.global_batch_indices(0)
        bad = next(int(i) for i in first if tr.data.dataset[int(i)].get("grid_thw") is not None)
        tr.loader.dataset.base = _FailsOn(tr.loader.dataset.base, bad, failing)
        steps = [tr.step() for _ in range(cfg.steps)]
        out[failing] = {"bad": bad, "skipped": [r["skipped_samples"] for r in steps],
                        "losses": [r["loss"] for r in steps], "groups": [r["degrees"] for r in steps]}
    return out


@pytest.mark.timeout(300)
def test_training_with_a_video_that_fails_on_one_rank_equals_failing_on_both(tmp_path):
    """No hang, and exact: a partial failure trains like the failure on every rank of the group (whose step equals
    training on the rest of the global batch, tests/exec/test_hf_train.py) — the group agrees on the skip before
    the forward (fcp_exec.skips). fp32 model: losses within 1e-6 relative (measured: identical)."""
    cfg = TrainConfig(model="tiny-mllm", steps=3, global_batch_size=4, prefetch=0, verbose=False,
                      cache_dir=str(tmp_path), max_tokens=400, tokens_per_rank=200)  # videos need degree 2
    res = launch(_train_with_partial_failures, 2, cfg, timeout=240.0, pg_timeout=60.0)
    ref = res[0][(0, 1)]
    bad = ref["bad"]
    assert all(d == [2] for d in ref["groups"][0])  # one degree-2 group per micro-batch: the video has a peer
    for failing in ((0,), (1,)):
        run = res[0][failing]
        assert run["bad"] == bad and res[1][failing] == run  # every rank reports the same step
        # the step's records gather every rank's skips: the failure is reported once, by the rank that failed
        assert [(r["index"], r["rank"]) for r in run["skipped"][0]] == [(bad, failing[0])]
        assert all(np.isfinite(v) for v in run["losses"])
        for a, b in zip(run["losses"], ref["losses"]):
            assert abs(a - b) <= 1e-6 * abs(b), (failing, run["losses"], ref["losses"])


def _split_over_the_group(tr, i: int) -> bool:
    """Whether sample ``i`` is one whose vision inputs a degree-2 group splits: an InternVL image of several tiles,
    a LLaVA-OneVision video longer than one rank holds."""
    sample = tr.data.dataset[i]
    if tr.cfg.model.endswith("internvl-tiny.json"):
        return int(sample["pixel_values"].shape[0]) > 1
    return "pixel_values" in sample and len(sample["input_ids"]) > tr.cfg.tokens_per_rank


def _visual_partial_failures(cfg: TrainConfig) -> dict:
    """One step of a stock-weights VL model with the first sample of global batch 0 whose frames a degree-2 group
    splits failing on rank 0 only, on rank 1 only and on both: each run's loss, every gradient (float64), its groups
    and skip records."""
    out = {}
    for failing in ((0,), (1,), (0, 1)):
        tr = Trainer(cfg)
        first = tr.sampler.global_batch_indices(0)
        bad = next(int(i) for i in first if _split_over_the_group(tr, int(i)))
        tr.loader.dataset.base = _FailsOn(tr.loader.dataset.base, bad, failing)
        rec = tr.step()
        out[failing] = {"bad": bad, "skipped": rec["skipped_samples"], "loss": rec["loss"], "groups": rec["degrees"],
                        "grads": rec["grads"]}
    return out


# the bundled samples' real pixels: InternVL's 448-px tiles (one image of several tiles), LLaVA-OneVision's 384-px
# video frames (a video longer than one rank's 400 tokens)
_VISUAL_RUNS = {"internvl": dict(global_batch_size=2, max_tokens=3400, tokens_per_rank=1700),
                "llava_onevision": dict(global_batch_size=4, max_tokens=800, tokens_per_rank=400)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", sorted(_VISUAL_RUNS))
def test_visual_sample_failing_on_one_rank_trains_like_failing_on_both(tmp_path, family):
    """Hugging Face InternVL on the bundled images' real 448-px tiles / LLaVA-OneVision on the bundled videos' 384-px
    frames, one degree-2 group: an image of several tiles (a video of several frames) that fails to read on one rank
    only is packed there as its skeleton (its tiles / frames as zeros), so the group's exchange still matches; the
    run goes on, and loss and every gradient equal the failure on both ranks to 1e-12 (float64; a hang would hit the
    launch timeout). Before skeletons covered InternVL this stopped the run with one SampleReadError on both ranks."""
    transformers_models()
    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / f"{family}-tiny.json"
    cfg = TrainConfig(model=f"hf:{config}", dtype="float64", steps=1, prefetch=0, verbose=False, return_grads=True,
                      cache_dir=str(tmp_path), **_VISUAL_RUNS[family])
    res = launch(_visual_partial_failures, 2, cfg, timeout=280.0, pg_timeout=120.0,
                 preload=("transformers.modeling_utils",))
    ref = res[0][(0, 1)]
    assert any(2 in mb for mb in ref["groups"]), ref["groups"]  # the sample's frames are split over a degree-2 group
    assert [r["index"] for r in ref["skipped"]] == [ref["bad"]]  # one record per sample of the step
    for failing in ((0,), (1,)):
        run = res[0][failing]
        assert run["bad"] == ref["bad"] and res[1][failing]["loss"] == run["loss"]
        assert [(r["index"], r["rank"]) for r in run["skipped"]] == [(ref["bad"], failing[0])]
        assert abs(run["loss"] - ref["loss"]) <= 1e-12 * abs(ref["loss"]), (failing, run["loss"], ref["loss"])
        top = max(float(np.abs(g).max()) for g in ref["grads"].values() if g is not None)
        for name, g in ref["grads"].items():
            got = run["grads"][name]
            assert (got is None) == (g is None), name
            if g is not None:
                assert float(np.abs(got - g).max()) <= 1e-12 * top, (failing, name)
