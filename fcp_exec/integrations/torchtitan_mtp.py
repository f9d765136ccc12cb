"""DeepSeek-V3's multi-token prediction (torchtitan's ``MTPDecoder``) trained with FCP.

torchtitan's MTP depth ``k`` reads the token ``k`` places ahead of each position and is trained on the label ``k``
places ahead; its decoder takes both by shifting its own input along the sequence (``roll_mtp_sequence``), which is
why torchtitan refuses MTP with context parallelism ("MTP does not support context parallelism yet"): a CP shard's
last tokens have their look-ahead tokens on another rank. Under FCP the collator knows each document whole and hands
every token its look-ahead tokens, targets and validity (``FCPCollator(future_tokens=D)``, :mod:`fcp_data.lookahead`);
:func:`install` gives the model a forward that embeds those instead of shifting (the rest is torchtitan's
``MTPDecoder.forward`` as is: the main decoder, each MTP block on the previous depth's hidden state masked where no
token lies ahead, the shared LM head), and :func:`mtp_loss` / :class:`FCPMTPLoss` add each depth's cross-entropy on
those targets — torchtitan's ``MTPLoss``: ``main + mtp_scale · mean over depths``, over the global batch's main label
tokens. The look-ahead arrays travel on the micro-batch's ring batch (``attention_masks``) like FCP's pad mask.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FCPMTPLoss", "ce_sum", "install", "mtp_depth", "mtp_loss", "trainer_loss"]


def mtp_depth(model: nn.Module) -> int:
    """The number of MTP modules of a torchtitan decoder (0 for one without)."""
    layers = getattr(getattr(model, "module", model), "mtp_layers", None)
    return 0 if layers is None else len(layers)


def install(model: nn.Module) -> int:
    """Give a torchtitan ``MTPDecoder`` with MTP modules FCP's forward (module docstring; in place, idempotent).
    Returns the MTP depth (0: nothing to do). Refuses a decoder whose forward is not torchtitan's
    ``MTPDecoder.forward`` (the one this forward mirrors)."""
    depth = mtp_depth(model)
    if not depth or getattr(model, "_fcp_mtp", False):
        return depth
    from torchtitan.models.deepseek_v3.mtp import MTPDecoder

    if not isinstance(model, MTPDecoder) or type(model).forward is not MTPDecoder.forward:
        raise ValueError(f"{type(model).__name__} has MTP layers but a forward of its own: FCP replaces torchtitan's "
                         "MTPDecoder.forward only (its token shift would read across CP shards)")
    if getattr(model, "_skip_lm_head", False):
        raise ValueError("torchtitan's MTP decoder does not take skip_lm_head (its ChunkedLoss); neither does FCP's")
    model.forward = types.MethodType(_forward, model)
    model._fcp_mtp = True
    return depth


def _forward(self: nn.Module, tokens: torch.Tensor, positions: torch.Tensor | None = None,
             attention_masks: Any = None) -> list[torch.Tensor]:
    """torchtitan's ``MTPDecoder.forward`` with the look-ahead tokens from the collator instead of a shift."""
    future = getattr(attention_masks, "fcp_future", None)
    if future is None:
        raise RuntimeError("an MTP decoder under FCP runs on micro-batches from FCPCollator(future_tokens=D): call it "
                           "with fcp_exec.integrations.torchtitan.batch_inputs(batch, model)")
    ids, valid = future
    h = self.tok_embeddings(tokens)
    for layer in self.layers.values():
        h = layer(h, attention_masks, positions)
    prev = h
    outputs = [self.norm(h) if self.norm is not None else h]
    for depth, layer in enumerate(self.mtp_layers, 1):
        prev = layer(self.tok_embeddings(ids[depth - 1][None]), prev, valid[depth - 1][None], attention_masks,
                     positions)
        outputs.append(prev)
    return [self.lm_head(o) if self.lm_head is not None else o for o in outputs]


