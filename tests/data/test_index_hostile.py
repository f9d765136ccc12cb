"""Hostile input and failure for `fcp index` (issue 15): bad members never abort the run, limits are explicit,
no process outlives a killed run, a killed rebuild never mixes two indexes, --resume notices edited inputs.

The promise checked everywhere: every bad sample is an error record with its key and reason, indexed +
errors == seen, the index loads, good samples are indexed with the same values as when alone, the exit code
follows --max-error-rate. A failure names the input that broke that promise. Inputs are generated here.
"""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import os
import signal
import struct
import subprocess
import sys
import tarfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from fcp_data._resources import data_path
from fcp_cli.main import main as cli_main
from fcp_data.index import LengthIndex, build_index
from fcp_data.index.build import SLEEP_ENV
from fcp_data.index.store import KILL_AT_ENV, KILL_POINTS

SAMPLES = data_path("samples")
VISION_SPECS = ("qwen2-vl", "qwen3-vl", "internvl3", "llava-video")


def png(w: int, h: int) -> bytes:
    """A PNG whose header claims w x h pixels (tiny body: a decompression bomb when w*h is huge)."""
    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


def real_png(w: int, h: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), (w % 255, h % 255, 7)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def media() -> dict[str, bytes]:
    with tarfile.open(SAMPLES / "wds" / "shard-000000.tar") as tf:
        got = {ti.name: tf.extractfile(ti).read() for ti in tf}
    return {"mp4": got["clip-0000.mp4"], "mp4b": got["clip-0004.mp4"], "jpg": real_png(64, 48)}


def deep_json(depth: int) -> bytes:
    return b'{"a": ' + b"[" * depth + b"]" * depth + b"}"


def write_tar(path: Path, members: list[tuple[str, bytes]], **kw) -> None:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, **kw) as tar:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))


