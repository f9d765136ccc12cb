"""Megatron-core adapter: train a Megatron-core ``GPTModel`` on FCP micro-batches inside Megatron's own pipeline
schedule, DDP, ``finalize_model_grads`` and optimizer.

Megatron sees every rank as data-parallel (tensor-, pipeline- and context-parallel size 1, expert parallelism 1);
FCP forms the context-parallel groups per micro-batch. Three pieces connect them:

* **Attention.** :func:`fcp_layer_spec` puts :class:`FCPCoreAttention` in the ``core_attention`` slot of a layer or
  block spec (Megatron's local spec or the Transformer-Engine spec): the module computes ring attention over the
  micro-batch's CP group (:func:`fcp_exec.ring_attention`) on this rank's zigzag shard ``[s, 1, heads, dim]``.
  The micro-batch's metadata travels in the model's ``packed_seq_params`` argument as :class:`FCPPackedSeqParams`
  (``qkv_format="sbhd"``, so Megatron's own packing paths stay off), which Megatron hands to every layer.
* **Positions.** Megatron's rotary embedding numbers the tokens of the input ``0..s-1``; a rank's zigzag shard
  holds pieces of documents, so :func:`apply_fcp` wraps ``model.rotary_pos_emb`` (and the rotary module each
  multi-latent-attention layer owns, :mod:`fcp_exec.integrations.megatron_rope`) to return the frequencies at each
  token's position within its document (the collator's ``position_ids``), for the forward that carries
  :class:`FCPPackedSeqParams` only. Learned absolute position embeddings read ``position_ids`` directly.
* **Loss.** With ``TransformerConfig(calculate_per_token_loss=True)`` Megatron sums the loss of every micro-batch
  and rank and divides the gradients by the global-batch token count once (``finalize_model_grads``): the
  gradient of the global-batch mean, exactly what FCP's own ``train_step`` computes. :func:`forward_step` is the
  ``forward_step_func`` of ``get_forward_backward_func()``; the collator's labels are already shifted, which is
  Megatron's convention too (``labels[t]`` is the target of token ``t``); ignored labels become ``loss_mask`` 0.

Typical loop (``examples/train_megatron_gpt.py``; ``megatron.core`` names)::

    model = GPTModel(config, fcp_layer_spec(get_gpt_layer_local_spec()), vocab_size, max_len)
    model = DistributedDataParallel(config, DistributedDataParallelConfig(), apply_fcp(model))
    config.no_sync_func, config.finalize_model_grads_func = model.no_sync, finalize_model_grads
    loader = DataLoader(FCPDataset(ds), batch_sampler=FCPSampler(...), collate_fn=FCPCollator())
    batches, schedule = iter(loader), get_forward_backward_func()
    for step in range(steps):
        mbs = next_global_batch(batches, model)           # this rank's micro-batches of one global batch
        model.zero_grad_buffer(); optimizer.zero_grad()
        out = schedule(forward_step_func=forward_step, data_iterator=iter(mbs), model=[model],
                       num_microbatches=len(mbs), seq_length=max_len, micro_batch_size=1)
        optimizer.step(); loss = global_loss(out)

:func:`next_global_batch` runs the checks ``train_step`` runs before a step (the ranks' plans agree,
:func:`fcp_exec.lockstep.check_plan_agreement`; a document that failed to read on some rank of its group loses its
labels on all of them, :func:`fcp_exec.skips.agree_skips`) and puts a two-token label-free dummy in the place of a
micro-batch where the plan left this rank idle, so every rank runs the same number of forwards. The number of
micro-batches can change from one global batch to the next (``micro_batches="auto"``): pass ``len(mbs)``.
Megatron-LM's ``pretrain()`` pulls a fixed ``num_microbatches`` from its data iterator itself: give it the
DataLoader's iterator (``dataloader_type="external"``) with ``FCPSampler(micro_batches=num_microbatches)`` and
:func:`forward_step` prepares each batch as it comes (and says so if the counts differ).

Refused with one clear error: tensor/pipeline/context/expert parallelism > 1 (FCP is the context parallelism
here), a config without ``calculate_per_token_loss``, attention dropout, attention bias, yarn / multimodal RoPE on
GPT attention, and multi-latent attention with ``apply_rope_fusion``. Multi-token prediction (``mtp_num_layers``)
takes its look-ahead from the collator (``FCPCollator(future_tokens=mtp_num_layers)``,
:mod:`fcp_exec.integrations.megatron_mtp`), not from rolls across Megatron's CP ranks. Multi-latent attention
(DeepSeek-V3's; ``MLATransformerConfig``, RoPE or YaRN) runs: its value heads, narrower than query/key heads, are
padded inside the ring. Mixture-of-experts layers get ``padding_mask`` (:func:`padding_mask`: pads, unread
documents, idle dummies), so the auxiliary-loss-free expert bias counts what one process would; an auxiliary loss is
Megatron's per micro-batch. Sliding windows (``window_size=(left, 0)``, with
``window_attn_skip_freq``) run exactly (:mod:`fcp_exec.kernels.window`), and so do attention sinks
(``softmax_type="off-by-one"`` or ``"learnable"``, gpt-oss's: :func:`fcp_exec.kernels.base.add_sinks`). Tested with
megatron-core 0.16 on CPU against the stock model (``tests/exec/test_megatron.py``); on one GPU (H200) the example
trained in fp32 and bf16 (``Float16Module``), one process (BENCHMARKS.md); never across GPUs.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

import torch
from torch import nn

from fcp_exec.integrations.megatron_rope import wrap_rotaries
from fcp_exec.step import is_idle, padding_mask
from fcp_exec.step import next_global_batch as _take_global_batch
from fcp_exec.step import prepare_micro_batch as _prepare

try:  # Megatron-core is optional: the module imports without it, apply_fcp/fcp_layer_spec say what is missing
    from megatron.core.packed_seq_params import PackedSeqParams as _PackedSeqParams
    from megatron.core.transformer.module import MegatronModule as _MegatronModule
except ImportError:  # pragma: no cover - exercised where megatron-core is absent
    _PackedSeqParams, _MegatronModule = object, nn.Module

__all__ = ["FCPCoreAttention", "FCPPackedSeqParams", "apply_fcp", "batch_inputs", "fcp_layer_spec", "forward_step",
           "global_loss", "loss_func", "next_global_batch", "padding_mask", "prepare_micro_batch"]

_NEEDS = "pip install megatron-core (tested with 0.16)"


def _require_megatron() -> None:
    if _MegatronModule is nn.Module:
        raise ImportError(f"fcp_exec.integrations.megatron needs megatron-core: {_NEEDS}")


@dataclass
class FCPPackedSeqParams(_PackedSeqParams):  # type: ignore[misc, valid-type]
    """Megatron's ``packed_seq_params`` for one FCP micro-batch: ``qkv_format="sbhd"`` (Megatron's own packed
    path stays off), ``max_seqlen_q``/``max_seqlen_kv`` one past the largest position (the rotary table's length),
    and FCP's ``ring`` (:class:`fcp_exec.ring_attention.RingBatch`), ``positions`` (``[s]``, each token's position
    in its document) and ``kernel``; ``fcp_mtp``: the micro-batch's look-ahead for multi-token prediction
    (:class:`fcp_exec.integrations.megatron_mtp.MTPRolls`)."""

    ring: Any = None
    positions: torch.Tensor | None = None
    kernel: Any = None
    fcp_mtp: Any = None


class FCPCoreAttention(_MegatronModule):
    """Megatron ``core_attention`` module computing FCP ring attention: ``query`` ``[s, 1, heads, dim]``,
    ``key``/``value`` ``[s, 1, groups, dim]`` of this rank's shard → ``[s, 1, heads·dim]``. Takes the constructor
    arguments of Megatron's ``DotProductAttention``; the softmax scale is the same (``softmax_scale`` or
    ``1/sqrt(kv_channels)``; Megatron's query-key layer scaling cancels out)."""

    def __init__(self, config, layer_number: int, attn_mask_type, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None, **kwargs) -> None:
        _require_megatron()
        super().__init__(config=config)
        from megatron.core.transformer.enums import AttnMaskType

        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        if dropout:
            raise ValueError(f"FCP ring attention has no attention dropout (attention_dropout={dropout}); set it to 0")
        self._softmax_offset(config)
        if attn_mask_type not in (AttnMaskType.causal, AttnMaskType.no_mask):
            raise ValueError(f"FCP ring attention computes causal or full attention per document, not {attn_mask_type}")
        self.causal = attn_mask_type == AttnMaskType.causal
        self.layer_number = max(1, int(layer_number))
        head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.window = _layer_window(config, self.layer_number, self.causal)

    def _softmax_offset(self, config) -> None:
        """Megatron's ``softmax_type``: ``"off-by-one"`` (a zero logit per head in every softmax) or ``"learnable"``
        (a learned one, the ``softmax_offset`` parameter, initialised by ``init_method`` where Megatron's
        ``DotProductAttention`` does: same name, shape and RNG draw, so checkpoints and seeds carry over) — attention
        sinks, passed to the ring as ``sinks``."""
        kind = getattr(config, "softmax_type", "vanilla")
        if kind == "vanilla":
            self.softmax_offset = None
            return
        if kind not in ("off-by-one", "learnable"):
            raise ValueError(f"softmax_type={kind!r} is not one FCP ring attention knows ('vanilla', 'off-by-one', "
                             "'learnable')")
        device = "cpu" if getattr(config, "use_cpu_initialization", False) else torch.cuda.current_device()
        offset = torch.zeros(config.num_attention_heads, device=device, dtype=config.params_dtype)
        if kind == "off-by-one":
            self.register_buffer("softmax_offset", offset, persistent=False)
            return
        self.softmax_offset = nn.Parameter(offset)
        if config.perform_initialization:
            config.init_method(self.softmax_offset)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask=None,
                attn_mask_type=None, attention_bias=None, packed_seq_params=None, **kwargs) -> torch.Tensor:
        if not isinstance(packed_seq_params, FCPPackedSeqParams):
            raise ValueError("FCPCoreAttention runs on FCP micro-batches: call the model with "
                             "**fcp_exec.integrations.megatron.batch_inputs(batch, model)[0] (or use forward_step)")
        if attention_bias is not None:
            raise ValueError("FCP ring attention takes no attention bias")
        if query.dim() == 4 and query.shape[1] == 1:
            query, key, value = query[:, 0], key[:, 0], value[:, 0]
        elif query.dim() != 3:  # multi-latent attention hands the packed layout [s, heads, dim]
            raise ValueError(f"FCPCoreAttention takes one packed sequence [s, 1, heads, dim], got {tuple(query.shape)}")
        out = _ring(query, key, value, packed_seq_params, self.causal, self.softmax_scale, self.window,
                    self.softmax_offset)
        return out.reshape(out.shape[0], 1, -1)


