"""Samples as Hugging Face preprocessing leaves them, made into what FCP's collator takes: padding stripped, and
Qwen-VL samples in a processor's format put into FCP's.

**Padding.** A dataset tokenized with ``padding="max_length"`` (or left padding) carries pad tokens that its
``attention_mask`` marks 0; the stock Trainer's collators keep them out of the loss. FCP packs documents itself, so
:func:`strip_padding` cuts ``input_ids`` (and ``labels``, ``attention_mask``, ``token_type_ids``,
``mm_token_type_ids``) to the run of ones — padded or not, a sample trains as its attended tokens — and the token
counts the sampler plans with are those of the mask (``hf_trainer_data.count_lengths``). A mask whose ones are not
one run, or of another length than the ids, is a ``MalformedSampleError``.

**Qwen-VL processor format.**
A processor (``Qwen2_5_VLProcessor(text=..., images=..., videos=...)``, what a Hugging Face VL fine-tuning recipe
maps over its dataset) returns one sample's images and videos apart: ``pixel_values`` + ``image_grid_thw`` for the
images, ``pixel_values_videos`` + ``video_grid_thw`` for the videos, and ``second_per_grid_ts``, ``attention_mask``,
``mm_token_type_ids``. FCP's collator takes one ``grid_thw`` row per image or video *in order of appearance* and
their patches in ``pixel_values`` in that order: the vision tower of a CP group encodes the frames of all its
documents at once, and the embeddings fill the placeholder tokens in order. So:

* :func:`fcp_sample` converts one sample (a sample already in FCP's format, or text, passes unchanged). The k-th
  image or video in order of appearance is the one whose placeholders come k-th among the sample's visual tokens;
  an image holds t·h·w / merge² of them in one run, a video as many (Qwen3-VL puts one run per temporal frame
  group, with its timestamp text between: the visual tokens stay consecutive in that count). A sample whose grids,
  patches and placeholders disagree is a ``fcp_data.slots.MalformedSampleError`` (a ``ValueError``) naming what
  disagrees.
* :class:`HFSamples` wraps a map-style dataset so that each sample is unpadded (and, for a Qwen-VL model,
  converted) when read (inside ``FCPDataset``: a sample that fails is recorded and skipped like an unreadable one).
* :func:`placeholder_spans` gives every sample's placeholder runs, what the sampler's visual layout needs to count
  the loss denominator exactly (labels whose target is a placeholder are not trained): from the ``input_ids`` Arrow
  column for a ``datasets.Dataset`` (no pixel is read), else sample by sample.

``FCPTrainer`` applies them to training and evaluation data that is not an fcp index.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from fcp_data.slots import MalformedSampleError

__all__ = ["HFSamples", "fcp_sample", "placeholder_spans", "strip_padding"]

PROCESSOR_KEYS = ("image_grid_thw", "video_grid_thw", "pixel_values_videos")
_PER_TOKEN = ("input_ids", "labels", "attention_mask", "token_type_ids", "mm_token_type_ids")
_CONSUMED = ("image_grid_thw", "video_grid_thw", "pixel_values_videos", "pixel_values", "mm_token_type_ids",
             "attention_mask")


def _num_rows(pixels: Any) -> int:
    if pixels is None or isinstance(pixels, float):
        return 0
    shape = getattr(pixels, "shape", None)  # a tensor or array; 0-d: a datasets row's missing Array2D (NaN)
    if shape is not None:
        return int(shape[0]) if len(shape) else 0
    return len(pixels)


def _patch_rows(pixels: Any) -> torch.Tensor:
    """Patch rows as one tensor: a tensor, an array, nested lists (a ``datasets`` row: through numpy, so their floats
    keep float64 — torch would make float32), or a list of per-image/per-video 2-D arrays or tensors (concatenated)."""
    if isinstance(pixels, torch.Tensor):
        return pixels
    if isinstance(pixels, (list, tuple)) and pixels and all(getattr(p, "ndim", 0) == 2 for p in pixels):
        return torch.cat([p if isinstance(p, torch.Tensor) else torch.from_numpy(np.asarray(p)) for p in pixels])
    return torch.from_numpy(np.asarray(pixels))


class _Media:
    """The images (or the videos) of one sample: grid rows and their patch rows, handed out in order."""

    def __init__(self, grid: Any, pixels: Any, name: str) -> None:
        self.name, self.next_row = name, 0
        self.grid = torch.zeros((0, 3), dtype=torch.long) if grid is None else \
            torch.as_tensor(grid, dtype=torch.long).reshape(-1, 3)
        sizes = (self.grid[:, 0] * self.grid[:, 1] * self.grid[:, 2]).tolist()
        if not sizes:  # no image (video): its pixels are None, or a datasets Array2D column's NaN, or no rows
            if _num_rows(pixels):
                raise MalformedSampleError(f"has {name} pixel values ({_num_rows(pixels)} rows) but no {name} grid rows")
            self.chunks = []
            return
        if pixels is None or _num_rows(pixels) == 0:
            raise MalformedSampleError(f"has {len(sizes)} {name} grid row(s) but no {name} pixel values")
        pixels = _patch_rows(pixels)
        if pixels.dim() != 2 or pixels.shape[0] != sum(sizes):
            raise MalformedSampleError(f"{name} pixel values of shape {tuple(pixels.shape)} do not hold the {sum(sizes)} "
                             f"patch rows of its grid(s) {self.grid.tolist()}")
        self.chunks = list(torch.split(pixels, sizes))

    def take(self) -> tuple[list[int], torch.Tensor]:
        if self.next_row >= len(self.grid):
            raise MalformedSampleError(f"has more {self.name} placeholder tokens than its {len(self.grid)} {self.name} grid "
                             "row(s) hold")
        k, self.next_row = self.next_row, self.next_row + 1
        return self.grid[k].tolist(), self.chunks[k]

    def check_used(self) -> None:
        if self.next_row != len(self.grid):
            raise MalformedSampleError(f"has {len(self.grid)} {self.name} grid row(s) but placeholder tokens for "
                             f"{self.next_row}")


def fcp_sample(sample: Any, *, image_token_id: int, video_token_id: int, merge: int) -> Any:
    """``sample`` in FCP's format: ``grid_thw`` (one row per image/video in order of appearance), ``pixel_values``
    (their patches in that order), ``second_per_grid_ts`` (one per video) — from a processor's output (module
    docstring). Other keys are kept but ``attention_mask`` and ``mm_token_type_ids`` (rebuilt by the collator). A
    sample with a processor's keys (``image_grid_thw``, ``video_grid_thw``, ``pixel_values_videos``; None or NaN in
    a ``datasets`` row without images or videos) is converted; anything else is returned as it is."""
    if not isinstance(sample, dict) or not any(k in sample for k in PROCESSOR_KEYS):
        return sample
    if sample.get("grid_thw") is not None:
        raise MalformedSampleError("has both grid_thw (FCP's format) and image_grid_thw/video_grid_thw (a processor's): give one")
    ids = torch.as_tensor(sample["input_ids"])
    if ids.dim() != 1:
        raise MalformedSampleError(f"has input_ids of shape {tuple(ids.shape)}; a sample's ids are 1-D (a processor called on "
                         "one sample returns a batch of 1: keep [0] of each output)")
    kinds = (ids == image_token_id).to(torch.int8) + 2 * (ids == video_token_id).to(torch.int8)
    kinds = kinds[kinds > 0]
    media = {1: _Media(sample.get("image_grid_thw"), sample.get("pixel_values"), "image"),
             2: _Media(sample.get("video_grid_thw"), sample.get("pixel_values_videos"), "video")}
    rows, chunks, cursor = [], [], 0
    while cursor < len(kinds):
        kind = int(kinds[cursor])
        row, chunk = media[kind].take()
        tokens = row[0] * row[1] * row[2] // (merge * merge)
        run = kinds[cursor:cursor + tokens]
        if tokens < 1 or row[1] % merge or row[2] % merge or len(run) < tokens or bool((run != kind).any()):
            raise MalformedSampleError(f"has a {media[kind].name} grid row {row} (t·h·w / {merge}² = {tokens} placeholder "
                             f"tokens) that does not match its placeholders from visual token {cursor} on")
        rows.append(row)
        chunks.append(chunk)
        cursor += tokens
    for m in media.values():
        m.check_used()
    out = {k: v for k, v in sample.items() if k not in _CONSUMED}
    out.pop("second_per_grid_ts", None)
    if not rows:  # a text sample of a processor's dataset
        return out
    out["grid_thw"] = torch.tensor(rows, dtype=torch.long)
    out["pixel_values"] = torch.cat(chunks)
    if sample.get("second_per_grid_ts") is not None and media[2].next_row:
        out["second_per_grid_ts"] = torch.as_tensor(sample["second_per_grid_ts"], dtype=torch.float64).reshape(-1)
    return out


def _attended(mask: Any, n: int) -> tuple[int, int] | None:
    """``(start, end)`` of the one run of ones of ``mask`` (None: no zero, nothing to cut)."""
    m = np.asarray(mask).reshape(-1)
    if m.size != n:
        raise MalformedSampleError(f"has an attention_mask of {m.size} for {n} input_ids (they must align)")
    if bool(m.all()):
        return None
    ones = np.flatnonzero(m)
    if not len(ones):
        return 0, 0
    start, end = int(ones[0]), int(ones[-1]) + 1
    if end - start != len(ones):
        raise MalformedSampleError(f"has an attention_mask whose ones are not one run (zeros between tokens {start} "
                                   f"and {end}): one sample is one document here")
    return start, end


def strip_padding(sample: Any) -> Any:
    """``sample`` cut to the tokens its ``attention_mask`` attends (module docstring); a sample without a mask, or
    whose mask has no zero, is returned as it is."""
    if not isinstance(sample, dict) or sample.get("attention_mask") is None or sample.get("input_ids") is None:
        return sample
    ids = sample["input_ids"]
    run = _attended(sample["attention_mask"], len(ids))
    if run is None:
        return sample
    start, end = run
    return {k: (v[start:end] if k in _PER_TOKEN and v is not None else v) for k, v in sample.items()}


def _attended_counts(data: Any) -> np.ndarray | None:
    """Every row's attended tokens from a ``datasets.Dataset``'s ``attention_mask`` Arrow column (None: no such
    list column without nulls)."""
    values, starts = _arrow_column(data, "attention_mask")
    if values is None:
        return None
    total = np.concatenate([[0], np.cumsum(values.astype(np.int64))])
    return total[starts[1:]] - total[starts[:-1]]


def arrow_list_column(data: Any, name: str) -> Any:
    """The list column ``name`` of a Hugging Face ``datasets.Dataset`` as Arrow (in the dataset's own order, after
    ``shuffle``/``select``/``filter``); None for anything else: another dataset, no such column, not a list column,
    or one with nulls (then read sample by sample, where a missing value is named by its index)."""
    if not type(data).__module__.startswith("datasets.") or name not in (getattr(data, "column_names", ()) or ()):
        return None
    import pyarrow as pa

    column = data.with_format("arrow")[name]
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)) or column.null_count:
        return None
    return column


def _arrow_column(data: Any, name: str) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(values, row starts + end)`` of :func:`arrow_list_column` (``(None, None)`` when there is none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = arrow_list_column(data, name)
    if column is None:
        return None, None
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.list_flatten(column).to_numpy(zero_copy_only=False), np.concatenate([[0], np.cumsum(lengths)])


class HFSamples:
    """``HFSamples(base, config)[i]``: ``base[i]`` with its padding stripped (:func:`strip_padding`) and, for a
    Qwen-VL ``config`` (its ``image_token_id``, ``video_token_id`` and vision ``spatial_merge_size``), in FCP's
    format (:func:`fcp_sample`); for InternVL a ``grid_thw`` of ``[[tiles, side, side]]`` added when the sample has
    tiles but no grid (its processor's output); ``config=None``: padding only. ``len`` and other attributes are the
    base's."""

    def __init__(self, base: Any, config: Any = None) -> None:
        self.base = base
        self.vl = config is not None and getattr(config, "vision_config", None) is not None
        self.tile_side = None  # InternVL: patches per tile side; a sample's grid_thw is [[tiles, side, side]]
        self._config = config
        self.llava = self.vl and getattr(config, "model_type", None) == "llava_onevision"  # hf_llava.fcp_inputs
        if self.vl and getattr(config, "model_type", None) == "internvl":
            from fcp_exec.integrations.hf_models import tile_geometry

            self.tile_side = tile_geometry(config)[0]
        elif self.vl and not self.llava:
            self.image_token_id, self.video_token_id = int(config.image_token_id), int(config.video_token_id)
            self.merge = int(config.vision_config.spatial_merge_size)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> Any:
        sample = strip_padding(self.base[i])
        if not self.vl:
            return sample
        if self.llava:
            from fcp_exec.integrations.hf_llava import fcp_inputs

            return fcp_inputs(sample, self._config)
        if self.tile_side is not None:  # InternVL: pixel_values [tiles, 3, H, W] (its processor gives no grid)
            if isinstance(sample, dict) and sample.get("pixel_values") is not None and sample.get("grid_thw") is None:
                tiles = int(torch.as_tensor(sample["pixel_values"]).shape[0])
                sample = {**sample, "grid_thw": torch.tensor([[tiles, self.tile_side, self.tile_side]])}
            return sample
        return fcp_sample(sample, image_token_id=self.image_token_id, video_token_id=self.video_token_id,
                          merge=self.merge)

    def __getattr__(self, name: str) -> Any:
        if name == "base":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.base, name)


