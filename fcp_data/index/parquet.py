"""Parquet inputs of ``fcp index`` (how Hugging Face datasets ship; also the ``.arrow`` files of ``save_to_disk``
and the datasets cache): one row is one record, read as a jsonl line would be (``--text-field``, ``--prompt-field``, ``--chat-field``; an image/video cell ``{"bytes", "path"}`` is
read from its bytes).

Random access: a Parquet row group is compressed and decoded whole, so reading one shuffled row at a time would
decode thousands of rows per sample. While indexing, the rows are therefore also written, uncompressed, to an
Arrow IPC file in the index (``OUT/records/``, batches of ``BATCH_ROWS`` rows) that the reader
memory-maps: a row is a zero-copy slice (as Hugging Face datasets' Arrow cache does). The disk cost is the rows'
uncompressed size; the Parquet file is not read after indexing (the index holds the snapshot it counted). Rows
whose copy was deleted are read from the Parquet file again, keeping its last decoded row groups. A big file is
indexed by several tasks (whole row groups, about ``TASK_ROWS`` rows each), each writing the copy of its rows
(``<source>-<first row>.arrow``).

A run's tasks write their copies into ``OUT/records.run/``, never into the committed ``OUT/records/``: the run's
index takes them along when it is committed (``store.commit_index``); a run that is rejected (``--max-error-rate``)
or refused leaves the index there reading exactly its own rows, and its ``records.run/`` is removed. An interrupted
run's ``records.run/`` stays for ``--resume`` (a non-resume run clears it). Each copy carries its task's identity
(schema metadata ``fcp_task``): ``--resume`` reuses a finished task only with a copy of that very task, from
``records.run/`` or (hard-linked) from the committed ``records/``; otherwise the task runs again.

The index addresses a row by its position in the file (the member ``parquet`` holds ``(row, 1)``). A row without a
``--key-field`` is keyed ``<file stem>:<row>`` (0-based). A file pyarrow cannot open is one ``unreadable_shard``
error; a row group it cannot decode is one error per row of it (null rows hold its place in the records file).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import OrderedDict
from pathlib import Path

__all__ = ["index_parquet", "parquet_pieces", "ParquetRows", "records_path", "records_of", "records_ready",
           "BATCH_ROWS", "TASK_ROWS"]

BATCH_ROWS = 256  # rows per record batch of the records file (a read slices one batch)
TASK_ROWS = 50_000  # rows per indexing task of a Parquet/Arrow file (whole row groups; a big file is shared)


def _open(path):
    """A Parquet file, or an Arrow file seen through the same slice of ``ParquetFile``'s API."""
    try:
        import pyarrow.parquet as pq
    except ImportError:  # an optional dependency: one clear line, not a traceback
        raise ValueError("reading .parquet/.arrow needs pyarrow: pip install 'fcp[parquet]' (or pyarrow)") from None
    return _ArrowFile(path) if str(path).endswith(".arrow") else pq.ParquetFile(path)


class _ArrowFile:
    """A Hugging Face datasets Arrow file (the IPC stream ``save_to_disk`` and the datasets cache write, or an IPC
    file), memory-mapped, its record batches standing for row groups: ``schema_arrow``, ``metadata.num_row_groups``,
    ``metadata.row_group(g).num_rows``, ``read_row_group(g)``."""

    def __init__(self, path) -> None:
        import pyarrow as pa

        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path)))
        except pa.ArrowInvalid:  # not the file format: the stream format
            reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        table = reader.read_all()  # zero-copy over the map
        self._pa, self.schema_arrow, self._batches = pa, table.schema, table.to_batches()
        self.metadata = self

    @property
    def num_row_groups(self) -> int:
        return len(self._batches)

    def row_group(self, g: int):
        return self._batches[g]

    def read_row_group(self, g: int):
        return self._pa.Table.from_batches([self._batches[g]], schema=self.schema_arrow)

    def close(self) -> None:
        self._batches = []


