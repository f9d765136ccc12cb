"""The vision side of :func:`fcp_exec.integrations.hf.apply_fcp`: a CP group's images and video frames encoded once
per group, each rank a contiguous share of whole frames, every visual row sent to the rank that holds its token
(:mod:`fcp_exec.vision_exchange`), handed to the model through transformers' ``mm_encoder_outputs``.

Three layouts of a group's vision inputs (``pixel_values`` + ``grid_thw``, in order of appearance):

* Qwen2-VL / Qwen2.5-VL / Qwen3-VL: flattened patches, a grid row ``(t, h, w)`` per image/video; a frame is one
  temporal patch, encoded by the model's ``visual`` tower (Qwen3-VL: with its deepstack features).
* InternVL (``tiles``): ``[n, 3, H, W]`` tiles, grid rows ``(tiles, side, side)``; a frame is one tile, encoded by the
  model's ``get_image_features``.
* LLaVA-OneVision (``frames``, :mod:`~fcp_exec.integrations.hf_llava`): ``[n, 3, S, S]`` video frames and image
  crops; a video's frames are encoded by the model's own ``get_video_features`` (tower, projector, 2×2 pooling) and
  its newline row is the learned ``image_newline``; an image's crops are encoded and packed together (AnyRes) by
  one rank.

Every rank calls the vision tower exactly once per micro-batch (on a one-frame dummy, weighted 0, when it has nothing
to encode) so FSDP2-sharded vision blocks stay in lock-step. The rows join the input embeddings through a zero-weighted
anchor (:func:`make_embed_hook`) so their backward runs after every ring-attention backward exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from fcp_exec.integrations import hf_llava as llava
from fcp_exec.integrations.hf_models import QWEN3_VL_MODEL_TYPES

__all__ = ["State", "VisionCall", "install_hooks", "encode_tiles"]


@dataclass
class State:
    """What :func:`~fcp_exec.integrations.hf.apply_fcp` stores on the model (``model._fcp_state``): per model."""

    model_type: str
    kernel: Any
    timeout: float | None
    is_vl: bool
    tiles: bool = False  # InternVL: the vision inputs are fixed-size tiles, positions are 1-D
    frames: bool = False  # LLaVA-OneVision: square video frames + one newline row per video, positions are 1-D
    image_token_id: int | None = None
    video_token_id: int | None = None
    merge: int = 1
    router: Any = None  # the MoE load-balancing loss (hf_router.RouterLoss), None without one
    active: Any = field(default=None, repr=False)  # the VisionCall of the forward in progress, else None


@dataclass
class VisionCall:
    """One forward's vision inputs (created by :func:`~fcp_exec.integrations.hf.batch_inputs`, consumed by the
    pre-hook)."""

    input_ids: torch.Tensor
    pixel_values: torch.Tensor | None
    grid_thw: torch.Tensor | None
    visual_pos: torch.Tensor
    visual_index: torch.Tensor
    ranks: tuple[int, ...]
    cp_rank: int
    anchor: torch.Tensor | None = None


def install_hooks(model: nn.Module) -> None:
    """The model's forward pre/post hooks and its input embedding's hook (once per model)."""
    model.register_forward_pre_hook(_vision_pre_hook, with_kwargs=True)
    model.register_forward_hook(_vision_post_hook, always_call=True)
    model.get_input_embeddings().register_forward_hook(make_embed_hook(model))


def _visual(model: nn.Module) -> nn.Module:
    inner = getattr(model, "model", model)
    visual = getattr(inner, "visual", None) or getattr(inner, "vision_tower", None)
    if visual is None:
        raise TypeError(f"{type(model).__name__} has no vision tower at .model.visual or .model.vision_tower")
    return visual


def encode_tiles(model: nn.Module, tiles: torch.Tensor) -> torch.Tensor:
    """Rows ``[visual tokens, hidden]`` of InternVL tiles ``[n, 3, H, W]``: the model's own ``get_image_features``
    (vision tower, pixel shuffle, projector), each tile's tokens in order."""
    feats = getattr(model, "model", model).get_image_features(pixel_values=tiles, return_dict=True).pooler_output
    return feats.reshape(-1, feats.shape[-1])


def _encode(visual: nn.Module, pixel_values: torch.Tensor, grids: list[tuple[int, int, int]],
            deepstack: bool) -> torch.Tensor:
    """Rows ``[visual tokens, hidden·(1 + #deepstack)]`` of Qwen-VL frames ``grids`` (each ``(1, h, w)``)."""
    out = visual(pixel_values, grid_thw=torch.tensor(grids, dtype=torch.long, device=pixel_values.device))
    rows = out.pooler_output
    if deepstack:
        rows = torch.cat([rows] + list(out.deepstack_features), dim=1)
    return rows


def _dummy_frame(visual: nn.Module, merge: int, dtype, device) -> torch.Tensor:
    w = visual.patch_embed.proj.weight
    shape = getattr(w, "ds_shape", w.shape)  # DeepSpeed ZeRO-3 partitions the weight; ds_shape is its full shape
    return torch.zeros((merge * merge, math.prod(shape[1:])), dtype=dtype, device=device)


def _square(module: nn.Module) -> tuple[int, int]:
    size = module.config.vision_config.image_size
    return tuple(size) if isinstance(size, (list, tuple)) else (int(size), int(size))