def write_dir(root: Path, members: list[tuple[str, bytes]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in members:
        (root / name).write_bytes(data)


def hostile_mix(media) -> list[tuple[str, bytes]]:
    """97 good samples (videos with captions, images) + a bomb, a truncated video and a deep-JSON sample."""
    good = []
    for i in range(97):
        if i % 4 == 0:
            good += [(f"g{i:03d}.mp4", media["mp4"] if i % 8 else media["mp4b"]), (f"g{i:03d}.txt", f"clip {i}".encode())]
        else:
            good += [(f"g{i:03d}.png", real_png(32 + i, 24 + i)), (f"g{i:03d}.json", json.dumps({"i": i}).encode())]
    bad = [("bomb.png", png(30000, 30000)), ("bomb.txt", b"a caption"),
           ("trunc.mp4", media["mp4"][: len(media["mp4"]) // 2]),
           ("deep.mp4", media["mp4"]), ("deep.json", deep_json(100_000))]
    return good[:40] + bad + good[40:]


EXPECTED_MIX = {"image_too_large": 1, "corrupt_video": 1, "json_too_deep": 1}


def run_cli(args: list[str], env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fcp_cli", "index", *args, "--no-progress"], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def check(out: Path, num_samples: int, reasons: dict) -> LengthIndex:
    ix = LengthIndex.load(out)
    m = ix.manifest
    assert (len(ix), m["num_errors"]) == (num_samples, sum(reasons.values())), (len(ix), m["errors_by_reason"])
    assert m["errors_by_reason"] == reasons
    assert m["num_samples"] + m["num_errors"] == m["num_seen"]
    assert all(e["key"] and e["reason"] and e["source"] for e in ix.errors)
    return ix


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["tar", "folder"])
def test_bomb_truncated_video_deep_json_and_97_good(tmp_path, media, kind):
    """The issue's case: 1 bomb, 1 truncated video, 1 deep-JSON sample among 97 good: 97 indexed, 3 errors, exit 0."""
    members = hostile_mix(media)
    src = tmp_path / "mix.tar"
    if kind == "tar":
        write_tar(src, members)
    else:
        src = tmp_path / "mix"
        write_dir(src, members)
    r = run_cli([str(src), "--spec", "qwen2-vl", "--out", str(tmp_path / "ix"), "--workers", "2", "--max-error-rate", "0.05"])
    assert r.returncode == 0, r.stderr
    ix = check(tmp_path / "ix", 97, EXPECTED_MIX)
    assert {e["key"]: e["reason"] for e in ix.errors} == {"bomb": "image_too_large", "trunc": "corrupt_video",
                                                          "deep": "json_too_deep"}
    assert "errors by reason: corrupt_video 1, image_too_large 1, json_too_deep 1" in r.stdout
    r = run_cli([str(src), "--spec", "qwen2-vl", "--out", str(tmp_path / "ix1")])  # default budget 1 %: exit 1
    assert r.returncode == 1 and "exceeds --max-error-rate" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("spec", VISION_SPECS)
def test_bomb_is_an_error_for_every_vision_spec(tmp_path, media, spec):
    """A decompression bomb in a tar and in a folder, for every vision spec: one image_too_large each, run goes on."""
    members = [("a.png", media["jpg"]), ("bomb.png", png(30000, 30000)), ("c.mp4", media["mp4"])]
    write_tar(tmp_path / "s.tar", members)
    write_dir(tmp_path / "d", members)
    _, rc = build_index([str(tmp_path / "s.tar"), str(tmp_path / "d")], spec, tmp_path / "ix", progress=False,
                        max_error_rate=0.5)
    assert rc == 0
    check(tmp_path / "ix", 4, {"image_too_large": 2})


@pytest.mark.timeout(30)
def test_lone_surrogates_in_jsonl(tmp_path):
    """Lone surrogates in the text are a bad_encoding error; in the id the key is escaped and the sample indexed."""
    (tmp_path / "s.jsonl").write_bytes(b'{"id": "a", "text": "bad \\ud800 text"}\n{"id": "b\\udc80", "text": "fine"}\n'
                                       b'{"id": "c", "text": "fine too"}\n')
    rc = cli_main(["index", str(tmp_path / "s.jsonl"), "--spec", "text", "--out", str(tmp_path / "ix"), "--no-progress",
                   "--max-error-rate", "0.5"])
    assert rc == 0
    ix = check(tmp_path / "ix", 2, {"bad_encoding": 1})
    assert ix.keys.tolist() == ["b\\udc80", "c"] and ix.errors[0]["key"] == "a"


@pytest.mark.timeout(30)
def test_non_utf8_names(tmp_path, media):
    """Non-UTF-8 member names: escaped and indexed in a tar (read by offset); a bad_name error in a folder."""
    write_tar(tmp_path / "s.tar", [("caf\udce9.png", media["jpg"]), ("ok.png", media["jpg"])],
              encoding="utf-8", errors="surrogateescape")
    d = tmp_path / "d"
    d.mkdir()
    try:
        (d / os.fsdecode(b"caf\xe9.png")).write_bytes(media["jpg"])
    except (OSError, UnicodeEncodeError):
        pytest.skip("this filesystem refuses non-UTF-8 names")
    (d / "ok.png").write_bytes(media["jpg"])
    rc = cli_main(["index", str(tmp_path / "s.tar"), str(d), "--spec", "qwen2-vl", "--out", str(tmp_path / "ix"),
                   "--no-progress", "--max-error-rate", "0.5"])
    assert rc == 0
    ix = check(tmp_path / "ix", 3, {"bad_name": 1})
    assert sorted(ix.keys) == ["caf\\udce9", "ok", "ok"] and ix.errors[0]["key"] == "caf\\udce9"


@pytest.mark.timeout(30)
def test_symlink_loop_and_dangling_link(tmp_path, media):
    """A link loop, a self-link and a dangling link are error records, counted as seen; good files are indexed."""
    d = tmp_path / "d"
    write_dir(d, [("a.png", media["jpg"])])
    (d / "sub").mkdir()
    (d / "sub" / "b.png").write_bytes(media["jpg"])
    os.symlink("..", d / "sub" / "up")          # a folder link back to an ancestor
    os.symlink("self.png", d / "self.png")      # resolves to itself (ELOOP)
    os.symlink("nowhere.png", d / "gone.png")   # dangling
    _, rc = build_index([str(d)], "qwen2-vl", tmp_path / "ix", progress=False, max_error_rate=1.0)
    ix = check(tmp_path / "ix", 2, {"broken_link": 1, "symlink_loop": 2})
    assert sorted(ix.keys) == ["a", "sub/b"]
    assert {e["key"]: e["reason"] for e in ix.errors} == {"gone": "broken_link", "self": "symlink_loop",
                                                          "sub/up": "symlink_loop"}


@pytest.mark.timeout(30)
def test_absurd_brace_range_exits_2_fast(tmp_path, capsys):
    """'shard-{0..99999999}.tar' is refused before anything is expanded: one line, exit 2, in well under a second."""
    t = time.perf_counter()
    rc = cli_main(["index", str(tmp_path / "shard-{0..99999999}.tar"), "--spec", "qwen2-vl", "--out",
                   str(tmp_path / "ix"), "--no-progress"])
    took = time.perf_counter() - t
    err = capsys.readouterr().err
    assert rc == 2 and took < 2.0, took
    assert err.count("\n") == 1 and "expands to 100,000,000 paths" in err


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for a reaper is dead
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_no_worker_outlives_a_sigkilled_parent(tmp_path):
    """SIGKILL of `fcp index --workers 2` while its workers are busy: no worker alive 5 s later."""
    for k in range(4):
        (tmp_path / f"t{k}.jsonl").write_text('{"text": "hello"}\n')
    p = subprocess.Popen([sys.executable, "-m", "fcp_cli", "index", str(tmp_path / "t*.jsonl"), "--spec", "text",
                          "--out", str(tmp_path / "ix"), "--workers", "2", "--no-progress"],
                         env={**os.environ, SLEEP_ENV: "60"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 40
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
            workers = _children(p.pid)
        assert len(workers) >= 2, "the pool never started"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        t = time.monotonic()
        while any(_alive(w) for w in workers) and time.monotonic() - t < 5:
            time.sleep(0.1)
        assert not [w for w in workers if _alive(w)], "workers outlived their killed parent"
    finally:
        for w in _children(p.pid):
            os.kill(w, signal.SIGKILL)
        if p.poll() is None:
            p.kill()


def _build_then_exit(inputs, out, point):
    os.environ[KILL_AT_ENV] = point
    build_index(inputs, "text", out, progress=False)
    os._exit(0)  # the point was never reached


def _snapshot(out: Path) -> tuple:
    ix = LengthIndex.load(out)
    return (ix.keys.tolist(), np.asarray(ix.num_tokens).tolist(), np.asarray(ix.offset).tolist(), ix.manifest["num_seen"],
            [e["key"] for e in ix.errors])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_during_rebuild_leaves_old_or_new_index(tmp_path, point):
    """A rebuild killed at every replace point: load raises or returns exactly the old index (exactly the new
    one once the manifest was replaced); never old metadata with new columns. The next build cleans up."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("".join(json.dumps({"id": f"a{i}", "text": "x " * i}) + "\n" for i in range(1, 6)) + "{bad\n")
    b.write_text("".join(json.dumps({"id": f"b{i}", "text": "yy " * (i * 3)}) + "\n" for i in range(1, 12)))
    build_index([str(b)], "text", tmp_path / "new", progress=False)
    new = _snapshot(tmp_path / "new")
    out = tmp_path / "ix"
    build_index([str(a)], "text", out, progress=False, max_error_rate=1.0)
    old = _snapshot(out)
    proc = mp.get_context("fork").Process(target=_build_then_exit, args=([str(b)], out, point))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 137, proc.exitcode
    try:
        got = _snapshot(out)
    except (ValueError, FileNotFoundError):
        got = None
    before_commit = KILL_POINTS.index(point) < KILL_POINTS.index("committed")
    assert got == (old if before_commit else new), point
    build_index([str(b)], "text", out, progress=False)
    assert _snapshot(out) == new
    left = sorted(p.name for p in out.iterdir())
    assert left[:1] == [".lock"] and left[2:] == ["errors.jsonl", "manifest.json", "parts"], left
    assert left[1] == LengthIndex.load(out).manifest["data"]  # the old data folder and the staging leftovers are gone


@pytest.mark.timeout(30)
def test_resume_reindexes_an_edited_input(tmp_path):
    """--resume reuses a part only while its input is unchanged (size + mtime): an edited jsonl is indexed again."""
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(3)))
    other = tmp_path / "u.jsonl"
    other.write_text(json.dumps({"text": "other"}) + "\n")
    build_index([str(src), str(other)], "text", tmp_path / "ix", progress=False)
    kept = (tmp_path / "ix" / "parts" / "000001.npz").stat().st_mtime_ns
    with open(src, "a") as f:
        f.write(json.dumps({"text": "line 3"}) + "\n")
    build_index([str(src), str(other)], "text", tmp_path / "ix", progress=False, resume=True)
    assert len(LengthIndex.load(tmp_path / "ix")) == 5
    assert (tmp_path / "ix" / "parts" / "000001.npz").stat().st_mtime_ns == kept  # the unchanged one was reused
    st = src.stat()
    src.write_text(src.read_text().replace("line 0", "LINE 0"))  # same size, new content
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    build_index([str(src), str(other)], "text", tmp_path / "ix", progress=False, resume=True)
    ix = LengthIndex.load(tmp_path / "ix")
    with open(src, "rb") as f:
        f.seek(int(ix.offset[0]))
        assert json.loads(f.read(int(ix.size[0])))["text"] == "LINE 0"


@pytest.mark.timeout(60)
def test_errors_jsonl_is_byte_identical_across_runs(tmp_path, media):
    """Two clean runs (1 and 2 workers) over corrupt media give byte-identical errors.jsonl (no addresses)."""
    members = [("a.png", b"\x89PNG garbage"), ("b.jpg", b"\xff\xd8\xff" + bytes(range(256)) * 3), ("c.mp4", b"\x00" * 999),
               ("d.mp4", media["mp4"][:3000]), ("e.webp", b"RIFF1234WEBPxxxx"), ("f.png", media["jpg"])]
    write_tar(tmp_path / "s.tar", members)
    write_dir(tmp_path / "d", members)
    inputs = [str(tmp_path / "s.tar"), str(tmp_path / "d")]
    build_index(inputs, "qwen2-vl", tmp_path / "x", progress=False, max_error_rate=1.0)
    build_index(inputs, "qwen2-vl", tmp_path / "y", progress=False, max_error_rate=1.0, workers=2)
    ex, ey = ((tmp_path / n / "errors.jsonl").read_bytes() for n in ("x", "y"))
    assert ex == ey and ex.count(b"\n") == 10
    assert b" at 0x" not in ex and b"object at" not in ex


def test_probe_decode_records_videos_damaged_behind_their_header(tmp_path):
    """Three mp4s of a shard keep their header but have their frame data zeroed. The header probe (default) indexes
    them (training then skips them when they fail to read); ``--probe decode`` decodes the frames a reader samples
    and records them as ``corrupt_video``, and indexes every other sample exactly as the header probe does."""
    from _damaged_data import damaged_video_index

    av_index, damaged = damaged_video_index(tmp_path / "av", "qwen2.5-vl", probe="av")
    dec_index, again = damaged_video_index(tmp_path / "dec", "qwen2.5-vl", probe="decode")
    assert again == damaged and len(damaged) == 3
    a, d = LengthIndex.load(av_index), LengthIndex.load(dec_index)
    assert len(a) == 11 and not (av_index / "errors.jsonl").read_text().strip()
    errors = [json.loads(x) for x in (dec_index / "errors.jsonl").read_text().splitlines()]
    assert sorted(e["key"] for e in errors) == sorted(damaged)
    assert all(e["reason"] == "corrupt_video" and e["detail"].startswith("frame data: cannot decode the video's frames (") for e in errors)
    assert list(d.keys) == [k for k in a.keys if k not in damaged]
    keep = np.array([k not in damaged for k in a.keys])
    for col in ("num_tokens", "num_visual_tokens", "num_frames", "height", "width"):
        assert np.array_equal(np.asarray(getattr(d, col)), np.asarray(getattr(a, col))[keep]), col
