"""Hostile media and inputs found by review: each test fails on the code before its fix.

- folder files with upper-case extensions (``IMG_0001.JPG``) are indexed and read under their own names;
- a video replaced by a shorter one, a jsonl whose lines were swapped: failed reads (``StaleSampleError``), not the
  wrong pixels or the wrong sample;
- a 16-bit greyscale PNG is scaled to 8 bits, not clipped white;
- a text-only chat line with ``"image": []`` is text;
- an empty Megatron ``.idx``/``.bin`` names its file; a ``.bin`` longer than its ``.idx`` warns;
- a run with nothing to index is refused (exit 2) and leaves no folder; an index already there is untouched;
- a video is decoded in chunks, with the values of a one-batch decode.
"""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from fcp_cli.main import main as cli_main
from fcp_data import FCPDataset, IndexedDataset
from fcp_data.index import LengthIndex, build_index
from fcp_data.read_errors import SkippedSample
from fcp_data.slots import StaleSampleError


def make_video(path: Path, n: int, w: int = 64, h: int = 48, fps: int = 8) -> Path:
    """An mpeg4 video of ``n`` frames whose frame k is a flat grey (7·k mod 256) with a gradient."""
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("mpeg4", rate=fps)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        ramp = np.linspace(0, 120, w, dtype=np.uint8)[None, :, None]
        for i in range(n):
            img = np.clip(np.full((h, w, 3), (i * 7) % 128, np.uint8) + ramp, 0, 255).astype(np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode(None):
            c.mux(p)
    return path


def make_image(path: Path, w: int = 64, h: int = 48, mode: str = "RGB", value=None) -> Path:
    from PIL import Image

    if mode == "I;16":
        Image.fromarray(np.full((h, w), value, dtype=np.uint16)).save(path)
    else:
        Image.new("RGB", (w, h), value or (200, 30, 7)).save(path)
    return path


def read_or_skip(ds, i: int):
    """``FCPDataset``'s outcome of sample ``i`` (a sample dict, or the SkippedSample of a failed read)."""
    from fcp_data.slots import MicroBatchMeta, SampleSlot

    n = int(ds.num_tokens[i]) if hasattr(ds, "num_tokens") else int(ds.index.num_tokens[i])
    meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=n,
                          ranks=(0,), cp_rank=0)
    got = FCPDataset(ds, retries=0, strict_lengths=False)[SampleSlot(index=i, num_tokens=n, length=n, meta=meta)]
    return got[0]


# ---------------------------------------------------------------- A: upper-case extensions in a folder


def test_upper_case_extensions_are_indexed_and_read(tmp_path):
    d = tmp_path / "media"
    d.mkdir()
    make_image(d / "IMG_0001.JPG")
    (d / "IMG_0001.TXT").write_text("a red picture")
    make_video(d / "CLIP.MP4", 12)
    make_image(d / "mixed.Png", value=(1, 2, 3))
    manifest, rc = build_index([str(d)], "qwen2-vl", tmp_path / "idx", progress=False)
    assert rc == 0 and manifest["num_errors"] == 0, manifest["errors_by_reason"]
    ds = IndexedDataset(tmp_path / "idx")
    assert sorted(ds.index.keys.tolist()) == ["CLIP", "IMG_0001", "mixed"]
    for i in range(len(ds)):
        s = ds[i]
        assert len(s["input_ids"]) == int(ds.index.num_tokens[i])
    cap = ds.index.keys.index_of("IMG_0001")
    assert "red" in ds.spec.tokenizer().decode(ds[cap]["input_ids"].tolist())


def test_two_files_differing_only_in_extension_case_are_one_error(tmp_path):
    d = tmp_path / "media"
    d.mkdir()
    make_image(d / "a.jpg")
    make_image(d / "a.JPG", value=(0, 0, 0))
    make_image(d / "b.png")
    manifest, _ = build_index([str(d)], "qwen2-vl", tmp_path / "idx", progress=False, max_error_rate=1.0)
    assert (manifest["num_samples"], manifest["errors_by_reason"]) == (1, {"duplicate_member": 1})


# ---------------------------------------------------------------- B: a video replaced by a shorter one