def _share_encoder(state: State, module: nn.Module, table: torch.Tensor, pv: torch.Tensor,
                   dummy: Callable[[], torch.Tensor]) -> Callable[[int, int], torch.Tensor]:
    """``encode_share(f_lo, f_hi)`` for :func:`fcp_exec.vision_exchange.exchange_rows`: rows of table frames
    ``[f_lo, f_hi)`` in order."""
    deepstack = state.model_type in QWEN3_VL_MODEL_TYPES

    def encode_share(f_lo: int, f_hi: int) -> torch.Tensor:
        if f_hi <= f_lo:
            return dummy()[:0]  # an empty share still joins the graph (its peers' gradients come back through it)
        if state.tiles:  # one frame of the table = one tile = one row of pixel_values
            return encode_tiles(module, pv[f_lo:f_hi])
        if state.frames:  # LLaVA-OneVision: frames, newlines and whole images (hf_llava)
            return llava.encode_rows(module, table[f_lo:f_hi], pv, dummy)
        p_lo = int(table[f_lo, 2])
        p_hi = int(table[f_hi - 1, 2] + table[f_hi - 1, 3] * table[f_hi - 1, 4])
        grids = [(1, int(table[f, 3]), int(table[f, 4])) for f in range(f_lo, f_hi)]
        return _encode(_visual(module), pv[p_lo:p_hi], grids, deepstack)

    return encode_share


def _vision_pre_hook(module: nn.Module, args, kwargs):
    call = kwargs.pop("fcp_vision", None)
    if call is None:
        return args, kwargs
    from fcp_exec.vision_exchange import exchange_rows, frame_table

    state: State = module._fcp_state
    visual = _visual(module)
    dtype = next(visual.parameters()).dtype
    device = call.input_ids.device
    dummy_rows: list[torch.Tensor] = []

    def dummy() -> torch.Tensor:
        if state.tiles:
            rows = encode_tiles(module, torch.zeros((1, 3, *_square(module)), dtype=dtype, device=device))
        elif state.frames:
            rows = llava.encode_frames(module, torch.zeros((1, 3, *_square(module)), dtype=dtype, device=device))
        else:
            rows = _encode(visual, _dummy_frame(visual, state.merge, dtype, device), [(1, state.merge, state.merge)],
                           state.model_type in QWEN3_VL_MODEL_TYPES)
        dummy_rows.append(rows)
        return rows

    has_frames = call.grid_thw is not None and call.grid_thw.numel() > 0 and call.pixel_values is not None
    rows = None
    if has_frames:
        table = llava.frame_table(call.grid_thw, module.config) if state.frames else frame_table(call.grid_thw,
                                                                                                  state.merge)
        pv = call.pixel_values.to(device=device, dtype=dtype)
        rows = exchange_rows(_share_encoder(state, module, table, pv, dummy), table, call.visual_index, call.ranks,
                             call.cp_rank, device)
        mm = _mm_outputs(state, module, call, rows, device)
        if mm:
            kwargs["mm_encoder_outputs"] = mm
    else:
        if call.visual_pos.numel():
            raise ValueError("the batch has visual placeholder tokens but no pixel_values/grid_thw")
        dummy()
    # float32: the anchor's gradient is the sum of every embedding gradient (the broadcast add in the embedding
    # hook), which in fp16 overflows under a loss scaler long before any real gradient does (inf * 0 = NaN)
    anchor = rows.float().sum() * 0.0 if rows is not None else None
    for r in dummy_rows:
        anchor = r.float().sum() * 0.0 if anchor is None else anchor + r.float().sum() * 0.0
    call.anchor = anchor
    state.active = call
    return args, kwargs


def _mm_outputs(state: State, module: nn.Module, call: VisionCall, rows: torch.Tensor, device) -> dict:
    """This rank's rows as transformers' ``mm_encoder_outputs`` (``{"image": ..., "video": ...}``), each kind's rows
    in the order of its placeholder tokens."""
    hidden = int(module.config.text_config.hidden_size)
    kinds = call.input_ids.index_select(0, call.visual_pos.to(device))
    mm = {}
    for name, tid in (("image", state.image_token_id), ("video", state.video_token_id)):
        sel = torch.nonzero(kinds == tid).flatten() if tid is not None else kinds[:0]
        if sel.numel() and (state.tiles or state.frames):
            from transformers.modeling_outputs import BaseModelOutputWithPooling

            part = rows.index_select(0, sel)  # LLaVA-OneVision concatenates a tuple of image blocks
            mm[name] = BaseModelOutputWithPooling(pooler_output=(part,) if state.frames and name == "image" else part[None])
        elif sel.numel():
            part = rows.index_select(0, sel)
            mm[name] = _encoder_output(state, part[:, :hidden], part[:, hidden:], hidden)
    return mm


def _encoder_output(state: State, main: torch.Tensor, extra: torch.Tensor, hidden: int):
    if state.model_type in QWEN3_VL_MODEL_TYPES:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

        return BaseModelOutputWithDeepstackFeatures(pooler_output=(main,),
                                                    deepstack_features=[(c,) for c in extra.split(hidden, dim=1)])
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return BaseModelOutputWithPooling(pooler_output=(main,))


def _vision_post_hook(module: nn.Module, args, output):
    state = getattr(module, "_fcp_state", None)
    if state is not None:
        state.active = None
    return output


def make_embed_hook(model: nn.Module):
    def hook(embedding: nn.Module, args, output):
        # The vision rows join the graph *before* the first decoder layer, so on every rank their backward (and
        # the exchange's gradient P2P) runs after all ring-attention backward P2P: no cross-wait between the two.
        call = getattr(model, "_fcp_state", None) and model._fcp_state.active
        if call is None or call.anchor is None:
            return output
        return output + call.anchor.to(output.dtype)

    return hook