def _too_large(obj: dict, limits) -> str | None:
    """Why a row is refused by the text limits (its JSON size or nesting), else None."""
    from fcp_data.index.limits import json_depth_exceeds

    raw = json.dumps(obj, default=str, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(raw) > limits.max_text_bytes:
        return f"row of {len(raw)} bytes (as JSON) > --max-text-bytes {limits.max_text_bytes}"
    if json_depth_exceeds(raw, obj, limits.max_json_depth):
        return f"nested deeper than --max-json-depth {limits.max_json_depth}"
    return None


def records_path(out: str | Path, source: int, first_row: int = 0, folder: str = "records") -> Path:
    """The Arrow copy, inside index ``out``, of source ``source``'s rows from ``first_row`` (one file per task);
    ``folder``: ``records`` (the committed index's) or ``records.run`` (the running build's)."""
    return Path(out) / folder / f"{source:06d}-{first_row:012d}.arrow"


_TASK_META = b"fcp_task"


def _task_id(task: dict) -> str:
    return hashlib.sha256(json.dumps(task, sort_keys=True).encode()).hexdigest()


def _copy_of(path: Path) -> str | None:
    """The identity of the task that wrote the copy ``path`` (None: no such copy, or not one of ours)."""
    try:
        import pyarrow as pa

        with pa.memory_map(str(path)) as f:
            meta = pa.ipc.open_file(f).schema.metadata or {}
    except Exception:  # noqa: BLE001 - missing, half-written or foreign: not reusable
        return None
    return meta.get(_TASK_META, b"").decode() or None


def records_ready(out: str | Path, task: dict) -> bool:
    """For ``--resume``: whether the finished ``task`` has its copy of its rows in the run's ``records.run/``, taking
    the committed index's copy (hard link, else a copy) when that one is the same task's. Not a Parquet task: True."""
    from fcp_data.index.store import RECORDS, RECORDS_RUN

    if task["kind"] != "parquet":
        return True
    want, at = _task_id(task), (task["source"], task.get("first_row", 0))
    run, done = records_path(out, *at, RECORDS_RUN), records_path(out, *at, RECORDS)
    if _copy_of(run) == want:
        return True
    if _copy_of(done) != want:
        return False
    run.parent.mkdir(parents=True, exist_ok=True)
    tmp = run.parent / f".{run.name}.tmp{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.link(done, tmp)
    except OSError:  # no hard links here
        shutil.copyfile(done, tmp)
    os.replace(tmp, run)
    return True


def records_of(out: str | Path, source: int) -> list[tuple[int, Path]]:
    """``[(first row, file)]`` of the copies an index holds of source ``source``, in row order."""
    found = []
    for p in (Path(out) / "records").glob(f"{source:06d}-*.arrow"):
        try:
            found.append((int(p.stem.split("-")[1]), p))
        except (IndexError, ValueError):
            continue
    return sorted(found)


def parquet_pieces(path: str | Path) -> list[tuple[int, int, int]]:
    """``[(first row group, end row group, first row)]`` covering a file in tasks of at least ``TASK_ROWS`` rows (so
    several workers share one big file); ``[(0, -1, 0)]`` when its metadata cannot be read (the task says why)."""
    try:
        md = _open(path).metadata
    except Exception:  # noqa: BLE001 - recorded by the task that opens it
        return [(0, -1, 0)]
    out, g0, first, acc = [], 0, 0, 0
    for g in range(md.num_row_groups):
        acc += md.row_group(g).num_rows
        if acc >= TASK_ROWS:
            out.append((g0, g + 1, first))
            g0, first, acc = g + 1, first + acc, 0
    if g0 < md.num_row_groups or not out:
        out.append((g0, md.num_row_groups, first))
    return out


def index_parquet(task: dict, cfg: dict, spec, rows) -> int:
    """Index every row of one Parquet (or Arrow) file into ``rows``; returns the rows seen."""
    from fcp_data.index.build import _regular_file
    from fcp_data.index.limits import Limits
    from fcp_data.index.textbatch import TextBatch

    path, limits = Path(task["path"]), Limits.from_dict(cfg.get("limits"))
    try:
        _regular_file(path)
        pf = _open(path)
    except Exception as e:  # OSError, pyarrow's ArrowInvalid ("not a parquet file"), ProbeError
        rows.error(str(path), "unreadable_shard", getattr(e, "detail", None) or f"{type(e).__name__}: {e}", str(path))
        return 1
    batch = TextBatch(task, spec, rows, eos=not cfg.get("chat_field"), ext="parquet")
    g0, g1 = task.get("row_groups", (0, -1))
    first = row = task.get("first_row", 0)
    from fcp_data.index.store import RECORDS_RUN

    with _RecordsWriter(records_path(cfg["out"], task["source"], first, RECORDS_RUN), pf.schema_arrow,
                        _task_id(task)) as copy:
        for rg in range(g0, pf.metadata.num_row_groups if g1 < 0 else g1):
            row = _index_row_group(pf, rg, row, path, limits, cfg, task, spec, rows, batch, copy)
    batch.flush()
    return row - first


def _index_row_group(pf, rg: int, seen: int, path: Path, limits, cfg, task, spec, rows, batch, copy) -> int:
    from fcp_data.index.build import index_record
    from fcp_data.index.probe import ProbeError

    n = pf.metadata.row_group(rg).num_rows
    try:
        table = pf.read_row_group(rg)
        records = table.to_pylist()
    except Exception as e:  # a damaged row group: each of its rows is one error, the file goes on
        for r in range(seen, seen + n):
            rows.error(f"{path.stem}:{r}", "unreadable_member", f"row group {rg}: {type(e).__name__}: {e}", str(path))
        copy.nulls(n)
        return seen + n
    copy.write(table)
    for obj in records:
        key = f"{path.stem}:{seen}"
        problem = _too_large(obj, limits) if isinstance(obj, dict) else None
        if problem:
            rows.record(key, str(path), ProbeError("text_too_large", problem))
        else:
            index_record(obj, key, seen, 1, cfg, task, spec, rows, batch, ext="parquet")
        seen += 1
    return seen


class _RecordsWriter:
    """The records file, written to a temporary name and renamed when every row group is in (before the task's
    part file, so a resumed build never trusts a half-written copy)."""

    def __init__(self, path: Path, schema, task_id: str) -> None:
        import pyarrow as pa

        self.path, self.schema, self.pa = path, schema, pa
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # an earlier try's copy: never left beside a part that does not match it
        self.tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
        tagged = schema.with_metadata({**(schema.metadata or {}), _TASK_META: task_id.encode()})
        self.writer = pa.ipc.new_file(str(self.tmp), tagged)

    def write(self, table) -> None:
        # cast only a row group of another schema: a cast validates, and pyarrow's own Parquet reader returns a
        # null-typed field inside a list of structs (an all-null column: Image cells with bytes and no path) shorter
        # than its struct — the whole file was one shard_failed
        table = table if table.schema.equals(self.schema) else table.cast(self.schema)
        for b in table.to_batches(max_chunksize=BATCH_ROWS):
            self.writer.write_batch(b)

    def nulls(self, n: int) -> None:
        pa = self.pa
        self.write(pa.Table.from_arrays([pa.nulls(n, type=f.type) for f in self.schema], schema=self.schema))

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> None:
        self.writer.close()
        if kind is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)


