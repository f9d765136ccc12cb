"""torchtitan decoder models (``torchtitan.models.qwen3`` / ``llama3``) trained with FCP.

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

Tested on CPU (``tests/exec/test_torchtitan.py``): torchtitan's Qwen3 and Llama 3 models and Qwen3's MoE debug model
with FCP on 2 gloo processes (all-reduce, DDP, FSDP2) equal torchtitan's stock model trained in one process, one
document per forward with its SDPA causal attention (the MoE's bfloat16 experts to bf16 rounding; its tokens per
expert exactly). torchtitan's own ``Trainer`` runs these pieces through
:mod:`fcp_exec.integrations.torchtitan_trainer` (``fcp_config``). Not tested: its tensor/pipeline/expert parallelism (FCP is the CP; tensor parallelism would split the heads
inside the ring); refused with one error: other decoders (gpt-oss, DeepSeek-V3, Qwen3.5, ...), attention sinks,
sliding or bidirectional windows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fcp_exec.ring_attention import RingBatch
from fcp_exec.ring_op import register, ring_attention_op
from fcp_exec.integrations.torchtitan_moe import exclude_padding, moe_shape
from fcp_exec.step import denominator, padding_mask

__all__ = ["FCPInnerAttention", "TESTED_MODELS", "apply_fcp", "batch_inputs", "fcp_loss", "model_shape"]


class FCPInnerAttention(nn.Module):
    """torchtitan's inner-attention contract (``q``, ``k``, ``v`` ``[B, L, N, H]``, ``attention_masks``, ``scale``,
    ``enable_gqa``) computed by FCP's ring attention over the :class:`RingBatch` given as ``attention_masks``."""

    def __init__(self, timeout: float | None = None) -> None:
        super().__init__()
        self.timeout = timeout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attention_masks: Any = None,
                scale: float | None = None, enable_gqa: bool = False, is_causal: bool = True,
                **kwargs: Any) -> torch.Tensor:
        if kwargs:
            raise ValueError(f"FCP's ring attention does not take {sorted(kwargs)}")
        if not isinstance(attention_masks, RingBatch):
            raise ValueError("a model after fcp_exec.integrations.torchtitan.apply_fcp takes an FCP micro-batch: call "
                             "it with batch_inputs(batch, model), whose attention_masks is the batch's RingBatch")
        if q.shape[0] != 1:
            raise ValueError(f"FCP micro-batches are one packed row per rank, got batch size {q.shape[0]}")
        # one opaque op (fcp_exec.ring_op): torch.compile takes the whole block, fullgraph, with the ring inside
        return ring_attention_op(q[0], k[0], v[0], attention_masks, causal=is_causal, softmax_scale=scale)[None]


def _attentions(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(getattr(m, "inner_attention", None), nn.Module)]


TESTED_MODELS = ("Qwen3Model", "Llama3Model")  # decoders whose only token mixing is their GQAttention


def apply_fcp(model: nn.Module, *, timeout: float | None = None) -> nn.Module:
    """Replace the inner attention of every attention module of a torchtitan decoder by :class:`FCPInnerAttention`
    (in place, before FSDP2/DDP wrap the model); returns ``model``. Refuses models and attention FCP does not
    compute: a decoder other than TESTED_MODELS (another one may mix tokens outside its attention modules — linear
    attention, MLA — which would then see only this rank's shard), attention sinks, a sliding or bidirectional
    window."""
    found = _attentions(model)
    if not found:
        raise ValueError(f"{type(model).__name__} has no module with an inner_attention (torchtitan's GQAttention): "
                         "not a torchtitan decoder model")
    if type(model).__name__ not in TESTED_MODELS:
        raise ValueError(f"FCP's torchtitan adapter takes {' and '.join(TESTED_MODELS)}, not {type(model).__name__}: "
                         "another decoder may mix tokens outside its attention modules, which would see one shard")
    for m in found:
        inner = m.inner_attention
        if getattr(m, "sinks", None) is not None:
            raise ValueError(f"{type(m).__name__} has attention sinks, which FCP's torchtitan adapter does not pass to "
                             "the ring (gpt-oss trains with FCP through transformers or Megatron-core)")
        window = getattr(inner, "window_size", (-1, 0))  # VarlenAttention's (left, right); (-1, 0) is causal
        if tuple(window) != (-1, 0):
            raise ValueError(f"{type(inner).__name__} has window_size={tuple(window)}: FCP's torchtitan adapter "
                             "computes causal attention over whole documents only, (-1, 0)")
        if not isinstance(inner, FCPInnerAttention):
            m.inner_attention = FCPInnerAttention(timeout)
    exclude_padding(model)  # MoE layers that balance their experts count the data's tokens only (torchtitan_moe)
    model._fcp_torchtitan = True
    model._fcp_own_state_dict = True  # fcp_exec.checkpoint: its fused QKV renames keys on save (wq/wk/wv)
    return model


