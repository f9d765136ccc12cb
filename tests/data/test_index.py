"""Length index: build/load round trip on the bundled samples, folder vs tar inputs, probes, error accounting.

References: the token formulas recomputed from decord's own header values, bytes read by tarfile, token counts
from the tokenizer on the raw jsonl text. A failure means the index disagrees with its inputs, loses or
double-counts a sample, or lets a bad sample kill the job.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fcp_data._resources import data_path
from fcp_cli.main import main as cli_main
from fcp_data.index import KIND_IMAGE, KIND_TEXT, KIND_VIDEO, LengthIndex, build_index
from fcp_data.index.build import expand_inputs
from fcp_data.index.probe import probe_video
from fcp_data.specs import count_segments, load_spec, plan_visual

SAMPLES = data_path("samples")
SHARDS = str(SAMPLES / "wds" / "shard-{000000..000003}.tar")
TEXT = str(SAMPLES / "text.jsonl")


@pytest.fixture(scope="module")
def vl_index(tmp_path_factory) -> LengthIndex:
    out = tmp_path_factory.mktemp("idx") / "qwen2-vl"
    manifest, rc = build_index([SHARDS, TEXT], "qwen2-vl", out, workers=2, progress=False)
    assert rc == 0
    return LengthIndex.load(out)


def _tar_members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tf:
        return {ti.name: ti for ti in tf}


def test_round_trip_counts_and_offsets(vl_index):
    """Every sample of the bundled data is indexed once; columns agree with the raw inputs."""
    ix = vl_index
    spec = load_spec("qwen2-vl")
    n_text = sum(1 for line in open(TEXT, encoding="utf-8") if line.strip())
    members = {}
    for p in sorted((SAMPLES / "wds").glob("shard-*.tar")):
        members[str(p.resolve())] = _tar_members(p)
    n_media = sum(1 for m in members.values() for name in m if name.endswith((".mp4", ".jpg")))
    assert len(ix) == n_text + n_media == ix.manifest["num_samples"] == ix.manifest["num_seen"]
    assert ix.manifest["num_errors"] == 0 and ix.errors == []
    assert isinstance(ix.num_tokens, np.memmap)
    keys = ix.keys.tolist()
    assert len(set(keys)) == len(keys)
    tok = spec.tokenizer()
    lines = [json.loads(line) for line in open(TEXT, encoding="utf-8") if line.strip()]
    for i in range(len(ix)):
        src = ix.sources[int(ix.shard[i])]
        if ix.kind[i] == KIND_TEXT:
            doc = lines[int(keys[i].split("-")[1])]
            assert doc["id"] == keys[i]
            assert ix.num_tokens[i] == len(tok.encode(doc["text"], add_special_tokens=False).ids) + 1  # + EOS
            with open(src["path"], "rb") as f:
                f.seek(int(ix.offset[i]))
                assert json.loads(f.read(int(ix.size[i])))["id"] == keys[i]
            continue
        tar = members[src["path"]]
        for ext, (off, size) in ix.members(i).items():
            ti = tar[f"{keys[i]}.{ext}"]
            assert (off, size) == (ti.offset_data, ti.size)
        with open(src["path"], "rb") as f:
            f.seek(int(ix.offset[i]))
            data = f.read(int(ix.size[i]))
        caption = ""
        if "txt" in ix.members(i):
            with tarfile.open(src["path"]) as tf:
                caption = tf.extractfile(f"{keys[i]}.txt").read().decode()
        n_cap = len(tok.encode(caption, add_special_tokens=False).ids) + 1
        if ix.kind[i] == KIND_VIDEO:
            h = probe_video(data, "decord")  # the reader's view of the header
            assert (ix.num_frames[i], ix.height[i], ix.width[i]) == (h.num_frames, h.height, h.width)
            assert abs(ix.fps[i] - h.fps) < 1e-9
            plan = plan_visual(spec, "video", height=h.height, width=h.width, num_frames=h.num_frames, fps=h.fps)
        else:
            assert ix.kind[i] == KIND_IMAGE
            from PIL import Image

            w, hh = Image.open(io.BytesIO(data)).size
            plan = plan_visual(spec, "image", height=hh, width=w)
        assert ix.num_visual_tokens[i] == plan.num_visual_tokens
        assert ix.num_tokens[i] == count_segments(spec, plan.segments) + n_cap
    assert np.all(ix.eta[:] == 0.0)
    t = ix.manifest["tokens"]
    assert t["max"] == int(ix.num_tokens.max()) and t["p50"] <= t["p90"] <= t["p99"] <= t["max"]


def test_probes_agree_and_folder_equals_tar(tmp_path, vl_index):
    """decord and PyAV probes give the same index; a folder of the extracted files indexes like the tar shards."""
    by_decord, _ = build_index([SHARDS], "qwen2-vl", tmp_path / "dec", probe="decord", progress=False)
    a, b = LengthIndex.load(tmp_path / "dec"), vl_index
    rows_b = {k: i for i, k in enumerate(b.keys)}
    for i, k in enumerate(a.keys):
        j = rows_b[k]
        for col in ("num_tokens", "num_visual_tokens", "num_frames", "height", "width", "offset", "size"):
            assert getattr(a, col)[i] == getattr(b, col)[j], (k, col)
        assert abs(a.fps[i] - b.fps[j]) < 1e-9
    folder = tmp_path / "folder"
    for p in sorted((SAMPLES / "wds").glob("shard-*.tar")):
        with tarfile.open(p) as tf:
            tf.extractall(folder / "videos", filter="data")
    build_index([str(folder / "videos")], "qwen2-vl", tmp_path / "dir", progress=False)
    c = LengthIndex.load(tmp_path / "dir")
    assert sorted(c.keys) == sorted(a.keys)
    for i, k in enumerate(c.keys):
        assert c.num_tokens[i] == b.num_tokens[rows_b[k]], k
        assert set(c.members(i)) == set(b.members(rows_b[k]))


def test_input_expansion(tmp_path):
    """Brace ranges keep zero padding, globs sort, folders/jsonl/tar are told apart; an empty glob is an error."""
    src = expand_inputs([SHARDS, str(SAMPLES / "wds" / "shard-00000[23].tar"), TEXT, str(SAMPLES / "wds")])
    names = [Path(s["path"]).name for s in src]
    assert names[:6] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar", "shard-000003.tar",
                         "shard-000002.tar", "shard-000003.tar"]
    assert [s["kind"] for s in src[6:]] == ["jsonl", "dir"]
    with pytest.raises(ValueError, match="matches no file"):
        expand_inputs([str(tmp_path / "nothing-*.tar")])


def _add(tar, name, data: bytes):
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> tuple[list[str], dict[str, int]]:
    """Deliberately broken inputs; returns (inputs, expected errors by reason apart from the truncated shard's)."""
    d = tmp_path_factory.mktemp("bad")
    good = {}
    with tarfile.open(SAMPLES / "wds" / "shard-000000.tar") as tf:
        for ti in tf:
            good[ti.name] = tf.extractfile(ti).read()
    mp4 = good["clip-0000.mp4"]
    with tarfile.open(d / "bad-000000.tar", "w") as tar:
        _add(tar, "ok-1.mp4", mp4)
        _add(tar, "ok-1.txt", b"a fine caption")
        _add(tar, "garbage.mp4", os.urandom(4000))                      # corrupt_video
        _add(tar, "half.mp4", mp4[: len(mp4) // 2])                      # corrupt_video (truncated, no moov)
        _add(tar, "nomedia.txt", b"caption without its video")          # missing_member
        _add(tar, "empty.mp4", b"")                                      # empty_sample
        _add(tar, "latin1.mp4", mp4)
        _add(tar, "latin1.txt", "caf\xe9".encode("latin-1"))            # bad_encoding
        _add(tar, "badimg.jpg", b"\xff\xd8\xff" + os.urandom(100))       # corrupt_image
        _add(tar, "ok-2.jpg", good["img-0000.jpg"])
    full = (SAMPLES / "wds" / "shard-000001.tar").read_bytes()
    (d / "bad-000001.tar").write_bytes(full[: len(full) // 2 + 100])    # truncated shard
    (d / "bad-000002.tar").write_bytes(os.urandom(3000))                # unreadable_shard
    with open(d / "docs.jsonl", "wb") as f:
        f.write(b'{"id": "t1", "text": "hello world"}\n')
        f.write(b'{"id": "t2", "text": "caf\xe9 latin-1"}\n')           # bad_encoding
        f.write(b'{"id": "t3", "text": "   "}\n')                        # empty_sample
        f.write(b'{"id": "t4", "text": \n')                              # bad_json
        f.write(b'{"id": "t5", "body": "x"}\n')                          # missing_field
        f.write(b'\n')                                                   # blank line: not a sample
        f.write(b'{"id": "t6", "text": "the end"}\n')
    inputs = [str(d / "bad-{000000..000003}.tar"), str(d / "docs.jsonl")]  # 000003 does not exist: unreadable_shard
    expected = {"corrupt_video": 2, "missing_member": 1, "empty_sample": 2, "bad_encoding": 2, "corrupt_image": 1,
                "unreadable_shard": 2, "bad_json": 1, "missing_field": 1}
    return inputs, expected


def test_errors_are_recorded_counted_and_the_job_goes_on(tmp_path, bad_inputs):
    """Each kind of bad input lands in errors.jsonl with key and reason; indexed + errors == seen."""
    inputs, expected = bad_inputs
    manifest, rc = build_index(inputs, "qwen2-vl", tmp_path / "ix", progress=False, max_error_rate=1.0)
    assert rc == 0
    ix = LengthIndex.load(tmp_path / "ix")
    reasons = manifest["errors_by_reason"]
    truncated = {r: n for r, n in reasons.items() if r.startswith("truncated")}
    assert sum(truncated.values()) >= 1, reasons
    assert {r: n for r, n in reasons.items() if not r.startswith("truncated")} == expected
    assert len(ix) + len(ix.errors) == manifest["num_seen"]
    assert all(e["key"] and e["reason"] for e in ix.errors)
    keys = set(ix.keys)
    assert {"ok-1", "ok-2", "t1", "t6"} <= keys
    assert not keys & {"garbage", "half", "nomedia", "empty", "latin1", "badimg", "t2", "t3", "t4", "t5"}
    # the readable first half of the truncated shard is indexed, and all of it is accounted for
    with tarfile.open(SAMPLES / "wds" / "shard-000001.tar") as tf:
        n_in_shard = len({ti.name.split(".")[0] for ti in tf})
    from_truncated = sum(1 for i in range(len(ix)) if Path(ix.sources[int(ix.shard[i])]["path"]).name == "bad-000001.tar")
    assert 0 < from_truncated < n_in_shard


def test_exit_code_follows_max_error_rate(tmp_path, bad_inputs, capsys):
    """`fcp index` exits 1 above --max-error-rate (default 1 %) and 0 when the budget allows the errors."""
    inputs, _ = bad_inputs
    rc = cli_main(["index", *inputs, "--spec", "qwen2-vl", "--out", str(tmp_path / "a"), "--no-progress"])
    assert rc == 1
    assert "errors by reason" in capsys.readouterr().out
    rc = cli_main(["index", *inputs, "--spec", "qwen2-vl", "--out", str(tmp_path / "b"), "--no-progress",
                   "--max-error-rate", "0.9"])
    assert rc == 0
    assert cli_main(["index", TEXT, "--spec", "no-such-spec", "--out", str(tmp_path / "c")]) == 2


def test_text_spec_and_eta(tmp_path):
    """A text-only spec indexes jsonl; the bidirectional spec records eta = 1 for every row."""
    build_index([TEXT], "text-bidirectional", tmp_path / "t", progress=False)
    ix = LengthIndex.load(tmp_path / "t")
    assert len(ix) == 320 and np.all(ix.eta[:] == 1.0) and np.all(ix.num_visual_tokens[:] == 0)
    assert ix.manifest["tokens"]["max"] > 20 * ix.manifest["tokens"]["p50"]  # the long tail is there