def ce_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ cross-entropy of ``logits`` ``[..., V]`` on ``labels`` (``-100`` ignored): in float64 for float64 logits,
    else float32."""
    logits = logits.reshape(-1, logits.shape[-1])
    logits = logits if logits.dtype == torch.float64 else logits.float()  # bf16/fp16 logits: the loss in float32
    return F.cross_entropy(logits, labels.reshape(-1).to(logits.device), ignore_index=-100, reduction="sum")


def mtp_loss(pred: list[torch.Tensor], labels: torch.Tensor, future_labels: torch.Tensor, mtp_scale: float,
             ce: Any = ce_sum) -> torch.Tensor:
    """torchtitan's ``MTPLoss`` before its division by the label tokens: Σ cross-entropy of the main logits on
    ``labels`` ``+ mtp_scale ·`` the mean over depths of Σ cross-entropy of depth ``k``'s logits on
    ``future_labels[k-1]`` (``[D, L]``, :mod:`fcp_data.lookahead`). ``ce(logits [1, L, V], labels [1, L])``: the
    Σ-reduced cross-entropy (default :func:`ce_sum`)."""
    depths = len(pred) - 1
    if depths < 1 or future_labels.shape[0] < depths:
        raise ValueError(f"{depths} MTP predictions for {future_labels.shape[0]} look-ahead targets per token: build "
                         f"FCPCollator(future_tokens={max(depths, 1)})")
    labels = labels.reshape(1, -1).to(pred[0].device)
    future_labels = future_labels.to(pred[0].device)
    extra = sum(ce(p, future_labels[k][None]) for k, p in enumerate(pred[1:]))
    return ce(pred[0], labels) + float(mtp_scale) * (extra / depths if depths > 1 else extra)


class FCPMTPLoss:
    """torchtitan's ``MTPLoss`` (its ``mtp_scale`` and its cross-entropy ``fn``) for
    :class:`~fcp_exec.integrations.torchtitan_trainer.FCPTitanTrainer`: the same call (``pred`` list, ``labels``,
    ``global_valid_tokens``), each depth's targets from the micro-batch's ``future_labels`` that the trainer sets
    before the forward (``targets``)."""

    def __init__(self, loss: Any) -> None:
        self.loss, self.mtp_scale, self.targets = loss, float(loss.mtp_scale), None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loss, name)

    def __call__(self, pred: list[torch.Tensor], labels: torch.Tensor, global_valid_tokens: Any = None,
                 **_: Any) -> tuple[torch.Tensor, dict]:
        if self.targets is None:
            raise RuntimeError("FCPMTPLoss: no look-ahead targets were set for this micro-batch")
        fn, vocab = self.loss.fn, getattr(self.loss, "global_vocab_size", None)
        loss = mtp_loss(pred, labels, self.targets, self.mtp_scale,
                        lambda logits, target: fn(logits, target, global_vocab_size=vocab))
        return (loss if global_valid_tokens is None else loss / global_valid_tokens), {}


def trainer_loss(loss_fn: Any, model: nn.Module, future_tokens: int) -> Any:
    """The loss a torchtitan ``Trainer`` under FCP calls: ``loss_fn``, or for a model with MTP modules its ``MTPLoss``
    as :class:`FCPMTPLoss` (each depth's targets from the collator, not shifted along the shard); the loader must then
    give that many look-ahead tokens (``future_tokens``)."""
    depth = mtp_depth(model)
    if not depth:
        return loss_fn
    if not hasattr(loss_fn, "mtp_scale"):
        raise ValueError(f"FCPTitanTrainer: the model has {depth} MTP modules but the loss is "
                         f"{type(loss_fn).__name__}, not torchtitan's MTPLoss (its list of predictions needs it)")
    if future_tokens < depth:
        raise ValueError(f"FCPTitanTrainer: the model has {depth} MTP modules but dataloader.future_tokens is "
                         f"{future_tokens} (fcp_config sets it from the model)")
    return FCPMTPLoss(loss_fn)
