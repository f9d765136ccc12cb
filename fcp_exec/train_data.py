"""Datasets for ``fcp train`` / the demo / the e2e tests: bundled samples through the real index and
readers, a length-capped view, and small deterministic synthetic text and video sets.

``load_train_data(model, data, *, max_tokens, seed, cache_dir)`` returns a :class:`TrainData`:

* ``data=None``: the bundled samples — ``samples/text.jsonl`` (spec ``text``) for tiny-llm, the
  webdataset video/image shards (spec ``qwen2-vl``) for tiny-mllm — indexed once with
  :func:`fcp_data.index.build_index` into ``cache_dir`` and read with :class:`fcp_data.readers.IndexedDataset`.
* ``data=PATH``: a length index built by ``fcp index`` (its spec decides text or multimodal).
* ``data="synthetic"``: :class:`SyntheticText` / :class:`SyntheticVideo` (random ids, random pixels).

``max_tokens`` caps sample length the same way for every world size (so runs on 1 and N processes see
identical data): text samples are truncated to ``max_tokens``; a multimodal sample cannot be cut inside
its visual block, so one longer than ``max_tokens`` is left out (``num_dropped``).

``visual_layout`` (for ``FCPSampler(visual_layout=...)``) tells the sampler where the placeholders sit, so
that the loss denominator with masked visual labels is exact: :class:`~fcp_data.visual_layout.IndexVisualLayout`
over the kept index rows, or :class:`~fcp_data.visual_layout.SpanVisualLayout` for the synthetic video.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["TrainData", "SyntheticText", "SyntheticVideo", "CappedDataset", "load_train_data", "VIDEO_SPEC"]

VIDEO_SPEC = "qwen2-vl"
_SYN_PLACEHOLDER = 5  # <|video_pad|> in tiny-bpe
_SYN_PAD = 1


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainData:
    """A map-style ``dataset``, its per-sample token counts ``lengths`` (what the sampler plans with),
    the collator's ``pad_token_id`` and ``visual_token_ids`` (empty for text), a one-line ``description``,
    ``num_dropped`` (multimodal samples over ``max_tokens``) and ``visual_layout`` (module docstring; None
    for text); ``has_labels``: the samples carry their own (SFT) labels."""

    dataset: Any
    lengths: np.ndarray
    pad_token_id: int
    visual_token_ids: tuple[int, ...] = ()
    description: str = ""
    num_dropped: int = 0
    patch_dim: int | None = field(default=None)
    visual_layout: Any = None
    has_labels: bool = False


class SyntheticText:
    """``num`` documents of random ids in ``[10, vocab)`` with log-normal lengths in ``[min_len, max_len]``
    (or exactly ``lengths``); sample ``i`` is drawn from ``default_rng([seed, i])`` (deterministic in every process)."""

    def __init__(self, num: int = 24, *, seed: int = 0, min_len: int = 3, max_len: int = 160, vocab: int = 2000,
                 lengths=None):
        if lengths is not None:
            self.lengths = np.asarray(lengths, dtype=np.int64)
            if self.lengths.ndim != 1 or self.lengths.size == 0 or self.lengths.min() < 2:
                raise ValueError("synthetic lengths must be a non-empty list of integers >= 2")
        else:
            if not 2 <= min_len <= max_len:
                raise ValueError(f"need 2 <= min_len <= max_len, got {min_len}, {max_len}")
            rng = np.random.default_rng([seed, 7])
            raw = rng.lognormal(np.log(max(min_len, max_len / 6)), 0.9, size=num)
            self.lengths = np.clip(raw.astype(np.int64), min_len, max_len)
            self.lengths[0] = max_len  # the long tail is always there
        self.seed, self.vocab = seed, vocab

    def __len__(self) -> int:
        return int(self.lengths.size)

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng([self.seed, 1000 + int(i)])
        return {"input_ids": torch.from_numpy(rng.integers(10, self.vocab, int(self.lengths[i])))}


class SyntheticVideo:
    """Qwen-VL-layout video samples: ``[text | vision_start | placeholders | vision_end | text]`` with
    ``grid_thw = [[t, h, w]]`` (``h, w`` even, merge 2) and random ``pixel_values`` ``[t·h·w, patch_dim]``.
    Some samples are text-only, so some ranks hold no visual token."""

    def __init__(self, num: int = 16, *, seed: int = 0, max_len: int = 160, patch_dim: int = 1176, vocab: int = 2000):
        rng = np.random.default_rng([seed, 11])
        self.samples = []
        for i in range(num):
            text_only = i % 5 == 4
            if text_only:
                t = h = w = 0
            else:
                t = int(rng.integers(1, 5))
                h, w = 2 * int(rng.integers(1, 4)), 2 * int(rng.integers(1, 4))
            vis = t * h * w // 4
            pre = int(rng.integers(1, 8))
            budget = max(2, max_len - vis - pre - 2)
            post = int(rng.integers(1, max(2, min(budget, 40))))
            self.samples.append((t, h, w, pre, post))
        if num:  # the longest sample, for non-trivial plans
            self.samples[0] = (4, 6, 6, 3, max(1, max_len - 36 - 3 - 2))
        self.lengths = np.array([(p + 2 + t * h * w // 4 + q) if t else p + q for t, h, w, p, q in self.samples],
                                dtype=np.int64)
        self.seed, self.patch_dim, self.vocab = seed, patch_dim, vocab

    def __len__(self) -> int:
        return len(self.samples)

    def placeholder_spans(self) -> list[tuple[tuple[int, int], ...]]:
        """``(start, count)`` of each sample's placeholder run (after ``pre`` text tokens and vision_start)."""
        return [((p + 1, t * h * w // 4),) if t else () for t, h, w, p, _ in self.samples]

    def __getitem__(self, i: int) -> dict:
        t, h, w, pre, post = self.samples[int(i)]
        rng = np.random.default_rng([self.seed, 2000 + int(i)])
        ids = [rng.integers(10, self.vocab, pre)]
        if t:
            ids += [np.array([2]), np.full(t * h * w // 4, _SYN_PLACEHOLDER), np.array([3])]
        ids.append(rng.integers(10, self.vocab, post))
        out = {"input_ids": torch.from_numpy(np.concatenate(ids).astype(np.int64))}
        if t:
            out["pixel_values"] = torch.from_numpy(rng.standard_normal((t * h * w, self.patch_dim)).astype(np.float32))
            out["grid_thw"] = torch.tensor([[t, h, w]], dtype=torch.long)
        return out


class CappedDataset:
    """``base`` restricted to ``keep`` (indices into base) with text samples truncated to ``max_tokens``."""

    def __init__(self, base: Any, keep: np.ndarray, max_tokens: int):
        self.base, self.keep, self.max_tokens = base, np.asarray(keep, dtype=np.int64), int(max_tokens)

    def __len__(self) -> int:
        return int(self.keep.size)

    def sample_key(self, i: int) -> str | None:
        key = getattr(self.base, "sample_key", None)
        return None if key is None else key(int(self.keep[i]))

    def skeleton(self, i: int) -> dict | None:
        skeleton = getattr(self.base, "skeleton", None)
        return None if skeleton is None else skeleton(int(self.keep[i]))

    def __getitem__(self, i: int) -> dict:
        s = dict(self.base[int(self.keep[i])])
        ids = torch.as_tensor(s["input_ids"])
        if ids.numel() > self.max_tokens:
            if "pixel_values" in s:
                raise ValueError(f"multimodal sample {int(self.keep[i])} is longer than max_tokens={self.max_tokens}")
            s["input_ids"] = ids[: self.max_tokens]
            if s.get("labels") is not None:
                s["labels"] = torch.as_tensor(s["labels"])[: self.max_tokens]
        return s


def _labels_note(base) -> str:
    """What an index's own labels train on, for the run's one-line data description."""
    if base.caption_labels:
        return ", caption-only labels"
    if not base.has_labels:
        return ""
    if getattr(base, "chat_field", None):  # with a prompt field too: TRL's prompt-completion lines
        if base.prompt_field:
            only = (getattr(getattr(base, "index", None), "manifest", None) or {}).get("assistant_only_loss")
            return ", SFT labels (the completion's assistant turns)" if only else ", SFT labels (the completion)"
        return ", SFT labels (assistant turns)"
    return ", SFT labels (prompt masked)"


def _dropped_note(dropped: int) -> str:
    """The multimodal samples left out for ``max_tokens``, for the run's one-line data description."""
    return f", {dropped} left out (longer than --max-tokens)" if dropped else ""


def _cap(base: Any, lengths: np.ndarray, visual: np.ndarray, max_tokens: int) -> tuple[CappedDataset, np.ndarray, int]:
    keep = np.flatnonzero(~(visual & (lengths > max_tokens)))
    return CappedDataset(base, keep, max_tokens), np.minimum(lengths[keep], max_tokens), int(lengths.size - keep.size)


def _bundled_index(model: str, cache_dir: str | None, spec: str | None = None) -> Path:
    """The bundled samples' index for ``model`` (``tiny-llm``: text, else ``spec`` or the tiny MLLM's video spec)."""
    from fcp_data._resources import bundled_index

    if spec is None:
        spec = "text" if model == "tiny-llm" else VIDEO_SPEC
    return bundled_index(spec, cache_dir)


HF_SPECS = {"qwen2_vl": "qwen2-vl", "qwen2_5_vl": "qwen2.5-vl", "qwen3_vl": "qwen3-vl", "qwen3_vl_moe": "qwen3-vl",
            "internvl": "internvl3", "llava_onevision": "llava-onevision"}


def _check_llava_index(config, base: Any, what: str) -> None:
    """A LLaVA-OneVision model reads videos indexed with its processor's rule: ``tokens_per_frame`` pooled tokens per
    frame + one newline (spec ``llava-onevision``), frames of the vision tower's size, the config's token ids."""
    from fcp_exec.integrations.hf_data import check_data_fits
    from fcp_exec.integrations.hf_llava import pooled_side

    v = base.spec.vision
    if base.spec.family != "llava-video" or not (v.get("video") or {}).get("newline"):
        raise ValueError(f"{what} was built with spec {base.spec.name!r}; a llava_onevision model needs its processor's "
                         "token rule (fcp index ... --spec llava-onevision)")
    t = v["tokens"]
    check_data_fits(config, ids={"image": base.spec.token_id(t["image"]), "video": base.spec.token_id(t["video"])},
                    what=what)
    size, per = int(config.vision_config.image_size), pooled_side(config) ** 2
    if (int(v["image_size"]), int(v["tokens_per_frame"])) != (size, per):
        raise ValueError(f"{what} has {v['image_size']}-px frames of {v['tokens_per_frame']} tokens but the model's "
                         f"vision tower takes {size}-px frames of {per}; set vision_config.image_size to the spec's")
    a = (v.get("image") or {}).get("anyres")
    aspect = f"anyres_max_{a['max_patches']}" if a else None
    if a and ([list(x) for x in a["grid_pinpoints"]], int(v["patch_size"]), aspect) != \
            ([list(x) for x in config.image_grid_pinpoints], int(config.vision_config.patch_size),
             getattr(config, "vision_aspect_ratio", "anyres_max_9")):
        raise ValueError(f"{what} counts images with other AnyRes settings (grid pinpoints, patch size, {aspect}) than "
                         "the model config's image_grid_pinpoints / patch_size / vision_aspect_ratio; make them equal")


def check_index_fits(config, base: Any, what: str) -> np.ndarray:
    """``ValueError`` (one line, with the fix) when the fcp index ``base`` (an ``IndexedDataset``) cannot feed a
    transformers model of ``config``: a tokenizer vocabulary larger than the model's, a non-Qwen-VL spec for a Qwen-VL
    model, special token ids or pixel patches that differ, images/videos for a text model. Returns which samples are
    visual."""
    from fcp_exec.integrations.hf_data import check_data_fits

    check_data_fits(config, vocab_size=base.spec.tokenizer().get_vocab_size(), what=what)
    index = base.index
    n = len(index.num_tokens)
    visual = np.asarray(index.num_visual_tokens, dtype=np.int64) > 0 if base.placeholder_ids else np.zeros(n, bool)
    if config.model_type == "internvl":
        if base.spec.family != "internvl":
            raise ValueError(f"{what} was built with spec {base.spec.name!r}; an internvl model needs an InternVL spec "
                             "(fcp index ... --spec internvl3)")
        check_data_fits(config, ids={"image": base.spec.token_id(base.spec.vision["tokens"]["img_context"])}, what=what)
        size = tuple(int(x) for x in config.vision_config.image_size)
        if size != (int(base.spec.vision["tile_size"]),) * 2:
            raise ValueError(f"{what} has {base.spec.vision['tile_size']}-px tiles but the model's vision tower takes "
                             f"{size}; set vision_config.image_size to the spec's tile size")
    elif config.model_type == "llava_onevision":
        _check_llava_index(config, base, what)
    elif config.model_type in HF_SPECS:
        if base.spec.family != "qwen-vl":
            raise ValueError(f"{what} was built with spec {base.spec.name!r}; a {config.model_type} model needs a Qwen-VL "
                             f"spec (fcp index ... --spec {HF_SPECS[config.model_type]})")
        t = base.spec.vision["tokens"]
        check_data_fits(config, ids={"image": base.image_token_id, "video": base.video_token_id,
                                     "vision_start": base.spec.token_id(t["vision_start"]),
                                     "vision_end": base.spec.token_id(t["vision_end"])}, what=what)
        v = base.spec.vision
        check_data_fits(config, patch=3 * int(v["temporal_patch_size"]) * int(v["patch_size"]) ** 2, what=what)
    elif visual.any():
        raise ValueError(f"{what} holds images/videos but {config.model_type} is a text model")
    return visual


def load_train_data(model: str, data: str | None = None, *, max_tokens: int = 2304, seed: int = 0,
                    cache_dir: str | None = None, num_synthetic: int | None = None, lengths=None,
                    hf_config=None, prompt_mask: bool = False, caption_labels: bool = False) -> TrainData:
    """The dataset a training run uses (module docstring). ``hf_config``: the transformers config of an
    ``hf:`` model (text model → text data, Qwen-VL → the bundled video/image samples in its family's spec);
    ``prompt_mask``: its synthetic samples carry SFT labels with a masked prompt (:class:`SyntheticHFDocs`);
    ``caption_labels``: an index's image/video samples train on their caption only (``IndexedDataset``)."""
    if max_tokens < 4:
        raise ValueError(f"max_tokens must be >= 4, got {max_tokens}")
    if hf_config is not None:
        return _load_hf_data(hf_config, data, max_tokens=max_tokens, seed=seed, cache_dir=cache_dir,
                             num_synthetic=num_synthetic, prompt_mask=prompt_mask, caption_labels=caption_labels)
    if data == "synthetic":
        if model == "tiny-llm":
            base = SyntheticText(num_synthetic or 24, seed=seed, max_len=max_tokens, lengths=lengths)
            vis = np.zeros(len(base), dtype=bool)
            ds, lengths, dropped = _cap(base, base.lengths, vis, max_tokens)
            return TrainData(dataset=ds, lengths=lengths, pad_token_id=_SYN_PAD,
                             description=f"synthetic text: {len(ds)} documents, up to {max_tokens} tokens")
        base = SyntheticVideo(num_synthetic or 16, seed=seed, max_len=max_tokens)
        vis = np.array([s[0] > 0 for s in base.samples])
        ds, lengths, dropped = _cap(base, base.lengths, vis, max_tokens)
        from fcp_data.visual_layout import SpanVisualLayout

        spans = base.placeholder_spans()
        return TrainData(dataset=ds, lengths=lengths, pad_token_id=_SYN_PAD, visual_token_ids=(_SYN_PLACEHOLDER,),
                         visual_layout=SpanVisualLayout([spans[int(k)] for k in ds.keep]),
                         description=f"synthetic video: {len(ds)} samples, up to {max_tokens} tokens"
                                     + _dropped_note(dropped),
                         num_dropped=dropped, patch_dim=base.patch_dim)
    from fcp_data.readers import IndexedDataset

    path = Path(data) if data else _bundled_index(model, cache_dir)
    base = IndexedDataset(path, caption_labels=caption_labels)
    index = base.index
    lengths = np.asarray(index.num_tokens, dtype=np.int64)
    visual = np.asarray(index.num_visual_tokens, dtype=np.int64) > 0 if base.placeholder_ids else np.zeros(lengths.size, bool)
    if model == "tiny-llm" and visual.any():
        raise ValueError(f"index {path} holds images/videos; train it with --model tiny-mllm")
    if model == "tiny-mllm" and not base.placeholder_ids:
        raise ValueError(f"index {path} was built with the text spec {base.spec.name!r}; tiny-mllm needs an index "
                         "built with a vision spec (e.g. `fcp index ... --spec qwen2-vl`), or use --model tiny-llm")
    _check_tiny_vocab(model, base, path)
    ds, capped, dropped = _cap(base, lengths, visual, max_tokens)
    if capped.size == 0:
        raise ValueError(f"no sample of {path} fits max_tokens={max_tokens}; raise --max-tokens")
    what = "bundled samples" if not data else str(path)
    from fcp_data.visual_layout import IndexVisualLayout

    layout = IndexVisualLayout(index, keep=ds.keep, spec=base.spec) if base.placeholder_ids else None
    return TrainData(dataset=ds, lengths=capped, pad_token_id=int(base.pad_token_id), visual_layout=layout,
                     has_labels=base.has_labels,
                     visual_token_ids=tuple(base.placeholder_ids), num_dropped=dropped,
                     description=f"{what} (spec {base.spec.name}): {capped.size} samples, {int(capped.sum())} tokens, "
                                 f"max {int(capped.max())} (cap {max_tokens})"
                                 + _dropped_note(dropped) + _labels_note(base))


def view_exclusions(data: "TrainData", exclude: Any) -> Any:
    """``--exclude FILE`` in the numbering of ``data`` (``TrainData.dataset``: an index's samples, or the
    ``--max-tokens`` view of them that :class:`CappedDataset` keeps): records that name their sample's key are
    resolved by it (:func:`fcp_data.sampler_inputs.resolve_exclusions`; a sample outside the view is left out
    already), so a file another ``--max-tokens``, the example scripts or ``FCPDataset(errors_path=)`` wrote applies
    to the samples it names."""
    from fcp_data.sampler_inputs import resolve_exclusions

    ds = data.dataset
    base = getattr(ds, "base", ds)
    keys = getattr(getattr(base, "index", None), "keys", None)
    if exclude is None or keys is None or not hasattr(keys, "index_of"):
        return exclude
    keep = getattr(ds, "keep", None) if ds is not base else None

    def key_of(i: int) -> str:
        return keys[int(keep[i]) if keep is not None else i]

    def index_of(key: str) -> int | None:
        row = keys.index_of(key)
        if keep is None:
            return row
        j = int(np.searchsorted(keep, row))
        return j if j < keep.size and int(keep[j]) == row else None

    return resolve_exclusions(exclude, key_of, index_of)


def _check_tiny_vocab(model: str, base: Any, path: Path) -> None:
    """An index whose tokenizer has more ids than the tiny models' embedding (the bundled tokenizer's 2,000) would
    end the run in the embedding at its first such id: one error naming the fix."""
    from fcp_exec.models.tiny_llm import TinyLLMConfig

    have, vocab = TinyLLMConfig().vocab_size, base.spec.tokenizer().get_vocab_size()
    if vocab > have:
        raise ValueError(f"index {path} was built with a tokenizer of {vocab} ids but {model} embeds {have} (the "
                         f"bundled tokenizer's); train it with --model hf:CONFIG (a model whose vocab_size is at least "
                         f"{vocab}) or index with the bundled tokenizer")


def _load_hf_data(config, data: str | None, *, max_tokens: int, seed: int, cache_dir: str | None,
                  num_synthetic: int | None, prompt_mask: bool = False, caption_labels: bool = False) -> TrainData:
    """Data for a transformers model, checked against its config (vocabulary, special token ids, patch size)."""
    from fcp_data.visual_layout import IndexVisualLayout, SpanVisualLayout
    from fcp_exec.integrations.hf_data import SyntheticHFDocs, special_ids

    is_vl = config.model_type in HF_SPECS
    if data == "synthetic":
        base = SyntheticHFDocs(config, num_synthetic or 24, seed=seed, long_text=min(200, max_tokens // 2),
                               prompt_mask=prompt_mask)
        vis = np.array([bool(sp) for sp in base.placeholder_spans()])
        ds, lengths, dropped = _cap(base, base.lengths, vis, max_tokens)
        tc = getattr(config, "text_config", config)
        pad = int(getattr(tc, "pad_token_id", None) or 0)
        sft = ", SFT labels with masked prompts" if prompt_mask else ""
        if not is_vl:
            return TrainData(has_labels=prompt_mask, dataset=ds, lengths=lengths, pad_token_id=pad, num_dropped=dropped,
                             description=f"synthetic text for {config.model_type}: {len(ds)} documents{sft}"
                                         + _dropped_note(dropped))
        ids = special_ids(config)
        spans = base.placeholder_spans()
        return TrainData(dataset=ds, lengths=lengths, pad_token_id=pad,
                         visual_token_ids=tuple(ids[k] for k in ("image", "video") if k in ids),
                         has_labels=prompt_mask,
                         visual_layout=SpanVisualLayout([spans[int(k)] for k in ds.keep]), num_dropped=dropped,
                         description=f"synthetic images/videos for {config.model_type}: {len(ds)} documents{sft}"
                                     + _dropped_note(dropped))
    from fcp_data.readers import IndexedDataset

    path = Path(data) if data else _bundled_index("hf", cache_dir, HF_SPECS.get(config.model_type, "text"))
    base = IndexedDataset(path, caption_labels=caption_labels)
    what = f"index {path}" if data else "the bundled samples"
    index = base.index
    lengths = np.asarray(index.num_tokens, dtype=np.int64)
    visual = check_index_fits(config, base, what)
    ds, capped, dropped = _cap(base, lengths, visual, max_tokens)
    if capped.size == 0:
        raise ValueError(f"no sample of {path} fits max_tokens={max_tokens}; raise --max-tokens")
    layout = IndexVisualLayout(index, keep=ds.keep, spec=base.spec) if base.placeholder_ids else None
    return TrainData(dataset=ds, lengths=capped, pad_token_id=int(base.pad_token_id), visual_layout=layout,
                     has_labels=base.has_labels,
                     visual_token_ids=tuple(base.placeholder_ids) if is_vl else (), num_dropped=dropped,
                     description=f"{what} (spec {base.spec.name}): {capped.size} samples, {int(capped.sum())} tokens, "
                                 f"max {int(capped.max())} (cap {max_tokens})"
                                 + _dropped_note(dropped) + _labels_note(base))
