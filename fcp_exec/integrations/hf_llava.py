"""LLaVA-OneVision (transformers' ``llava_onevision``) in :mod:`~fcp_exec.integrations.hf_vision`: its images and
videos as rows of a CP group's vision exchange, each encoded by the model's own code.

fcp's format of a LLaVA-OneVision document: ``pixel_values`` ``[rows, 3, S, S]`` (S = the vision tower's image size)
and one ``grid_thw`` row per image or video, in order of appearance:

* a video of ``t`` frames: ``(t, p, p)`` and its ``t`` frames, ``p = ceil(S / patch / 2)`` (its processor writes
  ``t·p² + 1`` ``<video>`` tokens: 2×2-pooled frames, then the model's learned ``image_newline``);
* an image: ``(−n, H, W)``: its ``n`` crops (AnyRes: the whole image resized, then the crops of the best-fit grid —
  ``n ≥ 2``; a sample of several images: one padded square crop, ``n = 1``) and its size in pixels before
  processing, which the model's ``pack_image_features`` needs (unpadding, a newline per row); as many ``<image>``
  tokens as that packing yields (:func:`image_tokens`).

The exchange table (:func:`frame_table`) has one row per video frame, per video newline and per image (an image's
crops are packed together, so one rank encodes all of them); its rows are weighted by the vision tower's patches.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

__all__ = ["pooled_side", "image_tokens", "num_crops", "frame_table", "encode_frames", "encode_rows",
           "synthetic_entry", "processor_inputs", "fcp_inputs", "FRAME", "NEWLINE", "IMAGE"]

FRAME, NEWLINE, IMAGE = 0, 1, 2  # kinds of a table row (column 5)


def _patches(config) -> int:
    v = config.vision_config
    return int(v.image_size) // int(v.patch_size)


def pooled_side(config) -> int:
    """Visual tokens per side of one pooled video frame, ``ceil(image_size / patch_size / 2)``."""
    return math.ceil(_patches(config) / 2)


def num_crops(config, size: tuple[int, int], single: bool = True) -> int:
    """Crops of an image of ``size`` = (H, W) pixels: AnyRes's best-fit grid + the whole image (``single``: the only
    image of its sample), else 1 — the model's own ``image_size_to_num_patches`` rule."""
    if not single:
        return 1
    from transformers.models.llava_onevision.modeling_llava_onevision import image_size_to_num_patches

    return int(image_size_to_num_patches(list(size), config.image_grid_pinpoints, int(config.vision_config.image_size)))


def image_tokens(config, crops: int, size: tuple[int, int]) -> int:
    """``<image>`` tokens of an image of ``crops`` crops and ``size`` pixels: the length of the model's own
    ``pack_image_features`` on zero features (base crop, unpadded grid with a newline per row, or one crop + a
    newline), so the count cannot drift from the model's."""
    from transformers.models.llava_onevision.modeling_llava_onevision import LlavaOnevisionModel

    p = _patches(config)
    packed, _ = LlavaOnevisionModel.pack_image_features(
        SimpleNamespace(config=config), [torch.zeros(int(crops), p * p, 1)], torch.tensor([list(size)]),
        image_newline=torch.zeros(1), vision_aspect_ratio=getattr(config, "vision_aspect_ratio", "anyres_max_9"))
    return int(packed[0].shape[0])


def frame_table(grid_thw: torch.Tensor, config) -> torch.Tensor:
    """The exchange table of a group's LLaVA-OneVision grids (module docstring): rows ``[row_start, rows, pixel
    row, weight_h, weight_w, kind, crops, H, W]`` — a frame ``(…, p², its pixel row, P, P, FRAME, 1, 0, 0)``, a
    newline ``(…, 1, -1, 1, 1, NEWLINE, 0, 0, 0)``, an image ``(…, tokens, its first crop, n·P, P, IMAGE, n, H, W)``
    (P = vision patches per side: a row's weight is the tower's patches)."""
    g = torch.as_tensor(grid_thw, dtype=torch.long).reshape(-1, 3).cpu()
    big = _patches(config)
    rows, row0, pix0 = [], 0, 0
    for t, h, w in g.tolist():
        if t < 0:  # an image of -t crops, h × w pixels
            n = image_tokens(config, -t, (h, w))
            rows.append((row0, n, pix0, -t * big, big, IMAGE, -t, h, w))
            row0, pix0 = row0 + n, pix0 - t
            continue
        for _ in range(t):
            rows.append((row0, h * w, pix0, big, big, FRAME, 1, 0, 0))
            row0, pix0 = row0 + h * w, pix0 + 1
        rows.append((row0, 1, -1, 1, 1, NEWLINE, 0, 0, 0))
        row0 += 1
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 9)


