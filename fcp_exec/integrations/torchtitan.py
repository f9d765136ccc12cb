"""torchtitan decoder models (``torchtitan.models.qwen3`` / ``llama3`` / ``deepseek_v3`` / ``gpt_oss``) trained with FCP.

torchtitan's own context parallelism splits every sequence over a fixed CP mesh and refuses varlen attention
("Context Parallel only supports SDPA and FlexAttention"): packed variable-length documents and CP do not mix there.
With FCP every rank is data-parallel to torchtitan, and FCP forms the CP groups per micro-batch:

    from fcp_exec.integrations.torchtitan import apply_fcp, fcp_loss
    from fcp_exec.step import make_reducer, train_step

    model = apply_fcp(model_config.build())             # each GQAttention's inner attention -> ring attention
    model, reducer = make_reducer("fsdp2", model)       # or FSDP2 applied by your parallelize_fn + reducer_for
    res = train_step(model, micro_batches, fcp_loss, reducer)   # FCPSampler -> FCPDataset -> FCPCollator

* **Attention.** :func:`apply_fcp` replaces the ``inner_attention`` of every attention module (torchtitan's
  ``GQAttention``: QKV projection, q/k norm and RoPE stay torchtitan's) by :class:`FCPInnerAttention`, which runs
  :func:`fcp_exec.ring_attention.ring_attention` on the micro-batch's :class:`~fcp_exec.ring_attention.RingBatch`.
  The ring batch travels in torchtitan's own ``attention_masks`` argument, which the decoder hands to every layer
  unchanged.
* **Positions.** :func:`batch_inputs` passes the collator's per-document ``position_ids`` as torchtitan's
  ``positions`` (RoPE of each token's position in its own document, on every shard).
* **Loss.** :func:`fcp_loss` is the token-sum cross-entropy of this rank's shards over the global batch's label
  tokens (``num_tokens_global``), the share :func:`fcp_exec.step.train_step` sums over ranks.

* **MoE.** A layer that balances its experts by a routing bias (``load_balance_coeff``) counts the tokens routed to
  each expert; :mod:`fcp_exec.integrations.torchtitan_moe` keeps FCP's pads and idle dummies out of those counts.
* **DeepSeek-V3.** Multi-latent attention (192-wide queries and keys, 128-wide values) goes through the ring as it is
  (the values zero-padded: :func:`fcp_exec.ring_args.padded_values`). Its multi-token-prediction modules read each
  token's look-ahead tokens from the collator (``FCPCollator(future_tokens=D)``) instead of shifting this rank's
  shard, and :func:`fcp_loss` adds torchtitan's ``MTPLoss`` terms (:mod:`fcp_exec.integrations.torchtitan_mtp`) —
  MTP under context parallelism, which torchtitan's own CP refuses.
* **gpt-oss.** Attention sinks (its ``out_transform``, ``out · sigmoid(lse − sink)``) and the sliding windows of its
  even layers (``sliding_window_size``, varlen's ``window_size=(W − 1, 0)``) run inside the ring (the op
  ``torch.ops.fcp.ring_attention`` with its window and sinks: a compiled block keeps them, fullgraph).

Tested on CPU (``tests/exec/test_torchtitan.py``): torchtitan's Qwen3 and Llama 3 models, Qwen3's MoE debug model,
DeepSeek-V3 (MLA, two MTP modules) and gpt-oss (sinks, a sliding window) with FCP on 2 gloo processes (all-reduce,
DDP, FSDP2) equal torchtitan's stock model trained in one process, one document per forward with its SDPA causal
attention (gpt-oss: a dense float64 kernel of its flex/varlen contract through its own ``out_transform``;
DeepSeek-V3: its own ``MTPLoss`` and token shift; the MoEs' bfloat16 experts to bf16 rounding, their tokens per
expert exactly). torchtitan's own ``Trainer`` runs these pieces through
:mod:`fcp_exec.integrations.torchtitan_trainer` (``fcp_config``). Not tested: its tensor/pipeline/expert parallelism (FCP is the CP; tensor parallelism would split the heads
inside the ring); refused with one error: other decoders (Qwen3.5's linear attention, ...), bidirectional windows,
an ``out_transform`` other than gpt-oss's sinks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fcp_exec.ring_attention import RingBatch
from fcp_exec.ring_op import register, ring_attention_op
from fcp_exec.integrations.torchtitan_moe import exclude_padding, moe_shape
from fcp_exec.integrations.torchtitan_mtp import install as install_mtp
from fcp_exec.integrations.torchtitan_mtp import ce_sum, mtp_depth, mtp_loss
from fcp_exec.step import denominator, padding_mask

__all__ = ["FCPInnerAttention", "TESTED_MODELS", "apply_fcp", "batch_inputs", "fcp_loss", "model_shape"]


class FCPInnerAttention(nn.Module):
    """torchtitan's inner-attention contract (``q``, ``k``, ``v`` ``[B, L, N, H]``, ``attention_masks``, ``scale``,
    ``enable_gqa``, ``out_transform``) computed by FCP's ring attention over the :class:`RingBatch` given as
    ``attention_masks``. ``window``: a causal sliding window of that many keys (``i - j < window``: torchtitan's
    ``sliding_window_size``, its varlen ``window_size=(window - 1, 0)``); ``out_transform``: gpt-oss's attention sinks
    only (its ``_apply_sinks``, whose ``out · sigmoid(lse − sink)`` is the sink's logit in the softmax, computed by the
    ring: :func:`fcp_exec.kernels.base.add_sinks`) — :func:`apply_fcp` links the attention module whose ``sinks``
    they are (``sink_owner``, read at every call: FSDP2 swaps the parameter object)."""

    def __init__(self, timeout: float | None = None, window: int | None = None) -> None:
        super().__init__()
        self.timeout, self.window = timeout, window

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attention_masks: Any = None,
                scale: float | None = None, enable_gqa: bool = False, is_causal: bool = True,
                out_transform: Any = None, **kwargs: Any) -> torch.Tensor:
        if kwargs:
            raise ValueError(f"FCP's ring attention does not take {sorted(kwargs)}")
        if not isinstance(attention_masks, RingBatch):
            raise ValueError("a model after fcp_exec.integrations.torchtitan.apply_fcp takes an FCP micro-batch: call "
                             "it with batch_inputs(batch, model), whose attention_masks is the batch's RingBatch")
        if q.shape[0] != 1:
            raise ValueError(f"FCP micro-batches are one packed row per rank, got batch size {q.shape[0]}")
        sinks = None
        if out_transform is not None:  # gpt-oss's sinks (apply_fcp checked that this is what out_transform applies)
            owner = self.__dict__.get("sink_owner")
            if owner is None:
                raise ValueError("FCP's ring attention takes gpt-oss's attention sinks as out_transform, not another "
                                 "transform of (out, lse)")
            sinks = owner.sinks
        # one opaque op (fcp_exec.ring_op): torch.compile takes the whole block, fullgraph, with the ring inside
        return ring_attention_op(q[0], k[0], v[0], attention_masks, causal=is_causal, softmax_scale=scale,
                                 window=self.window, sinks=sinks)[None]


def _attentions(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(getattr(m, "inner_attention", None), nn.Module)]


# decoders whose only token mixing is their attention modules (MLA and gpt-oss's sinks/windows included)
TESTED_MODELS = ("Qwen3Model", "Llama3Model", "DeepSeekV3Model", "GptOssModel")


def apply_fcp(model: nn.Module, *, timeout: float | None = None) -> nn.Module:
    """Replace the inner attention of every attention module of a torchtitan decoder by :class:`FCPInnerAttention`
    (in place, before FSDP2/DDP wrap the model); returns ``model``. Sliding windows (gpt-oss's even layers) move into
    it, attention sinks are read from ``out_transform``, DeepSeek-V3's MTP modules get FCP's look-ahead tokens
    (:mod:`fcp_exec.integrations.torchtitan_mtp`). Refuses a decoder other than TESTED_MODELS (another one may mix
    tokens outside its attention modules — linear attention — which would then see only this rank's shard) and a
    bidirectional or non-causal window."""
    found = _attentions(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no module with an inner_attention (torchtitan's GQAttention): "
                         "not a torchtitan decoder model")
    sharded = next((n for n, p in model.named_parameters() if hasattr(p, "device_mesh")), None)  # a DTensor
    if sharded is not None:  # its attention would already see tensor-parallel heads or FSDP2's hooks in place
        raise ValueError(f"{type(model).__name__} is already parallelized ({sharded} is a DTensor): call apply_fcp "
                         "on the plain model, before FSDP2/DDP (FCP runs every rank data-parallel: no tensor parallel)")
    if type(model).__name__ not in TESTED_MODELS:
        raise ValueError(f"FCP's torchtitan adapter takes {', '.join(TESTED_MODELS)}, not {type(model).__name__}: "
                         "another decoder may mix tokens outside its attention modules, which would see one shard")
    windows = _config_windows(model)
    for m in found:
        inner = m.inner_attention
        if not isinstance(inner, FCPInnerAttention):
            m.inner_attention = inner = FCPInnerAttention(timeout, _window(m, inner, windows.get(id(m))))
        if isinstance(getattr(m, "sinks", None), torch.Tensor) and callable(getattr(m, "_apply_sinks", None)):
            inner.__dict__["sink_owner"] = m  # gpt-oss: its out_transform is _apply_sinks (not a submodule: no cycle)
    install_mtp(model)
    exclude_padding(model)  # MoE layers that balance their experts count the data's tokens only (torchtitan_moe)
    model._fcp_torchtitan = True
    model._fcp_own_state_dict = True  # fcp_exec.checkpoint: its fused QKV renames keys on save (wq/wk/wv)
    return model


def _config_windows(model: nn.Module) -> dict[int, int]:
    """``id(attention module) -> sliding_window_size`` from the decoder's own config (gpt-oss keeps a layer's window
    there and in its flex masks, not in the module)."""
    cfg_layers, out = getattr(getattr(model, "config", None), "layers", None), {}
    layers = getattr(model, "layers", None)
    if cfg_layers is None or layers is None:
        return out
    for key, layer in layers.items():
        size = getattr(getattr(cfg_layers[int(key)], "attention", None), "sliding_window_size", None)
        if size is not None and getattr(layer, "attention", None) is not None:
            out[id(layer.attention)] = int(size)
    return out


def _window(attention: nn.Module, inner: nn.Module, size: int | None) -> int | None:
    """The causal window (keys per query) of one attention module: its config's ``sliding_window_size`` or its varlen
    inner attention's ``window_size=(left, 0)`` (``left + 1`` keys); None for plain causal attention."""
    left, right = tuple(getattr(inner, "window_size", (-1, 0)))
    if right != 0 or left < -1:
        raise ValueError(f"{type(inner).__name__} has window_size={(left, right)}: FCP's torchtitan adapter computes "
                         "causal attention (a sliding window (W - 1, 0) or whole documents (-1, 0))")
    if left >= 0 and size is not None and left + 1 != size:
        raise ValueError(f"{type(attention).__name__}: sliding_window_size={size} but its inner attention's "
                         f"window_size={(left, right)}")
    return size if size is not None else (left + 1 if left >= 0 else None)


def batch_inputs(batch: dict, model: nn.Module) -> dict[str, Any]:
    """``model(**...)`` keyword arguments for one ``FCPCollator`` batch: ``tokens`` and ``positions`` ``[1, T_local]``
    and the micro-batch's :class:`RingBatch` as ``attention_masks``."""
    inner = getattr(model, "module", model)
    if not getattr(inner, "_fcp_torchtitan", False):
        raise ValueError("call fcp_exec.integrations.torchtitan.apply_fcp(model) before batch_inputs (and before DDP/FSDP2)")
    if batch.get("ranks") is None or len(batch["ranks"]) == 0:  # a tuple, list or tensor (not its truth value)
        raise ValueError("this rank is idle in this micro-batch (ranks == ()); train_step runs fcp_exec.step.idle_batch "
                         "instead")
    depth = mtp_depth(inner)
    if depth and (batch.get("future_ids") is None or batch["future_ids"].shape[0] < depth):
        raise ValueError(f"the model has {depth} MTP modules: build its micro-batches with "
                         f"FCPCollator(future_tokens={depth}) (each token's look-ahead tokens and targets)")
    device = next(inner.parameters()).device
    timeout = next(m.inner_attention.timeout for m in _attentions(inner))
    ring = RingBatch(batch["cu_seqlens"], tuple(int(r) for r in batch["ranks"]), timeout=timeout)
    register(ring)  # its op handle, made here in eager code (a compiled model then only reads it)
    if getattr(inner, "_fcp_pad_hooks", False):
        ring.fcp_pads = padding_mask(batch).to(device)  # read by torchtitan_moe's hooks in this forward
    if depth:  # the MTP modules' look-ahead tokens (torchtitan_mtp: the model's forward reads them)
        ring.fcp_future = (batch["future_ids"][:depth].to(device), batch["future_valid"][:depth].to(device))
    return {"tokens": batch["input_ids"].to(device)[None], "positions": batch["position_ids"].to(device)[None],
            "attention_masks": ring}


def fcp_loss(model: nn.Module, batch: dict, *, mtp_scale: float = 0.3) -> torch.Tensor:
    """This rank's share of the global-batch mean loss: Σ cross-entropy over its labelled tokens (the collator's
    labels are already shifted) / the global batch's label tokens. A model with MTP modules adds torchtitan's
    ``MTPLoss`` terms (``mtp_scale`` · the mean over depths of each depth's Σ cross-entropy on the batch's
    ``future_labels``; :func:`fcp_exec.integrations.torchtitan_mtp.mtp_loss`) over the same denominator."""
    out = model(**batch_inputs(batch, model))
    if isinstance(out, list):
        return mtp_loss(out, batch["labels"], batch["future_labels"], mtp_scale) / denominator(batch)
    return ce_sum(out[0], batch["labels"]) / denominator(batch)


def model_shape(model: Any) -> dict | None:
    """The ``fcp_data.presets.ModelConfig`` fields of a torchtitan decoder config (its first layer's attention widths,
    its feed-forward or MoE layers; tied embeddings counted once), or None where it is not a decoder of that form. A
    MoE (router gate, top-k routed experts, shared experts per token: :func:`~fcp_exec.integrations.torchtitan_moe.
    moe_shape`), multi-latent attention (DeepSeek-V3: the ring runs its 192-wide heads, one K/V head per query head)
    or MTP modules (each one more block, an ``eh_proj`` and the LM head once more per token, counted as layers) give
    ``active_params`` per token and ``stored_params`` held (every expert); gpt-oss's sliding windows give ``window``
    and ``window_layers``."""
    from fcp_data.presets import ModelConfig

    main, mtp = getattr(model, "layers", None), list(getattr(model, "mtp_layers", None) or [])
    try:
        layers = list(main) + mtp
        attn_params, heads, kv, head_dim = _attention_shape(layers[0].attention, int(model.dim))
        dim, vocab = int(model.dim), int(model.vocab_size)
        ffns = [getattr(layer, "feed_forward", None) for layer in layers]
        width = next((int(f.w1.out_features) for f in ffns if f is not None), 0)
        windows = [int(w) for w in (getattr(layer.attention, "sliding_window_size", None) for layer in main) if w]
    except (AttributeError, IndexError, TypeError):
        return None
    out = dict(layers=len(layers), hidden=dim, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=max(width, 1),
               vocab=vocab)
    if windows:
        out.update(window=max(windows), window_layers=len(windows))
    tied = bool(getattr(model, "enable_weight_tying", False))  # the embedding is the LM head: held once
    mla = hasattr(layers[0].attention, "kv_lora_rank")
    if any(getattr(layer, "moe", None) is not None for layer in layers) or mla or mtp:
        mlps = moe_shape(layers, dim)
        if mlps is None:
            return None
        extra = len(mtp) * 2 * dim * dim  # each MTP module's eh_proj over [embedding; hidden]
        out["active_params"] = float(len(layers) * attn_params + mlps["active"] + extra + dim * vocab * (1 + len(mtp)))
        out["stored_params"] = float(len(layers) * attn_params + mlps["stored"] + extra
                                     + dim * vocab * (1 if tied else 2))
    elif tied:
        out["stored_params"] = float(ModelConfig(**out).matmul_params)
    return out


def _attention_shape(attn: Any, dim: int) -> tuple[int, int, int, int]:
    """``(matmul weights, heads, K/V heads the ring ships, head dim it runs)`` of one attention config: grouped-query
    attention, or DeepSeek-V3's multi-latent attention (queries through a LoRA rank or not, K/V decompressed per
    head, values padded to the query width in the ring)."""
    heads = int(attn.n_heads)
    if hasattr(attn, "kv_lora_rank"):
        nope, rope, v = int(attn.qk_nope_head_dim), int(attn.qk_rope_head_dim), int(attn.v_head_dim)
        qk, kv_rank, q_rank = nope + rope, int(attn.kv_lora_rank), int(attn.q_lora_rank or 0)
        q = dim * q_rank + q_rank * heads * qk if q_rank else dim * heads * qk
        kv = dim * (kv_rank + rope) + kv_rank * heads * (nope + v)
        return q + kv + heads * v * dim, heads, heads, qk
    kv = int(attn.n_kv_heads or heads)
    head_dim = int(attn.head_dim or dim // heads)
    return 2 * dim * heads * head_dim + 2 * dim * kv * head_dim, heads, kv, head_dim