@pytest.mark.parametrize("frames", [5, 40])
def test_video_with_another_frame_count_is_a_stale_read(tmp_path, frames):
    d = tmp_path / "media"
    d.mkdir()
    make_video(d / "v.mp4", 24)
    build_index([str(d)], "qwen2-vl", tmp_path / "idx", progress=False)
    ds = IndexedDataset(tmp_path / "idx")
    assert ds[0]["pixel_values"].shape[0] > 0
    make_video(d / "v.mp4", frames)  # same size and fps: only the frame count tells
    with pytest.raises(StaleSampleError, match="changed since indexing"):
        ds[0]
    got = read_or_skip(ds, 0)
    assert isinstance(got, SkippedSample) and got.reason == "StaleSampleError", got


def test_a_frame_count_a_frame_apart_still_reads(tmp_path):
    """Decoders count a frame or two apart from the header the index read (edit lists, a trailing frame): within
    max(2, 1 %) frames the read goes on, the last frame standing in, as before the frame-count check."""
    d = tmp_path / "media"
    d.mkdir()
    make_video(d / "v.mp4", 24)
    build_index([str(d)], "qwen2-vl", tmp_path / "idx", progress=False)
    ds = IndexedDataset(tmp_path / "idx")
    want = ds[0]["pixel_values"]
    make_video(d / "v.mp4", 23)
    got = ds[0]["pixel_values"]
    assert got.shape == want.shape


def test_probe_decode_records_a_frame_count_the_decoder_does_not_see(tmp_path, monkeypatch):
    from fcp_data.index import probe

    make_video(tmp_path / "v.mp4", 24)
    with pytest.raises(probe.ProbeError, match="has 24 frames, not the 30 of its header"):
        probe.check_video_frames(str(tmp_path / "v.mp4"), [0, 29], num_frames=30)
    probe.check_video_frames(str(tmp_path / "v.mp4"), [0, 23], num_frames=24)


# ---------------------------------------------------------------- C: swapped jsonl lines


def _text_index(tmp_path, lines: list[dict], **kw) -> IndexedDataset:
    p = tmp_path / "a.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    manifest, rc = build_index([str(p)], "text", tmp_path / "idx", progress=False, **kw)
    assert rc == 0, manifest["errors_by_reason"]
    return IndexedDataset(tmp_path / "idx")


def test_swapped_jsonl_lines_are_a_stale_read(tmp_path):
    lines = [{"id": "a", "text": "alpha one"}, {"id": "b", "text": "bravo two"}, {"id": "c", "text": "charl three"}]
    ds = _text_index(tmp_path, lines)
    want = [ds[i]["input_ids"].tolist() for i in range(3)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [lines[1], lines[0], lines[2]]))
    ds = IndexedDataset(tmp_path / "idx")
    for i, key in enumerate(ds.index.keys):
        if key == "c":
            assert ds[i]["input_ids"].tolist() == want[i]
        else:
            with pytest.raises(StaleSampleError, match="another one"):
                ds[i]
            got = read_or_skip(ds, i)
            assert isinstance(got, SkippedSample) and got.reason == "StaleSampleError"


def test_jsonl_keys_made_from_line_numbers_still_read(tmp_path):
    lines = [{"text": "alpha one"}, {"id": 7, "text": "bravo two"}, {"id": None, "text": "x y z"}]
    ds = _text_index(tmp_path, lines)
    assert ds.index.keys.tolist() == ["a:1", "7", "a:3"]
    assert all(len(ds[i]["input_ids"]) == int(ds.index.num_tokens[i]) for i in range(3))
    # a line with an id where one without was indexed (same length, so the bytes parse): caught too
    other = {"id": 1, "text": ""}
    assert len(json.dumps(other)) == len(json.dumps(lines[0]))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [other, *lines[1:]]))
    with pytest.raises(StaleSampleError, match="'id' is '1'"):
        IndexedDataset(tmp_path / "idx")[0]


def test_jsonl_key_field_other_than_id(tmp_path):
    lines = [{"uid": "u1", "text": "alpha one"}, {"uid": "u2", "text": "bravo two"}]
    ds = _text_index(tmp_path, lines, key_field="uid")
    assert [ds[i]["input_ids"].numel() for i in range(2)] == [int(n) for n in ds.index.num_tokens]


# ---------------------------------------------------------------- D: 16-bit images


