"""Parquet inputs of ``fcp index`` (how Hugging Face datasets ship; also the ``.arrow`` files of ``save_to_disk``
and the datasets cache): one row is one record, read as a jsonl line would be (``--text-field``, ``--prompt-field``, ``--chat-field``; an image/video cell ``{"bytes", "path"}`` is
read from its bytes).

Random access: a Parquet row group is compressed and decoded whole, so reading one shuffled row at a time would
decode thousands of rows per sample. While indexing, the rows are therefore also written, uncompressed, to an
Arrow IPC file in the index (``OUT/records/<source>.arrow``, batches of ``BATCH_ROWS`` rows) that the reader
memory-maps: a row is a zero-copy slice (as Hugging Face datasets' Arrow cache does). The disk cost is the rows'
uncompressed size; the Parquet file is not read after indexing (the index holds the snapshot it counted). An index
without the records file (deleted) falls back to the Parquet file, keeping its last decoded row groups.

The index addresses a row by its position in the file (the member ``parquet`` holds ``(row, 1)``). A row without a
``--key-field`` is keyed ``<file stem>:<row>`` (0-based). A file pyarrow cannot open is one ``unreadable_shard``
error; a row group it cannot decode is one error per row of it (null rows hold its place in the records file).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

__all__ = ["index_parquet", "ParquetRows", "records_path", "BATCH_ROWS"]

BATCH_ROWS = 256  # rows per record batch of the records file (a read slices one batch)


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


def records_path(out: str | Path, source: int) -> Path:
    """The Arrow copy of source ``source``'s rows inside index ``out``."""
    return Path(out) / "records" / f"{source:06d}.arrow"


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
    with _RecordsWriter(records_path(cfg["out"], task["source"]), pf.schema_arrow) as copy:
        seen = 0
        for rg in range(pf.metadata.num_row_groups):
            seen = _index_row_group(pf, rg, seen, path, limits, cfg, task, spec, rows, batch, copy)
    batch.flush()
    return seen


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

    def __init__(self, path: Path, schema) -> None:
        import pyarrow as pa

        self.path, self.schema, self.pa = path, schema, pa
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.parent / f".{path.name}.tmp{os.getpid()}"
        self.writer = pa.ipc.new_file(str(self.tmp), schema)

    def write(self, table) -> None:
        for b in table.cast(self.schema).to_batches(max_chunksize=BATCH_ROWS):
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
    """Row ``r`` of an indexed Parquet file as a dict, for the reader: from the index's records file when there is
    one (memory-mapped Arrow IPC: a zero-copy slice of one batch), else from the Parquet file (the last ``keep``
    decoded row groups kept)."""

    def __init__(self, path: str | Path, records: str | Path | None = None, keep: int = 2) -> None:
        self.keep, self._groups = keep, OrderedDict()
        if records is not None and Path(records).is_file():
            import pyarrow as pa

            self.pf, self._ipc = None, pa.ipc.open_file(pa.memory_map(str(records)))
            sizes = [self._ipc.get_batch(b).num_rows for b in range(self._ipc.num_record_batches)]
        else:
            self.pf, self._ipc = _open(path), None
            sizes = [self.pf.metadata.row_group(rg).num_rows for rg in range(self.pf.metadata.num_row_groups)]
        self.ends, total = [], 0
        for n in sizes:
            total += n
            self.ends.append(total)

    def close(self) -> None:
        self._groups.clear()
        close = getattr(self.pf, "close", None)
        if close is not None:
            close()
        self._ipc = None

    def row(self, r: int) -> dict:
        import bisect

        if not 0 <= r < (self.ends[-1] if self.ends else 0):
            raise OSError(f"row {r} is past the end of the file ({self.ends[-1] if self.ends else 0} rows): the "
                          "file changed since indexing")
        rg = bisect.bisect_right(self.ends, r)
        start = self.ends[rg - 1] if rg else 0
        if self._ipc is not None:
            return self._ipc.get_batch(rg).slice(r - start, 1).to_pylist()[0]
        table = self._groups.get(rg)
        if table is None:
            while len(self._groups) >= self.keep:
                self._groups.popitem(last=False)
            table = self._groups[rg] = self.pf.read_row_group(rg)
        else:
            self._groups.move_to_end(rg)
        return table.slice(r - start, 1).to_pylist()[0]