def batch_inputs(batch: dict, model: nn.Module) -> dict[str, Any]:
    """``model(**...)`` keyword arguments for one ``FCPCollator`` batch: ``tokens`` and ``positions`` ``[1, T_local]``
    and the micro-batch's :class:`RingBatch` as ``attention_masks``."""
    inner = getattr(model, "module", model)
    if not getattr(inner, "_fcp_torchtitan", False):
        raise ValueError("call fcp_exec.integrations.torchtitan.apply_fcp(model) before batch_inputs (and before DDP/FSDP2)")
    if not batch.get("ranks"):
        raise ValueError("this rank is idle in this micro-batch (ranks == ()); train_step runs fcp_exec.step.idle_batch "
                         "instead")
    device = next(inner.parameters()).device
    timeout = next(m.inner_attention.timeout for m in _attentions(inner))
    ring = RingBatch(batch["cu_seqlens"], tuple(int(r) for r in batch["ranks"]), timeout=timeout)
    register(ring)  # its op handle, made here in eager code (a compiled model then only reads it)
    if getattr(inner, "_fcp_pad_hooks", False):
        ring.fcp_pads = padding_mask(batch).to(device)  # read by torchtitan_moe's hooks in this forward
    return {"tokens": batch["input_ids"].to(device)[None], "positions": batch["position_ids"].to(device)[None],
            "attention_masks": ring}


def fcp_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """This rank's share of the global-batch mean loss: Σ cross-entropy over its labelled tokens (the collator's
    labels are already shifted) / the global batch's label tokens."""
    logits = model(**batch_inputs(batch, model))[0]
    labels = batch["labels"].to(logits.device)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # bf16/fp16 logits: the loss in float32
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / denominator(batch)


def model_shape(model: Any) -> dict | None:
    """The ``fcp_data.presets.ModelConfig`` fields of a torchtitan decoder config (its first layer's attention widths,
    its feed-forward or MoE layers; tied embeddings counted once), or None where it is not a decoder of that form. A
    MoE (router gate, top-k routed experts, shared experts per token: :func:`~fcp_exec.integrations.torchtitan_moe.
    moe_shape`) gives ``active_params`` per token and ``stored_params`` held (every expert)."""
    from fcp_data.presets import ModelConfig

    layers = getattr(model, "layers", None)
    try:
        attn = layers[0].attention
        heads, kv, dim = int(attn.n_heads), int(attn.n_kv_heads or attn.n_heads), int(model.dim)
        head_dim = int(attn.head_dim or dim // heads)
        vocab = int(model.vocab_size)
        ffns = [getattr(layer, "feed_forward", None) for layer in layers]
        width = next((int(f.w1.out_features) for f in ffns if f is not None), 0)
    except (AttributeError, IndexError, TypeError):
        return None
    out = dict(layers=len(layers), hidden=dim, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=max(width, 1),
               vocab=vocab)
    tied = bool(getattr(model, "enable_weight_tying", False))  # the embedding is the LM head: held once
    if any(getattr(layer, "moe", None) is not None for layer in layers):
        experts = moe_shape(layers, dim)
        if experts is None:
            return None
        attention = len(layers) * (ModelConfig(**dict(out, ffn=1)).layer_params - 3 * dim)  # without its ffn
        out["active_params"] = float(attention + experts["active"] + dim * vocab)
        out["stored_params"] = float(attention + experts["stored"] + dim * vocab * (1 if tied else 2))
    elif tied:
        out["stored_params"] = float(ModelConfig(**out).matmul_params)
    return out
