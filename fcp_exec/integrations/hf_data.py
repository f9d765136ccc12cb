"""Data for Hugging Face models: deterministic synthetic documents laid out as each model family's processor lays
them out, the check that a dataset fits a model config, and the single-process stock-HF reference step that the
distributed FCP step must reproduce.

:class:`SyntheticHFDocs` — sample ``i`` (deterministic in every process) is, in a cycle of layouts:
text only; an image ``(1, 4, 4)``; videos ``(2, 4, 4)``, ``(6, 4, 4)``, ``(8, 2, 4)``; and a mixed
text + image + text + video + text document (InternVL: every entry is ``t`` tiles of its vision tower's image
size, ``<IMG_CONTEXT>`` runs without markers; LLaVA-OneVision: videos as ``t·p² + 1`` ``<video>`` tokens, the last
one its newline, images as AnyRes crops of a few sizes — the image-only layout as two images of one crop each). Visual blocks are ``<|vision_start|>`` + placeholders +
``<|vision_end|>`` (Qwen3-VL videos: per temporal frame group, a few timestamp text tokens and their own
start/end pair, as ``Qwen3VLProcessor`` does). Videos carry ``second_per_grid_ts`` (0.5, 1.0, 1.5, … so
Qwen2.5-VL's temporal scaling is exercised). Samples are ``{"input_ids", "pixel_values", "grid_thw",
"second_per_grid_ts"}`` with grids in order of appearance, as :class:`fcp_data.readers.IndexedDataset` gives them.

:func:`reference_step`: one optimizer step of the *stock* model (``sdpa`` attention, HF's own positions from
``mm_token_type_ids`` and the grids, one document per forward) over the samples of one global batch, loss =
Σ token losses / number of label tokens (targets that are visual placeholders ignored, as the collator does).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fcp_exec.integrations.hf_models import QWEN3_VL_MODEL_TYPES

__all__ = ["SyntheticHFDocs", "check_data_fits", "patch_dim", "reference_loss", "reference_step", "special_ids"]

_LAYOUTS = (
    (),
    (("image", (1, 4, 4)),),
    (("video", (2, 4, 4)),),
    (("video", (6, 4, 4)),),
    (("video", (8, 2, 4)),),
    (("image", (1, 4, 4)), ("video", (2, 4, 4))),
)


def special_ids(config) -> dict[str, int]:
    """Token ids a VL config expects: image, video, vision_start, vision_end (InternVL: image, its ``<IMG_CONTEXT>``)."""
    if config.model_type == "internvl":
        return {"image": int(config.image_token_id)}
    if config.model_type == "llava_onevision":
        return {"image": int(config.image_token_id), "video": int(config.video_token_id)}
    out = {"image": int(config.image_token_id), "video": int(config.video_token_id),
           "vision_start": int(config.vision_start_token_id)}
    end = getattr(config, "vision_end_token_id", None)
    out["vision_end"] = int(end) if end is not None else out["vision_start"] + 1
    return out


def patch_dim(config) -> int:
    v = config.vision_config
    return int(getattr(v, "in_channels", getattr(v, "in_chans", 3))) * int(v.temporal_patch_size) * int(v.patch_size) ** 2


def _text_cfg(config):
    return getattr(config, "text_config", config)


class SyntheticHFDocs:
    """Synthetic documents for a transformers ``config`` (module docstring). ``num`` samples; text lengths drawn
    in ``[min_text, max_text]``; the text part of sample 0 is ``long_text`` tokens (the long tail).
    ``prompt_mask``: each sample also has SFT-style ``labels`` (HF convention): ``input_ids`` with a random prompt
    — the first 0 to 60 % of the tokens, images included — set to -100."""

    def __init__(self, config, num: int = 24, *, seed: int = 0, min_text: int = 4, max_text: int = 60,
                 long_text: int = 200, prompt_mask: bool = False) -> None:
        self.config, self.seed, self.prompt_mask = config, int(seed), bool(prompt_mask)
        tc = _text_cfg(config)
        self.vocab = int(tc.vocab_size)
        self.is_vl = hasattr(config, "vision_config") and hasattr(config, "image_token_id")
        self.qwen3 = config.model_type in QWEN3_VL_MODEL_TYPES
        self.tiles = config.model_type == "internvl"  # every visual entry: t tiles of the vision tower's image size
        self.frames = config.model_type == "llava_onevision"  # videos of t frames, AnyRes / single-crop images
        self.ids = special_ids(config) if self.is_vl else {}
        reserved = set(self.ids.values()) | {int(getattr(tc, "pad_token_id", None) or 0)}
        self.low = max(reserved) + 1 if reserved else 1
        if self.low >= self.vocab - 8:
            raise ValueError(f"vocab_size {self.vocab} leaves no room for text tokens above the special ids {sorted(reserved)}")
        rng = np.random.default_rng([self.seed, 17])
        self.samples = []
        for i in range(int(num)):
            layout = _LAYOUTS[i % len(_LAYOUTS)] if self.is_vl else ()
            n_text = long_text if i == 0 else int(rng.integers(min_text, max_text + 1))
            self.samples.append((layout, n_text))
        self._built = [self._layout(i) for i in range(len(self.samples))]
        self.lengths = np.array([len(b[0]) for b in self._built], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.samples)

    def _layout(self, i: int):
        """``(token kinds list, grids, spts, spans)`` — the token sequence with ``-1`` for random text ids."""
        layout, n_text = self.samples[i]
        if self.frames and layout == _LAYOUTS[1]:  # LLaVA-OneVision: two images, each one crop (a multi-image sample)
            layout = _LAYOUTS[1] * 2
        parts = np.array_split(np.arange(n_text), len(layout) + 1)
        seq: list[int] = []
        grids, spts, spans = [], [], []
        m = int(self.config.vision_config.spatial_merge_size) if self.is_vl and not (self.tiles or self.frames) else 1
        for k, (kind, (t, h, w)) in enumerate(layout):
            seq += [-1] * len(parts[k])
            if self.frames:  # LLaVA-OneVision: AnyRes images (one crop when several), videos with their newline
                from fcp_exec.integrations.hf_llava import synthetic_entry

                images = sum(e[0] == "image" for e in layout)
                kind, count, grid = synthetic_entry(self.config, kind, t, i + k, images)
                spans.append((len(seq), count))
                seq += [self.ids[kind]] * count
                grids.append(grid)
                continue
            if self.tiles:  # InternVL: <IMG_CONTEXT> × tokens of t tiles (its processor's markers are plain text here)
                from fcp_exec.integrations.hf_models import tile_geometry

                g, m = tile_geometry(self.config)
                spans.append((len(seq), t * (g // m) ** 2))
                seq += [self.ids["image"]] * (t * (g // m) ** 2)
                grids.append((t, g, g))
                continue
            per = h * w // (m * m)
            tok = self.ids[kind]
            if kind == "video" and self.qwen3:
                for _ in range(t):
                    seq += [-1, -1, self.ids["vision_start"]]
                    spans.append((len(seq), per))
                    seq += [tok] * per + [self.ids["vision_end"]]
            else:
                seq += [self.ids["vision_start"]]
                spans.append((len(seq), t * per))
                seq += [tok] * (t * per) + [self.ids["vision_end"]]
            grids.append((t, h, w))
            if kind == "video":
                spts.append(0.5 * (1 + (i + k) % 3))
        seq += [-1] * len(parts[-1])
        if len(seq) < 2:
            seq += [-1] * (2 - len(seq))
        return seq, grids, spts, spans

    def placeholder_spans(self) -> list[tuple[tuple[int, int], ...]]:
        """``(start, count)`` runs of placeholder tokens per sample (for ``SpanVisualLayout``)."""
        return [tuple(b[3]) for b in self._built]

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        seq, grids, spts, _ = self._built[i]
        rng = np.random.default_rng([self.seed, 5000 + i])
        ids = np.array(seq, dtype=np.int64)
        rand = ids < 0
        ids[rand] = rng.integers(self.low, self.vocab, int(rand.sum()))
        out: dict[str, Any] = {"input_ids": torch.from_numpy(ids)}
        if self.prompt_mask:
            labels = ids.copy()
            labels[: int(np.random.default_rng([self.seed, 9000 + i]).integers(0, int(0.6 * ids.size) + 1))] = -100
            out["labels"] = torch.from_numpy(labels)
        if grids and (self.tiles or self.frames):
            size = self.config.vision_config.image_size
            size = (int(size), int(size)) if isinstance(size, int) else tuple(int(x) for x in size)
            out["pixel_values"] = torch.from_numpy(rng.standard_normal((sum(abs(g[0]) for g in grids), 3, *size)))
            out["grid_thw"] = torch.tensor(grids, dtype=torch.long)
        elif grids:
            npatch = sum(t * h * w for t, h, w in grids)
            out["pixel_values"] = torch.from_numpy(rng.standard_normal((npatch, patch_dim(self.config))))
            out["grid_thw"] = torch.tensor(grids, dtype=torch.long)
            if spts:
                out["second_per_grid_ts"] = torch.tensor(spts, dtype=torch.float64)
        return out


def check_data_fits(config, *, vocab_size: int | None = None, ids: dict[str, int] | None = None,
                    patch: int | None = None, what: str = "the data") -> None:
    """``ValueError`` (one line, with the fix) when ``what``'s token ids or pixel patches cannot feed ``config``:
    ``vocab_size`` of the data's tokenizer larger than the model's, VL placeholder/marker ids that differ, a
    different flattened patch size."""
    tc = _text_cfg(config)
    if vocab_size is not None and int(vocab_size) > int(tc.vocab_size):
        raise ValueError(f"{what} uses token ids up to {int(vocab_size) - 1} but the model's vocab_size is {tc.vocab_size}; "
                         "raise vocab_size in the config or index the data with the model's tokenizer")
    if ids:
        want = special_ids(config)
        bad = {k: (v, want[k]) for k, v in ids.items() if k in want and int(v) != want[k]}
        if bad:
            detail = ", ".join(f"{k} {v} (config {w})" for k, (v, w) in sorted(bad.items()))
            raise ValueError(f"{what} and the model config disagree on special token ids: {detail}; set the config's "
                             "*_token_id to the data's tokenizer ids")
    if patch is not None and patch != patch_dim(config):
        raise ValueError(f"{what} has pixel patches of {patch} values but the model's vision tower takes "
                         f"{patch_dim(config)} (in_channels·temporal_patch_size·patch_size²); use the spec of this model family")


def _doc_forward(model: nn.Module, sample: dict, is_vl: bool) -> torch.Tensor:
    return doc_output(model, sample, is_vl).logits[0]


def doc_output(model: nn.Module, sample: dict, is_vl: bool) -> Any:
    """The stock ``model``'s output on one document alone (batch of one), its images and videos as the model's own
    processor would pass them: the reference forward of :func:`reference_step`."""
    ids = torch.as_tensor(sample["input_ids"], dtype=torch.long)
    if not is_vl or sample.get("grid_thw") is None:
        return model(input_ids=ids[None], use_cache=False)
    cfg = model.config
    if cfg.model_type == "internvl":  # the document's tiles, its <IMG_CONTEXT> tokens in order
        pv = torch.as_tensor(sample["pixel_values"]).to(next(model.parameters()).dtype)
        return model(input_ids=ids[None], pixel_values=pv, use_cache=False)
    if cfg.model_type == "llava_onevision":
        return _llava_forward(model, ids, sample)
    tt = torch.zeros_like(ids, dtype=torch.int32)
    tt[ids == cfg.image_token_id] = 1
    tt[ids == cfg.video_token_id] = 2
    grids = torch.as_tensor(sample["grid_thw"], dtype=torch.long).reshape(-1, 3)
    pv = torch.as_tensor(sample["pixel_values"]).to(next(model.parameters()).dtype)
    # grid rows in order of appearance: the k-th grid's placeholders are the next t·h·w/m² visual tokens
    m = int(cfg.vision_config.spatial_merge_size)
    vis = torch.nonzero(tt > 0).flatten().tolist()
    kinds, cursor = [], 0
    for t, h, w in grids.tolist():
        kinds.append(int(tt[vis[cursor]]))
        cursor += t * h * w // (m * m)
    sizes = (grids[:, 0] * grids[:, 1] * grids[:, 2]).tolist()
    chunks = torch.split(pv, sizes)
    kw: dict[str, Any] = {"mm_token_type_ids": tt[None]}
    img = [i for i, k in enumerate(kinds) if k == 1]
    vid = [i for i, k in enumerate(kinds) if k == 2]
    if img:
        kw["pixel_values"] = torch.cat([chunks[i] for i in img])
        kw["image_grid_thw"] = grids[img]
    if vid:
        kw["pixel_values_videos"] = torch.cat([chunks[i] for i in vid])
        kw["video_grid_thw"] = grids[vid]
        if sample.get("second_per_grid_ts") is not None and cfg.model_type == "qwen2_5_vl":
            kw["second_per_grid_ts"] = torch.as_tensor(sample["second_per_grid_ts"], dtype=torch.float64)
    return model(input_ids=ids[None], use_cache=False, **kw)


def _llava_forward(model: nn.Module, ids: torch.Tensor, sample: dict) -> Any:
    """The stock LLaVA-OneVision forward of one document, its images and videos as its processor gives them
    (``hf_llava.processor_inputs``: padded crops, ``image_sizes``, ``batch_num_images``, ``pixel_values_videos``)."""
    from fcp_exec.integrations.hf_llava import processor_inputs

    dtype = next(model.parameters()).dtype
    kw = {k: v.to(dtype) if v.is_floating_point() else v for k, v in processor_inputs(sample).items()}
    return model(input_ids=ids[None], use_cache=False, **kw)


def _reference_labels(samples: Sequence[dict], ignore_ids: Sequence[int]) -> tuple[list[torch.Tensor], int]:
    """Each sample's shifted targets (its own ``labels`` if it has them, else ``input_ids``; ``ignore_ids`` -100)
    and their label-token count over all samples."""
    ignore = torch.tensor(list(ignore_ids), dtype=torch.long)
    labels_all = []
    for s in samples:
        ids = torch.as_tensor(s["input_ids"], dtype=torch.long)
        lab = torch.as_tensor(s.get("labels", ids), dtype=torch.long)[1:].clone()
        if ignore.numel():
            lab[torch.isin(ids[1:], ignore)] = -100
        labels_all.append(lab)
    return labels_all, int(sum(int((lab != -100).sum()) for lab in labels_all))


def reference_step(model: nn.Module, samples: Sequence[dict], *, ignore_ids: Sequence[int] = ()) -> tuple[float, int]:
    """Forward/backward the stock ``model`` on every sample of one global batch (module docstring); gradients
    accumulate in ``.grad``. A sample's own ``labels`` (HF convention: aligned with ``input_ids``, -100 where no loss
    is wanted) replace ``input_ids`` as targets. Returns ``(loss, label tokens)``."""
    is_vl = hasattr(model.config, "vision_config")
    labels_all, num = _reference_labels(samples, ignore_ids)
    total = 0.0
    for s, lab in zip(samples, labels_all):
        logits = _doc_forward(model, s, is_vl)
        loss = F.cross_entropy(logits[:-1], lab, ignore_index=-100, reduction="sum") / max(num, 1)
        loss.backward()
        total += float(loss.detach())
    return total, num


def reference_loss(model: nn.Module, samples: Sequence[dict], *, ignore_ids: Sequence[int] = ()) -> tuple[torch.Tensor, int]:
    """:func:`reference_step`'s loss as one differentiable tensor (no backward; every document's graph is kept until
    the caller's backward): what a stock ``transformers.Trainer``'s ``compute_loss`` returns for one global batch in
    the single-process reference of ``FCPTrainer``. Returns ``(loss, label tokens)``."""
    is_vl = hasattr(model.config, "vision_config")
    labels_all, num = _reference_labels(samples, ignore_ids)
    loss = sum(F.cross_entropy(_doc_forward(model, s, is_vl)[:-1], lab, ignore_index=-100, reduction="sum")
               for s, lab in zip(samples, labels_all))
    return loss / max(num, 1), num