@torch.compiler.disable
def _ring(q, k, v, params: FCPPackedSeqParams, causal: bool, scale: float, window: int | None,
          sinks: torch.Tensor | None) -> torch.Tensor:
    from fcp_exec.ring_attention import ring_attention

    return ring_attention(q, k, v, params.ring, causal=causal, softmax_scale=scale, kernel=params.kernel,
                          window=window, sinks=None if sinks is None else sinks.to(q.device))


def _layer_window(config, layer_number: int, causal: bool) -> int | None:
    """FCP's window (query ``i`` sees keys ``i - W < j <= i``) of Megatron's ``window_size=(left, right)`` for this
    layer (``window_attn_skip_freq`` decides which layers have one), or None."""
    size = getattr(config, "window_size", None)
    if size is None:
        return None
    from megatron.core.transformer.utils import is_layer_window_attention

    if not is_layer_window_attention(size, getattr(config, "window_attn_skip_freq", None), layer_number):
        return None
    left, right = (int(x) for x in size)
    if not causal or right != 0 or left < 0:
        raise ValueError(f"FCP runs sliding windows on causal attention as window_size=(left, 0), got {tuple(size)}")
    return left + 1


def fcp_layer_spec(spec):
    """A copy of a Megatron layer spec (``ModuleSpec`` of a ``TransformerLayer``) or block spec
    (``TransformerBlockSubmodules``, e.g. ``get_gpt_decoder_block_spec``) whose self-attention's ``core_attention``
    is :class:`FCPCoreAttention`."""
    _require_megatron()
    spec = copy.deepcopy(spec)
    layers = getattr(spec, "layer_specs", None)
    for layer in (layers if layers is not None else [spec]):
        attn = getattr(getattr(layer, "submodules", None), "self_attention", None)
        sub = getattr(attn, "submodules", None)
        if sub is None or not hasattr(sub, "core_attention"):
            raise TypeError(f"not a Megatron transformer layer spec with self_attention.core_attention: {layer!r}")
        sub.core_attention = FCPCoreAttention
    return spec


