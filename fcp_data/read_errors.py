"""A sample that cannot be read is recorded and skipped, never the end of a run (``FCPDataset(on_error="skip")``).

``fcp index`` catches what it can see (headers, damaged images, bad text) before training, but some failures show
only when a sample is read: a video whose data is damaged after a readable header, a file removed or replaced
since indexing, a shard on a flaky network mount. :class:`fcp_data.slots.FCPDataset` catches the exception of
``base[i]``, tries again ``retries`` times (a transient I/O error then costs nothing), and otherwise returns a
:class:`SkippedSample` in the sample's place:

* the plan stays valid: :class:`fcp_data.collator.FCPCollator` packs ``slot.num_tokens`` tokens for it with no
  label — its skeleton from the index where the dataset has one (``IndexedDataset.skeleton``: an image or video
  keeps its visual block and grid, zero pixels of its shape, pads for its text), else pad tokens with text positions and
  no pixels — so every tensor has the planned shape and every rank of its CP group packs the same layout (they
  all read the same file; with a skeleton even a rank whose read succeeded agrees on the visual layout);
* the step equals training on the rest of the global batch: the batch lists the sample in ``skipped_samples``
  with its share of label tokens, and :func:`fcp_exec.step.train_step` takes them out of ``num_tokens_global``
  (riding on the step's loss all-reduce; gradients rescaled once) — a loop of your own all-reduces
  the batches' ``num_skipped_labels`` and calls :func:`fcp_exec.step.rescale_skipped`;
* it is recorded: one ``WARNING`` line on the ``fcp_data`` logger (stderr by default, from the DataLoader worker),
  one JSON line ``{"index", "key", "reason", "detail", "epoch", "global_batch", "rank"}`` appended to
  ``errors_path`` when given (the fields of ``fcp index``'s ``errors.jsonl`` and where it failed), and
  ``fcp train`` counts them per step (once each).
  Every rank of the sample's CP group reads it, so each one that fails writes its line: a degree-d group writes
  up to d records of the sample, one per ``rank`` (dedupe by ``index``, ``epoch``); none is lost when only some
  ranks fail, and ``rank`` says which did;
* when only some ranks of the group failed, the group agrees before the forward (each batch's ``read_status``,
  :func:`fcp_exec.skips.agree_skips`, run by ``train_step``): the sample loses its labels on every rank, so the step
  equals the failure on all of them; a visual sample that a rank could pack only as plain pads (no skeleton) while a
  peer read its pixels is a :class:`SampleReadError` on every rank of the group, not a hang in the frame exchange.

A dataset that fails everywhere is not bad data but a bug or a missing mount: :class:`ReadErrorBudget` ends the run
with :class:`SampleReadError` (naming the last failure) after ``max_consecutive_errors`` failures in a row, or, once
that many have failed in all, when more than ``max_error_rate`` of the samples read failed. The counts are per
process (each DataLoader worker keeps its own). ``on_error="raise"`` ends the run at the first sample that still fails
after its retries, with a :class:`SampleReadError` that names it (the original exception chained as its cause).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReadErrorBudget", "check_errors_path", "SampleReadError", "SkippedSample", "ON_ERROR", "SKIPPED", "LAYOUT_UNKNOWN", "VISUAL"]

logger = logging.getLogger("fcp_data")

ON_ERROR = ("skip", "raise")

# bits of a document's ``read_status`` in a collated batch (the ranks of a CP group agree on them before the forward:
# fcp_exec.skips.agree_skips): SKIPPED: it failed to read on this rank; LAYOUT_UNKNOWN: ... and was packed as plain
# pads by a multimodal collator (no skeleton), so its images/videos are unknown here; VISUAL: read here, with
# images/videos (pixel values or a grid)
SKIPPED, LAYOUT_UNKNOWN, VISUAL = 1, 2, 4
_DETAIL_CHARS = 300


class SampleReadError(RuntimeError):
    """Too many samples failed to read: the dataset itself is broken (``FCPDataset``'s error budget)."""


@dataclass(frozen=True)
class SkippedSample:
    """What ``FCPDataset`` returns for a sample that failed to read: its dataset ``index``, its ``key`` (an
    ``IndexedDataset``'s sample key, else None), the exception's type name (``reason``) and first line
    (``detail``); ``skeleton``: the sample's structure from the index when the dataset knows it
    (``IndexedDataset.skeleton``: visual block, pads for text, zero pixels), packed instead of plain pads so that
    the ranks of its CP group agree on the visual layout even if only some of them failed to read it."""

    index: int
    key: str | None
    reason: str
    detail: str
    skeleton: dict | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, index: int, key: str | None, exc: BaseException, skeleton: dict | None = None) -> "SkippedSample":
        text = str(exc).strip().splitlines()
        return cls(int(index), key, type(exc).__name__, (text[0] if text else "")[:_DETAIL_CHARS], skeleton)

    def describe(self) -> str:
        return f"sample {self.index}{f' ({self.key})' if self.key is not None else ''}: {self.reason}: {self.detail}"

    def record(self, slot: Any = None) -> dict[str, Any]:
        out = {"index": self.index, "key": self.key, "reason": self.reason, "detail": self.detail}
        if slot is not None:  # rank: the global rank that failed to read it (a flaky mount is one node's)
            out.update(epoch=int(slot.epoch), global_batch=int(slot.global_batch), rank=int(slot.rank))
        return out