def _runs(values: np.ndarray, starts: np.ndarray, ids: Sequence[int]) -> list[tuple[tuple[int, int], ...]]:
    """Per row (``starts``: offsets of the rows in ``values``, plus the end): its runs of ``ids`` as
    ``(start within the row, count)``."""
    mask = np.isin(values, np.asarray(list(ids), dtype=values.dtype if values.size else np.int64))
    begin = mask.copy()
    begin[1:] &= ~mask[:-1]
    row_starts = starts[:-1][starts[:-1] < len(values)]
    begin[row_starts] = mask[row_starts]  # a run never continues across two samples
    end = mask.copy()
    end[:-1] &= ~mask[1:]
    row_ends = starts[1:][starts[1:] > 0] - 1
    end[row_ends] = mask[row_ends]
    b, e = np.flatnonzero(begin), np.flatnonzero(end)
    rows = np.searchsorted(starts, b, side="right") - 1
    out: list[list[tuple[int, int]]] = [[] for _ in range(len(starts) - 1)]
    for r, s, t in zip(rows.tolist(), b.tolist(), e.tolist()):
        out[r].append((s - int(starts[r]), t - s + 1))
    return [tuple(r) for r in out]


def placeholder_spans(data: Any, ids: Sequence[int]) -> list[tuple[tuple[int, int], ...]]:
    """Every sample's runs of the token ids ``ids`` (placeholders) as ``(start, count)`` in its unpadded tokens
    (:func:`strip_padding`), for ``fcp_data.SpanVisualLayout``: a ``datasets.Dataset`` from its ``input_ids`` Arrow
    column when no row is padded, else read sample by sample (a progress bar from 10,000 samples on)."""
    values, starts = _arrow_column(data, "input_ids")
    if values is not None:
        counts = _attended_counts(data)
        if counts is None or np.array_equal(counts, np.diff(starts)):
            return _runs(values, starts, ids)
    from tqdm.auto import tqdm

    out = []
    for i in tqdm(range(len(data)), desc="FCPTrainer: placeholder runs", unit="sample", disable=len(data) < 10_000):
        values = np.asarray(torch.as_tensor(strip_padding(data[i])["input_ids"]).reshape(-1).numpy())
        out += _runs(values, np.array([0, len(values)]), ids)
    return out
