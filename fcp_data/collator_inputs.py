"""What :class:`fcp_data.collator.FCPCollator` accepts: the checks on its batch and on each sample, and a sample's
own labels (``sample_labels=True``). Every refusal is one ``ValueError``/``TypeError`` naming the sample and the fix.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from fcp_data.strict import token_id


def no_stop_iteration(collate: Callable) -> Callable:
    """``collate`` (a collator's ``__call__``) with a ``StopIteration`` raised inside it — by a ``position_fn``, a
    processor, an installed model's ``get_rope_index`` calling ``next()`` on an exhausted iterator — turned into a
    ``RuntimeError`` naming the micro-batch's samples. Unconverted, a DataLoader takes it for the end of the epoch
    (in its main process and from its workers alike): the epoch's remaining micro-batches would be dropped without a
    word and the step would fail later, far from the cause."""

    @functools.wraps(collate)
    def call(self, batch, *args, **kwargs):
        try:
            return collate(self, batch, *args, **kwargs)
        except StopIteration as e:
            idx = [int(s.index) for _, s in batch]  # (sample, SampleSlot) pairs: check_pairs ran first
            raise RuntimeError(f"StopIteration raised while collating samples {idx} (a next() on an exhausted iterator "
                               "in the code the collator calls; see the chained traceback): a DataLoader would have "
                               "ended the epoch here and dropped its remaining micro-batches") from e

    return call


def check_pairs(batch: Any) -> None:
    """The batch must be a list of ``(sample, SampleSlot)`` pairs, as ``FCPDataset`` + ``FCPSampler`` produce."""
    from fcp_data.slots import SampleSlot

    how = ("build the DataLoader with dataset=FCPDataset(base), batch_sampler=FCPSampler(...), "
           "collate_fn=FCPCollator(...)")
    if not isinstance(batch, (list, tuple)):
        raise TypeError(f"FCPCollator takes a list of (sample, SampleSlot) pairs, got {type(batch).__name__}; {how}")
    for i, item in enumerate(batch):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], SampleSlot)):
            got = (f"a {len(item)}-tuple ending in {type(item[-1]).__name__}" if isinstance(item, (tuple, list)) and item
                   else type(item).__name__)
            raise TypeError(f"FCPCollator: batch item {i} must be a (sample, SampleSlot) pair, got {got}; {how}")


def as_ids(x: Any, index: int, key: str = "input_ids") -> torch.Tensor:
    if isinstance(x, (list, tuple)) and len(x) == 0:
        raise ValueError(f"sample {index}: {key} is empty; every sample needs at least one token")
    try:
        t = torch.as_tensor(x).cpu()  # DataLoader workers collate on the host; pinning and the copy come later
    except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
        raise ValueError(f"sample {index}: {key} must be a 1-D integer tensor or list, got {type(x).__name__} "
                         f"({str(e).splitlines()[0][:120]})") from None
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ValueError(
            f"sample {index}: {key} must be a 1-D integer tensor or list, got shape {tuple(t.shape)} "
            f"dtype {t.dtype}")
    return t.to(torch.long)


def token_ids(v: Any) -> tuple[int, ...]:
    """``visual_token_id`` as a tuple of ints: None, one id, or an iterable of ids (list, tuple, array, tensor)."""
    if v is None:
        return ()
    try:
        if isinstance(v, (str, bytes, dict)):  # iterable, but not a list of ids: list(b"a") is [97]
            raise TypeError
        items = [v] if hasattr(v, "__index__") and getattr(v, "ndim", 0) == 0 else list(v)
        return tuple(token_id("visual_token_id", x, minimum=0) for x in items)
    except TypeError:
        raise TypeError(f"visual_token_id must be an int token id or a list of them, got {v!r}") from None


# keys of a Hugging Face processor's output that this collator does not read: carrying the sample on would drop them
_HF_VISUAL_KEYS = ("image_grid_thw", "video_grid_thw", "pixel_values_videos")


def check_sample_keys(sample: dict, full: torch.Tensor, index: int, sample_labels: bool) -> None:
    """Refuse what the collator would otherwise drop in silence: without ``sample_labels``, per-token ``labels``
    other than the causal-LM copy of ``input_ids`` (the collator derives the labels, and the loss denominator is
    the sampler's count), and a processor's separate image / video grids and video pixels."""
    labels = sample.get("labels")
    if labels is not None and not sample_labels:
        lab = as_ids(labels, index, "labels")
        if lab.shape != full.shape or not torch.equal(lab, full):
            raise ValueError(
                f"sample {index}: its labels differ from its input_ids (a prompt mask, as in SFT?); by default "
                "FCPCollator derives the labels from input_ids and the loss denominator num_tokens_global is the "
                "sampler's count of those; pass FCPCollator(sample_labels=True) to train on the samples' own labels "
                "(train_step then counts them over the global batch), or drop 'labels' from the sample")
    hf = [k for k in _HF_VISUAL_KEYS if sample.get(k) is not None]
    if hf:
        raise ValueError(
            f"sample {index} has {', '.join(hf)} (a Hugging Face processor's output): FCPCollator reads one 'grid_thw' "
            "[n, 3] per sample, rows in the order of the visual placeholders, and one 'pixel_values' with the patches "
            "in that order; merge them so, or read the data with fcp_data.IndexedDataset")


def sample_labels_of(sample: dict, full: torch.Tensor, index: int, ignore_index: int) -> torch.Tensor:
    """A sample's own labels in the Hugging Face convention — aligned with ``input_ids`` (not shifted), the target
    of a token is the next token's label, ``ignore_index`` where no loss is wanted (an SFT prompt) — or, without a
    ``labels`` key, ``input_ids`` itself (plain causal LM)."""
    labels = sample.get("labels")
    if labels is None:
        return full
    lab = as_ids(labels, index, "labels")
    if lab.shape != full.shape:
        raise ValueError(f"sample {index}: labels has {lab.numel()} entries but input_ids has {full.numel()}; labels "
                         "are aligned with input_ids (the Hugging Face convention, not shifted), ignore_index "
                         f"({ignore_index}) where no loss is wanted")
    bad = (lab < 0) & (lab != ignore_index)
    if bad.any():
        raise ValueError(f"sample {index}: labels must be token ids >= 0 or ignore_index ({ignore_index}), got "
                         f"{int(lab[bad][0])}")
    return lab


def grid_of(sample: dict, index: int, signed: bool) -> torch.Tensor | None:
    """A sample's ``grid_thw`` as ``[n, 3]`` longs (None without one): ``(t, h, w)`` rows, every entry ``>= 1``, or
    with ``signed`` (LLaVA-OneVision's image rows ``(-crops, H, W)``) ``h, w >= 1`` and ``t != 0``."""
    grid = sample.get("grid_thw")
    if grid is None:
        return None
    try:
        grid = torch.as_tensor(grid, dtype=torch.long).reshape(-1, 3)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"sample {index}: grid_thw must be n rows of (t, h, w) integers, got "
                         f"{type(sample['grid_thw']).__name__} ({str(e).splitlines()[0][:120]})") from None
    if (grid[:, 1:] < 1).any() or (grid[:, 0] == 0).any() or (not signed and (grid < 1).any()):
        what = "needs h, w >= 1 and t != 0" if signed else "entries must be >= 1"
        raise ValueError(f"sample {index}: grid_thw {what}, got {grid.tolist()}")
    return grid


def pixels_of(sample: dict, index: int) -> torch.Tensor | None:
    """A sample's ``pixel_values`` as a tensor (None without them); anything that is not an array is this sample's
    error."""
    pixels = sample.get("pixel_values")
    if pixels is None or isinstance(pixels, torch.Tensor):
        return pixels
    try:
        if isinstance(pixels, (str, bytes)):
            raise TypeError(f"a {type(pixels).__name__}")
        return torch.as_tensor(pixels)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"sample {index}: pixel_values must be an array of numbers, got {type(pixels).__name__} "
                         f"({str(e).splitlines()[0][:120]})") from None
