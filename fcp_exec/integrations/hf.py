"""Hugging Face transformers adapter: run a stock causal LM or vision-language model on FCP micro-batches.

One call, :func:`apply_fcp`, makes a transformers model run its (text) attention through
:func:`fcp_exec.ring_attention` over each micro-batch's CP group, the way transformers expects custom attention:
an attention function registered in ``AttentionInterface`` under :data:`ATTENTION_NAME`, with the per-micro-batch
metadata (local ``cu_seqlens`` and the group's ``ranks``) passed as one keyword argument, ``fcp_context``, that
transformers forwards from ``model(...)`` down to every attention call. There is no module-level state: each
forward carries its own context, so nothing can leak from one micro-batch into the next.

Typical use (see ``examples/``)::

    model = apply_fcp(AutoModelForCausalLM.from_config(cfg))        # or a Qwen2/2.5/3-VL model
    collate = hf_collator(model)    # VL: positions from the model's own rule; text: FCPCollator(pad_token_id=...)
    loader = DataLoader(FCPDataset(ds), batch_sampler=FCPSampler(...), collate_fn=collate)
    model, reducer = make_reducer("fsdp2", model)                   # or "ddp" / "allreduce"
    opt = torch.optim.AdamW(model.parameters())                      # after make_reducer: FSDP2 shards them
    for step in range(steps):
        res = train_step(model, loader_iter, fcp_loss, reducer); opt.step(); opt.zero_grad()

* :func:`batch_inputs` maps an ``FCPCollator`` batch to the model's keyword arguments (``input_ids`` ``[1, L]``,
  ``position_ids`` — ``[1, L]`` text positions, or ``[3, 1, L]`` Qwen-VL 3-D positions —, ``fcp_context``,
  ``use_cache=False`` and, for VL models, the group's vision inputs).
* :func:`fcp_loss` / :func:`lm_loss`: the collator's labels are *already shifted* (``labels[t]`` is the target of
  token ``t``), so the loss is ``Σ CE(logits[t], labels[t]) / num_tokens_global`` with no further shift; the
  all-reduce SUM of gradients over ranks then equals the single-process gradient of the global-batch mean.
  Passing the collator's labels as HF ``labels=`` alone would shift them a second time (a wrong loss and wrong
  gradients). To use HF's own loss instead, pass :func:`hf_loss_kwargs` (``labels``, ``shift_labels`` — the
  pre-shifted labels — and ``num_items_in_batch``); note that HF's ``ForCausalLMLoss`` computes in float32.
* Vision (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, InternVL, LLaVA-OneVision videos; :mod:`~fcp_exec.integrations.hf_vision`):
  a CP group's images and video frames are encoded once per group, each rank encoding a contiguous share of whole
  frames with the model's own vision code, and every visual row travels to the rank that holds its token
  (:mod:`fcp_exec.vision_exchange`, gradients back to the encoder that produced them). The rows reach the model
  through transformers' ``mm_encoder_outputs`` argument, so the model's own code places them (and Qwen3-VL's
  deepstack features). This runs in a forward pre-hook of the model, inside FSDP2's root unshard. InternVL and
  LLaVA-OneVision have 1-D positions.

Tested with transformers 5.18 to 5.25 (model types :data:`SUPPORTED_MODEL_TYPES`; other causal LMs whose attention
goes through ``AttentionInterface`` are accepted with a warning). A layer's sliding window shorter than a document
is computed exactly (:mod:`fcp_exec.kernels.window`), and so are gpt-oss's attention sinks
(:func:`fcp_exec.kernels.base.add_sinks`), Gemma 2's logit soft-capping (the same masked path) and DeepSeek-V3's
narrower value heads (padded); attention dropout and KV caches are refused with a clear error
(:func:`fcp_exec.integrations.hf_models.attention_limits`): this path is for training.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from fcp_exec.integrations.hf_models import (FRAME_VL_MODEL_TYPES, SUPPORTED_MODEL_TYPES,  # noqa: F401
                                             TILE_VL_MODEL_TYPES, VL_MODEL_TYPES, build_model,
                                             enable_gradient_checkpointing, has_weights, load_config, load_model,
                                             other_token_mixing, require_hf_models, ring_call, tile_geometry)
from fcp_exec.integrations.hf_checks import check_call, check_model_and_batch, refuse_wrapped
from fcp_exec.integrations.hf_router import router_loss, router_loss_of
from fcp_exec.integrations.hf_vision import State, VisionCall, install_hooks
from fcp_exec.ring_op import register
from fcp_exec.step import denominator

__all__ = ["ATTENTION_NAME", "SUPPORTED_MODEL_TYPES", "VL_MODEL_TYPES", "FCPAttentionContext", "apply_fcp",
           "batch_inputs", "fcp_attention_forward", "fcp_loss", "hf_loss_kwargs", "lm_loss", "model_loss",
           "model_type_of", "register_attention", "unwrap", "load_config", "build_model", "load_model", "has_weights",
           "enable_gradient_checkpointing"]

ATTENTION_NAME = "fcp_ring"


@dataclass(frozen=True, slots=True)
class FCPAttentionContext:
    """Per-micro-batch metadata for :func:`fcp_attention_forward`: ``ring``, the micro-batch's
    :class:`fcp_exec.ring_attention.RingBatch` (this rank's local document bounds as host ints, the CP group, the
    block plans — built once, shared by every layer, never read back from the device), and the kernel
    :func:`apply_fcp` chose."""

    ring: Any
    kernel: Any = None

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.ring.comm.ranks


def fcp_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                          fcp_context: FCPAttentionContext | None = None, **kwargs):
    """transformers attention function: ``query`` ``[1, H_q, L, D]``, ``key``/``value`` ``[1, H_kv, L, D]`` of
    this rank's zigzag shard → ``(out [1, L, H_q, D], None)`` by ring attention over ``fcp_context.ranks``.

    Under ``torch.compile`` (``TrainingArguments(torch_compile=True)``) the ring is one opaque node of the graph,
    ``torch.ops.fcp.ring_attention`` (:func:`~fcp_exec.integrations.hf_models.ring_call`): its plan and peer exchange
    depend on each micro-batch's documents and CP group, which it reads from the micro-batch's registered handle, so
    a new micro-batch does not recompile and the model compiles without a graph break at its attention, sliding
    windows and attention sinks included (arguments of the op). Logit soft-capping (Gemma 2) or a non-default kernel
    runs the ring eagerly there instead (one graph break each)."""
    if fcp_context is None:
        raise ValueError("attention implementation 'fcp_ring' needs fcp_context=...: call the model with "
                         "**fcp_exec.integrations.hf.batch_inputs(batch, model)")
    if query.shape[0] != 1:
        raise ValueError(f"fcp_ring attention takes one packed sequence (batch size 1), got batch size {query.shape[0]}")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    out = ring_call(module, q, k, v, fcp_context.ring, fcp_context.kernel, scaling, dropout, kwargs)
    return out.unsqueeze(0), None


def register_attention() -> None:
    """Register :func:`fcp_attention_forward` in transformers' ``AttentionInterface`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, fcp_attention_forward)


