"""Build a length index: expand inputs into shard tasks, index each shard (the per-shard function both engines
run), write per-shard parts atomically, then merge the parts in task order into the columnar index.

Accounting invariant: for every task, ``indexed + errors == seen``; an unreadable shard counts as one seen
sample (its key is the shard path) and a shard that breaks off counts one ``truncated_shard`` error.
Blank jsonl lines are not samples.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np

from fcp_data.index.format import COLUMNS, KIND_IMAGE, KIND_TEXT, KIND_VIDEO, atomic_write_bytes
from fcp_data.index.probe import (IMAGE_EXTS, TEXT_EXTS, VIDEO_EXTS, ProbeError, iter_dir_samples, iter_tar_samples,
                                  probe_image, probe_video, split_key)

__all__ = ["expand_inputs", "make_tasks", "index_task", "task_fingerprint", "part_path", "EXIT_AFTER_ENV", "DIR_CHUNK"]

EXIT_AFTER_ENV = "FCP_INDEX_EXIT_AFTER"  # test hook: a worker process os._exit()s after writing this many parts
DIR_CHUNK = 256  # samples per task for folder inputs
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_done_in_process = 0


def _expand_braces(s: str) -> list[str]:
    m = _BRACE.search(s)
    if not m:
        return [s]
    a, b = m.group(1), m.group(2)
    width = len(a) if a.startswith("0") or len(a) == len(b) else 0
    lo, hi = int(a), int(b)
    if hi < lo:
        raise ValueError(f"brace range {m.group(0)} in {s!r} is empty; write {{low..high}}")
    out = []
    for i in range(lo, hi + 1):
        out += _expand_braces(s[:m.start()] + str(i).zfill(width) + s[m.end():])
    return out


def expand_inputs(inputs: list[str]) -> list[dict]:
    """Sources ``[{"path", "kind"}]`` (kind ``jsonl``/``tar``/``dir``) from paths, globs and brace ranges.

    A brace-expanded or explicit path that does not exist is kept (it becomes an ``unreadable_shard``
    error, counted); a glob that matches nothing is a ValueError.
    """
    sources: list[dict] = []
    for item in inputs:
        for pat in _expand_braces(item):
            paths = sorted(glob.glob(pat)) if glob.has_magic(pat) else [pat]
            if not paths:
                raise ValueError(f"input {pat!r} matches no file; check the path or quote the glob")
            for p in paths:
                pp = Path(p)
                if pp.is_dir():
                    kind = "dir"
                elif pp.name.endswith((".jsonl", ".json.l", ".ndjson")):
                    kind = "jsonl"
                elif pp.name.endswith(".tar"):
                    kind = "tar"
                elif not pp.exists():
                    kind = "tar" if ".tar" in pp.name else "jsonl"
                else:
                    raise ValueError(f"input {p!r}: not a .jsonl file, a .tar shard or a folder")
                sources.append({"path": str(pp.resolve()), "kind": kind})
    if not sources:
        raise ValueError("no inputs given; pass jsonl files, tar shards (globs or {000..009} ranges) or folders")
    return sources


def make_tasks(sources: list[dict], dir_chunk: int = DIR_CHUNK) -> list[dict]:
    """One task per jsonl file and tar shard; folders are split into chunks of ``dir_chunk`` samples."""
    tasks: list[dict] = []
    for si, src in enumerate(sources):
        if src["kind"] != "dir":
            tasks.append({"id": len(tasks), "source": si, "kind": src["kind"], "path": src["path"]})
            continue
        root = Path(src["path"])
        files = sorted(str(p.relative_to(root)).replace(os.sep, "/") for p in root.rglob("*")
                       if p.is_file() and not p.name.startswith("."))
        keys: dict[str, list[str]] = {}
        for f in files:
            keys.setdefault(split_key(f)[0], []).append(f)
        groups = list(keys.values())
        for c in range(0, len(groups), dir_chunk):
            chunk = [f for g in groups[c:c + dir_chunk] for f in g]
            tasks.append({"id": len(tasks), "source": si, "kind": "dir", "path": src["path"], "files": chunk})
    return tasks


def task_fingerprint(task: dict, cfg: dict) -> str:
    """What a finished part must match to be reused by ``--resume``."""
    keep = {k: cfg[k] for k in ("spec_fingerprint", "probe", "text_field", "key_field")}
    return hashlib.sha256(json.dumps([task, keep], sort_keys=True).encode()).hexdigest()


class _Rows:
    def __init__(self):
        self.cols = {k: [] for k in COLUMNS}
        self.keys: list[str] = []
        self.members: list[list[tuple[str, int, int]]] = []
        self.errors: list[dict] = []

    def add(self, key: str, members: list[tuple[str, int, int]], **vals) -> None:
        for k in COLUMNS:
            self.cols[k].append(vals.get(k, 0))
        self.keys.append(key)
        self.members.append(members)

    def error(self, key: str, reason: str, detail: str = "", source: str = "") -> None:
        self.errors.append({"key": key, "reason": reason, "detail": detail, "source": source})


def _decode_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProbeError("bad_encoding", f"not UTF-8 at byte {e.start}") from None


def _index_jsonl(task: dict, cfg: dict, spec, rows: _Rows) -> int:
    path, seen = Path(task["path"]), 0
    texts: list[tuple[str, int]] = []
    try:
        f = open(path, "rb")
    except OSError as e:
        rows.error(str(path), "unreadable_shard", f"{type(e).__name__}: {e}", str(path))
        return 1
    with f:
        offset = 0
        for lineno, line in enumerate(f, start=1):
            start, offset = offset, offset + len(line)
            body = line.rstrip(b"\r\n")
            if not body.strip():
                continue
            seen += 1
            key = f"{path.stem}:{lineno}"
            try:
                obj = json.loads(_decode_text(body))
                if not isinstance(obj, dict):
                    raise ProbeError("bad_json", "line is not a JSON object")
                if isinstance(obj.get(cfg["key_field"]), (str, int)):
                    key = str(obj[cfg["key_field"]])
                text = obj.get(cfg["text_field"])
                if not isinstance(text, str):
                    raise ProbeError("missing_field", f"no string field {cfg['text_field']!r}")
                if not text.strip():
                    raise ProbeError("empty_sample", "empty text")
            except ProbeError as e:
                rows.error(key, e.reason, e.detail, str(path))
                continue
            except json.JSONDecodeError as e:
                rows.error(key, "bad_json", str(e), str(path))
                continue
            rows.add(key, [("jsonl", start, len(body))], offset=start, size=len(body), shard=task["source"],
                     kind=KIND_TEXT, eta=spec.eta)
            texts.append((text, len(rows.keys) - 1))
    tok, extra = spec.tokenizer(), (1 if spec.eos_id is not None else 0)
    for c in range(0, len(texts), 512):
        chunk = texts[c:c + 512]
        for (_, row), enc in zip(chunk, tok.encode_batch([t for t, _ in chunk], add_special_tokens=False)):
            rows.cols["num_tokens"][row] = len(enc.ids) + extra
    return seen


def _index_media(key: str, members: dict, read, spec, cfg: dict, task: dict, rows: _Rows) -> None:
    from fcp_data.specs import count_segments, plan_visual

    vid = next((e for e in VIDEO_EXTS if e in members), None)
    img = None if vid else next((e for e in IMAGE_EXTS if e in members), None)
    txt = next((e for e in TEXT_EXTS if e in members), None)
    media = vid or img
    if spec.is_multimodal and media is None:
        raise ProbeError("missing_member", f"no video/image member (has {', '.join(sorted(members)) or 'none'})")
    if not spec.is_multimodal and txt is None:
        raise ProbeError("missing_member", f"text spec needs a .txt member (has {', '.join(sorted(members))})")
    if media and not spec.is_multimodal:
        media = vid = img = None  # a text spec indexes only the caption/text member
    primary = media or txt
    if members[primary][1] <= 0:
        raise ProbeError("empty_sample", f"member .{primary} is empty")
    caption = _decode_text(read(txt)) if txt else ""
    n_text = len(spec.encode(caption)) if caption else 0
    if not media and not caption.strip():
        raise ProbeError("empty_sample", "empty text")
    vals = dict(kind=KIND_TEXT, num_visual_tokens=0)
    if vid:
        h = probe_video(read(vid) if task["kind"] == "tar" else Path(task["path"]) / f"{key}.{vid}", cfg["probe"])
        try:
            plan = plan_visual(spec, "video", height=h.height, width=h.width, num_frames=h.num_frames, fps=h.fps)
        except ValueError as e:
            raise ProbeError("unsupported_video", str(e)) from None
        vals = dict(kind=KIND_VIDEO, num_frames=h.num_frames, fps=h.fps, height=h.height, width=h.width)
    elif img:
        ih, iw = probe_image(read(img))
        try:
            plan = plan_visual(spec, "image", height=ih, width=iw)
        except ValueError as e:
            raise ProbeError("unsupported_image", str(e)) from None
        vals = dict(kind=KIND_IMAGE, num_frames=1, height=ih, width=iw)
    n_vis = count_segments(spec, plan.segments) if media else 0
    vals["num_visual_tokens"] = plan.num_visual_tokens if media else 0
    total = n_vis + n_text + (1 if spec.eos_id is not None else 0)
    mem = [(e, o, s) for e, (o, s) in members.items()]
    rows.add(key, mem, num_tokens=total, eta=spec.eta, shard=task["source"], offset=members[primary][0],
             size=members[primary][1], **vals)


def _index_container(task: dict, cfg: dict, spec, rows: _Rows) -> int:
    path, seen = Path(task["path"]), 0
    if task["kind"] == "tar":
        fh = None
        try:
            fh = open(path, "rb")
            it = iter_tar_samples(path)
            first = next(it, None)
        except (OSError, ProbeError) as e:
            if fh is not None:
                fh.close()
            rows.error(str(path), "unreadable_shard", getattr(e, "detail", None) or f"{type(e).__name__}: {e}", str(path))
            return 1
        samples = ([first] if first else []) + [s for s in it]

        def reader(key, members):
            def read(ext):
                off, size = members[ext]
                fh.seek(off)
                data = fh.read(size)
                if len(data) != size:
                    raise ProbeError("truncated_member", f".{ext}: {len(data)} of {size} bytes")
                return data
            return read
    else:
        fh = io.BytesIO()
        samples = list(iter_dir_samples(path, task["files"]))

        def reader(key, members):
            def read(ext):
                return (path / f"{key}.{ext}").read_bytes()
            return read
    with fh:
        for key, members, problem in samples:
            seen += 1
            if problem:
                reason, _, detail = problem.partition(": ")
                rows.error(key, reason, detail, str(path))
                continue
            try:
                _index_media(key, members, reader(key, members), spec, cfg, task, rows)
            except ProbeError as e:
                rows.error(key, e.reason, e.detail, str(path))
            except OSError as e:
                rows.error(key, "unreadable_member", f"{type(e).__name__}: {e}", str(path))
    return seen


def part_path(out: Path, task_id: int) -> Path:
    return Path(out) / "parts" / f"{task_id:06d}.npz"


def index_task(task: dict, cfg: dict) -> dict:
    """Index one shard task and write its part file atomically; returns ``{"id", "seen", "indexed", "errors"}``.

    This is the function both engines run (a local process pool and Ray tasks).
    """
    global _done_in_process
    from fcp_data.specs import load_spec

    spec = load_spec(cfg["spec_path"], cfg.get("tokenizer"))
    rows = _Rows()
    seen = _index_jsonl(task, cfg, spec, rows) if task["kind"] == "jsonl" else _index_container(task, cfg, spec, rows)
    n = len(rows.keys)
    if n + len(rows.errors) != seen:  # internal invariant of the accounting
        raise AssertionError(f"task {task['id']}: {n} indexed + {len(rows.errors)} errors != {seen} seen")
    exts = sorted({e for m in rows.members for e, _, _ in m})
    ext_id = {e: i for i, e in enumerate(exts)}
    key_bytes = [k.encode("utf-8") for k in rows.keys]
    arrays = {k: np.asarray(v, dtype=dt) for (k, v), dt in zip(rows.cols.items(), COLUMNS.values())}
    arrays["key_ptr"] = np.concatenate([[0], np.cumsum([len(b) for b in key_bytes], dtype=np.int64)]).astype(np.int64)
    arrays["key_bytes"] = np.frombuffer(b"".join(key_bytes), dtype=np.uint8)
    arrays["member_ptr"] = np.concatenate([[0], np.cumsum([len(m) for m in rows.members], dtype=np.int64)]).astype(np.int64)
    flat = [x for m in rows.members for x in m]
    arrays["member_ext"] = np.asarray([ext_id[e] for e, _, _ in flat], dtype=np.int16)
    arrays["member_offset"] = np.asarray([o for _, o, _ in flat], dtype=np.int64)
    arrays["member_size"] = np.asarray([s for _, _, s in flat], dtype=np.int64)
    meta = {"task": task["id"], "fingerprint": task_fingerprint(task, cfg), "seen": seen, "exts": exts, "errors": rows.errors}
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    out = part_path(Path(cfg["out"]), task["id"])
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, buf.getvalue())
    _done_in_process += 1
    limit = os.environ.get(EXIT_AFTER_ENV)
    if limit and _done_in_process >= int(limit):
        os._exit(17)  # simulated crash (tests only)
    return {"id": task["id"], "seen": seen, "indexed": n, "errors": len(rows.errors)}
