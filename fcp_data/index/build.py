"""Index one shard task (the per-shard function both engines run) and write its part file atomically.

Accounting invariant: for every task, ``indexed + errors == seen``; an unreadable shard counts as one seen
sample (its key is the shard path) and a shard that breaks off counts one ``truncated_shard`` error.
Blank jsonl lines are not samples.

Every per-sample failure (decode, probe, parse, tokenise, a limit of :class:`~fcp_data.index.limits.Limits`,
and any unexpected exception) is caught at the sample boundary and recorded with its reason and key; the
task goes on. Memory per task is bounded: jsonl lines are read up to ``max_text_bytes`` and tokenised in
batches of 512, media members are probed through a file window, never read whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import stat
import time
from pathlib import Path

import numpy as np

from fcp_data import text_tokens
from fcp_data.chat_media import has_media
from fcp_data.index.format import COLUMNS, KIND_TEXT, atomic_write_bytes
from fcp_data.index.inputs import DIR_CHUNK, expand_inputs, make_tasks
from fcp_data.index.limits import Limits, clean_detail, json_depth_exceeds, record_key, safe_key
from fcp_data.index.media_chat import index_media_chat, probe_plan
from fcp_data.index.probe import (IMAGE_EXTS, TEXT_EXTS, VIDEO_EXTS, MemberFile, ProbeError, iter_dir_samples,
                                  iter_tar_samples, split_key)
from fcp_data.index.records import check_unicode, jsonl_text
from fcp_data.index.textbatch import TextBatch

__all__ = ["expand_inputs", "make_tasks", "index_task", "task_fingerprint", "part_path", "EXIT_AFTER_ENV",
           "SLEEP_ENV", "DIR_CHUNK"]

EXIT_AFTER_ENV = "FCP_INDEX_EXIT_AFTER"  # test hook: a worker process os._exit()s after writing this many parts
SLEEP_ENV = "FCP_INDEX_TASK_SLEEP"  # test hook: seconds a worker sleeps before each task (keeps workers busy)
_done_in_process = 0
_INT_RANGE = {np.dtype(dt): np.iinfo(dt) for dt in COLUMNS.values() if np.issubdtype(dt, np.integer)}


def task_fingerprint(task: dict, cfg: dict) -> str:
    """What a finished part must match to be reused by ``--resume`` (the task includes its input's stamp)."""
    keep = {k: cfg.get(k) for k in ("spec_fingerprint", "probe", "text_field", "key_field", "limits")}
    # only when set: earlier parts keep their fingerprints (every chat build sets template_kwargs_field since stop 62:
    # --resume counts older chat parts again, counted without the lines' kwargs)
    for k in ("prompt_field", "chat_field", "chat_template", "media_root", "tools_field", "template_kwargs_field",
              "assistant_only_loss"):
        if cfg.get(k):
            keep[k] = cfg[k]
    return hashlib.sha256(json.dumps([task, keep], sort_keys=True).encode()).hexdigest()


class _Rows:
    def __init__(self):
        self.cols = {k: [] for k in COLUMNS}
        self.keys: list[str] = []
        self.members: list[list[tuple[str, int, int]]] = []
        self.errors: list[dict] = []

    def add(self, key: str, members: list[tuple[str, int, int]], **vals) -> None:
        if vals.get("num_tokens", 0) < 1:  # text that tokenizes to nothing: no sample to train (LengthIndex refuses 0)
            raise ProbeError("empty_sample", "0 tokens")
        for k, dt in COLUMNS.items():
            r = _INT_RANGE.get(np.dtype(dt))
            if r is not None and not r.min <= vals.get(k, 0) <= r.max:
                raise ProbeError("value_out_of_range", f"{k} = {vals[k]} does not fit {np.dtype(dt).name}")
        for k in COLUMNS:
            self.cols[k].append(vals.get(k, 0))
        self.keys.append(safe_key(key))
        self.members.append(members)

    def error(self, key: str, reason: str, detail: str = "", source: str = "") -> None:
        self.errors.append({"key": safe_key(key), "reason": reason, "detail": clean_detail(detail),
                            "source": safe_key(source)})

    def record(self, key: str, source: str, e: BaseException) -> None:
        """One sample's failure as an error record with a reason."""
        if isinstance(e, ProbeError):
            self.error(key, e.reason, e.detail, source)
        elif isinstance(e, RecursionError):
            self.error(key, "json_too_deep", "nested deeper than Python's parser allows", source)
        elif isinstance(e, MemoryError):
            self.error(key, "out_of_memory", "the sample did not fit in memory", source)
        elif isinstance(e, OSError):
            self.error(key, "unreadable_member", f"{type(e).__name__}: errno {e.errno} ({e.strerror})", source)
        else:  # a bug or an unforeseen input: recorded, the task goes on
            self.error(key, "unexpected_error", f"{type(e).__name__}: {e}", source)

    def guard(self, key: str, source: str, fn, *args) -> None:
        """Run ``fn(*args)`` for one sample; any failure becomes one error record."""
        try:
            fn(*args)
        except Exception as e:
            self.record(key, source, e)


def _decode_text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProbeError("bad_encoding", f"not UTF-8 at byte {e.start}") from None


def _parse_json(raw: bytes, limits: Limits):
    try:
        obj = json.loads(_decode_text(raw))
    except ValueError as e:  # JSONDecodeError, and huge integers past Python's digit limit
        raise ProbeError("bad_json", str(e)) from None
    if json_depth_exceeds(raw, obj, limits.max_json_depth):
        raise ProbeError("json_too_deep", f"nested deeper than --max-json-depth {limits.max_json_depth}")
    return obj


def _iter_lines(f, max_bytes: int):
    """``(start, body or None, length)`` per line; a line longer than ``max_bytes`` is skipped in chunks (None)."""
    offset = 0
    while True:
        line = f.readline(max_bytes + 2)
        if not line:
            return
        start, n = offset, len(line)
        if not line.endswith(b"\n") and n >= max_bytes + 2:
            while True:
                more = f.readline(1 << 20)
                n += len(more)
                if not more or more.endswith(b"\n"):
                    break
            offset += n
            yield start, None, n
            continue
        offset += n
        body = line.rstrip(b"\r\n")
        yield start, body, len(body)


def _regular_file(path: Path) -> None:
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ProbeError("unreadable_shard", "not a regular file (a fifo, socket, device or folder)")


def _index_jsonl(task: dict, cfg: dict, spec, rows: _Rows) -> int:
    path, seen, limits = Path(task["path"]), 0, Limits.from_dict(cfg.get("limits"))
    try:
        _regular_file(path)
        f = open(path, "rb")
    except (OSError, ProbeError) as e:
        rows.error(str(path), "unreadable_shard", getattr(e, "detail", None) or f"{type(e).__name__}: {e.strerror}", str(path))
        return 1
    batch = TextBatch(task, spec, rows, eos=not cfg.get("chat_field"))  # a chat template ends its turns itself
    with f:
        for lineno, (start, body, size) in enumerate(_iter_lines(f, limits.max_text_bytes), start=1):
            if body is not None and not body.strip():
                continue
            seen += 1
            key = f"{path.stem}:{lineno}"
            if lineno == 1 and body is not None and body.startswith(b"\xef\xbb\xbf"):  # a UTF-8 BOM: not part of the JSON
                start, body, size = start + 3, body[3:], size - 3
            if body is None:
                rows.error(key, "text_too_large", f"line of {size} bytes > --max-text-bytes {limits.max_text_bytes}",
                           str(path))
                continue
            try:
                obj = _parse_json(body, limits)
            except Exception as e:
                rows.record(key, str(path), e)
                continue
            index_record(obj, key, start, size, cfg, task, spec, rows, batch)
    batch.flush()
    return seen


def index_record(obj, key: str, start: int, size: int, cfg: dict, task: dict, spec, rows: _Rows, batch: TextBatch,
                 ext: str = "jsonl") -> None:
    """One parsed record (a jsonl line, a Parquet row): its key field names it; a chat with an image or video is
    probed and added at once, text goes to ``batch``; a failure is one error record."""
    try:
        key = record_key(obj, cfg["key_field"]) or key  # before the checks: an error is recorded under this key
        if cfg.get("chat_field") and isinstance(obj, dict) and any(has_media(obj, cfg[f]) for f in (
                "chat_field", "prompt_field") if cfg.get(f)):
            index_media_chat(key, start, size, obj, cfg, task, spec, rows, ext)  # probed and added here
            return
        text = jsonl_text(obj, cfg, spec)
    except Exception as e:
        rows.record(key, str(task["path"]), e)
        return
    batch.add(key, start, size, text)


def _read_text(read, ext: str, size: int, limits: Limits) -> bytes:
    too_large = f".{ext} of {{}} bytes > --max-text-bytes {limits.max_text_bytes}"
    if size > limits.max_text_bytes:
        raise ProbeError("text_too_large", too_large.format(size))
    data = read(ext)
    if len(data) > limits.max_text_bytes:  # a folder file that grew since it was listed
        raise ProbeError("text_too_large", too_large.format(f"over {len(data)}"))
    return data


def _index_media(key: str, members: dict, read, open_member, spec, cfg: dict, task: dict, rows: _Rows) -> None:
    from fcp_data.specs import count_segments

    limits = Limits.from_dict(cfg.get("limits"))
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
    if "json" in members:  # webdataset metadata: a sample whose .json cannot be parsed breaks the trainer's decoder
        _parse_json(_read_text(read, "json", members["json"][1], limits), limits)
    caption = _decode_text(_read_text(read, txt, members[txt][1], limits)) if txt else ""
    check_unicode(caption)
    # a caption follows its visual block (text_tokens.encode_after); a text sample is its input's start
    n_text = len(text_tokens.encode_after(spec, caption)[0] if media else spec.encode(caption)) if caption else 0
    if not media and not caption.strip():
        raise ProbeError("empty_sample", "empty text")
    vals = dict(kind=KIND_TEXT, num_visual_tokens=0)
    if media:
        with open_member(media) as src:
            plan, vals = probe_plan("video" if vid else "image", src, spec, cfg["probe"], limits)
    n_vis = count_segments(spec, plan.segments, at_start=True) if media else 0  # the block opens the sample
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
            _regular_file(path)
            fh = open(path, "rb")
            samples = iter_tar_samples(path)
            first = next(samples, None)
        except (OSError, ProbeError) as e:
            if fh is not None:
                fh.close()
            rows.error(str(path), "unreadable_shard", getattr(e, "detail", None) or f"{type(e).__name__}: {e.strerror}", str(path))
            return 1
        samples = itertools.chain([first] if first else [], samples)

        def reader(key, members):
            def read(ext):
                off, size = members[ext]
                fh.seek(off)
                data = fh.read(size)
                if len(data) != size:
                    raise ProbeError("truncated_member", f".{ext}: {len(data)} of {size} bytes")
                return data

            def open_member(ext):
                return MemberFile(fh, *members[ext])
            return read, open_member
    else:
        fh, limit = io.BytesIO(), Limits.from_dict(cfg.get("limits")).max_text_bytes
        samples = iter_dir_samples(path, task["entries"])
        names = {split_key(e[0]): e[0] for e in task["entries"]}  # (key, lower-cased ext) → the file's own name

        def reader(key, members):
            def read(ext):
                with open(path / names.get((key, ext), f"{key}.{ext}"), "rb") as f:
                    return f.read(limit + 1)

            def open_member(ext):  # a path: FFmpeg and pillow open the file themselves
                return contextlib.nullcontext(path / names.get((key, ext), f"{key}.{ext}"))
            return read, open_member
    with fh:
        for key, members, problem in samples:
            seen += 1
            if problem:
                reason, _, detail = problem.partition(": ")
                rows.error(key, reason, detail, str(path))
                continue
            rows.guard(key, str(path), _index_media, key, members, *reader(key, members), spec, cfg, task, rows)
    return seen


def part_path(out: Path, task_id: int) -> Path:
    return Path(out) / "parts" / f"{task_id:06d}.npz"


def _index_rows(task: dict, cfg: dict, spec) -> tuple[_Rows, int]:
    rows = _Rows()
    try:
        if task["kind"] == "parquet":
            from fcp_data.index.parquet import index_parquet

            seen = index_parquet(task, cfg, spec, rows)
        else:
            seen = _index_jsonl(task, cfg, spec, rows) if task["kind"] == "jsonl" else \
                _index_container(task, cfg, spec, rows)
    except Exception as e:  # safety net outside the per-sample guards: the shard is one error, the run goes on
        rows = _Rows()
        rows.error(task["path"], "shard_failed", f"{type(e).__name__}: {e}", task["path"])
        seen = 1
    return rows, seen


def index_task(task: dict, cfg: dict) -> dict:
    """Index one shard task and write its part file atomically; returns ``{"id", "seen", "indexed", "errors"}``.

    This is the function both engines run (a local process pool and Ray tasks).
    """
    global _done_in_process
    from fcp_data.specs import load_spec

    if os.environ.get(SLEEP_ENV):
        time.sleep(float(os.environ[SLEEP_ENV]))
    spec = load_spec(cfg["spec_path"], cfg.get("tokenizer"))
    # what the reader will need (an EOS after text and captions; conversations end their turns): refused, not indexed
    text_tokens.check_tokens(spec, eos=not cfg.get("chat_field") or task["kind"] in ("tar", "dir"))
    rows, seen = _index_rows(task, cfg, spec)
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
