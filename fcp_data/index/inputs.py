"""Inputs of ``fcp index``: expand paths, globs and brace ranges into sources, walk folders, plan shard tasks.

A task is a plain dict (it crosses process and Ray boundaries) and carries a ``stamp`` of its input
(size + mtime of a jsonl file or tar shard; of every file of a folder chunk), so ``--resume`` reuses a
finished part only while its input is unchanged.

Folders are walked without trusting them: symlinks are followed, but a link back to a folder being walked
(``symlink_loop``), a second link to a folder already walked (``duplicate_dir``), a dangling link
(``broken_link``), an unreadable folder or file and anything that is not a regular file (fifo, socket,
device: ``not_a_file``) become entries with a reason, which the indexer records as errors. Hidden names
(starting with ``.``) are skipped, as before. An input path that is itself a symlink loop is kept like a missing
one (an ``unreadable_shard`` record; a run none of whose inputs exist is refused). :func:`prepare_out` refuses an
``--out`` that cannot be the index folder, in words, before anything is written.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Iterator

from fcp_data.index.probe import split_key

__all__ = ["expand_inputs", "make_tasks", "walk_folder", "source_stamp", "count_brace_paths", "unreadable_reason",
           "prepare_out", "MAX_INPUT_PATHS", "DIR_CHUNK"]

DIR_CHUNK = 256  # samples per task for folder inputs
MAX_INPUT_PATHS = 1_000_000  # brace ranges expanding to more paths are refused (use a glob)
_BRACE = re.compile(r"\{(\d+)\.\.(\d+)\}")


def count_brace_paths(s: str) -> int:
    """Paths the brace ranges of ``s`` expand to (product of the range sizes), computed without expanding."""
    n = 1
    for a, b in _BRACE.findall(s):
        n *= max(int(b) - int(a) + 1, 0)
    return n


def _expand_braces(s: str) -> Iterator[str]:
    m = _BRACE.search(s)
    if not m:
        yield s
        return
    a, b = m.group(1), m.group(2)
    width = len(a) if a.startswith("0") or len(a) == len(b) else 0
    lo, hi = int(a), int(b)
    if hi < lo:
        raise ValueError(f"brace range {m.group(0)} in {s!r} is empty; write {{low..high}}")
    for i in range(lo, hi + 1):
        yield from _expand_braces(s[:m.start()] + str(i).zfill(width) + s[m.end():])


def _brace_paths(item: str) -> list[str]:
    def too_many(n: str) -> ValueError:
        return ValueError(f"input {item!r} expands to {n} paths, more than {MAX_INPUT_PATHS:,}; use a glob "
                          "('shard-*.tar') or split the range over several runs")

    n = count_brace_paths(item)
    if n > MAX_INPUT_PATHS:
        raise too_many(f"{n:,}")
    out = []
    for p in _expand_braces(item):  # lazily, so a range that nesting makes larger still stops at the cap
        out.append(p)
        if len(out) > MAX_INPUT_PATHS:
            raise too_many(f"over {MAX_INPUT_PATHS:,}")
    return out


def expand_inputs(inputs: list[str]) -> list[dict]:
    """Sources ``[{"path", "kind"}]`` (kind ``jsonl``/``parquet``/``tar``/``dir``) from paths, globs and brace ranges.

    A brace-expanded or explicit path that does not exist, or a symlink loop, is kept (it becomes an
    ``unreadable_shard`` error, counted); a glob that matches nothing is a ValueError, and so is a brace range of
    more than ``MAX_INPUT_PATHS`` paths (counted before anything is expanded).
    """
    sources: list[dict] = []
    for item in inputs:
        for pat in _brace_paths(item):
            paths = sorted(glob.glob(pat)) if glob.has_magic(pat) else [pat]
            if not paths:
                raise ValueError(f"input {pat!r} matches no file; check the path or quote the glob")
            for p in paths:
                pp = Path(p)
                _not_megatron(pp)
                if pp.is_dir():
                    kind = "dir"
                elif pp.name.endswith((".jsonl", ".json.l", ".ndjson")):
                    kind = "jsonl"
                elif pp.name.endswith(".tar"):
                    kind = "tar"
                elif pp.name.endswith((".parquet", ".arrow")):
                    kind = "parquet"  # a table of records (fcp_data.index.parquet reads both)
                elif not pp.exists():
                    kind = "tar" if ".tar" in pp.name else "parquet" if ".parquet" in pp.name else "jsonl"
                else:
                    raise ValueError(f"input {p!r}: not a .jsonl, .parquet or .arrow file, a .tar shard or a folder")
                sources.append({"path": _absolute(pp), "kind": kind})
            if len(sources) > MAX_INPUT_PATHS:
                raise ValueError(f"the inputs name more than {MAX_INPUT_PATHS:,} shards; index them in several runs")
    if not sources:
        raise ValueError("no inputs given; pass jsonl files, tar shards (globs or {000..009} ranges) or folders")
    return sources


def _not_megatron(p: Path) -> None:
    """A Megatron indexed dataset (``PREFIX.idx`` / ``.bin``, or the prefix) is tokenized already: a ValueError
    that points to the reader that takes it as it is."""
    from fcp_data.megatron_indexed import is_megatron_index

    if p.name.endswith((".jsonl", ".json.l", ".ndjson", ".tar", ".parquet", ".arrow")) or p.is_dir() \
            or not is_megatron_index(p):
        return
    prefix = str(p.with_suffix("")) if p.suffix in (".idx", ".bin") else str(p)
    raise ValueError(f"input {str(p)!r} is a Megatron indexed dataset (tokenized already, its lengths in the .idx): "
                     f"train on it with fcp_data.megatron_indexed.MegatronIndexedDocuments({prefix!r}) and plan "
                     f"with fcp plan/simulate --lengths {prefix}.idx; fcp index is for jsonl, Parquet, tar shards "
                     "and folders")


def _absolute(p: Path) -> str:
    """``p`` with its links resolved; a symlink loop cannot be resolved (pathlib raises RuntimeError) and is kept
    as its absolute path, so that its task records it as an ``unreadable_shard`` like a missing file."""
    try:
        return str(p.resolve())
    except (RuntimeError, OSError):
        return os.path.abspath(p)


def unreadable_reason(path: str | Path) -> str:
    """Why an input cannot be opened, in words (for a run none of whose inputs can be read)."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a symlink loop"
        if e.errno == errno.ENOENT:
            return "a dangling symlink" if os.path.islink(path) else "not found"
        return os.strerror(e.errno or 0).lower()
    return "readable"


