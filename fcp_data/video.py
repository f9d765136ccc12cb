"""Decode only the sampled frames, resize and patchify them in the model family's layout.

The frame indices, target sizes and tile grids come from :func:`fcp_data.specs.plan_visual`, the same
plan the length index counted, so the produced patches always match the index's visual token count.

- Qwen-VL: decord ``get_batch`` of the plan's frames → torch bicubic antialiased resize to the plan's
  (H, W) (what qwen-vl-utils does with torchvision) → rescale 1/255, normalise → patchify with temporal
  patch 2 (last frame repeated when the count is odd) and 2×2 merge order:
  ``pixel_values [t·h·w, C·tp·p·p]`` (transformers Qwen2-VL layout), ``grid_thw [[t, h, w]]`` in patches.
  Videos also get Qwen2.5-VL's ``second_per_grid_ts`` (:func:`qwen_second_per_grid`).
- InternVL: 448-px tiles (PIL bicubic), images tiled by the plan's (cols, rows) + thumbnail, video frames one
  tile each: ``pixel_values [tiles, 3, 448, 448]``, ``grid_thw [[tiles, 32, 32]]`` (14-px patches per tile;
  tokens = t·h·w / 4 after the 0.5 pixel shuffle).
- LLaVA-Video: frames resized to 384×384: ``pixel_values [frames, 3, 384, 384]``, ``grid_thw [[frames, 14, 15]]``
  (14×14 pooled patches + one newline token per row = 210 per frame).

Video frames are decoded :data:`DECODE_CHUNK_BYTES` at a time and resized before the next chunk, so one read of a
long high-resolution video holds about a chunk of full-size frames plus its resized output, never every sampled frame
at full size (nor their float32 copy); the values are those of a one-batch decode. A video whose frame count is more
than a frame or two (or 1 %) from the indexed one is a :class:`~fcp_data.slots.StaleSampleError` (it changed since
indexing), never its last frame repeated to fill the plan. 16-bit greyscale images are scaled to 8 bits.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import torch

from fcp_data.specs import Spec, VisualPlan

__all__ = ["VideoDecodeError", "decode_frames", "iter_frames", "decode_image", "qwen_patchify", "qwen_second_per_grid",
           "vision_inputs", "zero_vision_inputs"]


_QUIET = []


class VideoDecodeError(RuntimeError):
    """A video whose frames cannot be decoded (damaged data, often behind a readable header)."""


DECODE_CHUNK_BYTES = 64 << 20  # decoded frames held at once by a read (then resized and let go): bounds its peak memory


def _stale(msg: str) -> Exception:
    from fcp_data.slots import StaleSampleError

    return StaleSampleError(f"{msg}: it changed since indexing")


def iter_frames(src: bytes | str | Path, indices, num_frames: int | None = None, chunk_bytes: int | None = None):
    """Frames ``indices`` of a video as uint8 ``[t, H, W, 3]`` chunks of about ``chunk_bytes`` (the first chunk is one
    frame, which sizes the rest), so a long high-resolution video is never held whole. ``num_frames``: the frame
    count the index recorded; a video more than max(2, 1 %) frames from it raises
    :class:`~fcp_data.slots.StaleSampleError` (within that, decoders' counts differ: the last frame stands in). An
    undecodable video raises :class:`VideoDecodeError` with decord's message, less its time stamp and source line;
    libav's own per-packet error lines are silenced."""
    import decord

    if not _QUIET:
        decord.logging.set_level(decord.logging.FATAL)
        _QUIET.append(True)
    try:
        vr = decord.VideoReader(io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else str(src), num_threads=1)
        # decoders may count a frame or two apart from the header the index read (edit lists, a trailing frame):
        # within that tolerance the last frame stands in; a larger difference is another file than the indexed one
        if num_frames is not None and abs(len(vr) - int(num_frames)) > max(2, int(num_frames) // 100):
            raise _stale(f"the video has {len(vr)} frames, not the {int(num_frames)} indexed")
        idx = [min(int(i), len(vr) - 1) for i in indices]
        pos, step = 0, 1
        while pos < len(idx):
            batch = vr.get_batch(idx[pos:pos + step]).asnumpy()
            yield batch
            pos += step
            step = max(1, int(chunk_bytes or DECODE_CHUNK_BYTES) // max(batch[0].nbytes, 1))
    except decord.DECORDError as e:
        lines = str(e).strip().splitlines()
        # decord prefixes "[hh:mm:ss] file.cc:line: ", nested once per layer: all stripped (a record stays the same)
        msg = re.sub(r"^(?:\[\d{2}:\d{2}:\d{2}\] \S+:\d+: )+", "", lines[0] if lines else "")
        raise VideoDecodeError(f"cannot decode the video's frames ({msg})") from None


def decode_frames(src: bytes | str | Path, indices, num_frames: int | None = None) -> np.ndarray:
    """Frames ``indices`` of a video as uint8 ``[T, H, W, 3]`` (decord; nothing else is decoded; see
    :func:`iter_frames`, which a reader uses to hold only a chunk at a time)."""
    return np.concatenate(list(iter_frames(src, indices, num_frames)))


def decode_image(src: bytes | str | Path):
    """An image as 8-bit RGB. A 16-bit greyscale image (PNG: pillow mode ``I;16``/``I``) is scaled to 8 bits
    (``>> 8``) first: pillow's ``convert("RGB")`` clips it at 255, turning most of it white."""
    from PIL import Image

    im = Image.open(io.BytesIO(src) if isinstance(src, (bytes, bytearray)) else str(src))
    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.asarray(im).astype(np.int64) >> 8
        im = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), mode="L")
    return im.convert("RGB")


def _normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """x: [..., C, H, W] in 0..255 (any dtype) → a new float32 ``(x/255 - mean) / std``, computed as
    ``x · (1/(255·std)) − mean/std`` on the ``[N, C, H·W]`` view (one copy to float32, two in-place passes with
    the per-channel factors broadcast over the last axis): ~1.5× faster than four broadcast passes over
    ``[C, 1, 1]`` on 448×448 tiles; equal to that form to float32 rounding (≤ 1e-6)."""
    m = torch.tensor(mean, dtype=torch.float64).view(-1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(-1, 1)
    y = x.to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    c, h, w = y.shape[-3:]
    y.view(-1, c, h * w).mul_((1.0 / (255.0 * s)).float()).sub_((m / s).float())
    return y


def _tiles_to_tensor(tiles: list[np.ndarray], mean, std) -> torch.Tensor:
    """uint8 HWC tiles → normalised float32 [N, 3, H, W] (one copy to float, then in place)."""
    x = torch.from_numpy(np.stack(tiles)).permute(0, 3, 1, 2).contiguous()
    return _normalize(x, mean, std)


def qwen_patchify(frames: torch.Tensor, patch_size: int, merge_size: int, temporal_patch_size: int) -> tuple[torch.Tensor, tuple]:
    """``frames [T, C, H, W]`` → (``[t·h·w, C·tp·p·p]``, (t, h, w)) in transformers' Qwen2-VL order."""
    T, C, H, W = frames.shape
    p, m, tp = patch_size, merge_size, temporal_patch_size
    if H % (p * m) or W % (p * m):
        raise ValueError(f"frame size {H}x{W} is not a multiple of patch*merge = {p * m}")
    if T % tp:
        frames = torch.cat([frames, frames[-1:].expand(tp - T % tp, -1, -1, -1)])
    t, h, w = frames.shape[0] // tp, H // p, W // p
    x = frames.reshape(t, tp, C, h // m, m, p, w // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(t * h * w, C * tp * p * p).contiguous(), (t, h, w)


def qwen_second_per_grid(num_sampled_frames: int, total_frames: int, video_fps: float, temporal_patch_size: int) -> float:
    """Seconds one temporal patch of a video spans, as transformers' ``Qwen2_5_VLProcessor`` computes
    ``second_per_grid_ts``: ``temporal_patch_size / sampled_fps`` with ``sampled_fps = num_sampled_frames /
    total_frames · video_fps`` (qwen-vl-utils ``fetch_video``'s ``sample_fps``, transformers
    ``VideoMetadata.sampled_fps``)."""
    if num_sampled_frames < 1 or total_frames < 1 or video_fps <= 0:
        raise ValueError(f"need sampled frames, frames and a positive fps, got {num_sampled_frames}, {total_frames}, "
                         f"{video_fps}")
    return temporal_patch_size / (num_sampled_frames / total_frames * video_fps)


def _resize_bicubic(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``[T, C, H, W]`` float → resized like ``torchvision.transforms.functional.resize(BICUBIC, antialias=True)`` in
    float, then rounded. torchvision given uint8 (qwen-vl-utils, transformers' processors) uses a fixed-point uint8
    kernel: within 1 grey level on natural frames, up to ~21 on pixel noise (a review measured, stop 60)."""
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    y = torch.nn.functional.interpolate(x, size=size, mode="bicubic", align_corners=False, antialias=True)
    return y.clamp_(0, 255).round_()  # torchvision on uint8 input clamps and rounds back to uint8 values


def _pil_resize(arr_or_img, size_wh: tuple[int, int]) -> np.ndarray:
    from PIL import Image

    im = arr_or_img if isinstance(arr_or_img, Image.Image) else Image.fromarray(arr_or_img)
    return np.asarray(im.resize(size_wh, Image.BICUBIC), dtype=np.uint8)


def _qwen_video(plan: VisualPlan, src, num_frames: int | None, chunk_bytes: int | None) -> torch.Tensor:
    """A video's sampled frames resized to the plan's size, decoded and resized a chunk at a time: uint8
    ``[T, C, H, W]`` (the bicubic resize clamps and rounds to 0..255, so uint8 holds its values exactly)."""
    parts = []
    for chunk in iter_frames(src, plan.frame_indices, num_frames, chunk_bytes):
        x = _resize_bicubic(torch.from_numpy(chunk).permute(0, 3, 1, 2).float(), plan.resized)
        parts.append(x.to(torch.uint8))
        del chunk, x
    return torch.cat(parts)


def vision_inputs(spec: Spec, plan: VisualPlan, src: bytes | str | Path, num_frames: int | None = None, *,
                  chunk_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(``pixel_values``, ``grid_thw [1, 3]``) of one image or video following ``plan``. ``num_frames``: a video's
    frame count as indexed (another count is a :class:`~fcp_data.slots.StaleSampleError`). Video frames are decoded
    ``chunk_bytes`` (default :data:`DECODE_CHUNK_BYTES`, read at the call) at a time and resized before the next
    chunk (:func:`iter_frames`)."""
    v, fam = spec.vision, spec.family
    if plan.kind != "video":
        img = decode_image(src)
    if fam == "qwen-vl":
        x = _qwen_video(plan, src, num_frames, chunk_bytes) if plan.kind == "video" else \
            _resize_bicubic(torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1)[None], plan.resized)
        if plan.kind == "image":  # an image is one frame repeated over the temporal patch
            x = x.expand(v["temporal_patch_size"], -1, -1, -1)
        x = _normalize(x, v["image_mean"], v["image_std"])
        pv, grid = qwen_patchify(x, v["patch_size"], v["merge_size"], v["temporal_patch_size"])
        if grid != plan.grid_thw:
            raise ValueError(f"patch grid {grid} differs from the planned {plan.grid_thw}: the file changed since indexing")
        return pv, torch.tensor([grid], dtype=torch.long)
    size, grid = _tile_grid(spec, plan)
    if fam == "internvl" and plan.kind == "image":
        cols, rows = plan.resized
        big = _pil_resize(img, (cols * size, rows * size))
        tiles = [big[r * size:(r + 1) * size, c * size:(c + 1) * size] for r in range(rows) for c in range(cols)]
        if v["image"].get("use_thumbnail", True) and len(tiles) > 1:
            tiles.append(_pil_resize(img, (size, size)))
    elif fam == "llava-video" and plan.kind == "image" and plan.grid_thw is not None:  # LLaVA-OneVision's AnyRes
        tiles = _anyres_crops(spec, img, size) if grid[0] < -1 else [_square_crop(spec, img, size)]
        if len(tiles) != -grid[0] or tuple(img.size[::-1]) != tuple(grid[1:]):
            raise ValueError(f"image of {img.size[1]}x{img.size[0]} px, {len(tiles)} crops differs from the planned "
                             f"{grid[1]}x{grid[2]}, {-grid[0]}: the file changed since indexing")
    elif plan.kind == "video":  # an InternVL video frame is one tile; LLaVA-Video resizes each frame to one square
        tiles = [_pil_resize(f, (size, size)) for c in iter_frames(src, plan.frame_indices, num_frames, chunk_bytes)
                 for f in c]
    else:
        tiles = [_pil_resize(img, (size, size))]
    return _tiles_to_tensor(tiles, v["image_mean"], v["image_std"]), torch.tensor([grid], dtype=torch.long)


def _square_crop(spec: Spec, img, tile: int) -> np.ndarray:
    """LLaVA-OneVision's one crop of an image among several in its sample: padded to a square, centred, with the
    image mean as the background (its processor's ``pad_to_square``), then resized to ``tile × tile``."""
    arr = np.asarray(img, dtype=np.uint8)
    h, w = arr.shape[:2]
    side = max(h, w)
    canvas = np.empty((side, side, 3), dtype=np.uint8)
    canvas[:] = [int(x * 255) for x in spec.vision["image_mean"]]
    y, x = (side - h) // 2, (side - w) // 2
    canvas[y:y + h, x:x + w] = arr
    return _pil_resize(canvas, (tile, tile))


def _anyres_crops(spec: Spec, img, tile: int) -> list[np.ndarray]:
    """LLaVA-OneVision's crops of one image (:mod:`fcp_data.anyres`): the whole image resized to ``tile × tile``,
    then the image resized into its best resolution keeping its aspect ratio, centred on a zero canvas and cut into
    ``tile × tile`` crops row by row (PIL bicubic: the processor's token count, not its exact pixels)."""
    from fcp_data import anyres

    w, h = img.size
    bh, bw = anyres.best_resolution((h, w), spec.vision["image"]["anyres"]["grid_pinpoints"])
    nh, nw = anyres.resized_size((h, w), (bh, bw))
    canvas = np.zeros((bh, bw, 3), dtype=np.uint8)
    y, x = (bh - nh) // 2, (bw - nw) // 2
    canvas[y:y + nh, x:x + nw] = _pil_resize(img, (nw, nh))
    crops = [canvas[r:r + tile, c:c + tile] for r in range(0, bh, tile) for c in range(0, bw, tile)]
    return [_pil_resize(img, (tile, tile))] + crops


def _tile_grid(spec: Spec, plan: VisualPlan) -> tuple[int, tuple[int, int, int]]:
    """(square side in pixels, ``grid_thw`` row) of an InternVL/LLaVA-Video image or video under ``plan``: the row's
    first entry is the number of tiles/frames (InternVL: the tile grid plus its thumbnail), then the patch grid of
    one (InternVL: patches per tile side; LLaVA-Video: the pooled token grid of one frame)."""
    v, fam = spec.vision, spec.family
    if fam == "internvl":
        size = int(v["tile_size"])
        if plan.kind == "image":
            cols, rows = plan.resized
            n = cols * rows + (1 if v["image"].get("use_thumbnail", True) and cols * rows > 1 else 0)
        else:
            n = len(plan.frame_indices)
        g = size // int(v["patch_size"])
        return size, (n, g, g)
    if fam == "llava-video" and plan.kind == "image" and plan.grid_thw is not None:  # AnyRes: (−crops, H, W)
        return int(v["image_size"]), tuple(plan.grid_thw)
    if fam == "llava-video":
        n = len(plan.frame_indices) if plan.kind == "video" else 1
        side = int(round((plan.num_visual_tokens // n) ** 0.5)) if plan.kind == "video" else 27
        return int(v["image_size"]), (n, side, plan.num_visual_tokens // n // side)
    raise ValueError(f"spec {spec.name!r} has no vision inputs")


def zero_vision_inputs(spec: Spec, plan: VisualPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """What :func:`vision_inputs` returns for ``plan`` — same shapes, same grid — with zero pixels and nothing read:
    the vision inputs of a sample that failed to read (``IndexedDataset.skeleton``)."""
    v = spec.vision
    if spec.family == "qwen-vl":
        t, h, w = plan.grid_thw
        return (torch.zeros((t * h * w, 3 * int(v["temporal_patch_size"]) * int(v["patch_size"]) ** 2)),
                torch.tensor([plan.grid_thw], dtype=torch.long))
    size, grid = _tile_grid(spec, plan)
    return torch.zeros((abs(grid[0]), 3, size, size)), torch.tensor([grid], dtype=torch.long)