class ParquetRows:
    """Row ``r`` of an indexed Parquet/Arrow file as a dict, for the reader: from the index's copies of its rows
    (memory-mapped Arrow IPC: a zero-copy slice of one batch), else — a copy deleted — from the file itself (the last
    ``keep`` decoded row groups kept)."""

    def __init__(self, path: str | Path, copies: list[tuple[int, Path]] = (), keep: int = 2) -> None:
        self.path, self.keep, self._groups = path, keep, OrderedDict()
        self._firsts = [f for f, _ in copies]
        self._copies = [p for _, p in copies]
        self._open: dict[int, tuple[object, list[int]]] = {}
        self.pf, self._ends = None, []

    @staticmethod
    def _ends_of(sizes) -> list[int]:
        ends, total = [], 0
        for n in sizes:
            total += n
            ends.append(total)
        return ends

    def _copy(self, k: int):
        if k not in self._open:
            import pyarrow as pa

            ipc = pa.ipc.open_file(pa.memory_map(str(self._copies[k])))
            self._open[k] = ipc, self._ends_of(ipc.get_batch(b).num_rows for b in range(ipc.num_record_batches))
        return self._open[k]

    def close(self) -> None:
        self._groups.clear()
        self._open.clear()
        close = getattr(self.pf, "close", None)
        if close is not None:
            close()

    def row(self, r: int) -> dict:
        import bisect

        k = bisect.bisect_right(self._firsts, r) - 1
        if k >= 0:
            ipc, ends = self._copy(k)
            local = r - self._firsts[k]
            if local < (ends[-1] if ends else 0):
                b = bisect.bisect_right(ends, local)
                return ipc.get_batch(b).slice(local - (ends[b - 1] if b else 0), 1).to_pylist()[0]
        return self._from_file(r)

    def _from_file(self, r: int) -> dict:
        import bisect

        if self.pf is None:
            self.pf = _open(self.path)
            md = self.pf.metadata
            self._ends = self._ends_of(md.row_group(g).num_rows for g in range(md.num_row_groups))
        if not 0 <= r < (self._ends[-1] if self._ends else 0):
            raise OSError(f"row {r} is past the end of {self.path} ({self._ends[-1] if self._ends else 0} rows): the "
                          "file changed since indexing")
        rg = bisect.bisect_right(self._ends, r)
        table = self._groups.get(rg)
        if table is None:
            while len(self._groups) >= self.keep:
                self._groups.popitem(last=False)
            table = self._groups[rg] = self.pf.read_row_group(rg)
        else:
            self._groups.move_to_end(rg)
        return table.slice(r - (self._ends[rg - 1] if rg else 0), 1).to_pylist()[0]