def unwrap(model: nn.Module) -> nn.Module:
    """The transformers model inside a DDP wrapper (``.module``); FSDP2 modules are the model itself."""
    return getattr(model, "module", model)


def model_type_of(model: nn.Module) -> str:
    cfg = getattr(unwrap(model), "config", None)
    if cfg is None:
        raise TypeError(f"{type(model).__name__} is not a transformers model (no .config)")
    return str(cfg.model_type)



def apply_fcp(model: nn.Module, *, kernel=None, timeout: float | None = None) -> nn.Module:
    """Make ``model`` (a transformers causal LM or Qwen-VL model, before DDP/FSDP2 wrapping) run its text
    attention as FCP ring attention; returns the same model. ``kernel``: an attention kernel or its name
    (default: by device); ``timeout``: seconds bounding every ring P2P wait (None: the process group's)."""
    from fcp_exec.kernels import KERNEL_NAMES, AttentionKernel
    refuse_wrapped(model)
    require_hf_models()  # transformers < 5.18 would train a VL model without its images
    model_type = model_type_of(model)
    text_cfg = getattr(model.config, "text_config", model.config)  # a VL model's language model, else the model's
    router = router_loss_of(text_cfg, model_type, type(model).__name__)
    mixing = other_token_mixing(model)
    if mixing:
        raise ValueError(f"{type(model).__name__} cannot train with FCP: {mixing}; ring attention sees a document "
                         "split over its CP group only inside full / sliding-window attention layers")
    if not (kernel is None or isinstance(kernel, AttentionKernel) or kernel in KERNEL_NAMES):
        raise ValueError(f"kernel must be an AttentionKernel or one of {', '.join(KERNEL_NAMES)}, got {kernel!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds (None: the process group's), got {timeout!r}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        warnings.warn(f"model type {model_type!r} is not one fcp was tested with ({', '.join(SUPPORTED_MODEL_TYPES)}); "
                      "it works if its attention goes through transformers' AttentionInterface", stacklevel=2)
    register_attention()
    tiles, frames = model_type in TILE_VL_MODEL_TYPES, model_type in FRAME_VL_MODEL_TYPES
    is_vl = model_type in VL_MODEL_TYPES or tiles or frames
    model.set_attn_implementation({"text_config": ATTENTION_NAME} if is_vl else ATTENTION_NAME)
    if getattr(text_cfg, "_attn_implementation", None) != ATTENTION_NAME:
        raise RuntimeError(f"could not set the attention implementation of {type(model).__name__} to {ATTENTION_NAME!r}")
    state = State(model_type=model_type, kernel=kernel, timeout=timeout, is_vl=is_vl, tiles=tiles, frames=frames,
                  router=router)
    model.fcp_exact_denominator = router is not None  # train_step: failed reads out before the first forward
    if is_vl:
        cfg = model.config
        state.image_token_id = int(cfg.image_token_id)
        state.video_token_id = None if tiles else int(cfg.video_token_id)
        # a tile's grid row (tiles, h, w) counts patches; h·w / merge² of them are its visual tokens
        state.merge = tile_geometry(cfg)[1] if tiles else 1 if frames else int(cfg.vision_config.spatial_merge_size)
        if getattr(model, "_fcp_state", None) is None:
            install_hooks(model)
    model._fcp_state = state
    if not getattr(model, "_fcp_call_check", False):
        model.register_forward_pre_hook(check_call, with_kwargs=True, prepend=True)
        model._fcp_call_check = True
    return model


