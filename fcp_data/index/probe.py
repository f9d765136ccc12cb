"""Header probes (never a full decode) and the raw sample iterators over jsonl files, tar shards and folders.

Video probes return the values the token formulas need: frame count, average fps, height, width.

- ``av`` (default): PyAV opens the container and reads the stream header: ``stream.frames`` (from the mp4
  sample table), ``average_rate``, the codec size. No frame is decoded. When a container has no frame count
  (some mkv/webm), packets are counted by demuxing, still without decoding.
- ``decord``: ``len(vr)``, ``vr.get_avg_fps()``, and the first frame only for the size (decord has no size
  accessor). This is exactly what the readers see at training time.

``benchmarks/bench_index.py`` measures both against a full decode.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["VideoHeader", "ProbeError", "probe_video", "probe_image", "full_decode_frames", "iter_tar_samples",
           "iter_dir_samples", "VIDEO_EXTS", "IMAGE_EXTS", "TEXT_EXTS", "PROBES"]

VIDEO_EXTS = ("mp4", "avi", "mkv", "webm", "mov", "m4v")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
TEXT_EXTS = ("txt", "caption", "text")
PROBES = ("av", "decord")


class ProbeError(Exception):
    """A bad sample: ``reason`` is a short machine-readable tag stored in errors.jsonl."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


@dataclass(frozen=True, kw_only=True, slots=True)
class VideoHeader:
    """Header values of one video: frames, average fps, height and width in pixels."""

    num_frames: int
    fps: float
    height: int
    width: int

    def __post_init__(self) -> None:
        if self.num_frames <= 0 or not self.fps > 0 or self.height <= 0 or self.width <= 0:
            raise ProbeError("corrupt_video", f"bad header: {self.num_frames} frames, {self.fps} fps, {self.width}x{self.height}")


def _source(src: bytes | str | Path):
    return io.BytesIO(src) if isinstance(src, (bytes, bytearray, memoryview)) else str(src)


def _probe_av(src) -> VideoHeader:
    import av

    try:
        with av.open(_source(src), mode="r") as c:
            if not c.streams.video:
                raise ProbeError("corrupt_video", "no video stream")
            st = c.streams.video[0]
            n = int(st.frames or 0)
            if n <= 0:  # no sample table: count packets (demux only, no decode)
                n = sum(1 for pkt in c.demux(st) if pkt.size > 0)
            rate = st.average_rate or st.guessed_rate
            return VideoHeader(num_frames=n, fps=float(rate or 0), height=int(st.codec_context.height),
                               width=int(st.codec_context.width))
    except ProbeError:
        raise
    except Exception as e:  # av raises many InvalidDataError/OSError subclasses
        raise ProbeError("corrupt_video", f"{type(e).__name__}: {e}") from None


def _probe_decord(src) -> VideoHeader:
    import decord

    try:
        vr = decord.VideoReader(_source(src), num_threads=1)
        n, fps = len(vr), float(vr.get_avg_fps())
        h, w = vr[0].shape[:2]
        return VideoHeader(num_frames=n, fps=fps, height=int(h), width=int(w))
    except ProbeError:
        raise
    except Exception as e:  # decord raises DECORDError / RuntimeError on bad input
        raise ProbeError("corrupt_video", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None


def probe_video(src: bytes | str | Path, backend: str = "av") -> VideoHeader:
    """Frame count, average fps and size of a video (bytes or path) from its header."""
    if backend == "av":
        return _probe_av(src)
    if backend == "decord":
        return _probe_decord(src)
    raise ValueError(f"unknown probe {backend!r}; use one of {', '.join(PROBES)}")


def probe_image(src: bytes | str | Path) -> tuple[int, int]:
    """(height, width) of an image from its header (pillow, lazy: no pixel decode)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(_source(src)) as im:
            w, h = im.size
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ProbeError("corrupt_image", f"{type(e).__name__}: {e}") from None
    if w <= 0 or h <= 0:
        raise ProbeError("corrupt_image", f"size {w}x{h}")
    return int(h), int(w)


def full_decode_frames(src: bytes | str | Path) -> int:
    """Decode every frame with PyAV and count them (the baseline the header probe avoids)."""
    import av

    with av.open(_source(src)) as c:
        return sum(1 for _ in c.decode(video=0))


def split_key(name: str) -> tuple[str, str]:
    """webdataset convention: ``dir/base.ext.more`` → key ``dir/base``, ext ``ext.more`` (lower-cased)."""
    d, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{d}/{stem}" if d else stem), ext.lower()


def iter_tar_samples(path: str | Path) -> Iterator[tuple[str, dict[str, tuple[int, int]], str | None]]:
    """Yield ``(key, {ext: (offset, size)}, problem)`` for consecutive members sharing a key.

    Only tar headers are read (tarfile seeks over member data). ``problem`` is None, or
    ``"truncated_member"`` when a member's data runs past the end of the file. A shard that cannot be
    opened raises ``ProbeError("unreadable_shard")``; one that breaks off mid-way yields what came before and
    then a final ``(path#offset, {}, "truncated_shard")``.
    """
    p = Path(path)
    try:
        file_size = p.stat().st_size
        tf = tarfile.open(p, mode="r:")
    except (OSError, tarfile.TarError) as e:
        raise ProbeError("unreadable_shard", f"{type(e).__name__}: {e}") from None
    cur_key, cur, problem, last_end = None, {}, None, 0
    with tf:
        while True:
            try:
                ti = tf.next()
            except (tarfile.TarError, OSError, EOFError) as e:
                if cur_key is not None:
                    yield cur_key, cur, problem
                    cur_key = None
                yield f"{p.name}#{last_end}", {}, f"truncated_shard: {type(e).__name__}"
                return
            if ti is None:
                break
            if not ti.isfile():
                continue
            key, ext = split_key(ti.name)
            if key != cur_key:
                if cur_key is not None:
                    yield cur_key, cur, problem
                cur_key, cur, problem = key, {}, None
            cur[ext] = (int(ti.offset_data), int(ti.size))
            last_end = int(ti.offset_data + ti.size)
            if last_end > file_size:
                problem = "truncated_member"
        if cur_key is not None:
            yield cur_key, cur, problem


def iter_dir_samples(root: Path, files: list[str]) -> Iterator[tuple[str, dict[str, tuple[int, int]], str | None]]:
    """Group ``files`` (paths relative to ``root``, sorted) by key; offsets are 0, sizes the file sizes."""
    cur_key, cur = None, {}
    for rel in files:
        key, ext = split_key(rel)
        if key != cur_key:
            if cur_key is not None:
                yield cur_key, cur, None
            cur_key, cur = key, {}
        try:
            cur[ext] = (0, (root / rel).stat().st_size)
        except OSError:
            cur[ext] = (0, -1)
    if cur_key is not None:
        yield cur_key, cur, None
