"""Parquet inputs of ``fcp index`` (how Hugging Face datasets ship): one row is one record, read as a jsonl line
would be (``--text-field``, ``--prompt-field``, ``--chat-field``; an image/video cell ``{"bytes", "path"}`` is
read from its bytes).

The index addresses a row by its position in the file (the member ``parquet`` holds ``(row, 1)``); the reader
finds its row group from the file's metadata and keeps the last row groups it decoded. A row without a
``--key-field`` is keyed ``<file stem>:<row>`` (0-based). A file pyarrow cannot open is one ``unreadable_shard``
error; a row group it cannot decode is one error per row of it.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

__all__ = ["index_parquet", "ParquetRows"]


def _open(path):
    try:
        import pyarrow.parquet as pq
    except ImportError:  # an optional dependency: one clear line, not a traceback
        raise ValueError("reading .parquet needs pyarrow: pip install 'fcp[parquet]' (or pyarrow)") from None
    return pq.ParquetFile(path)


def _too_large(obj: dict, limits) -> str | None:
    """Why a row is refused by the text limits (its JSON size or nesting), else None."""
    from fcp_data.index.limits import json_depth_exceeds

    raw = json.dumps(obj, default=str, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if len(raw) > limits.max_text_bytes:
        return f"row of {len(raw)} bytes (as JSON) > --max-text-bytes {limits.max_text_bytes}"
    if json_depth_exceeds(raw, obj, limits.max_json_depth):
        return f"nested deeper than --max-json-depth {limits.max_json_depth}"
    return None


def index_parquet(task: dict, cfg: dict, spec, rows) -> int:
    """Index every row of one Parquet file into ``rows``; returns the rows seen."""
    from fcp_data.index.build import _regular_file, index_record
    from fcp_data.index.limits import Limits
    from fcp_data.index.probe import ProbeError
    from fcp_data.index.textbatch import TextBatch

    path, limits = Path(task["path"]), Limits.from_dict(cfg.get("limits"))
    try:
        _regular_file(path)
        pf = _open(path)
    except Exception as e:  # OSError, pyarrow's ArrowInvalid ("not a parquet file"), ProbeError
        rows.error(str(path), "unreadable_shard", getattr(e, "detail", None) or f"{type(e).__name__}: {e}", str(path))
        return 1
    batch = TextBatch(task, spec, rows, eos=not cfg.get("chat_field"), ext="parquet")
    seen = 0
    for rg in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(rg).num_rows
        try:
            records = pf.read_row_group(rg).to_pylist()
        except Exception as e:  # a damaged row group: each of its rows is one error, the file goes on
            for r in range(seen, seen + n):
                rows.error(f"{path.stem}:{r}", "unreadable_member", f"row group {rg}: {type(e).__name__}: {e}",
                           str(path))
            seen += n
            continue
        for obj in records:
            key = f"{path.stem}:{seen}"
            problem = _too_large(obj, limits) if isinstance(obj, dict) else None
            if problem:
                rows.record(key, str(path), ProbeError("text_too_large", problem))
            else:
                index_record(obj, key, seen, 1, cfg, task, spec, rows, batch, ext="parquet")
            seen += 1
    batch.flush()
    return seen


class ParquetRows:
    """Row ``r`` of a Parquet file as a dict, for the reader: the file's row-group boundaries are read once, the
    last ``keep`` decoded row groups are kept (random access within a row group decodes it once)."""

    def __init__(self, path: str | Path, keep: int = 2) -> None:
        self.pf, self.keep, self._pid = _open(path), keep, os.getpid()
        md = self.pf.metadata
        self.ends, total = [], 0
        for rg in range(md.num_row_groups):
            total += md.row_group(rg).num_rows
            self.ends.append(total)
        self._groups: OrderedDict[int, object] = OrderedDict()

    def close(self) -> None:
        self._groups.clear()
        close = getattr(self.pf, "close", None)
        if close is not None:
            close()

    def row(self, r: int) -> dict:
        import bisect

        if not 0 <= r < (self.ends[-1] if self.ends else 0):
            raise OSError(f"row {r} is past the end of the file ({self.ends[-1] if self.ends else 0} rows): the "
                          "file changed since indexing")
        rg = bisect.bisect_right(self.ends, r)
        table = self._groups.get(rg)
        if table is None:
            while len(self._groups) >= self.keep:
                self._groups.popitem(last=False)
            table = self._groups[rg] = self.pf.read_row_group(rg)
        else:
            self._groups.move_to_end(rg)
        return table.slice(r - (self.ends[rg - 1] if rg else 0), 1).to_pylist()[0]