def test_16_bit_grey_png_is_scaled_not_clipped(tmp_path):
    from fcp_data.video import decode_image

    p = make_image(tmp_path / "g.png", mode="I;16", value=1000)
    arr = np.asarray(decode_image(str(p)))
    assert arr.shape == (48, 64, 3) and int(arr.max()) == int(arr.min()) == 1000 >> 8  # ~4/255, not 255
    assert int(np.asarray(decode_image(p.read_bytes())).max()) == 3
    full = make_image(tmp_path / "w.png", mode="I;16", value=65535)
    assert int(np.asarray(decode_image(str(full))).min()) == 255
    # read back through an index: the pixels of a dark image are dark
    d = tmp_path / "media"
    d.mkdir()
    make_image(d / "g.png", mode="I;16", value=1000)
    build_index([str(d)], "qwen2-vl", tmp_path / "idx", progress=False)
    ds = IndexedDataset(tmp_path / "idx")
    mean, std = ds.spec.vision["image_mean"][0], ds.spec.vision["image_std"][0]
    pix = ds[0]["pixel_values"].reshape(-1, 3, 2, 14, 14)[:, 0]
    assert torch.allclose(pix, torch.full_like(pix, (3 / 255 - mean) / std), atol=1e-5)


# ---------------------------------------------------------------- E: empty media lists in a chat line


def test_chat_line_with_an_empty_media_list_is_text(tmp_path):
    msgs = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "general kenobi"}]
    lines = [{"id": "a", "messages": msgs, "image": []}, {"id": "b", "messages": msgs, "video": [], "image": None},
             {"id": "c", "messages": msgs}]
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    manifest, rc = build_index([str(p)], "qwen2-vl", tmp_path / "idx", chat_field="messages", progress=False)
    assert rc == 0 and manifest["num_errors"] == 0, manifest["errors_by_reason"]
    ds = IndexedDataset(tmp_path / "idx")
    assert len({tuple(ds[i]["input_ids"].tolist()) for i in range(3)}) == 1
    assert ds.index.kind.tolist() == [0, 0, 0]


# ---------------------------------------------------------------- F: empty / over-long Megatron files


def _megatron(prefix: Path, docs: list[list[int]]) -> None:
    lens = np.array([len(d) for d in docs], np.int32)
    ptrs = np.concatenate([[0], np.cumsum(lens.astype(np.int64) * 2)[:-1]]).astype(np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(docs), len(docs) + 1))
        f.write(lens.tobytes() + ptrs.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())
    Path(f"{prefix}.bin").write_bytes(b"".join(np.asarray(d, np.uint16).tobytes() for d in docs))


def test_empty_megatron_files(tmp_path):
    from fcp_data.megatron_indexed import MegatronIndexedDocuments

    prefix = tmp_path / "c"
    _megatron(prefix, [[1, 2, 3], [4, 5]])
    Path(f"{prefix}.bin").write_bytes(b"")
    with pytest.warns(UserWarning, match=r"c\.bin: 2 document\(s\) lie past the end of the file \(0 bytes"):
        docs = MegatronIndexedDocuments(prefix)
    with pytest.raises(OSError, match="past the end"):
        docs[0]
    got = read_or_skip(docs, 1)
    assert isinstance(got, SkippedSample) and got.reason == "OSError"
    Path(f"{prefix}.idx").write_bytes(b"")
    with pytest.raises(ValueError, match=r"c\.idx: not a readable Megatron indexed dataset"):
        MegatronIndexedDocuments(prefix)