def apply_fcp(model: nn.Module, *, kernel=None, timeout: float | None = None) -> nn.Module:
    """Check that ``model`` (a Megatron-core ``GPTModel`` built with :func:`fcp_layer_spec`, before Megatron's DDP)
    can run FCP micro-batches and make its rotary embedding follow each token's document position; returns the
    same model. ``kernel``: an attention kernel or its name (default: by device); ``timeout``: seconds bounding every
    ring P2P wait (None: the process group's)."""
    _require_megatron()
    from fcp_exec.kernels import KERNEL_NAMES, AttentionKernel

    if not (kernel is None or isinstance(kernel, AttentionKernel) or kernel in KERNEL_NAMES):
        raise ValueError(f"kernel must be an AttentionKernel or one of {', '.join(KERNEL_NAMES)}, got {kernel!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds (None: the process group's), got {timeout!r}")
    _check_config(model)
    cores = [m for m in model.modules() if type(m).__name__.endswith("Attention") and hasattr(m, "core_attention")]
    if not cores:
        raise TypeError(f"{type(model).__name__} has no Megatron attention layer (.core_attention)")
    wrong = {type(m.core_attention).__name__ for m in cores if not isinstance(m.core_attention, FCPCoreAttention)}
    if wrong:
        raise ValueError(f"the model's core attention is {', '.join(sorted(wrong))}: build it with "
                         "fcp_exec.integrations.megatron.fcp_layer_spec(<your layer or block spec>)")
    if getattr(model, "position_embedding_type", "rope") == "rope":
        wrap_rotaries(model)
    for router in model.modules():
        if getattr(router, "enable_expert_bias", False) and not hasattr(router, "_fcp_bias_counts"):
            router._fcp_bias_counts = router._apply_expert_bias
            router._apply_expert_bias = partial(_expert_bias_counts, router._fcp_bias_counts)
    if getattr(model.config, "mtp_num_layers", None):  # its rolls along the sequence: from the collator's look-ahead
        from fcp_exec.integrations.megatron_mtp import install

        install()
    model._fcp_megatron = {"kernel": kernel, "timeout": timeout}
    return model


