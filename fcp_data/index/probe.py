"""Header probes (never a full decode) and the raw sample iterators over jsonl files, tar shards and folders.

Video probes return the values the token formulas need: frame count, average fps, height, width.

- ``av`` (default): PyAV opens the container and reads the stream header: ``stream.frames`` (from the mp4
  sample table), ``average_rate``, the codec size. No frame is decoded. When a container has no frame count
  (some mkv/webm), packets are counted by demuxing, still without decoding.
- ``decord``: ``len(vr)``, ``vr.get_avg_fps()``, and the first frame only for the size (decord has no size
  accessor). This is exactly what the readers see at training time.

``benchmarks/bench_index.py`` measures both against a full decode.

Probes take bytes, a path or a seekable binary file (:class:`MemberFile`: a window onto one tar member, so a
large member is never read into memory). Every failure of a probe is a :class:`ProbeError` with a reason
and a detail that is the same in every run (no object addresses).
"""

from __future__ import annotations

import errno
import io
import math
import os
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

__all__ = ["VideoHeader", "ProbeError", "MemberFile", "probe_video", "probe_image", "full_decode_frames",
           "check_video_frames",
           "iter_tar_samples", "iter_dir_samples", "split_key", "member_path", "VIDEO_EXTS", "IMAGE_EXTS", "TEXT_EXTS",
           "PROBES"]

VIDEO_EXTS = ("mp4", "avi", "mkv", "webm", "mov", "m4v")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
TEXT_EXTS = ("txt", "caption", "text")
PROBES = ("av", "decord", "decode")  # decode: av's header, then the frames a reader samples are decoded (probe_plan)


class ProbeError(Exception):
    """A bad sample: ``reason`` is a short machine-readable tag stored in errors.jsonl."""

    def __init__(self, reason: str, detail: str = ""):
        from fcp_data.index.limits import clean_detail

        detail = clean_detail(detail)
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason, self.detail = reason, detail


class MemberFile(io.RawIOBase):
    """A read-only, seekable window of ``size`` bytes at ``offset`` of an open binary file (one tar member).

    Closing the window leaves the underlying file open.
    """

    def __init__(self, fh, offset: int, size: int):
        super().__init__()
        self._fh, self._off, self._size, self._pos = fh, int(offset), max(int(size), 0), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        self._fh.seek(self._off + self._pos)
        data = self._fh.read(n)
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(base + int(pos), 0)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __repr__(self) -> str:
        return f"<tar member at {self._off}, {self._size} bytes>"


@dataclass(frozen=True, kw_only=True, slots=True)
class VideoHeader:
    """Header values of one video: frames, average fps, height and width in pixels."""

    num_frames: int
    fps: float
    height: int
    width: int

    def __post_init__(self) -> None:
        if self.num_frames <= 0 or not 0 < self.fps < math.inf or self.height <= 0 or self.width <= 0:
            raise ProbeError("corrupt_video", f"bad header: {self.num_frames} frames, {self.fps} fps, {self.width}x{self.height}")


def _source(src):
    if isinstance(src, (bytes, bytearray, memoryview)):
        return io.BytesIO(src)
    if hasattr(src, "read"):
        src.seek(0)
        return src
    return str(src)


def _error_text(e: BaseException) -> str:
    """``Type: message`` of an exception, preferring FFmpeg's strerror (its message repeats the file object)."""
    msg = getattr(e, "strerror", None) or str(e)
    return f"{type(e).__name__}: {msg}"


def _probe_av(src, max_frames: int | None) -> VideoHeader:
    import av

    try:
        with av.open(_source(src), mode="r") as c:
            if not c.streams.video:
                raise ProbeError("corrupt_video", "no video stream")
            st = c.streams.video[0]
            n = int(st.frames or 0)
            if n <= 0:  # no sample table: count packets (demux only, no decode), stopping past the limit
                for pkt in c.demux(st):
                    n += pkt.size > 0
                    if max_frames is not None and n > max_frames:
                        raise ProbeError("too_many_frames", f"more than --max-frames {max_frames} packets")
            rate = st.average_rate or st.guessed_rate
            return VideoHeader(num_frames=n, fps=float(rate or 0), height=int(st.codec_context.height),
                               width=int(st.codec_context.width))
    except ProbeError:
        raise
    except Exception as e:  # av raises many InvalidDataError/OSError subclasses
        raise ProbeError("corrupt_video", _error_text(e)) from None


