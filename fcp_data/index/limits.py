"""Ingestion limits of ``fcp index`` and the helpers that keep one hostile sample from hurting the run.

Every limit is explicit, has a flag and a documented default; a sample past a limit becomes an error record
with its reason (``errors.jsonl``), never a crash or a memory blow-up:

==================  ====================  =========================================================================
flag                default               what it bounds (reason recorded when exceeded)
==================  ====================  =========================================================================
--max-image-pixels  89,478,485            width x height of an image or a video frame, from the header
                                          (``image_too_large``, ``frame_too_large``). The default is pillow's
                                          own ``Image.MAX_IMAGE_PIXELS``, so a reader never meets a
                                          decompression-bomb warning; pillow refuses images above twice its
                                          limit whatever this flag says.
--max-frames        1,000,000             frames of a video from its header, or demuxed packets when the header
                                          has no count (``too_many_frames``); at most 2**31 - 1 (an int32 column)
--max-duration      86,400 s (24 h)       frames / fps of a video (``video_too_long``)
--max-text-bytes    64 MiB                bytes of a jsonl line, a .txt/.caption/.text member or a .json member
                                          (``text_too_large``); an over-long jsonl line is skipped without being
                                          held in memory
--max-json-depth    100                   nesting of a jsonl line or a .json member (``json_too_deep``); Python's
                                          own parser stops near 1000 whatever this flag says
==================  ====================  =========================================================================
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

__all__ = ["Limits", "json_depth_exceeds", "clean_detail", "safe_key", "record_key", "record_mismatch", "INT32_MAX"]

INT32_MAX = 2**31 - 1
LIMIT_MAX = 2**62  # an integer limit must fit the index-sized integers of the readers (read(limit + 1))
_ADDR = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")
_HEX = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True, kw_only=True, slots=True)
class Limits:
    """Per-sample ingestion limits (see the module docstring for what each bounds and the reason recorded).

    max_image_pixels: width x height of an image or one video frame. max_frames: frames of one video.
    max_duration: seconds of one video (frames / fps). max_text_bytes: bytes of one jsonl line or text/json
    member. max_json_depth: nesting depth of one JSON document (an object or array at top level is depth 1).
    """

    max_image_pixels: int = 89_478_485
    max_frames: int = 1_000_000
    max_duration: float = 86_400.0
    max_text_bytes: int = 64 * 2**20
    max_json_depth: int = 100

    def __post_init__(self) -> None:
        for name in ("max_image_pixels", "max_frames", "max_text_bytes", "max_json_depth"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= LIMIT_MAX:
                raise ValueError(f"--{name.replace('_', '-')} must be an integer in [1, 2**62], got {v!r}")
        if self.max_frames > INT32_MAX:
            raise ValueError(f"--max-frames must be <= {INT32_MAX} (the num_frames column is int32), got {self.max_frames}")
        if not (isinstance(self.max_duration, (int, float)) and 0 < self.max_duration < float("inf")):
            raise ValueError(f"--max-duration must be a positive number of seconds, got {self.max_duration!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict | None) -> "Limits":
        return cls(**(d or {}))


def json_depth_exceeds(raw: bytes, obj, max_depth: int) -> bool:
    """True when the parsed JSON ``obj`` (from ``raw``) nests deeper than ``max_depth`` (top-level container = 1).

    Counting brackets first makes the common shallow case O(len(raw)) in C; only documents with more brackets
    than the limit are walked (iteratively, so the walk itself cannot overflow the stack).
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            children = o.values()
        elif isinstance(o, list):
            children = o
        else:
            continue
        if d > max_depth:
            return True
        stack.extend((c, d + 1) for c in children)
    return False


def clean_detail(text: str, limit: int = 300) -> str:
    """An error detail that is the same in every run: no object addresses, no lone surrogates, bounded length."""
    text = _HEX.sub("", _ADDR.sub(r"<\1>", str(text)))
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def safe_key(key: str) -> str:
    """``key`` itself when it is valid UTF-8 text, else its deterministic escape (``\\udcff`` for a lone surrogate).

    File names that are not UTF-8 reach Python as lone surrogates (``surrogateescape``), and JSON may spell
    them (``"\\ud800"``); the index stores keys as UTF-8, so those are escaped, never dropped or crashed on.
    """
    try:
        key.encode("utf-8")
        return key
    except UnicodeEncodeError:
        return key.encode("utf-8", "backslashreplace").decode("utf-8")


def record_key(obj, key_field: str) -> str | None:
    """The key a record (a jsonl line, a Parquet row) names itself by: its ``key_field`` when that is a string or an
    integer, else None (``fcp index`` then keys it ``<file stem>:<line or row>``)."""
    if isinstance(obj, dict) and isinstance(obj.get(key_field), (str, int)):
        return str(obj[key_field])
    return None


def record_mismatch(obj, indexed: str, key_field: str, stem: str, row: int | None = None) -> str | None:
    """Why the record read back at a sample's recorded offset is not the one indexed under the key ``indexed``
    (None: it is, as far as its key tells). A record with a key field must carry that key; one without must have
    been keyed ``<stem>:<n>`` (jsonl: any line number — the offset does not tell it; Parquet: its ``row``)."""
    own = record_key(obj, key_field)
    if own is not None:
        return None if safe_key(own) == indexed else f"its {key_field!r} is {safe_key(own)!r}"
    want = re.escape(stem) + ":" + (str(row) if row is not None else r"\d+")
    return None if re.fullmatch(want, indexed) else f"it has no {key_field!r} field"