_OWN_ROPE_INDEX = ("qwen2_vl", "qwen2_5_vl")  # their get_rope_index departs from fcp_data.mrope's rule (there)
_WARNED_POSITIONS: set = set()


def _warn_builtin_positions(model_type: str) -> None:
    """Once per model type, at its first batch of the built-in rule (images or videos): positions of
    ``FCPCollator(mrope=True)``'s built-in rule given to a model whose own rule differs for videos (Qwen2-VL under
    transformers >= 5.3, Qwen2.5-VL's seconds-scaled temporal index; images agree) — training on videos would see
    other positions than the model does at inference."""
    if model_type in _WARNED_POSITIONS:
        return
    _WARNED_POSITIONS.add(model_type)
    warnings.warn(f"a {model_type} model gets 3-D positions of FCPCollator(mrope=True)'s built-in rule, which can "
                  "differ from this model's get_rope_index for videos (images agree; fcp_data/mrope.py says where and "
                  "for which transformers); for the model's own "
                  "positions build the collator with fcp_exec.integrations.hf_positions.hf_collator(model)",
                  stacklevel=3)


def batch_inputs(batch: dict, model: nn.Module) -> dict[str, Any]:
    """Keyword arguments for ``model(**...)`` from one ``FCPCollator`` batch (module docstring). The model must
    have gone through :func:`apply_fcp` (DDP-wrapped or not). The micro-batch's ``RingBatch`` (its plan, made once)
    is kept in ``batch["_fcp_ring"]``: a second forward of the batch reuses it, and a compiled model's backward finds
    it through the op handle while the batch lives."""
    check_model_and_batch(model, batch, "batch_inputs(batch, model)")
    inner = unwrap(model)
    state: State | None = getattr(inner, "_fcp_state", None)
    if state is None:
        raise ValueError("call fcp_exec.integrations.hf.apply_fcp(model) before batch_inputs (and before DDP/FSDP2)")
    if batch.get("ranks") is None or len(batch["ranks"]) == 0:  # a tuple, list or tensor (not its truth value)
        raise ValueError("this rank is idle in this micro-batch (ranks == ()); train_step runs fcp_exec.step.idle_batch "
                         "instead — or skip the forward when not using DDP/FSDP2")
    from fcp_exec.ring_attention import RingBatch

    device = next(inner.parameters()).device
    ids = batch["input_ids"].to(device)
    if batch.get("cu_seqlens") is None:
        raise ValueError("the batch has no cu_seqlens (FCPCollator's document boundaries): batch_inputs needs them")
    ring, ranks, held = batch.get("_fcp_ring"), tuple(int(r) for r in batch["ranks"]), batch.get("_fcp_ring_key")
    cu = torch.as_tensor(batch["cu_seqlens"])
    if ring is None or held is None or held[1] != ranks or not torch.equal(held[0], cu.cpu()):
        # first use, or a copy of a run batch with other cu_seqlens or ranks (values compared: edited in place too)
        # its op handle is made here, in eager code: a compiled model only reads it (fcp_exec.ring_op).
        ring = RingBatch(batch["cu_seqlens"], ranks, timeout=state.timeout)
        register(ring)  # The batch keeps the ring alive until its backward: a compiled graph holds only the handle
        batch["_fcp_ring"], batch["_fcp_ring_key"] = ring, (cu.detach().cpu().clone(), ranks)
    ctx = FCPAttentionContext(ring=ring, kernel=state.kernel)
    out: dict[str, Any] = {"input_ids": ids[None], "fcp_context": ctx, "use_cache": False}
    if state.is_vl:
        if state.tiles or state.frames:
            out["position_ids"] = batch["position_ids"].to(device)[None]
        elif "mrope_position_ids" not in batch:
            raise ValueError(f"a {state.model_type} model needs Qwen-VL 3-D positions in the batch: build the collator "
                             "with fcp_exec.integrations.hf_positions.hf_collator(model)")
        else:
            if batch.get("mrope_rule") == "fcp" and state.model_type in _OWN_ROPE_INDEX:
                _warn_builtin_positions(state.model_type)
            out["position_ids"] = batch["mrope_position_ids"].to(device)[:, None, :]
        vpos = batch.get("visual_pos", torch.zeros(0, dtype=torch.long))
        vidx = batch.get("visual_index", torch.zeros(0, dtype=torch.long))
        order = torch.argsort(vpos)
        out["fcp_vision"] = VisionCall(input_ids=ids, pixel_values=batch.get("pixel_values"),
                                        grid_thw=batch.get("grid_thw"), visual_pos=vpos[order], visual_index=vidx[order],
                                        ranks=ctx.ranks, cp_rank=int(batch.get("cp_rank", 0)))
    else:
        out["position_ids"] = batch["position_ids"].to(device)[None]
    return out


