"""Megatron-core rotary embeddings at each token's position in its document (for :mod:`fcp_exec.integrations.megatron`).

Megatron numbers the tokens of its input ``0..s-1``; a rank's zigzag shard holds pieces of documents. While a
forward carries :class:`~fcp_exec.integrations.megatron.FCPPackedSeqParams`, the wrapped rotary modules return the
frequencies at the collator's ``positions`` instead: the model's own ``rotary_pos_emb`` (GPT attention, frequencies
``[s, 1, 1, dim]``) and the one every multi-latent-attention layer owns (its packed path squeezes the batch
dimension away, so there they are ``[s, 1, dim]``; YaRN's ``(frequencies, mscale)`` keep their mscale).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FCPRotary", "wrap_rotaries"]


class FCPRotary(nn.Module):
    """A Megatron rotary module at the positions :func:`wrap_rotaries`'s pre-hook sets; the module itself otherwise.
    ``squeeze``: drop the batch dimension (multi-latent attention's packed layout)."""

    def __init__(self, base: nn.Module, squeeze: bool = False) -> None:
        super().__init__()
        self.base, self.squeeze = base, squeeze
        self.positions: torch.Tensor | None = None

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            base = self.__dict__.get("_modules", {}).get("base")
            if base is None:
                raise
            return getattr(base, name)  # get_rotary_seq_len, inv_freq, ... of Megatron's module

    def forward(self, max_seq_len: int, *args, **kwargs):
        out = self.base(max_seq_len, *args, **kwargs)
        if self.positions is None:
            return out
        emb, rest = (out[0], out[1:]) if isinstance(out, tuple) else (out, None)
        emb = emb[self.positions.to(emb.device)]
        if self.squeeze:
            emb = emb[:, 0]
        return emb if rest is None else (emb, *rest)


def wrap_rotaries(model: nn.Module) -> None:
    """Wrap ``model.rotary_pos_emb`` and every attention layer's own ``rotary_pos_emb`` (multi-latent attention) in
    :class:`FCPRotary` and register the hooks that set their positions from the forward's ``packed_seq_params``.
    Idempotent."""
    if getattr(model, "_fcp_rotaries", None) is not None:
        return
    rotaries = []
    if isinstance(getattr(model, "rotary_pos_emb", None), nn.Module):
        model.rotary_pos_emb = FCPRotary(model.rotary_pos_emb)
        rotaries.append(model.rotary_pos_emb)
    for module in list(model.modules()):
        if hasattr(module, "core_attention") and isinstance(getattr(module, "rotary_pos_emb", None), nn.Module):
            module.rotary_pos_emb = FCPRotary(module.rotary_pos_emb, squeeze=True)
            rotaries.append(module.rotary_pos_emb)
    model._fcp_rotaries = rotaries
    if rotaries:
        model.register_forward_pre_hook(_pre_hook, with_kwargs=True)
        model.register_forward_hook(_post_hook, with_kwargs=True, always_call=True)


def _pre_hook(module: nn.Module, args, kwargs):
    from fcp_exec.integrations.megatron import FCPPackedSeqParams

    params = kwargs.get("packed_seq_params", args[6] if len(args) > 6 else None)
    for rotary in module._fcp_rotaries:
        rotary.positions = params.positions if isinstance(params, FCPPackedSeqParams) else None


def _post_hook(module: nn.Module, args, kwargs, output):
    for rotary in module._fcp_rotaries:
        rotary.positions = None
    return output
