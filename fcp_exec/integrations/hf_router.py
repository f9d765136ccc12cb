"""The load-balancing loss of a Hugging Face mixture-of-experts model (``output_router_logits=True``) under FCP.

Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, FlexOlmo, gpt-oss, Qwen3-VL-MoE, Phi-3.5-MoE, Granite MoE and ERNIE-4.5-MoE
add ``router_aux_loss_coef · aux`` to their loss when their config sets ``output_router_logits=True``; ``aux`` is
transformers' Switch-Transformer loss over every routed row of the batch the model sees (the rows of all its MoE layers
together, padding left out by the attention mask)::

    aux = E · Σ_e (n_e / R) · (P_e / R)

``n_e``: the rows whose top-k experts include ``e``; ``P_e``: the sum of the rows' router probabilities of ``e``;
``R``: the rows (tokens × MoE layers); ``E``: the experts. It is not a sum over tokens, so no rank can compute its
share of it alone: under FCP one micro-batch's documents are spread over every rank (and a document's tokens over its
CP group). :func:`router_loss` makes the counts global — one all-reduce of ``[n_1 … n_E, R]``, which carry no gradient
(the top-k choice has none, in the stock model too) — and returns this rank's share ``E · Σ_e n_e · P_e^local / R²``:
the shares of all ranks sum to the stock ``aux`` of the micro-batch's documents as one padded batch, and since the
gradient flows through ``P`` alone, so do their gradients (summed over ranks by every reducer).

A global batch of M micro-batches gets the mean of their M losses (Megatron-core's convention for its auxiliary losses:
a micro-batch's own balance, every rank's tokens of it; one none of whose documents was read counts 0); with one
micro-batch it is the stock model's loss on the whole global batch. Tokens that are no data — pads after a document,
a document that failed to read, an idle rank's dummy — are left out (:func:`fcp_exec.step.padding_mask`); a step with
such a loss takes failed reads out of the cross-entropy's denominator before its first forward
(``fcp_exact_denominator`` on the model), so no gradient is rescaled afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.nn import functional as F

from fcp_data.hf_config import moe_experts
from fcp_data.sampler_inputs import dist_rank_and_world
from fcp_exec.step import padding_mask

__all__ = ["ROUTER_LOSS_MODEL_TYPES", "RouterLoss", "router_loss", "router_loss_of"]

# the families whose model adds transformers' load_balancing_loss_func (one formula in all of them, 5.18–5.25)
ROUTER_LOSS_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "qwen3_vl_moe", "phimoe",
                           "granitemoe", "ernie4_5_moe", "flex_olmo")


@dataclass(frozen=True, slots=True)
class RouterLoss:
    """What the model's config says of its load-balancing loss: ``coef · aux`` over ``num_experts``, top ``top_k``."""

    num_experts: int
    top_k: int
    coef: float


def router_loss_of(text_cfg: Any, model_type: str, model_name: str) -> RouterLoss | None:
    """The model's :class:`RouterLoss`, None when its config does not add one (``output_router_logits`` false); a
    ValueError for a model type whose loss fcp does not know (it would otherwise be trained without it)."""
    if not getattr(text_cfg, "output_router_logits", False):
        return None
    if model_type not in ROUTER_LOSS_MODEL_TYPES:
        raise ValueError(f"{model_name} adds its MoE router's load-balancing loss (output_router_logits=True), "
                         f"which fcp computes over the global batch for {', '.join(ROUTER_LOSS_MODEL_TYPES)} only; "
                         "set it to False to train without it")
    experts, top_k = moe_experts(text_cfg.to_dict())  # the presets' reading of the config
    coef = getattr(text_cfg, "router_aux_loss_coef", None)
    if not experts or not top_k or coef is None:
        raise ValueError(f"{model_name} sets output_router_logits=True but its config lacks the number of experts, "
                         "num_experts_per_tok or router_aux_loss_coef")
    return RouterLoss(num_experts=int(experts), top_k=int(top_k), coef=float(coef))


def _local_sums(router_logits: Sequence[torch.Tensor], keep: torch.Tensor,
                spec: RouterLoss) -> tuple[torch.Tensor, torch.Tensor]:
    """``([n_1 … n_E, R]`` float64 without gradient, ``P`` with its gradient) over this rank's data rows."""
    experts = spec.num_experts
    counts = torch.zeros(experts + 1, dtype=torch.float64, device=keep.device)
    probs = None
    for logits in router_logits:
        logits = logits.reshape(-1, logits.shape[-1])
        if logits.shape != (keep.shape[0], experts):
            raise RuntimeError(f"router logits of shape {tuple(logits.shape)} for {keep.shape[0]} tokens and "
                               f"{experts} experts: not the rows of this micro-batch")
        weights = F.softmax(logits.float() if logits.element_size() < 4 else logits, dim=-1)
        top = torch.topk(weights, spec.top_k, dim=-1).indices[keep]
        counts[:experts] += torch.bincount(top.reshape(-1), minlength=experts).to(torch.float64)
        counts[experts] += float(top.shape[0])
        layer = (weights * keep[:, None].to(weights.dtype)).sum(0)
        probs = layer if probs is None else probs + layer
    return counts, probs


def router_loss(router_logits: Sequence[torch.Tensor] | None, batch: dict, spec: RouterLoss) -> torch.Tensor:
    """This rank's share of ``coef · aux`` for one micro-batch (module docstring), divided by the step's micro-batch
    count. ``router_logits``: the model output's, one ``[tokens, E]`` tensor per MoE layer. Every rank of the job calls
    it for the same micro-batch (one all-reduce over the default group; an idle rank on its dummy)."""
    if not router_logits:
        raise RuntimeError("the model returned no router logits although its config sets output_router_logits=True")
    device = router_logits[0].device
    keep = ~padding_mask(batch).to(device)
    counts, probs = _local_sums(router_logits, keep, spec)
    if dist_rank_and_world()[1] > 1:
        from fcp_exec.launch import collective_dtype

        total = counts.to(collective_dtype(torch.float64))
        dist.all_reduce(total)
        counts = total.to(torch.float64)
    rows = max(float(counts[spec.num_experts]), 1.0)
    share = spec.num_experts * (counts[:spec.num_experts].to(probs.dtype) * probs).sum() / (rows * rows)
    return spec.coef * share / max(int(batch.get("num_micro_batches", 1)), 1)