def prepare_out(out: Path, sources: list[dict]) -> Path:
    """``out`` created as the index folder, or a ValueError that says in words why it cannot be: a file, a link
    that leads nowhere, a path under a file, or a folder overlapping an input folder (inside one, the next run
    reads the index's own files as samples; containing one, a rebuild's cleanup of ``parts/``/``records/`` runs
    among the inputs)."""
    try:
        real = out.resolve()
    except (RuntimeError, OSError):  # pathlib: RuntimeError "Symlink loop" (3.11), OSError ELOOP (later)
        raise ValueError(f"--out {out} is a symlink loop (a link that leads back to itself); give a folder") from None
    if os.path.islink(out) and not out.exists():
        raise ValueError(f"--out {out} is a symlink to {os.readlink(out)}, which does not exist; create that folder "
                         "or give another --out")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder for the index")
    for src in (Path(s["path"]) for s in sources if s["kind"] == "dir"):
        if real == src or src in real.parents:
            where = "is the input folder" if real == src else "is inside the input folder"
            raise ValueError(f"--out {out} {where} {src}: a later run would index the index's own files; put the "
                             "index outside its inputs")
        if real in src.parents:
            raise ValueError(f"--out {out} contains the input folder {src}: the index's files and folders would mix "
                             "with the inputs; put the index outside its inputs")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        blocker = next((p for p in reversed(out.absolute().parents) if p.exists() and not p.is_dir()), None)
        if e.errno == errno.ENOTDIR and blocker is not None:
            raise ValueError(f"--out {out}: {blocker} is a file, not a folder, so the index folder cannot be "
                             "created under it") from None
        raise ValueError(f"--out {out}: cannot create the index folder ({e.strerror or e})") from None
    return out


