"""LLaVA-OneVision's AnyRes images, from an image's size alone (no pixels, no transformers): its crops and the
``<image>`` tokens its processor writes, and the geometry the reader crops with.

The rules of transformers' ``LlavaOnevisionImageProcessor`` / ``LlavaOnevisionProcessor`` (5.18–5.25), written out:

* the best resolution among the grid pinpoints ``(h, w)`` maximises the image's effective pixels at that size
  (downscaled, never upscaled), ties to the least wasted area (``select_best_resolution``);
* the image is resized into it keeping its aspect ratio (the side that binds takes the target, the other
  ``ceil(side · scale)``, ``get_patch_output_size``), centred on a zero canvas of the best resolution, and cut into
  ``tile × tile`` crops row by row; the whole image resized to ``tile × tile`` comes first: ``crops = (h/tile)·(w/tile)
  + 1``;
* tokens = ``P²`` (the whole image, ``P = tile / patch``) + the crops' ``P``-grid unpadded to the image's aspect
  ratio, one newline per row, shrunk by ``sqrt(rows·cols / (max_patches·P²))`` when that exceeds 1.1
  (``anyres_max_9``: ``max_patches = 9``).

``fcp_exec.integrations.hf_llava.image_tokens`` counts the same from the model's own packing; a test holds the two
equal, and equal to the processor's count.
"""

from __future__ import annotations

import math

__all__ = ["best_resolution", "num_crops", "image_tokens", "resized_size"]


def best_resolution(size: tuple[int, int], pinpoints) -> tuple[int, int]:
    """``(h, w)`` of the grid pinpoints that an image of ``size`` = (H, W) is processed at."""
    height, width = size
    best, most, least_waste = None, 0, math.inf
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - effective
        if effective > most or (effective == most and waste < least_waste):
            best, most, least_waste = (int(h), int(w)), effective, waste
    return best


def resized_size(size: tuple[int, int], target: tuple[int, int]) -> tuple[int, int]:
    """``(h, w)`` of an image of ``size`` resized into ``target`` keeping its aspect ratio."""
    (height, width), (th, tw) = size, target
    if tw / width < th / height:
        return min(math.ceil(height * tw / width), th), tw
    return th, min(math.ceil(width * th / height), tw)


def num_crops(size: tuple[int, int], pinpoints, tile: int) -> int:
    """Crops of an image of ``size``: the best resolution's ``tile``-crops + the whole image."""
    h, w = best_resolution(size, pinpoints)
    return math.ceil(h / tile) * math.ceil(w / tile) + 1


def image_tokens(size: tuple[int, int], pinpoints, tile: int, patch: int, max_patches: int = 9) -> int:
    """``<image>`` tokens of an image of ``size`` alone in its sample (module docstring)."""
    height, width = size
    h, w = best_resolution(size, pinpoints)
    side = tile // patch
    cur_h, cur_w = side * (h // tile), side * (w // tile)
    if width / height > cur_w / cur_h:
        cur_h -= 2 * ((cur_h - int(round(height * (cur_w / width), 7))) // 2)
    else:
        cur_w -= 2 * ((cur_w - int(round(width * (cur_h / height), 7))) // 2)
    rows, cols = cur_h, cur_w
    ratio = math.sqrt(cur_h * cur_w / (max_patches * side ** 2))
    if ratio > 1.1:
        rows, cols = int(cur_h // ratio), int(cur_w // ratio)
    return side * side + rows * cols + rows