def encode_frames(model: nn.Module, frames: torch.Tensor) -> torch.Tensor:
    """Rows ``[n·p², hidden]`` of video frames ``[n, 3, H, W]``: the model's ``get_video_features`` on them as one
    video, without the newline it appends."""
    out = getattr(model, "model", model).get_video_features(pixel_values_videos=frames[None], return_dict=True)
    return out.pooler_output[0, :-1]


def _tower_features(inner: nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """``[n, P², hidden]``: crops or frames through the vision tower (its selected hidden state) and the projector,
    as the model's ``get_image_features`` / ``get_video_features`` do before packing / pooling."""
    cfg = inner.config
    out = inner.vision_tower(pixels, output_hidden_states=True, return_dict=True)
    layer = cfg.vision_feature_layer
    hidden = out.hidden_states[layer] if isinstance(layer, int) else \
        torch.cat([out.hidden_states[k] for k in layer], dim=-1)
    if cfg.vision_feature_select_strategy == "default":
        hidden = hidden[:, 1:]
    return inner.multi_modal_projector(hidden)


def encode_rows(model: nn.Module, table: torch.Tensor, pv: torch.Tensor, no_pixels) -> torch.Tensor:
    """Rows of the table rows ``table`` (a non-empty contiguous share) in order. The share's frames and crops go
    through the vision tower in ONE call (an FSDP2-sharded tower must run as often on every rank: a share of newline
    rows only calls ``no_pixels()``, the caller's zero-weighted dummy frame, instead), then frames are pooled by the
    model's ``apply_pooling``, each image's crops packed by its ``pack_image_features`` (AnyRes unpadding, newlines),
    and each video's newline is the model's ``image_newline``."""
    inner = getattr(model, "model", model)
    picks, spans = [], []  # pixel rows in table order; per table row its slice of them
    for r in range(table.shape[0]):
        lo, n = int(table[r, 2]), (int(table[r, 6]) if int(table[r, 5]) != NEWLINE else 0)
        spans.append((sum(len(x) for x in picks), n))
        picks.append(list(range(lo, lo + n)))
    index = torch.tensor([i for x in picks for i in x], dtype=torch.long, device=pv.device)
    feats = _tower_features(inner, pv.index_select(0, index)) if index.numel() else no_pixels()
    aspect = getattr(inner.config, "vision_aspect_ratio", "anyres_max_9")
    parts = []
    for r, (at, n) in enumerate(spans):
        kind = int(table[r, 5])
        if kind == NEWLINE:
            parts.append(inner.image_newline[None])
        elif kind == FRAME:
            parts.append(inner.apply_pooling(feats[at:at + n]).reshape(-1, feats.shape[-1]))
        else:
            size = torch.tensor([[int(table[r, 7]), int(table[r, 8])]])
            packed, _ = inner.pack_image_features([feats[at:at + n]], size, image_newline=inner.image_newline,
                                                  vision_aspect_ratio=aspect)
            parts.append(packed[0])
    return torch.cat([x.to(feats.dtype) for x in parts], dim=0)


SYNTHETIC_SIZES = ((40, 90), (56, 56), (100, 30), (30, 45))  # image sizes of the synthetic documents (H, W)


def synthetic_entry(config, kind: str, t: int, serial: int, images_in_doc: int) -> tuple[str, int, tuple]:
    """A synthetic document's image or video (``hf_data.SyntheticHFDocs``): ``(placeholder kind, tokens, grid
    row)`` — a video of ``t`` frames, or an image of ``SYNTHETIC_SIZES[serial % 4]`` (AnyRes when it is the only
    image of its document, one crop otherwise)."""
    if kind == "video":
        p = pooled_side(config)
        return "video", t * p * p + 1, (t, p, p)
    size = SYNTHETIC_SIZES[serial % len(SYNTHETIC_SIZES)]
    crops = num_crops(config, size, single=images_in_doc == 1)
    return "image", image_tokens(config, crops, size), (-crops, *size)


def processor_inputs(sample: dict) -> dict:
    """fcp's format of one document (module docstring) as LLaVA-OneVision's processor returns it: ``pixel_values``
    ``[images, most crops, 3, S, S]`` (zero-padded), ``image_sizes``, ``batch_num_images`` and
    ``pixel_values_videos`` ``[videos, frames, 3, S, S]`` (its videos have one frame count)."""
    grids = torch.as_tensor(sample["grid_thw"], dtype=torch.long).reshape(-1, 3).tolist()
    pv = torch.as_tensor(sample["pixel_values"])
    images, sizes, videos, at = [], [], [], 0
    for t, h, w in grids:
        n = abs(t)
        (images if t < 0 else videos).append(pv[at:at + n])
        sizes += [[h, w]] if t < 0 else []
        at += n
    out: dict = {}
    if images:
        most = max(x.shape[0] for x in images)
        out["pixel_values"] = torch.stack([torch.cat([x, x.new_zeros((most - x.shape[0], *x.shape[1:]))])
                                           for x in images])
        out["image_sizes"] = torch.tensor(sizes, dtype=torch.long)
        out["batch_num_images"] = torch.tensor([len(images)], dtype=torch.long)
    if videos:
        out["pixel_values_videos"] = torch.stack(videos)
    return out


def fcp_inputs(sample: dict, config) -> dict:
    """The inverse of :func:`processor_inputs` for a sample a processor made (``pixel_values`` + ``image_sizes``,
    ``pixel_values_videos``): fcp's ``pixel_values`` rows and grid rows in order of appearance — the document's
    runs of ``<image>`` / ``<video>`` tokens, each image taking as many as its packing yields. A sample already in
    fcp's format (``grid_thw``), or with neither, passes unchanged."""
    from fcp_data.slots import MalformedSampleError

    if not isinstance(sample, dict) or sample.get("grid_thw") is not None or \
            (sample.get("pixel_values") is None and sample.get("pixel_values_videos") is None):
        return sample
    ids = torch.as_tensor(sample["input_ids"]).reshape(-1)
    images, videos = _processor_images(sample, config), _processor_videos(sample, config)
    rows, grids, k_img, k_vid, pos = [], [], 0, 0, 0
    image_id, video_id = int(config.image_token_id), int(config.video_token_id)
    while pos < ids.numel():
        tok = int(ids[pos])
        queue, k = (images, k_img) if tok == image_id else (videos, k_vid) if tok == video_id else (None, 0)
        if queue is None:
            pos += 1
            continue
        if k >= len(queue):
            raise MalformedSampleError(f"the sample has more {'<image>' if tok == image_id else '<video>'} runs than "
                                       "its pixel values hold")
        pixels, grid, count = queue[k]
        if not bool((ids[pos:pos + count] == tok).all()) or pos + count > ids.numel():
            raise MalformedSampleError(f"a {'n image' if tok == image_id else ' video'} of grid {grid} needs {count} "
                                       "placeholder tokens in a row; the sample's ids disagree")
        rows.append(pixels)
        grids.append(grid)
        k_img, k_vid = (k_img + 1, k_vid) if tok == image_id else (k_img, k_vid + 1)
        pos += count
    if (k_img, k_vid) != (len(images), len(videos)):
        raise MalformedSampleError(f"the sample's ids place {k_img} images and {k_vid} videos, its pixel values hold "
                                   f"{len(images)} and {len(videos)}")
    rest = {k: v for k, v in sample.items() if k not in ("pixel_values", "pixel_values_videos", "image_sizes",
                                                          "batch_num_images")}
    return {**rest, "pixel_values": torch.cat(rows), "grid_thw": torch.tensor(grids, dtype=torch.long)}


def _processor_images(sample: dict, config) -> list[tuple[torch.Tensor, tuple, int]]:
    if sample.get("pixel_values") is None:
        return []
    pv = torch.as_tensor(sample["pixel_values"])
    pv = pv[None] if pv.dim() == 4 else pv
    sizes = torch.as_tensor(sample["image_sizes"]).reshape(-1, 2).tolist()
    if pv.dim() != 5 or len(sizes) != pv.shape[0]:
        from fcp_data.slots import MalformedSampleError

        raise MalformedSampleError(f"pixel_values {tuple(pv.shape)} and image_sizes of {len(sizes)} images: a LLaVA-"
                                   "OneVision processor gives [images, crops, 3, H, W] and one (H, W) per image")
    out = []
    for x, (h, w) in zip(pv, sizes):
        n = num_crops(config, (h, w), single=len(sizes) == 1)
        out.append((x[:n], (-n, h, w), image_tokens(config, n, (h, w))))
    return out


def _processor_videos(sample: dict, config) -> list[tuple[torch.Tensor, tuple, int]]:
    if sample.get("pixel_values_videos") is None:
        return []
    pv = torch.as_tensor(sample["pixel_values_videos"])
    pv = pv[None] if pv.dim() == 4 else pv
    if pv.dim() != 5:
        from fcp_data.slots import MalformedSampleError

        raise MalformedSampleError(f"pixel_values_videos has shape {tuple(pv.shape)}; a LLaVA-OneVision processor "
                                   "gives [videos, frames, 3, H, W]")
    p = pooled_side(config)
    return [(v, (int(v.shape[0]), p, p), int(v.shape[0]) * p * p + 1) for v in pv]
