"""torchtitan's MoE auxiliary-loss-free load balancing under FCP: expert counts of the data's tokens only.

A torchtitan MoE layer with ``load_balance_coeff`` counts, in every training forward, the tokens routed to each expert
(``tokens_per_expert_E``); before each optimizer step torchtitan sums those counts over the data-parallel ranks and
moves each expert's routing bias by ``± coeff`` toward balance (https://arxiv.org/abs/2408.15664). Under FCP a rank's
micro-batch also holds tokens that are no data — the pads that make each document's zigzag shards equal, and an idle
rank's two-token dummy — and the router routes them too, so the counts (and, through the sign, the biases) would
differ from a run on the same documents without FCP.

:func:`exclude_padding` takes them out: :func:`fcp_exec.integrations.torchtitan.batch_inputs` attaches the
micro-batch's padding mask (:func:`fcp_exec.step.padding_mask`) to the ring batch it passes as ``attention_masks``; a
forward pre-hook on the model keeps it for the forward, and a forward hook on each balanced layer's router subtracts
the pads' top-k choices from the layer's counts (in training mode, where torchtitan adds them). Under activation
checkpointing the router runs again in the backward and torchtitan counts twice; the hook subtracts twice, so
torchtitan's own halving still gives the data's counts. Eager only: ``torch.compile`` is refused with these layers
(:func:`fcp_exec.integrations.torchtitan_trainer.fcp_config`'s checks).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["balanced_moe_layers", "exclude_padding", "moe_shape"]


def balanced_moe_layers(model: nn.Module) -> list[nn.Module]:
    """The MoE modules of a torchtitan decoder that balance their experts by a routing bias (``load_balance_coeff``)."""
    return [m for m in model.modules() if getattr(m, "load_balance_coeff", None) is not None
            and hasattr(m, "tokens_per_expert_E") and isinstance(getattr(m, "router", None), nn.Module)]


def exclude_padding(model: nn.Module) -> int:
    """Hooks that keep FCP's pads and idle dummies out of the expert counts of every balanced MoE layer of ``model``
    (module docstring; idempotent). Returns the number of layers."""
    layers = balanced_moe_layers(model)
    if not layers or getattr(model, "_fcp_pad_hooks", False):
        return len(layers)

    def keep_mask(module: nn.Module, args: tuple, kwargs: dict) -> None:
        ring = kwargs.get("attention_masks")
        model._fcp_pads = getattr(ring, "fcp_pads", None)

    model.register_forward_pre_hook(keep_mask, with_kwargs=True)
    for moe in layers:
        moe.router.register_forward_hook(_subtract_pads(model, moe))
    model._fcp_pad_hooks = True
    return len(layers)


def _subtract_pads(model: nn.Module, moe: nn.Module):
    def hook(router: nn.Module, args: tuple, output: Any) -> None:
        if not moe.training or moe.load_balance_coeff is None:  # torchtitan counts in training, when it balances
            return
        pads = getattr(model, "_fcp_pads", None)
        if pads is None:
            raise RuntimeError("a balanced MoE layer ran without FCP's padding mask: call the model with "
                               "fcp_exec.integrations.torchtitan.batch_inputs(batch, model)")
        ids = output[1]  # (top-k scores, top-k expert ids, scores), each [B, L, ...]
        if ids.shape[:2] != (1, pads.shape[0]):
            raise RuntimeError(f"router output of shape {tuple(ids.shape)} for a micro-batch of {pads.shape[0]} tokens")
        chosen = ids[0][pads.to(ids.device)].reshape(-1)
        with torch.no_grad():
            counts = moe.tokens_per_expert_E
            counts.sub_(torch.bincount(chosen, minlength=counts.shape[0]).to(counts.dtype))

    return hook


def moe_shape(layers: Any, dim: int) -> dict | None:
    """``active_params`` / ``stored_params`` matmul weights of a torchtitan decoder's layers whose feed-forward is a
    MoE (router gate, top-k routed experts per token, shared experts), or None where a layer is neither MoE nor a
    plain feed-forward of the known form."""
    active = stored = 0
    for layer in layers:
        moe, ffn = getattr(layer, "moe", None), getattr(layer, "feed_forward", None)
        if moe is None:
            width = int(ffn.w1.out_features) if ffn is not None else 0
            active, stored = active + 3 * dim * width, stored + 3 * dim * width
            continue
        try:
            experts, top_k = int(moe.router.num_experts), int(moe.router.top_k)
            hidden = int(moe.routed_experts.inner_experts.hidden_dim)
        except (AttributeError, TypeError):
            return None
        shared = moe.shared_experts
        shared_width = int(shared.w1.out_features) if shared is not None else 0
        gate = dim * experts
        active += gate + 3 * dim * (hidden * top_k + shared_width)
        stored += gate + 3 * dim * (hidden * experts + shared_width)
    return {"active": active, "stored": stored}
