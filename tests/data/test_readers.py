"""Map-style readers: for every sample video and image of the bundled shards and every VLM family, the visual
tokens the reader produces equal the index's count, and the whole sequence has the index's length.

The index is built with the PyAV header probe; the reader decodes with decord, so agreement also checks the
probe against the decoder. Text samples decode back to their source text. A failure means a batch planned
from the index would not match the tensors the model receives.
"""

from __future__ import annotations

import json
import shutil
import tarfile

import numpy as np
import pytest
import torch

from fcp_data._resources import data_path
from fcp_data.index import KIND_IMAGE, KIND_TEXT, KIND_VIDEO, LengthIndex, build_index
from fcp_data.readers import IndexedDataset

SAMPLES = data_path("samples")
SHARDS = str(SAMPLES / "wds" / "shard-{000000..000003}.tar")


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, LengthIndex]:
    root = tmp_path_factory.mktemp("rd")
    out = {}
    for spec in ("qwen2-vl", "qwen3-vl", "internvl3", "llava-video"):
        build_index([SHARDS], spec, root / spec, progress=False, probe="av")
        out[spec] = LengthIndex.load(root / spec)
    return out


@pytest.mark.parametrize("spec", ["qwen2-vl", "qwen3-vl", "internvl3", "llava-video"])
def test_visual_tokens_equal_index_count_for_every_sample(indexes, spec):
    ix = indexes[spec]
    ds = IndexedDataset(ix)
    kinds = set()
    assert len(ds) == 42
    for i in range(len(ds)):
        s = ds[i]
        kinds.add(int(ix.kind[i]))
        ids = s["input_ids"]
        assert ids.dtype == torch.long and ids.ndim == 1
        assert len(ids) == ix.num_tokens[i], ix.keys[i]
        n_vis = int(np.isin(ids.numpy(), ds.placeholder_ids).sum())
        assert n_vis == ix.num_visual_tokens[i] > 0, ix.keys[i]
        assert ids[-1].item() == ds.eos_token_id
        pv, grid = s["pixel_values"], s["grid_thw"]
        assert grid.dtype == torch.long and grid.shape == (1, 3) and pv.dtype == torch.float32
        t, h, w = grid[0].tolist()
        if spec.startswith("qwen"):
            p = ds.spec.vision["patch_size"]
            assert pv.shape == (t * h * w, 3 * 2 * p * p)
            assert t * h * w // 4 == n_vis
            if ix.kind[i] == KIND_VIDEO:  # every temporal group holds two of the sampled frames
                assert t == -(-len(_plan(ds, i).frame_indices) // 2)
        elif spec == "internvl3":
            assert pv.shape == (t, 3, 448, 448) and t * h * w // 4 == n_vis
        else:
            assert pv.shape[0] == t and pv.shape[1:] == (3, 384, 384) and t * h * w == n_vis
        assert torch.isfinite(pv).all()
    assert kinds == {KIND_VIDEO, KIND_IMAGE}


def _plan(ds, i):
    from fcp_data.specs import plan_visual

    ix = ds.index
    return plan_visual(ds.spec, "video", height=int(ix.height[i]), width=int(ix.width[i]),
                       num_frames=int(ix.num_frames[i]), fps=float(ix.fps[i]))


def test_qwen_video_ids_layout(indexes):
    """Qwen2-VL video: <|vision_start|>, exactly N <|video_pad|>, <|vision_end|>, then caption ids and EOS."""
    ds = IndexedDataset(indexes["qwen2-vl"])
    i = next(i for i in range(len(ds)) if ds.index.kind[i] == KIND_VIDEO)
    ids = ds[i]["input_ids"].tolist()
    n = int(ds.index.num_visual_tokens[i])
    vs, ve = ds.spec.token_id("<|vision_start|>"), ds.spec.token_id("<|vision_end|>")
    assert ids[0] == vs and ids[1:n + 1] == [ds.video_token_id] * n and ids[n + 1] == ve
    with tarfile.open(ds.index.sources[int(ds.index.shard[i])]["path"]) as tf:
        caption = tf.extractfile(f"{ds.index.keys[i]}.txt").read().decode()
    assert ds.spec.tokenizer().decode(ids[n + 2:-1]) == caption


def test_text_samples_round_trip(tmp_path):
    """jsonl documents come back as their token ids (+ EOS) and decode to the original text."""
    build_index([str(SAMPLES / "text.jsonl")], "text", tmp_path / "t", progress=False)
    ds = IndexedDataset(tmp_path / "t")
    docs = [json.loads(line) for line in open(SAMPLES / "text.jsonl", encoding="utf-8")]
    for i in range(0, len(ds), 7):
        s = ds[i]
        assert set(s) == {"input_ids"} and len(s["input_ids"]) == ds.index.num_tokens[i]
        assert ds.spec.tokenizer().decode(s["input_ids"][:-1].tolist()) == docs[i]["text"]
    assert ds.placeholder_ids == ()


def test_reads_by_offset_without_scanning(tmp_path, indexes):
    """After indexing, clobber the shard's first tar header: a scanning reader would fail, the offset reader does not."""
    src = SAMPLES / "wds" / "shard-000000.tar"
    copy = tmp_path / "wds" / src.name
    copy.parent.mkdir()
    shutil.copy(src, copy)
    build_index([str(copy)], "qwen2-vl", tmp_path / "ix", progress=False)
    with open(copy, "r+b") as f:
        f.write(b"\x00garbage" * 64)  # the first 512-byte header
    with pytest.raises(tarfile.TarError):
        with tarfile.open(copy) as tf:
            tf.getmembers()
    ds = IndexedDataset(tmp_path / "ix")
    last = len(ds) - 1
    assert len(ds[last]["input_ids"]) == ds.index.num_tokens[last]


def test_dataloader_workers_and_spec_mismatch(indexes):
    """Samples survive DataLoader worker processes unchanged; a different spec than the index's is refused."""
    ds = IndexedDataset(indexes["qwen2-vl"])
    picks = [0, 5, 11, 41]
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, picks), batch_size=None, num_workers=2)
    for i, s in zip(picks, loader):
        ref = ds[i]
        assert torch.equal(s["input_ids"], ref["input_ids"]) and torch.equal(s["grid_thw"], ref["grid_thw"])
        assert torch.allclose(s["pixel_values"], ref["pixel_values"])
    with pytest.raises(ValueError, match="differs from the one the index"):
        IndexedDataset(indexes["qwen2-vl"], spec="qwen3-vl")
    assert ds.index.kind[0] != KIND_TEXT