def sample_skeleton(base: Any, index: int) -> dict | None:
    """``base.skeleton(i)`` when the dataset can give a failed sample's structure without reading it, else None."""
    try:
        return base.skeleton(index) if hasattr(base, "skeleton") else None
    except Exception:  # noqa: BLE001 - then plain pads: the skip itself must not fail
        return None


def sample_key(base: Any, index: int) -> str | None:
    """The sample's key when ``base`` names its samples (``base.sample_key(i)``: ``IndexedDataset`` gives its
    index's key, e.g. the tar member or jsonl id), else None."""
    try:
        return str(base.sample_key(index)) if hasattr(base, "sample_key") else None
    except Exception:  # noqa: BLE001 - a key is a courtesy: never fail the skip over it
        return None


def check_errors_path(path) -> None:
    """``errors_path`` must be a file that can be appended to, or a new file in an existing, writable folder:
    checked when the run starts (a ValueError), not found out at the first skipped sample, mid-run."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"errors_path must be a path or None, got {type(path).__name__}")
    p = os.fspath(path)
    if not str(p).strip():
        raise ValueError("errors_path (--read-errors-out) must name a file, got an empty path")
    if "\0" in str(p):
        raise ValueError(f"errors_path (--read-errors-out) {p!r} holds a NUL byte")
    folder = os.path.dirname(os.path.abspath(p))
    if os.path.isdir(p):
        raise ValueError(f"errors_path (--read-errors-out) {p} is a folder; give a file to append the records to")
    if os.path.exists(p) and not os.access(p, os.W_OK):
        raise ValueError(f"errors_path (--read-errors-out) {p} is not writable")
    if not os.path.isdir(folder):
        raise ValueError(f"errors_path (--read-errors-out) {p}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"errors_path (--read-errors-out) {p}: the folder {folder} is not writable")


class ReadErrorBudget:
    """Counts reads and failures of one process and decides when failures stop being "one bad sample"."""

    def __init__(self, *, max_consecutive_errors: int = 8, max_error_rate: float = 0.01,
                 errors_path: str | os.PathLike | None = None) -> None:
        if isinstance(max_consecutive_errors, bool) or not isinstance(max_consecutive_errors, int) or \
                max_consecutive_errors < 1:
            raise ValueError(f"max_consecutive_errors must be an int >= 1, got {max_consecutive_errors!r}")
        if isinstance(max_error_rate, bool) or not isinstance(max_error_rate, (int, float)) or \
                not 0.0 <= float(max_error_rate) <= 1.0:
            raise ValueError(f"max_error_rate must be a number in [0, 1], got {max_error_rate!r}")
        if errors_path is not None:
            check_errors_path(errors_path)
        self.max_consecutive_errors = max_consecutive_errors
        self.max_error_rate = float(max_error_rate)
        self.errors_path = None if errors_path is None else os.fspath(errors_path)
        self.reads = self.errors = self.consecutive = 0

    def __getstate__(self) -> dict:  # a DataLoader worker starts its own counts
        state = dict(self.__dict__)
        state.update(reads=0, errors=0, consecutive=0)
        return state

    def ok(self) -> None:
        self.reads += 1
        self.consecutive = 0

    def failed(self, skipped: SkippedSample, slot: Any = None) -> None:
        """Record one failed sample; raise :class:`SampleReadError` when the budget is spent."""
        self.reads += 1
        self.errors += 1
        self.consecutive += 1
        rec = skipped.record(slot)
        logger.warning("fcp: skipped %s (%d of %d read by this process%s failed)", skipped.describe(), self.errors,
                       self.reads, f", rank {rec['rank']}" if "rank" in rec else "")
        if self.errors_path is not None:
            line = (json.dumps(rec, ensure_ascii=False) + "\n").encode()
            try:
                fd = os.open(self.errors_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line)  # one write per record: O_APPEND keeps workers' lines whole
                finally:
                    os.close(fd)
            except OSError as e:  # a full disk or a vanished folder loses the record's file line, not the run
                logger.error("fcp: could not append the skipped sample's record to %s (%s); it is in this log only: %s",
                             self.errors_path, e, line.decode().strip())
        why = None
        if self.consecutive >= self.max_consecutive_errors:
            why = f"{self.consecutive} samples in a row failed to read"
        elif self.errors >= self.max_consecutive_errors and self.errors > self.max_error_rate * self.reads:
            why = (f"{self.errors} of {self.reads} samples read failed (more than max_error_rate="
                   f"{self.max_error_rate:g})")
        if why:
            raise SampleReadError(
                f"{why}; the last: {skipped.describe()}. The dataset looks broken (a missing mount, a stale index, a bug "
                "in __getitem__?), not one bad sample; FCPDataset(on_error='raise') stops at the first one")
