"""Commit a built index all-or-nothing, and keep two builds from writing the same folder at once.

``commit_index`` writes the columns and errors.jsonl into ``.staging-<pid>/``, renames it to
``data-<sha256 of its bytes>``, then atomically replaces ``manifest.json`` (which names that folder): the
single commit point. Only then are the old data folder and leftovers of killed builds removed. A process
killed at any of the named points below leaves ``LengthIndex.load`` returning exactly the old index (before
``committed``) or exactly the new one (from ``committed`` on); it never sees old metadata with new columns.

A Parquet index also has ``records/`` (its copies of the rows, which the reader reads; ``index/parquet.py``). A run
writes its copies into ``records.run/``; ``commit_index(..., records=...)`` moves that folder in right before the
manifest: ``records/`` renamed to ``records.old/``, ``records.run/`` (marked with the data folder's name) renamed to
``records/``, manifest, then ``records.old/`` removed. A run that does not commit never touches ``records/``. The
two renames and the manifest are three steps, so a process killed between them leaves them disagreeing until the
next build of the folder runs :func:`recover_records` (under the lock, first thing): a ``records/`` whose mark is
not the manifest's data folder is removed and ``records.old/`` is put back.

Kill points, in order (``FCP_INDEX_KILL_AT=<point>`` makes the process ``os._exit(137)`` there; tests only):
``columns`` (half the column files written), ``staged`` (staging folder complete), ``renamed`` (data folder
in place, manifest still old), ``records`` (``records/`` swapped, manifest still old), ``committed`` (manifest
replaced), ``linked`` (errors.jsonl link updated), ``cleanup`` (first old folder removed).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

from fcp_data.index.format import COLUMNS, RAGGED, atomic_write_bytes, fsync_dir, write_columns

__all__ = ["commit_index", "build_lock", "recover_records", "KILL_AT_ENV", "KILL_POINTS", "RECORDS", "RECORDS_RUN"]

KILL_AT_ENV = "FCP_INDEX_KILL_AT"
KILL_POINTS = ("columns", "staged", "renamed", "records", "committed", "linked", "cleanup")
RECORDS, RECORDS_RUN, RECORDS_OLD = "records", "records.run", "records.old"  # the committed copies, a run's, the last
_RECORDS_MARK = ".data"  # in records/: the data folder of the manifest it was committed with
_DATA_DIR = re.compile(r"^data-[0-9a-f]{16}$")


def _kill_point(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        os._exit(137)  # simulated SIGKILL (tests only)


def _cleanup(out: Path, keep: str) -> None:
    """Remove data folders other than ``keep``, staging leftovers and a format-1 index's top-level columns."""
    first = True
    for p in sorted(out.iterdir()):
        if p.name == keep:
            continue
        if p.is_dir() and not p.is_symlink() and (_DATA_DIR.match(p.name) or p.name.startswith(".staging-")):
            shutil.rmtree(p, ignore_errors=True)
        elif p.name in {f"{c}.npy" for c in (*COLUMNS, *RAGGED)} and p.is_file():
            p.unlink(missing_ok=True)
        else:
            continue
        if first:
            _kill_point("cleanup")
            first = False


def _link_errors(out: Path, data: str) -> None:
    """Point ``out/errors.jsonl`` at the data folder's (atomically); a copy where symlinks are not allowed."""
    link, tmp = out / "errors.jsonl", out / f".errors.jsonl.tmp{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(f"{data}/errors.jsonl", tmp)
        os.replace(tmp, link)
    except OSError:
        atomic_write_bytes(link, (out / data / "errors.jsonl").read_bytes())


def _committed_data(out: Path) -> str | None:
    try:
        return json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("data")
    except (OSError, ValueError, AttributeError):
        return None


def recover_records(out: Path) -> None:
    """Undo what a build killed inside the ``records/`` swap of :func:`commit_index` left (see the module doc)."""
    out = Path(out)
    cur, old = out / RECORDS, out / RECORDS_OLD
    mark = cur / _RECORDS_MARK
    if mark.is_file() and mark.read_text(encoding="utf-8").strip() != _committed_data(out):
        shutil.rmtree(cur)  # swapped in, but its manifest was never written
    if old.is_dir():
        shutil.rmtree(old) if cur.exists() else os.rename(old, cur)
        fsync_dir(out)


def _swap_records(out: Path, run: Path, data: str) -> None:
    """``run`` (a run's copies; empty when it made none) becomes ``out/records``, marked with ``data``; the previous
    one is ``out/records.old`` until the manifest is written. No copies before or now: nothing to do."""
    cur, old = out / RECORDS, out / RECORDS_OLD
    if not run.is_dir():
        if not cur.exists():
            return
        run.mkdir()  # the old copies must go with the old index
    atomic_write_bytes(run / _RECORDS_MARK, data.encode())
    shutil.rmtree(old, ignore_errors=True)
    if cur.exists():
        os.rename(cur, old)
    os.rename(run, cur)
    fsync_dir(out)


def commit_index(out: Path, cols: dict, errors: list[dict], manifest: dict, records: Path | None = None) -> dict:
    """Write one complete index into ``out`` and make it visible atomically; returns the manifest written.

    ``manifest`` gets ``data`` (the data folder) and ``column_bytes`` (sizes that ``load`` checks) added.
    ``records``: the run's folder of Parquet row copies, moved to ``out/records`` right before the manifest is
    written (a missing folder: the new index has no copies, the old ones go); None: ``out/records`` is left alone.
    """
    out = Path(out)
    staging = out / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    digest = hashlib.sha256()
    half = len(cols) // 2
    names = list(cols)
    sizes = write_columns(staging, cols, digest, on_column=lambda n: n == names[half - 1] and _kill_point("columns"))
    errors_bytes = "".join(json.dumps(e) + "\n" for e in errors).encode()
    digest.update(errors_bytes)
    atomic_write_bytes(staging / "errors.jsonl", errors_bytes)
    fsync_dir(staging)
    _kill_point("staged")
    data = f"data-{digest.hexdigest()[:16]}"
    if (out / data).is_dir():  # an identical build is already there (same bytes, same name)
        shutil.rmtree(staging)
    else:
        os.rename(staging, out / data)
    fsync_dir(out)
    _kill_point("renamed")
    if records is not None:
        _swap_records(out, Path(records), data)
    _kill_point("records")
    manifest = {**manifest, "data": data, "column_bytes": sizes}
    atomic_write_bytes(out / "manifest.json", (json.dumps(manifest, indent=1) + "\n").encode())
    _kill_point("committed")
    _link_errors(out, data)
    _kill_point("linked")
    shutil.rmtree(out / RECORDS_OLD, ignore_errors=True)
    _cleanup(out, data)
    return manifest


@contextlib.contextmanager
def build_lock(out: Path):
    """Hold ``out/.lock`` for a build; a second build of the same folder fails at once with a ValueError."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    f = open(Path(out) / ".lock", "a+")
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ValueError(f"another `fcp index` is writing {out} right now; wait for it to finish or use another --out") from None
        yield
    finally:
        f.close()
