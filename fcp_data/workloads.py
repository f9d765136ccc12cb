"""Sequence-length workloads for the planning commands: load, cap, draw global batches.

* :func:`load_lengths` reads token counts from ``.txt`` (one integer per line; blank lines and ``#``
  comments skipped), ``.npy`` (1-D integer array), ``.csv`` (a header row and a ``column`` chosen by
  name or 0-based index; a single-column file needs no ``column``) or a Megatron indexed dataset's ``.idx``
  (its documents' token counts, :mod:`fcp_data.megatron_indexed`).
* :func:`apply_cap` handles sequences longer than a cap: ``error`` (the default: name the first one and
  say how to fix it), ``truncate`` (cut to the cap) or ``drop`` (remove; the report lists which).
* :func:`draw_batches` draws global batches (indices, without replacement inside a batch) from a seed.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fcp_data.cost import MAX_SEQUENCE_TOKENS

__all__ = ["load_lengths", "apply_cap", "CapReport", "draw_batches", "OVERLONG_MODES"]

OVERLONG_MODES = ("error", "truncate", "drop")


def _check(values: np.ndarray, where: str, lines: list[int] | None = None) -> np.ndarray:
    """``values`` as int64, all > 0; ``lines``: the file's line number of each value (a text or CSV file: the error
    names the line, comments and blank lines counted), else the entry's 0-based position."""
    if values.size == 0:
        raise ValueError(f"{where}: no sequence lengths found (the file is empty)")
    bad = np.flatnonzero(values <= 0)
    if bad.size:
        at = f"{where}:{lines[bad[0]]}: " if lines else f"{where}: entry {bad[0]}: "
        raise ValueError(f"{at}lengths must be > 0, got {values[bad[0]]} (remove empty sequences)")
    return values.astype(np.int64)


def _parse_int(text: str, where: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r:.60} is not a number (expected one integer token count)") from None
    if not np.isfinite(v) or v != int(v):
        raise ValueError(f"{where}: {text!r:.60} is not a whole token count")
    if abs(v) > MAX_SEQUENCE_TOKENS:  # beyond int64 this used to escape as OverflowError
        raise ValueError(f"{where}: {text!r:.60} is not a plausible token count (at most {MAX_SEQUENCE_TOKENS})")
    return int(v)