def lm_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """``Σ CE(logits[t], labels[t]) / num_tokens_global`` over this rank's tokens, with the collator's pre-shifted
    labels (no further shift). Half-precision logits are upcast to float32. Labels ignored are -100, as in
    transformers (its own losses know no other): a collator built with another ``ignore_index`` is one ValueError."""
    num = denominator(batch)
    logits = logits.reshape(-1, logits.shape[-1])
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    labels = batch["labels"].to(logits.device).reshape(-1)
    if bool(((labels < 0) & (labels != -100)).any()):
        raise ValueError(f"labels hold {int(labels[(labels < 0) & (labels != -100)][0])}: Hugging Face models ignore "
                         "-100 only (transformers' convention); build FCPCollator with ignore_index=-100")
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / num


def fcp_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """``loss_fn`` for :func:`fcp_exec.step.train_step`: forward ``batch`` through ``model`` and return
    :func:`model_loss` of its output."""
    check_model_and_batch(model, batch, "fcp_loss(model, batch)")
    return model_loss(model, model(**batch_inputs(batch, model)), batch)


def model_loss(model: nn.Module, out: Any, batch: dict) -> torch.Tensor:
    """The loss the stock model adds up, this rank's share: :func:`lm_loss` of ``out.logits``, plus the MoE router's
    load-balancing loss when the model's config asks for it (``output_router_logits=True``:
    :func:`fcp_exec.integrations.hf_router.router_loss`, one all-reduce: every rank calls it for the micro-batch)."""
    loss = lm_loss(out.logits, batch)
    state: State | None = getattr(unwrap(model), "_fcp_state", None)
    if state is not None and state.router is not None:
        loss = loss + router_loss(getattr(out, "router_logits", None), batch, state.router).to(loss.dtype)
    return loss


def hf_loss_kwargs(batch: dict) -> dict[str, Any]:
    """Arguments that make HF's own loss (``model(..., **hf_loss_kwargs(batch)).loss``) equal :func:`lm_loss`
    (up to HF's float32 upcast): ``labels`` (only so that HF computes a loss), ``shift_labels`` — the
    collator's labels, already shifted — and ``num_items_in_batch`` = ``num_tokens_global`` (a sum, not a
    local mean). Not for a model with a router load-balancing loss (``output_router_logits=True``): HF's loss then adds
    each rank's own aux over its shard, pads included; :func:`model_loss` adds the global one."""
    labels = batch["labels"][None]
    return {"labels": labels, "shift_labels": labels, "num_items_in_batch": denominator(batch)}
