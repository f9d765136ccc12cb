"""Qwen-VL training positions from the installed transformers' own ``get_rope_index``.

A Qwen-VL model trained with context parallelism gets its 3-D rope positions from the collator
(``mrope_position_ids``), not from the model; they must equal what the same model computes at inference,
which is ``<Model class>.get_rope_index`` of the installed transformers — a rule that changed between
releases (see :mod:`fcp_data.collator`). :class:`HFRopeIndex` calls exactly that function on one whole
untruncated document, so the collator can then cut, pad and zigzag-shard the result::

    from fcp_exec.integrations.hf_positions import hf_collator
    collate = hf_collator(model.config)          # or hf_collator(model), + any FCPCollator keyword
    loader = DataLoader(FCPDataset(ds), batch_sampler=sampler, collate_fn=collate, num_workers=4)

No model is instantiated: a tiny host object holds ``.config`` and the model class's methods
(``get_rope_index``, ``get_vision_position_ids``, …) bound to itself. The inputs are built the way the
processors build them: ``mm_token_type_ids`` (0 text, 1 ``image_token_id``, 2 ``video_token_id``),
the sample's ``grid_thw`` rows (one per image/video, in order of appearance) split into
``image_grid_thw``/``video_grid_thw`` by the type of their placeholder runs, and for Qwen2.5-VL
``second_per_grid_ts`` (the sample's, one per video; 1.0 each when absent). Qwen2-VL/Qwen2.5-VL hold each
image/video in one run of placeholders; Qwen3-VL holds a video as one run per temporal frame group
(``"<t seconds>"`` text between them) and splits its video grids itself, so a video row there covers
``t`` runs. A sample whose placeholders do not fit its grid rows is a ``ValueError`` that says so.

Supported ``model_type``: ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_vl_moe``. transformers is imported
only when an ``HFRopeIndex`` is built or called, never by importing this module's package.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from types import MethodType
from typing import Any

import torch

from fcp_data.collator import FCPCollator

__all__ = ["HFRopeIndex", "hf_collator", "MODEL_CLASSES"]

# model_type -> the class whose get_rope_index transformers runs (module, qualified name)
MODEL_CLASSES: dict[str, tuple[str, str]] = {
    "qwen2_vl": ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel"),
    "qwen2_5_vl": ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel"),
    "qwen3_vl": ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLModel"),
    "qwen3_vl_moe": ("transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe", "Qwen3VLMoeModel"),
}
_FRAME_GROUP_RUNS = ("qwen3_vl", "qwen3_vl_moe")  # videos appear as one placeholder run per temporal frame group
_SECONDS_PER_GRID = ("qwen2_5_vl",)  # get_rope_index takes second_per_grid_ts


def _resolve(owner: tuple[str, str]) -> type:
    module, qualname = owner
    return functools.reduce(getattr, qualname.split("."), importlib.import_module(module))


class _Host:
    """Stands in for the model inside ``get_rope_index``: ``.config`` plus the class's methods bound to
    this object (no weights, no ``nn.Module``)."""

    def __init__(self, config: Any, cls: type) -> None:
        self.config = config
        self._cls = cls

    def __getattr__(self, name: str) -> Any:
        if name == "_cls" or name.startswith("__"):
            raise AttributeError(name)
        try:
            attr = inspect.getattr_static(self._cls, name)
        except AttributeError:
            raise AttributeError(
                f"{self._cls.__name__}.get_rope_index of the installed transformers uses the model attribute {name!r}, "
                "which a weightless host cannot provide; this transformers version is not supported by HFRopeIndex "
                "(tested with 5.18 to 5.25) — compute positions with the model itself") from None
        if isinstance(attr, (staticmethod, classmethod)):
            return getattr(self._cls, name)
        return MethodType(attr, self) if inspect.isfunction(attr) else getattr(self._cls, name)


class HFRopeIndex:
    """``position_fn`` for :class:`~fcp_data.collator.FCPCollator`: Qwen-VL 3-D positions of one document from
    the installed transformers' ``get_rope_index``.

    ``config``: a ``Qwen2VLConfig``/``Qwen2_5_VLConfig``/``Qwen3VLConfig``/``Qwen3VLMoeConfig`` (``model_type``
    ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``, ``qwen3_vl_moe``). ``model_class``: the class whose
    ``get_rope_index`` is called (default: the family's ``…Model`` class; :meth:`from_model` passes the model's own).
    Picklable: it holds the config and the class's import path; the host object is rebuilt in each process.

    ``__call__(sample, input_ids) -> LongTensor [3, n]``; :meth:`rope_inputs` shows the keyword arguments
    it passes (batch of one).
    """

    def __init__(self, config: Any, *, model_class: type | None = None) -> None:
        model_type = getattr(config, "model_type", None)
        if model_type not in MODEL_CLASSES:
            raise ValueError(f"HFRopeIndex supports model_type {', '.join(MODEL_CLASSES)}; got {model_type!r} "
                             f"({type(config).__name__}). Pass the Qwen-VL model's config (model.config)")
        for key in ("image_token_id", "video_token_id"):
            if not isinstance(getattr(config, key, None), int):
                raise ValueError(f"config.{key} must be an int token id, got {getattr(config, key, None)!r}")
        vision = getattr(config, "vision_config", None)
        if vision is None or not isinstance(getattr(vision, "spatial_merge_size", None), int):
            raise ValueError(f"{type(config).__name__} has no vision_config.spatial_merge_size; pass the full "
                             "Qwen-VL config (not its text_config)")
        self.config = config
        self.model_type: str = model_type
        self.image_token_id = int(config.image_token_id)
        self.video_token_id = int(config.video_token_id)
        self.spatial_merge_size = int(vision.spatial_merge_size)
        if model_class is None:
            self._owner = MODEL_CLASSES[model_type]
        else:
            if not callable(getattr(model_class, "get_rope_index", None)):
                raise TypeError(f"model_class {model_class!r} has no get_rope_index")
            self._owner = (model_class.__module__, model_class.__qualname__)
        self._host: _Host | None = None

    @classmethod
    def from_model(cls, model: Any) -> "HFRopeIndex":
        """From a model instance (``…ForConditionalGeneration`` or its ``.model``): its config and the class
        whose ``get_rope_index`` it runs. Nothing of the model is kept but the config."""
        inner = getattr(model, "model", None)
        for candidate in (inner, model):
            if candidate is not None and "get_rope_index" in dir(type(candidate)) and hasattr(candidate, "config"):
                return cls(candidate.config, model_class=type(candidate))
        raise TypeError(f"{type(model).__name__} (nor its .model) has no get_rope_index and config; pass a Qwen-VL "
                        "model or its config")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_host"] = None
        return state

    def __repr__(self) -> str:
        return f"HFRopeIndex({self.model_type}, {self._owner[1]}.get_rope_index)"

    @property
    def host(self) -> _Host:
        """The weightless stand-in for the model (built on first use in each process)."""
        if self._host is None:
            self._host = _Host(self.config, _resolve(self._owner))
        return self._host

    # ------------------------------------------------------------------ inputs
    def _runs(self, types: torch.Tensor) -> list[tuple[int, int, int]]:
        """``(type, start, length)`` of each run of placeholder tokens (type 1 image, 2 video)."""
        n = types.numel()
        if n == 0:
            return []
        change = torch.nonzero(types[1:] != types[:-1]).flatten() + 1
        starts = [0] + change.tolist()
        ends = starts[1:] + [n]
        return [(int(types[s]), s, e - s) for s, e in zip(starts, ends) if int(types[s]) != 0]

    def rope_inputs(self, sample: dict, input_ids: torch.Tensor) -> dict[str, Any]:
        """Keyword arguments of ``get_rope_index`` for one document (batch of one), validated."""
        ids = torch.as_tensor(input_ids).reshape(-1).to(torch.long)
        types = torch.zeros(ids.shape, dtype=torch.int32)
        types[ids == self.image_token_id] = 1
        types[ids == self.video_token_id] = 2
        grid = sample.get("grid_thw")
        rows = [] if grid is None else [tuple(int(v) for v in r) for r in
                                        torch.as_tensor(grid, dtype=torch.long).reshape(-1, 3).tolist()]
        runs = self._runs(types)
        ids_hint = f"the model's image_token_id={self.image_token_id} / video_token_id={self.video_token_id}"
        if rows and not runs:
            raise ValueError(
                f"sample has {len(rows)} grid_thw row(s) but no token equal to {ids_hint}: the reader's "
                "placeholder ids are not the model's — index and read with the spec whose tokenizer matches the "
                "model, or pass the config whose image_token_id/video_token_id are the reader's "
                "(dataset.image_token_id/video_token_id)")
        image_rows, video_rows = self._match_runs(runs, rows, ids_hint)
        kw: dict[str, Any] = {
            "input_ids": ids[None],
            "mm_token_type_ids": types[None],
            "image_grid_thw": torch.tensor(image_rows, dtype=torch.long) if image_rows else None,
            "video_grid_thw": torch.tensor(video_rows, dtype=torch.long) if video_rows else None,
        }
        if self.model_type in _SECONDS_PER_GRID:
            spg = sample.get("second_per_grid_ts")
            spg = torch.ones(len(video_rows)) if spg is None else \
                torch.as_tensor(spg, dtype=torch.float32).reshape(-1)
            if spg.numel() != len(video_rows):
                raise ValueError(f"second_per_grid_ts has {spg.numel()} value(s) but the sample has {len(video_rows)} "
                                 "video(s); give one value (temporal_patch_size / sampled fps) per video")
            kw["second_per_grid_ts"] = spg.to(torch.float32) if video_rows else None
        return kw

    def _match_runs(self, runs: list[tuple[int, int, int]], rows: list[tuple[int, int, int]],
                    ids_hint: str) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
        """Match placeholder runs to ``grid_thw`` rows in order; ``(image rows, video rows)`` or a ``ValueError``
        saying where they disagree (Qwen3-VL: one run per frame group of a video)."""
        m = self.spatial_merge_size
        frame_runs = self.model_type in _FRAME_GROUP_RUNS
        image_rows: list[tuple[int, int, int]] = []
        video_rows: list[tuple[int, int, int]] = []
        row_i, frames_left, per_group = 0, 0, 0
        for kind, start, length in runs:
            name = "image" if kind == 1 else "video"
            if frames_left:  # Qwen3-VL: the next frame group of the current video
                if kind != 2 or length != per_group:
                    raise ValueError(
                        f"placeholder run at token {start} ({length} {name} tokens) should be the next frame group of "
                        f"video grid {video_rows[-1]} ({per_group} video tokens): grid_thw rows and placeholder runs "
                        "disagree")
                frames_left -= 1
                continue
            if row_i >= len(rows):
                raise ValueError(f"placeholder run at token {start} ({length} {name} tokens) has no grid_thw row left "
                                 f"({len(rows)} row(s)): grid_thw rows and placeholder counts disagree")
            t, h, w = rows[row_i]
            row_i += 1
            if h % m or w % m or t < 1:
                raise ValueError(f"grid_thw row {rows[row_i - 1]} is not divisible by spatial_merge_size={m}")
            per = (h // m) * (w // m)
            expect = per if (frame_runs and kind == 2) else t * per
            if length != expect:
                raise ValueError(
                    f"placeholder run at token {start} holds {length} {name} tokens but its grid_thw row {(t, h, w)} "
                    f"implies {expect} (merge {m}{', one run per frame group' if frame_runs and kind == 2 else ''}): "
                    f"grid_thw rows and placeholder counts disagree, or the ids are not {ids_hint}")
            (image_rows if kind == 1 else video_rows).append((t, h, w))
            if frame_runs and kind == 2:
                frames_left, per_group = t - 1, per
        if frames_left:
            raise ValueError(f"video grid {video_rows[-1]} has {frames_left} frame group(s) without placeholder runs: "
                             "grid_thw rows and placeholder runs disagree")
        if row_i != len(rows):
            raise ValueError(f"sample has {len(rows)} grid_thw row(s) but placeholder runs for only {row_i} "
                             f"(ids {ids_hint}): grid_thw rows and placeholder counts disagree")
        return image_rows, video_rows

    def __call__(self, sample: dict, input_ids: torch.Tensor) -> torch.Tensor:
        """``LongTensor [3, len(input_ids)]``: the installed ``get_rope_index`` on the whole document."""
        kw = self.rope_inputs(sample, input_ids)
        with torch.no_grad():
            positions, _ = self.host.get_rope_index(**kw)
        return positions[:, 0].to(torch.long)


def _pad_id(config: Any) -> int:
    text = getattr(config, "text_config", None)
    order = ((text, "pad_token_id"), (config, "pad_token_id"), (text, "eos_token_id"), (config, "eos_token_id"))
    for holder, key in order:
        v = getattr(holder, key, None) if holder is not None else None
        if isinstance(v, (list, tuple)) and v:
            v = v[0]
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    raise ValueError("the config names no pad_token_id or eos_token_id; pass hf_collator(..., pad_token_id=...)")


def hf_collator(config_or_model: Any, **collator_kwargs: Any) -> FCPCollator:
    """An :class:`~fcp_data.collator.FCPCollator` whose ``mrope_position_ids`` equal the installed
    transformers model's: ``visual_token_id=(image_token_id, video_token_id)``, ``spatial_merge_size`` from the
    vision config, ``pad_token_id`` from the config (text pad id, else EOS) unless given, and
    ``position_fn=HFRopeIndex(...)``. Other keywords go to ``FCPCollator``. An InternVL model (1-D positions) gets
    ``visual_token_id=image_token_id`` and ``spatial_merge_size = 1 / downsample_ratio`` (a tile's grid row counts
    its vision patches) and the collator's own per-document positions. A text model (a config without
    ``vision_config``, e.g. an ``AutoModelForCausalLM``'s) gets the plain text collator,
    ``FCPCollator(pad_token_id=...)``."""
    fixed = ("visual_token_id", "spatial_merge_size", "position_fn", "mrope", "signed_grids")
    clash = sorted(k for k in collator_kwargs if k in fixed)
    if clash:
        raise TypeError(f"hf_collator sets {', '.join(clash)} from the model config; build FCPCollator directly to "
                        "choose them yourself")
    config = getattr(config_or_model, "config", config_or_model)
    if getattr(config, "vision_config", None) is None and getattr(config, "image_token_id", None) is None:
        collator_kwargs.setdefault("pad_token_id", _pad_id(config))  # a text model: 1-D per-document positions
        return FCPCollator(**collator_kwargs)
    if getattr(config, "model_type", None) == "internvl":
        collator_kwargs.setdefault("pad_token_id", _pad_id(config))
        from fcp_exec.integrations.hf_models import tile_geometry

        return FCPCollator(visual_token_id=int(config.image_token_id), spatial_merge_size=tile_geometry(config)[1],
                           **collator_kwargs)
    if getattr(config, "model_type", None) == "llava_onevision":
        collator_kwargs.setdefault("pad_token_id", _pad_id(config))
        return FCPCollator(visual_token_id=(int(config.image_token_id), int(config.video_token_id)),
                           spatial_merge_size=1, signed_grids=True, **collator_kwargs)
    fn = HFRopeIndex.from_model(config_or_model) if isinstance(config_or_model, torch.nn.Module) \
        else HFRopeIndex(config_or_model)
    collator_kwargs.setdefault("pad_token_id", _pad_id(fn.config))
    return FCPCollator(visual_token_id=(fn.image_token_id, fn.video_token_id), spatial_merge_size=fn.spatial_merge_size,
                       position_fn=fn, **collator_kwargs)