def test_qwen_patches_hold_the_planned_frames(indexes):
    """Reference: frames decoded independently with PyAV (all frames, then the plan's indices), resized and
    normalised, then cut into patches by explicit indexing of the documented order (t, h/2, w/2, 2, 2 | C, tp, p, p).
    A failure means wrong frames, a wrong resize or a wrong patch layout."""
    import av

    from fcp_data.video import _normalize, _resize_bicubic

    ds = IndexedDataset(indexes["qwen2-vl"])
    for i in [i for i in range(len(ds)) if ds.index.kind[i] == KIND_VIDEO][:3]:
        s = ds[i]
        plan = _plan(ds, i)
        data = ds.read_member(i, "mp4")
        import io

        with av.open(io.BytesIO(data)) as c:
            all_frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        frames = torch.from_numpy(np.stack([all_frames[j] for j in plan.frame_indices])).permute(0, 3, 1, 2).float()
        frames = _normalize(_resize_bicubic(frames, plan.resized), ds.spec.vision["image_mean"], ds.spec.vision["image_std"])
        t, h, w = s["grid_thw"][0].tolist()
        p = 14
        worst = 0.0
        for row in range(t * h * w):
            ti, rest = divmod(row, h * w)
            bh, rest = divmod(rest, (w // 2) * 4)
            bw, rest = divmod(rest, 4)
            mh, mw = divmod(rest, 2)
            y, x = (bh * 2 + mh) * p, (bw * 2 + mw) * p
            ref = frames[2 * ti:2 * ti + 2, :, y:y + p, x:x + p].permute(1, 0, 2, 3).reshape(-1)
            diff = (s["pixel_values"][row] - ref).abs()
            assert diff.mean() < 0.05, (ds.index.keys[i], row, float(diff.mean()))
            worst = max(worst, float(diff.max()))
        assert worst < 0.5, (ds.index.keys[i], worst)  # decord vs PyAV RGB conversion differ by a few levels