def test_megatron_bin_longer_than_its_idx_warns(tmp_path):
    from fcp_data.megatron_indexed import MegatronIndexedDocuments

    prefix = tmp_path / "c"
    _megatron(prefix, [[1, 2, 3], [4, 5]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MegatronIndexedDocuments(prefix)  # exact size: no warning
    with open(f"{prefix}.bin", "ab") as f:
        f.write(b"\1" * 7)
    with pytest.warns(UserWarning, match=r"c\.bin: 17 bytes, but .*c\.idx describes 10"):
        docs = MegatronIndexedDocuments(prefix)
    assert docs[1]["input_ids"].tolist() == [4, 5]


# ---------------------------------------------------------------- G: nothing to index


def test_nothing_to_index_is_refused_and_leaves_no_folder(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n\n")
    (tmp_path / "emptydir").mkdir()
    runs = [([str(tmp_path / "empty.jsonl"), str(tmp_path / "blank.jsonl")], "text"),
            ([str(tmp_path / "emptydir")], "qwen2-vl")]
    for inputs, spec in runs:
        out = tmp_path / "new" / "X"
        capsys.readouterr()
        assert cli_main(["index", *inputs, "--spec", spec, "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "no samples found" in err[0], err
        assert not (tmp_path / "new").exists()
    # an index already in OUT: untouched by a refused run
    (tmp_path / "good.jsonl").write_text('{"id": "a", "text": "some words"}\n')
    out = tmp_path / "idx"
    assert cli_main(["index", str(tmp_path / "good.jsonl"), "--spec", "text", "--out", str(out), "--no-progress"]) == 0
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    manifest = (out / "manifest.json").read_bytes()
    for inputs, spec in runs:
        assert cli_main(["index", *inputs, "--spec", spec, "--out", str(out), "--no-progress"]) == 2
    assert (out / "manifest.json").read_bytes() == manifest
    assert set(before) <= {p.name for p in out.iterdir()}
    assert len(LengthIndex.load(out)) == 1


# ---------------------------------------------------------------- H: chunked decode


def _one_batch_reference(spec, plan, path) -> torch.Tensor:
    """The pre-chunking Qwen-VL video path: every sampled frame decoded at once, one float copy, resized."""
    import decord

    from fcp_data.video import _normalize, _resize_bicubic, qwen_patchify

    v = spec.vision
    frames = decord.VideoReader(str(path), num_threads=1).get_batch(list(plan.frame_indices)).asnumpy()
    x = _resize_bicubic(torch.from_numpy(frames).permute(0, 3, 1, 2).float(), plan.resized)
    x = _normalize(x, v["image_mean"], v["image_std"])
    return qwen_patchify(x, v["patch_size"], v["merge_size"], v["temporal_patch_size"])[0]


@pytest.mark.parametrize("spec_name", ["qwen2-vl", "internvl3"])
def test_chunked_video_decode_equals_one_batch(tmp_path, spec_name):
    from fcp_data.specs import load_spec, plan_visual
    from fcp_data.video import iter_frames, vision_inputs

    path = make_video(tmp_path / "v.mp4", 30, w=92, h=60)
    spec = load_spec(spec_name)
    plan = plan_visual(spec, "video", height=60, width=92, num_frames=30, fps=8.0)
    chunks = [c.shape[0] for c in iter_frames(str(path), plan.frame_indices, 30, chunk_bytes=2 * 92 * 60 * 3)]
    assert chunks[0] == 1 and max(chunks) == 2 and sum(chunks) == len(plan.frame_indices)
    tiny = vision_inputs(spec, plan, str(path), 30, chunk_bytes=1)
    whole = vision_inputs(spec, plan, str(path), 30, chunk_bytes=1 << 40)
    assert torch.equal(tiny[0], whole[0]) and torch.equal(tiny[1], whole[1])
    if spec.family == "qwen-vl":
        assert torch.equal(tiny[0], _one_batch_reference(spec, plan, path))


def test_decord_messages_lose_every_time_stamp_layer(monkeypatch):
    """decord nests its "[hh:mm:ss] file.cc:line: " prefix once per layer that rethrows; only the first was stripped,
    so a recorded error's detail kept a wall-clock stamp and differed between runs of the same file (found by a review,
    stop 60). Reference: decord's message without any prefix."""
    decord = pytest.importorskip("decord")
    from fcp_data.video import VideoDecodeError, decode_frames

    def broken(*a, **k):
        raise decord.DECORDError("[13:55:26] /src/video/video_reader.cc:42: [13:55:27] /src/video/ffmpeg/threaded_"
                                 "decoder.cc:218: Check failed: avcodec_send_packet(x) >= 0 (-1 vs. 0)\nStack trace:")

    monkeypatch.setattr(decord, "VideoReader", broken)
    with pytest.raises(VideoDecodeError) as err:
        decode_frames(b"not a video", [0])
    assert str(err.value) == "cannot decode the video's frames (Check failed: avcodec_send_packet(x) >= 0 (-1 vs. 0))"
