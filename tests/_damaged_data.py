"""Small indexes with samples that pass ``fcp index`` but fail when read (tests of ``FCPDataset``'s skipping).

``damaged_video_index``: one bundled webdataset shard in which some mp4s keep their header (the ``moov`` atom, so
the header probe indexes them) but have their frame data (``mdat`` payload) zeroed, so decoding them fails.
``edited_text_index``: bundled jsonl lines, some of them overwritten in place after indexing (same size: not JSON, or
JSON with another text, whose token count no longer matches the index).
"""

from __future__ import annotations

import json
import shutil
import struct
import tarfile
from pathlib import Path

from fcp_data._resources import data_path
from fcp_data.index import build_index


def _mdat_payload(data: bytes) -> tuple[int, int]:
    """``(start, end)`` of the top-level ``mdat`` atom's payload in an mp4."""
    pos = 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"mdat":
            return pos + 8, pos + size
        if size < 8:
            break
        pos += size
    raise ValueError("no mdat atom")


def damaged_video_index(root: Path, spec: str, every: int = 3, probe: str = "av") -> tuple[Path, list[str]]:
    """Index ``root/shard.tar`` (bundled shard 0 with every ``every``-th mp4's frame data zeroed) into
    ``root/index`` with ``probe``; returns the index and the damaged samples' keys."""
    root.mkdir(parents=True, exist_ok=True)
    tar = root / "shard.tar"
    shutil.copyfile(sorted((data_path("samples") / "wds").glob("*.tar"))[0], tar)
    with tarfile.open(tar) as tf:
        videos = [m for m in tf.getmembers() if m.name.endswith(".mp4")]
        damaged = videos[1::every]
        spans = []
        for m in damaged:
            lo, hi = _mdat_payload(tf.extractfile(m).read())
            spans.append((m.offset_data + lo, hi - lo))
    with open(tar, "r+b") as f:
        for off, n in spans:
            f.seek(off)
            f.write(bytes(n))
    out = root / "index"
    build_index([str(tar)], spec, str(out), progress=False, probe=probe, max_error_rate=1.0)
    return out, [m.name.rsplit(".", 1)[0] for m in damaged]


def _same_size_json(line: bytes) -> bytes:
    """A valid jsonl line of the same byte length as ``line`` whose text is one repeated letter (other tokens)."""
    obj = json.loads(line)
    body = json.dumps({"id": obj["id"], "text": ""}).encode()
    return body[:-2] + b"z" * (len(line) - 1 - len(body)) + b'"}\n'


def edited_text_index(root: Path, lines: int = 16, edit=(2, 7, 12), rewrite=()) -> tuple[Path, list[int]]:
    """Index the first ``lines`` bundled jsonl lines, then overwrite lines ``edit`` in place (not JSON any more) and
    lines ``rewrite`` with valid JSON of the same size but another text (another token count)."""
    root.mkdir(parents=True, exist_ok=True)
    src = (data_path("samples") / "text.jsonl").read_bytes().splitlines(keepends=True)[:lines]
    path = root / "text.jsonl"
    path.write_bytes(b"".join(src))
    out = root / "index"
    _, rc = build_index([str(path)], "text", str(out), progress=False)
    assert rc == 0
    path.write_bytes(b"".join(b"#" * (len(x) - 1) + b"\n" if k in edit else _same_size_json(x) if k in rewrite else x
                              for k, x in enumerate(src)))
    return out, sorted(set(edit) | set(rewrite))