def _check_config(model: nn.Module) -> None:
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "calculate_per_token_loss"):
        raise TypeError(f"{type(model).__name__} is not a Megatron-core model (no TransformerConfig at .config)")
    sizes = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
             "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1}  # ETP: None (= TP) or a size
    bad = [f"{k}={getattr(cfg, k)}" for k in sizes if int(getattr(cfg, k, 1) or 1) != 1]
    if bad:
        raise ValueError(f"FCP forms the context-parallel groups itself and runs every rank as data-parallel: "
                         f"{', '.join(bad)} must be 1")
    if not cfg.calculate_per_token_loss:
        raise ValueError("set TransformerConfig(calculate_per_token_loss=True): FCP micro-batches hold different "
                         "numbers of tokens on different ranks, so only the per-token loss over the global batch is "
                         "the single-process loss")
    kind = getattr(model, "position_embedding_type", "rope")
    if kind not in ("rope", "learned_absolute", "none"):
        raise ValueError(f"position_embedding_type={kind!r} is not supported with FCP (rope, learned_absolute, none)")
    if getattr(cfg, "experimental_attention_variant", None):
        raise ValueError(f"experimental_attention_variant={cfg.experimental_attention_variant} is not supported with "
                         "FCP")
    if getattr(cfg, "multi_latent_attention", False) and getattr(cfg, "apply_rope_fusion", False):
        raise ValueError("multi-latent attention with apply_rope_fusion=True numbers the tokens by Megatron's own "
                         "context-parallel layout; set apply_rope_fusion=False (FCP's positions go through the unfused "
                         "rotary path)")