def source_stamp(path: str | Path) -> list:
    """``[size, mtime_ns]`` of a file (``[-1, -1]`` when it cannot be stat'ed): what --resume checks."""
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [-1, -1]


def _link_problem(err: OSError, is_link: bool) -> tuple[str, str]:
    if err.errno == errno.ELOOP:
        return "symlink_loop", "the link resolves to itself (ELOOP)"
    if is_link and err.errno == errno.ENOENT:
        return "broken_link", "the link target does not exist"
    return "unreadable_file", f"{type(err).__name__}: errno {err.errno} ({os.strerror(err.errno or 0)})"


def walk_folder(root: str | Path) -> list[list]:
    """Every non-hidden entry under ``root``, sorted by relative path (``/``-separated).

    Regular files give ``[rel, size, mtime_ns]``; entries that cannot be samples give ``[rel, reason, detail]``
    (see the module docstring). Symlinked folders are followed once; loops never recurse.
    """
    root = Path(root)
    out: list[list] = []
    st = os.stat(root)
    stack = [("", str(root), ((st.st_dev, st.st_ino),))]
    seen = {(st.st_dev, st.st_ino)}
    while stack:
        rel_dir, path, ancestors = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            out.append([rel_dir or ".", "unreadable_dir", f"{type(e).__name__}: errno {e.errno} ({os.strerror(e.errno or 0)})"])
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            try:
                is_link = e.is_symlink()
                est = os.stat(e.path)  # follows links
            except OSError as err:
                out.append([rel, *_link_problem(err, is_link)])
                continue
            if stat.S_ISDIR(est.st_mode):
                ident = (est.st_dev, est.st_ino)
                if ident in ancestors:
                    out.append([rel, "symlink_loop", "the link points back to a folder that contains it"])
                elif ident in seen:
                    out.append([rel, "duplicate_dir", "a folder already indexed through another path"])
                else:
                    seen.add(ident)
                    stack.append((rel, e.path, ancestors + (ident,)))
            elif stat.S_ISREG(est.st_mode):
                out.append([rel, est.st_size, est.st_mtime_ns])
            else:
                out.append([rel, "not_a_file", "a fifo, socket or device, not a regular file"])
    out.sort(key=lambda x: x[0])
    return out


def make_tasks(sources: list[dict], dir_chunk: int = DIR_CHUNK) -> list[dict]:
    """One task per jsonl file and tar shard; folders are split into chunks of ``dir_chunk`` samples, Parquet/Arrow
    files into runs of whole row groups (:func:`fcp_data.index.parquet.parquet_pieces`)."""
    tasks: list[dict] = []
    for si, src in enumerate(sources):
        if src["kind"] == "parquet":  # whole row groups, about TASK_ROWS rows per task
            from fcp_data.index.parquet import parquet_pieces

            stamp = source_stamp(src["path"])
            for g0, g1, first in parquet_pieces(src["path"]):
                tasks.append({"id": len(tasks), "source": si, "kind": "parquet", "path": src["path"], "stamp": stamp,
                              "row_groups": [g0, g1], "first_row": first})
            continue
        if src["kind"] != "dir":
            tasks.append({"id": len(tasks), "source": si, "kind": src["kind"], "path": src["path"],
                          "stamp": source_stamp(src["path"])})
            continue
        keys: dict[str, list[list]] = {}
        for entry in walk_folder(src["path"]):
            keys.setdefault(split_key(entry[0])[0], []).append(entry)
        groups = list(keys.values())
        for c in range(0, len(groups), dir_chunk):
            chunk = [f for g in groups[c:c + dir_chunk] for f in g]
            stamp = hashlib.sha256(json.dumps(chunk).encode()).hexdigest()
            tasks.append({"id": len(tasks), "source": si, "kind": "dir", "path": src["path"], "entries": chunk,
                          "stamp": stamp})
    return tasks