def _probe_decord(src) -> VideoHeader:
    import decord

    if hasattr(src, "read"):  # decord takes bytes or a path, not a file object
        src.seek(0)
        src = src.read()
    try:
        vr = decord.VideoReader(_source(src), num_threads=1)
        n, fps = len(vr), float(vr.get_avg_fps())
        h, w = vr[0].shape[:2]
        return VideoHeader(num_frames=n, fps=fps, height=int(h), width=int(w))
    except ProbeError:
        raise
    except Exception as e:  # decord raises DECORDError / RuntimeError on bad input
        raise ProbeError("corrupt_video", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from None


def probe_video(src, backend: str = "av", max_frames: int | None = None) -> VideoHeader:
    """Frame count, average fps and size of a video (bytes, path or binary file) from its header.

    ``max_frames`` bounds the packet count of a container without a frame count (``too_many_frames``).
    """
    if backend in ("av", "decode"):
        return _probe_av(src, max_frames)
    if backend == "decord":
        return _probe_decord(src)
    raise ValueError(f"unknown probe {backend!r}; use one of {', '.join(PROBES)}")


def probe_image(src, max_pixels: int | None = None) -> tuple[int, int]:
    """(height, width) of an image from its header (pillow, lazy: no pixel decode; :func:`check_image_data` decodes).

    An image of more than ``max_pixels`` pixels, or one pillow calls a decompression bomb, is
    ``image_too_large``.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(_source(src)) as im:
                w, h = im.size
    except Image.DecompressionBombError as e:
        raise ProbeError("image_too_large", f"pillow: {e}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        raise ProbeError("corrupt_image", f"{type(e).__name__}: {e}") from None
    if w <= 0 or h <= 0:
        raise ProbeError("corrupt_image", f"size {w}x{h}")
    if max_pixels is not None and w * h > max_pixels:
        raise ProbeError("image_too_large", f"{w}x{h} = {w * h} pixels > --max-image-pixels {max_pixels}")
    return int(h), int(w)


def check_image_data(src) -> None:
    """Decode the image once (a JPEG at 1/8 scale: its whole entropy-coded stream is still read) so that a file cut
    or damaged after a valid header is ``corrupt_image`` at index time, not a reader error that ends a training run.
    Call it after the size and plan checks (a bomb is refused before any decoding)."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(_source(src)) as im:
                if im.format == "JPEG":
                    im.draft("RGB", (max(1, im.width // 8), max(1, im.height // 8)))
                im.load()
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError) as e:
        raise ProbeError("corrupt_image", f"the image data is damaged: {type(e).__name__}: {e}") from None


def check_video_frames(src, frame_indices, num_frames: int | None = None) -> None:
    """Decode the frames ``frame_indices`` of a video exactly as the reader will (``--probe decode``), a chunk at a
    time: a video whose header is fine but whose frame data is damaged, or whose decoder sees another frame count than
    the header's ``num_frames``, is ``corrupt_video`` now, not a failed read in training."""
    from fcp_data.video import iter_frames

    if hasattr(src, "read"):  # decord takes bytes or a path, not a file object
        src.seek(0)
        src = src.read()
    try:
        for _ in iter_frames(src, frame_indices, num_frames):
            pass
    except Exception as e:  # VideoDecodeError, or anything else decord raises on bad data
        first = str(e).strip().splitlines()
        if type(e).__name__ == "StaleSampleError":  # here: the decoder and the header disagree
            what = str(e).split(":")[0].replace(" indexed", " of its header")
            raise ProbeError("corrupt_video", f"{what} (decord disagrees)") from None
        raise ProbeError("corrupt_video", f"frame data: {first[0][:200] if first else type(e).__name__}") from None


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


def member_path(root: str | Path, key: str, ext: str) -> Path:
    """The file of member ``ext`` of folder sample ``key``. The index stores extensions lower-cased (they classify
    members), while the file may be named ``IMG_0001.JPG``: ``key.ext`` when it exists, else ``key.EXT``, else the
    one file of the folder named ``key.`` plus ``ext`` in any case. None: ``FileNotFoundError`` naming ``key.ext``."""
    p = Path(root) / f"{key}.{ext}"
    if p.exists():
        return p
    up = Path(root) / f"{key}.{ext.upper()}"
    if up.exists():
        return up
    d, _, stem = key.rpartition("/")
    folder = Path(root) / d if d else Path(root)
    try:
        hits = [n for n in os.listdir(folder) if n.startswith(f"{stem}.") and n[len(stem) + 1:].lower() == ext]
    except OSError:
        hits = []
    if len(hits) == 1:
        return folder / hits[0]
    why = "no such file" if not hits else f"{len(hits)} files whose names differ only in case"
    raise FileNotFoundError(errno.ENOENT, why, str(p))


def _clean_end(tf: tarfile.TarFile, file_size: int) -> int | None:
    """None when the archive ends cleanly (a zero block, or nothing), else the byte where reading stopped."""
    off = tf.offset
    if off >= file_size:
        return None
    tf.fileobj.seek(off)
    block = tf.fileobj.read(tarfile.BLOCKSIZE)
    return None if len(block) == tarfile.BLOCKSIZE and not block.strip(b"\0") else off


def iter_tar_samples(path: str | Path) -> Iterator[tuple[str, dict[str, tuple[int, int]], str | None]]:
    """Yield ``(key, {ext: (offset, size)}, problem)`` for consecutive members sharing a key.

    Only tar headers are read (tarfile seeks over member data). ``problem`` is None or ``"reason: detail"``:
    ``truncated_member`` when a member's data runs past the end of the file, ``not_a_file`` for a link or
    device member, ``duplicate_member`` when a key has two members with the same extension. Folder members
    are skipped. A shard that cannot be opened raises ``ProbeError("unreadable_shard")``; one that breaks off
    mid-way yields what came before and then a final ``(path#offset, {}, "truncated_shard: ...")``.
    Member names that are not UTF-8 give keys with lone surrogates (tarfile's ``surrogateescape``).
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
            except Exception as e:  # TarError, OSError, EOFError, or a decoding error in a pax header
                if cur_key is not None:
                    yield cur_key, cur, problem
                    cur_key = None
                yield f"{p.name}#{last_end}", {}, f"truncated_shard: {type(e).__name__}"
                return
            if ti is None:
                end = _clean_end(tf, file_size)
                if cur_key is not None:
                    yield cur_key, cur, problem
                if end is not None:  # tarfile stops silently at a bad or cut header past the first one
                    yield f"{p.name}#{end}", {}, f"truncated_shard: bad or cut tar header at byte {end}"
                return
            if ti.isdir():
                continue
            key, ext = split_key(ti.name)
            if not key:
                key = f"{p.name}#{int(ti.offset)}"
            if key != cur_key:
                if cur_key is not None:
                    yield cur_key, cur, problem
                cur_key, cur, problem = key, {}, None
            if not ti.isfile():
                problem = problem or f"not_a_file: member {ext!r} is a link or device"
                continue
            if ext in cur:
                problem = problem or f"duplicate_member: two .{ext} members"
            cur[ext] = (int(ti.offset_data), int(ti.size))
            last_end = int(ti.offset_data + ti.size)
            if last_end > file_size:
                problem = "truncated_member: data runs past the end of the shard"


def iter_dir_samples(root: Path, entries: list[list]) -> Iterator[tuple[str, dict[str, tuple[int, int]], str | None]]:
    """Group folder ``entries`` (``inputs.walk_folder``, sorted) by key; offsets are 0, sizes the file sizes.

    An entry with a problem (broken link, loop, not a file) makes its sample's problem; a key that is not
    UTF-8 is ``bad_name`` (a reader opens ``key.ext`` by name, so it cannot be escaped).
    """
    groups: dict[str, list[list]] = {}
    for entry in entries:
        groups.setdefault(split_key(entry[0])[0], []).append(entry)
    for key, group in groups.items():
        cur, problem = {}, None
        for rel, a, b in group:
            ext = split_key(rel)[1]
            if isinstance(a, str):
                problem = problem or f"{a}: {rel.encode('utf-8', 'backslashreplace').decode()}: {b}"
            else:
                if ext in cur:  # a.jpg and a.JPG: extensions are compared lower-cased
                    problem = problem or f"duplicate_member: two .{ext} files (names differing only in case)"
                cur[ext] = (0, int(a))
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            problem = problem or "bad_name: the file name is not UTF-8"
        yield key, cur, problem