def batch_inputs(batch: dict, model: nn.Module) -> tuple[dict[str, Any], torch.Tensor]:
    """``(kwargs for model(**kwargs), loss_mask [s])`` from one ``FCPCollator`` batch: ``input_ids``/
    ``position_ids`` ``[1, s]``, ``attention_mask=None``, ``labels`` ``[1, s]`` (ignored labels as 0, masked by
    ``loss_mask``) and ``packed_seq_params`` (:class:`FCPPackedSeqParams`)."""
    from fcp_exec.ring_attention import RingBatch

    inner = _unwrap(model)
    opts = getattr(inner, "_fcp_megatron", None)
    if opts is None:
        raise ValueError("call fcp_exec.integrations.megatron.apply_fcp(model) before batch_inputs (and before DDP)")
    if is_idle(batch):
        raise ValueError("this rank is idle in this micro-batch: take the micro-batches from next_global_batch, which "
                         "puts a label-free dummy in its place")
    device = next(inner.parameters()).device
    ids = batch["input_ids"].to(device)
    pos = batch["position_ids"].to(device)
    labels = batch["labels"].to(device)
    loss_mask = labels != -100
    ring = RingBatch(batch["cu_seqlens"], tuple(int(r) for r in batch["ranks"]), timeout=opts["timeout"])
    top = int(batch["position_ids"].max()) + 1 if ids.numel() else 1
    params = FCPPackedSeqParams(qkv_format="sbhd", max_seqlen_q=top, max_seqlen_kv=top, ring=ring, positions=pos,
                                kernel=opts["kernel"])
    kwargs = {"input_ids": ids[None], "position_ids": pos[None], "attention_mask": None,
              "labels": torch.where(loss_mask, labels, torch.zeros_like(labels))[None], "packed_seq_params": params}
    depth = int(getattr(inner.config, "mtp_num_layers", None) or 0)
    if depth:  # multi-token prediction: the tokens and labels ahead of each token, from the collator
        if "future_ids" not in batch or int(batch["future_ids"].shape[0]) < depth:
            raise ValueError(f"the model predicts {depth} tokens ahead (mtp_num_layers): build the collator with "
                             f"FCPCollator(future_tokens={depth})")
        from fcp_exec.integrations.megatron_mtp import MTPRolls

        kwargs["loss_mask"] = loss_mask[None]
        params.fcp_mtp = MTPRolls(kwargs["input_ids"], kwargs["position_ids"], kwargs["labels"], kwargs["loss_mask"],
                                  tuple(batch[k] for k in ("future_ids", "future_labels", "future_valid")))
    if getattr(inner.config, "num_moe_experts", None):  # the routers count real tokens only (expert-bias updates)
        kwargs["padding_mask"] = padding_mask(batch).to(device)[None]
    return kwargs, loss_mask


def _expert_bias_counts(count, routing_map: torch.Tensor, padding_mask: torch.Tensor | None = None):
    """Megatron-core 0.16's router counts ``routing_map & ~padding_mask`` with a ``[tokens]`` mask against the
    ``[tokens, experts]`` map (a broadcast error): the mask, as a column."""
    if padding_mask is not None and padding_mask.dim() == 1:
        padding_mask = padding_mask[:, None]
    return count(routing_map, padding_mask)


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Megatron's per-token loss contract: ``(Σ masked token losses, their count, {"lm loss": [sum, count]})``."""
    losses = output_tensor.reshape(-1).float()
    mask = loss_mask.reshape(-1).to(losses.dtype)
    total = (losses * mask).sum()
    count = loss_mask.sum().to(torch.int)
    return total, count, {"lm loss": torch.stack([total.detach(), count.to(total.dtype)])}


