"""A catalogue of hostile inputs for `fcp index`, each checked against the same promise (issue 15).

Each case builds its input in a fresh folder and says what the index must hold: how many samples are indexed
and how many errors of each reason are recorded (indexed + errors == seen, the index loads, the run is not
aborted), or, for usage errors, exit code 2 with one line. The test runs every case, prints
"hostile cases: N tried, M behaved as promised" and fails naming each case that misbehaved; the numbers go
to docs/ROBUSTNESS.md. A failure means a bad input crashed, hung, was dropped silently or was miscounted.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from fcp_cli.main import main as cli_main
from fcp_data.index import LengthIndex, build_index
from fcp_data.index.format import COLUMNS, FORMAT_NAME, RAGGED, write_columns
from fcp_data.index.store import build_lock
from test_index_hostile import media, png, real_png, write_dir, write_tar  # noqa: F401  (media is a fixture)

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def jl(*objs) -> bytes:
    return b"".join((o if isinstance(o, bytes) else json.dumps(o).encode()) + b"\n" for o in objs)


def text_case(data: bytes, indexed: int, reasons: dict, **kw):
    def make(d: Path, media):
        (d / "t.jsonl").write_bytes(data)
        return dict(inputs=[str(d / "t.jsonl")], spec="text", indexed=indexed, reasons=reasons, **kw)
    return make


def tar_case(members, indexed: int, reasons: dict, **kw):
    def make(d: Path, media):
        write_tar(d / "s.tar", [(n, media[b] if isinstance(b, str) else b) for n, b in members])
        return dict(inputs=[str(d / "s.tar")], spec="qwen2-vl", indexed=indexed, reasons=reasons, **kw)
    return make


GOOD = {"id": "ok", "text": "a good line"}

# ---------------------------------------------------------------- jsonl
CASES.update({
    "line_is_an_array": text_case(jl([1, 2], GOOD), 1, {"bad_json": 1}),
    "line_is_null": text_case(jl(b"null", GOOD), 1, {"bad_json": 1}),
    "int_id_of_5000_digits": text_case(jl(b'{"id": ' + b"7" * 5000 + b', "text": "x"}', GOOD), 1, {"bad_json": 1}),
    "float_id_overflowing_to_inf": text_case(jl(b'{"id": 1e999, "text": "x"}', GOOD), 2, {}),
    "text_is_a_number": text_case(jl({"text": 12}, GOOD), 1, {"missing_field": 1}),
    "text_is_a_list": text_case(jl({"text": ["a"]}, GOOD), 1, {"missing_field": 1}),
    "text_field_missing": text_case(jl({"body": "x"}, GOOD), 1, {"missing_field": 1}),
    "text_only_whitespace": text_case(jl({"text": " \n\t "}, GOOD), 1, {"empty_sample": 1}),
    "nul_and_control_chars_in_text": text_case(jl({"text": "a\u0000b\u0007c\u202e"}), 1, {}),
    "last_line_without_newline": text_case(jl(GOOD) + json.dumps(GOOD).encode(), 2, {}),
    "binary_garbage_line": text_case(jl(bytes(range(128, 256)), GOOD), 1, {"bad_encoding": 1}),
    "truncated_json_line": text_case(jl(b'{"text": "abc', GOOD), 1, {"bad_json": 1}),
    "duplicate_ids": text_case(jl({"id": "x", "text": "a"}, {"id": "x", "text": "b"}), 2, {}),
    "id_is_an_object": text_case(jl({"id": {"a": 1}, "text": "a"}), 1, {}),
    "id_with_newline_and_slashes": text_case(jl({"id": "a/../b\nc", "text": "a"}), 1, {}),
    "line_nested_100k_deep": text_case(jl(b'{"text": "a", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", GOOD), 1,
                                       {"json_too_deep": 1}),
    "json_depth_at_and_past_limit": text_case(jl(b'{"text": "a", "x": ' + b"[" * 9 + b"]" * 9 + b"}",
                                                 b'{"text": "a", "x": ' + b"[" * 10 + b"]" * 10 + b"}"), 1,
                                              {"json_too_deep": 1}, limits={"max_json_depth": 10}),
})


@case
def crlf_lines_and_bom(d: Path, media):
    (d / "t.jsonl").write_bytes(b"\xef\xbb\xbf" + jl(GOOD).replace(b"\n", b"\r\n") + jl({"id": "z", "text": "q"}).replace(b"\n", b"\r\n"))

    def then(ix):
        for i in range(len(ix)):
            with open(d / "t.jsonl", "rb") as f:
                f.seek(int(ix.offset[i]))
                assert json.loads(f.read(int(ix.size[i])))["id"] == ix.keys[i]
    return dict(inputs=[str(d / "t.jsonl")], spec="text", indexed=2, reasons={}, then=then)


@case
def line_over_max_text_bytes(d: Path, media):
    (d / "t.jsonl").write_bytes(jl({"text": "x" * 5000}, {"id": "after", "text": "short"}))

    def then(ix):  # the long line was skipped without breaking the next line's offset
        with open(d / "t.jsonl", "rb") as f:
            f.seek(int(ix.offset[0]))
            assert json.loads(f.read(int(ix.size[0])))["id"] == "after"
    return dict(inputs=[str(d / "t.jsonl")], spec="text", indexed=1, reasons={"text_too_large": 1},
                limits={"max_text_bytes": 1000}, then=then)


@case
def fifo_as_jsonl_input(d: Path, media):
    os.mkfifo(d / "pipe.jsonl")
    (d / "t.jsonl").write_bytes(jl(GOOD))
    return dict(inputs=[str(d / "pipe.jsonl"), str(d / "t.jsonl")], spec="text", indexed=1,
                reasons={"unreadable_shard": 1})


@case
def missing_input_among_good(d: Path, media):
    (d / "t.jsonl").write_bytes(jl(GOOD))
    return dict(inputs=[str(d / "t.jsonl"), str(d / "gone.jsonl")], spec="text", indexed=1,
                reasons={"unreadable_shard": 1})


# ---------------------------------------------------------------- tar shards (qwen2-vl)
CASES.update({
    "zero_byte_video": tar_case([("a.mp4", b""), ("b.png", "jpg")], 1, {"empty_sample": 1}),
    "garbage_bytes_named_mp4": tar_case([("a.mp4", bytes(range(256)) * 20), ("b.png", "jpg")], 1, {"corrupt_video": 1}),
    "garbage_bytes_named_jpg": tar_case([("a.jpg", b"\xff\xd8\xff\xe0" + b"\x00" * 100), ("b.png", "jpg")], 1,
                                        {"corrupt_image": 1}),
    "binary_caption_txt": tar_case([("a.mp4", "mp4"), ("a.txt", b"\xff\xfe\x00bin"), ("b.png", "jpg")], 1,
                                   {"bad_encoding": 1}),
    "caption_with_utf8_encoded_surrogate": tar_case([("a.mp4", "mp4"), ("a.txt", b"x\xed\xa0\x80y"), ("b.png", "jpg")], 1,
                                                    {"bad_encoding": 1}),
    "caption_without_media": tar_case([("a.txt", b"just words"), ("b.png", "jpg")], 1, {"missing_member": 1}),
    "member_without_extension": tar_case([("README", b"hello"), ("b.png", "jpg")], 1, {"missing_member": 1}),
    "duplicate_member": tar_case([("a.png", "jpg"), ("a.png", "jpg"), ("b.png", "jpg")], 1, {"duplicate_member": 1}),
    "unparsable_json_member": tar_case([("a.png", "jpg"), ("a.json", b"{nope"), ("b.png", "jpg")], 1, {"bad_json": 1}),
    "huge_numbers_in_json_member": tar_case([("a.png", "jpg"), ("a.json", b'{"n": 1e400, "m": -1e400}'), ("b.png", "jpg")],
                                            2, {}),
    "caption_over_max_text_bytes": tar_case([("a.mp4", "mp4"), ("a.txt", b"w " * 200), ("b.png", "jpg")], 1,
                                            {"text_too_large": 1}, limits={"max_text_bytes": 100}),
    "one_pixel_image": tar_case([("a.png", real_png(1, 1))], 1, {}),
    "aspect_ratio_60000_to_1": tar_case([("a.png", png(60000, 1)), ("b.png", "jpg")], 1, {"unsupported_image": 1}),
    "png_header_claiming_0x0": tar_case([("a.png", png(0, 0)), ("b.png", "jpg")], 1, {"corrupt_image": 1}),
    "image_over_max_image_pixels": tar_case([("a.png", real_png(200, 200)), ("b.png", real_png(10, 10))], 1,
                                            {"image_too_large": 1}, limits={"max_image_pixels": 1000}),
    "video_over_max_frames": tar_case([("a.mp4", "mp4"), ("b.png", "jpg")], 1, {"too_many_frames": 1},
                                      limits={"max_frames": 3}),
    "video_over_max_duration": tar_case([("a.mp4", "mp4"), ("b.png", "jpg")], 1, {"video_too_long": 1},
                                        limits={"max_duration": 0.01}),
    "video_frame_over_max_image_pixels": tar_case([("a.mp4", "mp4"), ("b.png", real_png(10, 10))], 1,
                                                  {"frame_too_large": 1}, limits={"max_image_pixels": 1000}),
    "dotdot_member_name": tar_case([("../../evil.png", "jpg")], 1, {}),
})


@case
def symlink_member_in_tar(d: Path, media):
    with tarfile.open(d / "s.tar", "w") as tar:
        ti = tarfile.TarInfo("a.png")
        ti.type, ti.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(ti)
        ti = tarfile.TarInfo("b.png")
        ti.size = len(media["jpg"])
        tar.addfile(ti, io.BytesIO(media["jpg"]))
    return dict(inputs=[str(d / "s.tar")], spec="qwen2-vl", indexed=1, reasons={"not_a_file": 1})


@case
def zero_byte_and_garbage_tar_files(d: Path, media):
    (d / "a.tar").write_bytes(b"")
    (d / "b.tar").write_bytes(bytes(range(256)) * 40)
    write_tar(d / "c.tar", [("x.png", media["jpg"])])
    return dict(inputs=[str(d / "a.tar"), str(d / "b.tar"), str(d / "c.tar")], spec="qwen2-vl", indexed=1,
                reasons={"unreadable_shard": 2})


@case
def tar_cut_inside_a_header(d: Path, media):
    write_tar(d / "full.tar", [(f"x{i}.png", media["jpg"]) for i in range(4)])
    data = (d / "full.tar").read_bytes()
    cut = data.index(b"x2.png") + 100  # inside the third member's 512-byte header
    (d / "s.tar").write_bytes(data[:cut])
    return dict(inputs=[str(d / "s.tar")], spec="qwen2-vl", indexed=2, reasons={"truncated_shard": 1})


# ---------------------------------------------------------------- folders
@case
def fifo_named_mp4_in_folder(d: Path, media):
    write_dir(d / "f", [("ok.png", media["jpg"])])
    os.mkfifo(d / "f" / "pipe.mp4")
    return dict(inputs=[str(d / "f")], spec="qwen2-vl", indexed=1, reasons={"not_a_file": 1})


@case
def folder_named_like_a_video(d: Path, media):
    write_dir(d / "f" / "clip.mp4", [("inner.png", media["jpg"])])
    return dict(inputs=[str(d / "f")], spec="qwen2-vl", indexed=1, reasons={})


@case
def two_links_to_one_folder(d: Path, media):
    write_dir(d / "real", [("a.png", media["jpg"])])
    (d / "f").mkdir()
    os.symlink(d / "real", d / "f" / "l1")
    os.symlink(d / "real", d / "f" / "l2")
    return dict(inputs=[str(d / "f")], spec="qwen2-vl", indexed=1, reasons={"duplicate_dir": 1})


@case
def zero_byte_video_and_garbage_in_folder(d: Path, media):
    write_dir(d / "f", [("a.mp4", b""), ("b.mp4", b"\x00garbage" * 50), ("c.txt", b"no media"), ("d.png", media["jpg"])])
    return dict(inputs=[str(d / "f")], spec="qwen2-vl", indexed=1,
                reasons={"empty_sample": 1, "corrupt_video": 1, "missing_member": 1})


# ---------------------------------------------------------------- usage errors and the index folder itself
def usage_error(argv_fn, needle: str):
    def make(d: Path, media):
        def check(capsys):
            rc = cli_main(argv_fn(d))
            err = capsys.readouterr().err
            assert rc == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err, (rc, err)
        return check
    return make


def _argv(d: Path, *extra: str, inputs=None) -> list[str]:
    (d / "t.jsonl").write_bytes(jl(GOOD))
    return ["index", *(inputs or [str(d / "t.jsonl")]), "--spec", "text", "--out", str(d / "ix"), "--no-progress", *extra]


def _file_argv(d: Path, data: bytes) -> list[str]:
    (d / "e.jsonl").write_bytes(data)
    return _argv(d, inputs=[str(d / "e.jsonl")])


CASES.update({
    "seven_nested_brace_ranges": usage_error(lambda d: _argv(d, inputs=[str(d / ("{0..9}" * 7 + ".tar"))]), "expands to"),
    "max_frames_zero": usage_error(lambda d: _argv(d, "--max-frames", "0"), "--max-frames"),
    "max_frames_past_int32": usage_error(lambda d: _argv(d, "--max-frames", str(2**31)), "int32"),
    "max_duration_nan": usage_error(lambda d: _argv(d, "--max-duration", "nan"), "--max-duration"),
    "glob_matching_nothing": usage_error(lambda d: _argv(d, inputs=[str(d / "none-*.tar")]), "matches no file"),
    "out_is_a_file": usage_error(lambda d: (d / "ix").write_text("x") and _argv(d), "is a file"),
    "empty_folder": usage_error(lambda d: (d / "e").mkdir() or _argv(d, inputs=[str(d / "e")]), "no samples"),
    # nothing to index is refused like an empty folder (before, a 0-sample index was committed, exit 0)
    "empty_jsonl_file": usage_error(lambda d: _file_argv(d, b""), "no samples"),
    "blank_lines_only": usage_error(lambda d: _file_argv(d, b"\n  \n\t\r\n"), "no samples"),
})


@case
def concurrent_build_of_the_same_out(d: Path, media):
    def check(capsys):
        argv = _argv(d)
        (d / "ix").mkdir()
        with build_lock(d / "ix"):
            rc = cli_main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "another `fcp index` is writing" in err, err
        assert cli_main(argv) == 0  # and once the first is done, it builds
    return check


@case
def rebuild_over_a_format_1_index(d: Path, media):
    def check(capsys):
        out = d / "ix"
        cols = {k: np.zeros(1, dt) for k, dt in {**COLUMNS, **RAGGED}.items()}
        cols.update(key_ptr=np.array([0, 1]), key_bytes=np.frombuffer(b"k", np.uint8), member_ptr=np.array([0, 0]),
                    num_tokens=np.ones(1, COLUMNS["num_tokens"]))  # a sample has tokens (0 is a damaged index)
        write_columns(out, cols)
        (out / "manifest.json").write_text(json.dumps({"format": FORMAT_NAME, "version": 1, "num_samples": 1,
                                                       "num_errors": 0, "spec": {"name": "x"}, "exts": ["txt"],
                                                       "sources": [{"path": "gone.jsonl", "kind": "jsonl"}]}))
        assert LengthIndex.load(out).keys.tolist() == ["k"]  # format 1 still loads
        assert cli_main(_argv(d)) == 0
        ix = LengthIndex.load(out)
        assert ix.keys.tolist() == ["ok"] and ix.manifest["version"] == 2 and not list(out.glob("*.npy"))
    return check


def _run(name: str, d: Path, media, capsys) -> str | None:
    """None when the case behaved as promised, else what went wrong."""
    try:
        spec = CASES[name](d, media)
        if callable(spec):
            spec(capsys)
            return None
        _, rc = build_index(spec["inputs"], spec["spec"], d / "ix", progress=False, max_error_rate=1.0,
                            limits=spec.get("limits"))
        ix = LengthIndex.load(d / "ix")
        m = ix.manifest
        got = (len(ix), m["errors_by_reason"])
        if rc != 0 or got != (spec["indexed"], spec["reasons"]) or len(ix) + len(ix.errors) != m["num_seen"]:
            return f"indexed/errors {got}, expected {(spec['indexed'], spec['reasons'])}"
        if any(not (e["key"] and e["reason"]) for e in ix.errors):
            return "an error record without key or reason"
        if "then" in spec:
            spec["then"](ix)
        return None
    except Exception as e:  # noqa: BLE001 — any escape is a broken promise
        return f"{type(e).__name__}: {e}"


@pytest.mark.timeout(80)
def test_hostile_catalogue(tmp_path, media, capsys):
    failures = {}
    for name in CASES:
        d = tmp_path / name
        d.mkdir()
        why = _run(name, d, media, capsys)
        if why:
            failures[name] = why
    capsys.readouterr()
    with capsys.disabled():
        print(f"\nhostile cases: {len(CASES)} tried, {len(CASES) - len(failures)} behaved as promised")
    assert not failures, failures
    assert len(CASES) >= 20