def load_lengths(path: str | Path, column: str | int | None = None) -> np.ndarray:
    """Token counts from ``path`` (``.txt``, ``.npy``, ``.csv`` or a Megatron ``.idx``) as an int64 array; ``ValueError`` for
    empty, non-numeric or non-positive data, ``FileNotFoundError`` when the file is missing."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"lengths file {p} is a directory; pass a .txt, .npy or .csv file")
    if not p.exists():
        hint = ""
        if p.with_name(p.name + ".idx").is_file():  # a Megatron prefix: its .idx holds the counts
            hint = f" (a Megatron indexed dataset's prefix? pass {p.name}.idx)"
        raise FileNotFoundError(f"lengths file not found: {str(p)!r}{hint}")  # quoted: a blank name shows
    if not p.is_file():
        raise ValueError(f"lengths file {p} is not a regular file (a device, pipe or socket); pass a .txt, .npy or "
                         ".csv file")
    try:
        return _load(p, column)
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a text file (byte {e.start} is not UTF-8); lengths are .txt, .npy or .csv") from None


def load_npy_vector(p: Path) -> np.ndarray:
    """A 1-D numeric array from a ``.npy`` file (no pickles); ``ValueError`` naming the file otherwise."""
    try:
        arr = np.load(p, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(f"{p}: not a readable .npy array ({e})") from None
    if arr.ndim != 1 or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"{p}: expected a 1-D numeric array, got shape {arr.shape} dtype {arr.dtype}")
    return arr


def _load(p: Path, column: str | int | None) -> np.ndarray:
    suffix = p.suffix.lower()
    if column is not None and suffix != ".csv":  # .npy and .idx included: a column asked for is never ignored
        raise ValueError(f"--column applies to .csv files only, got {p}")
    if suffix == ".bin" and p.with_suffix(".idx").is_file():  # Megatron's token file: its .idx has the counts
        raise ValueError(f"{p}: a Megatron indexed dataset's tokens; its lengths are in {p.with_suffix('.idx').name}")
    if suffix == ".idx":  # a Megatron indexed dataset: its documents' token counts
        from fcp_data.megatron_indexed import megatron_document_lengths

        lengths = megatron_document_lengths(p)
        if not np.any(lengths > 0):
            raise ValueError(f"{p}: a Megatron indexed dataset without tokens ({lengths.size} document(s), none with a token)")
        if np.any(lengths == 0):  # one line on stderr (the logging module's last resort), not a Python warning
            import logging

            logging.getLogger("fcp_data").warning("%s: %d empty document(s) of %d left out", p,
                                                  int(np.sum(lengths == 0)), lengths.size)
            lengths = lengths[lengths > 0]
        return _check(lengths, str(p))
    if suffix == ".npy":
        arr = load_npy_vector(p)
        if np.issubdtype(arr.dtype, np.floating):
            arr = arr.astype(np.float64)  # float16 compared with MAX_SEQUENCE_TOKENS overflows (4 warning lines)
            bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
            if bad.size:
                raise ValueError(f"{p}: entry {bad[0]} is {arr[bad[0]]}, not a whole token count")
        big = np.flatnonzero(np.abs(arr) > MAX_SEQUENCE_TOKENS) if arr.dtype != np.uint64 else \
            np.flatnonzero(arr > MAX_SEQUENCE_TOKENS)
        if big.size:  # before the cast, which would wrap uint64 / large floats silently
            raise ValueError(f"{p}: entry {big[0]} is {arr[big[0]]}, not a plausible token count (at most "
                             f"{MAX_SEQUENCE_TOKENS})")
        return _check(arr.astype(np.int64), str(p))
    if suffix == ".csv":
        return _load_csv(p, column)
    values, lines = [], []
    with p.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if text:
                values.append(_parse_int(text, f"{p}:{lineno}"))
                lines.append(lineno)
    return _check(np.asarray(values, dtype=np.int64), str(p), lines)


def _load_csv(p: Path, column: str | int | None) -> np.ndarray:
    with p.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f, strict=True)  # line_num: the file's line of the row just read (quoted newlines counted)
        try:
            numbered = [(reader.line_num, r) for r in reader if any(c.strip() for c in r)]
        except csv.Error as e:  # an unterminated quote read the whole file as one cell: "the file is empty"
            raise ValueError(f"{p}:{reader.line_num}: not a valid CSV row ({e})") from None
    rows = [r for _, r in numbered]
    if not rows:
        raise ValueError(f"{p}: no sequence lengths found (the file is empty)")
    header = [c.strip() for c in rows[0]]
    has_header = not all(_is_number(c) for c in header)
    body = rows[1:] if has_header else rows
    if column is None:
        if len(header) != 1:
            raise ValueError(f"{p} has {len(header)} columns ({', '.join(header)}); choose one with --column")
        idx = 0
    elif isinstance(column, int) or str(column).isdigit():
        idx = int(column)
        if idx >= len(header):
            raise ValueError(f"{p}: column index {idx} out of range (the file has {len(header)} columns)")
    else:
        if not has_header or column not in header:
            raise ValueError(f"{p}: no column named {column!r}; columns: {', '.join(header) if has_header else '(no header)'}")
        idx = header.index(column)
    lines = [n for n, _ in numbered[1 if has_header else 0:]]
    values = []
    for line, row in zip(lines, body):
        if idx >= len(row):
            raise ValueError(f"{p}:{line}: row has no column {idx}")
        values.append(_parse_int(row[idx].strip(), f"{p}:{line}"))
    return _check(np.asarray(values, dtype=np.int64), str(p), lines)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True, slots=True)
class CapReport:
    """What :func:`apply_cap` did: ``num_overlong`` sequences exceeded ``cap``; ``overlong`` are their
    indices in the input; ``kept`` the input index of each output length (``drop`` removes entries)."""

    mode: str
    cap: int
    num_overlong: int
    overlong: tuple[int, ...]
    kept: np.ndarray

    def __post_init__(self) -> None:
        if self.mode not in OVERLONG_MODES:
            raise ValueError(f"overlong mode must be one of {', '.join(OVERLONG_MODES)}, got {self.mode!r}")

    def to_input(self, plan: dict[str, Any]) -> dict[str, Any]:
        """``plan`` (a ``Plan.to_dict()`` made on the capped lengths) with every ``seq_ids`` indexing the input
        lengths, as DESIGN §6 says they do (after ``drop`` the planner numbered the kept sequences only)."""
        kept = self.kept.tolist()
        for mb in plan["micro_batches"]:
            for g in mb["groups"]:
                g["seq_ids"] = [kept[i] for i in g["seq_ids"]]
        return plan

    def summary(self) -> str:
        if not self.num_overlong:
            return f"no sequence over {self.cap} tokens"
        verb = {"truncate": "truncated to", "drop": "dropped (over)", "error": "over"}[self.mode]
        return f"{self.num_overlong} sequence(s) {verb} {self.cap} tokens"


def apply_cap(lengths, cap: int, mode: str = "error") -> tuple[np.ndarray, CapReport]:
    """Apply the cap (``error`` | ``truncate`` | ``drop``) and return ``(lengths, report)``."""
    if mode not in OVERLONG_MODES:
        raise ValueError(f"--on-overlong must be one of {', '.join(OVERLONG_MODES)}, got {mode!r}")
    cap = int(cap)
    if cap < 1:
        raise ValueError(f"the length cap must be >= 1, got {cap}")
    arr = np.asarray(lengths, dtype=np.int64)
    over = np.flatnonzero(arr > cap)
    kept = np.arange(arr.size)
    if over.size and mode == "error":
        i = int(over[0])
        raise ValueError(f"sequence {i} has {arr[i]} tokens, more than the {cap} the ranks can hold "
                         f"({over.size} such sequence(s)); use --on-overlong truncate or --on-overlong drop")
    if mode == "truncate":
        arr = np.minimum(arr, cap)
    elif mode == "drop" and over.size:
        kept = np.flatnonzero(arr <= cap)
        arr = arr[kept]
        if arr.size == 0:
            raise ValueError(f"every sequence is longer than {cap} tokens; nothing left after --on-overlong drop")
    report = CapReport(mode=mode, cap=cap, num_overlong=int(over.size), overlong=tuple(int(i) for i in over), kept=kept)
    return arr, report


def draw_batches(num_samples: int, global_batch_size: int, steps: int, seed: int) -> list[np.ndarray]:
    """``steps`` global batches of ``global_batch_size`` indices into a workload of ``num_samples``
    (uniform, without replacement within a batch), from ``numpy.random.default_rng(seed)``."""
    if global_batch_size < 1 or steps < 1:
        raise ValueError(f"global batch size and steps must be >= 1, got {global_batch_size}, {steps}")
    if global_batch_size > num_samples:
        raise ValueError(f"global batch size {global_batch_size} exceeds the workload's {num_samples} sequences")
    rng = np.random.default_rng(seed)
    return [np.sort(rng.choice(num_samples, size=global_batch_size, replace=False)) for _ in range(steps)]