def forward_step(data_iterator: Iterator[dict], model: nn.Module):
    """``forward_step_func`` for Megatron's ``get_forward_backward_func()``: the model's per-token losses and
    :func:`loss_func` for them. ``data_iterator``: :func:`next_global_batch`'s micro-batches, or the FCPSampler
    DataLoader's iterator itself (Megatron-LM's ``pretrain()`` with an external data loader), whose batches are
    prepared here one by one (:func:`prepare_micro_batch`); then ``FCPSampler(micro_batches=M)`` must match
    Megatron's ``num_microbatches``."""
    batch = next(data_iterator)
    if not batch.get("fcp_prepared"):
        batch = prepare_micro_batch(batch, model, expected_micro_batches=_megatron_num_microbatches())
    kwargs, loss_mask = batch_inputs(batch, model)
    return model(**kwargs), partial(loss_func, loss_mask)


def _megatron_num_microbatches() -> int | None:
    """Megatron's global number of micro-batches where Megatron-LM set its calculator up, else None."""
    try:
        from megatron.core import num_microbatches_calculator as calc
    except ImportError:  # pragma: no cover
        return None
    return calc.get_num_microbatches() if calc._GLOBAL_NUM_MICROBATCHES_CALCULATOR is not None else None


def prepare_micro_batch(batch: dict, model: nn.Module, *, pad_token_id: int = 0, ignore_index: int = -100,
                        expected_micro_batches: int | None = None) -> dict:
    """One collator batch made ready for :func:`forward_step`: on a global batch's first micro-batch the ranks'
    plans are compared (:func:`fcp_exec.lockstep.check_plan_agreement`; with ``expected_micro_batches``, the plan's
    micro-batch count too), a failed read is agreed within the CP group (:func:`fcp_exec.skips.agree_skips`) and an
    idle micro-batch becomes a label-free two-token dummy. Every rank calls it for the same micro-batch."""
    num_mb = int(batch["num_micro_batches"])
    if int(batch["micro_batch"]) == 0 and expected_micro_batches is not None and num_mb != int(expected_micro_batches):
        raise ValueError(f"the FCP plan has {num_mb} micro-batches per global batch but Megatron runs "
                         f"{expected_micro_batches}: build the sampler with FCPSampler(micro_batches="
                         f"{expected_micro_batches}) or pass num_microbatches=len(next_global_batch(...))")
    device = next(_unwrap(model).parameters()).device
    return dict(_prepare(batch, device, pad_token_id=pad_token_id, ignore_index=ignore_index), fcp_prepared=True)


def next_global_batch(batches: Iterator[dict], model: nn.Module, *, pad_token_id: int = 0,
                      ignore_index: int = -100) -> list[dict]:
    """This rank's micro-batches of the next global batch from an ``FCPSampler`` DataLoader iterator, each made
    ready for :func:`forward_step` by :func:`prepare_micro_batch` (module docstring). Every rank must call it for
    the same global batch."""
    device = next(_unwrap(model).parameters()).device
    batches = _take_global_batch(batches, device, pad_token_id=pad_token_id, ignore_index=ignore_index)
    return [dict(b, fcp_prepared=True) for b in batches]


def global_loss(losses: list[dict], *, key: str = "lm loss", group=None) -> tuple[float, int]:
    """``(mean loss, token count)`` of one global batch over every rank from the schedule's output (the list of
    :func:`loss_func` reports): one all-reduce of ``[Σ loss, Σ tokens]``."""
    import torch.distributed as dist

    total = torch.zeros(2, dtype=torch.float64)
    for report in losses:
        total += report[key].detach().to(device="cpu", dtype=torch.float64)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dev = losses[0][key].device if losses else torch.device("cpu")
        from fcp_exec.launch import collective_dtype

        moved = total.to(device=dev, dtype=collective_dtype(torch.float64))
        dist.all_reduce(moved, group=group)
        total = moved.to(device="cpu", dtype=torch.float64)
    count = int(round(float(total[1])))
    return (float(total[0]) / count if count else 0.0), count
