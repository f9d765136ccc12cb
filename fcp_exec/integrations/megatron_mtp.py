"""Megatron-core's multi-token prediction (``TransformerConfig(mtp_num_layers=D)``) on FCP micro-batches.

Megatron's MTP depth ``k`` embeds the tokens ``k`` places ahead and is trained on the labels ``k`` places ahead; it
gets both by rolling tensors along the sequence one place per depth with ``roll_tensor`` — the input ids and position
ids in ``MultiTokenPredictionLayer._get_embeddings``, the labels and the loss mask in ``GPTModel``'s MTP loss. Its
context-parallel roll exchanges the chunk boundaries with the neighbouring ranks of Megatron's fixed CP group in its
own two-chunk layout; an FCP micro-batch has another group and layout for each micro-batch. The collator knows each
document whole (``FCPCollator(future_tokens=D)``: ``future_ids`` / ``future_labels`` / ``future_valid`` ``[D, L]``,
:mod:`fcp_data.lookahead`), so :func:`install` gives both modules a ``roll_tensor`` that, on an FCP micro-batch,
returns the tensor ``k`` places ahead from those — exactly Megatron's roll of each document on its own (zero where
``k`` places ahead is past the document's end) — and otherwise calls Megatron's.

Which tensor is rolled is known by identity: the micro-batch's state (:class:`MTPRolls`, on its packed-sequence
parameters) registers the ids, positions and loss mask handed to the model and every tensor it returns, at its depth;
``GPTModel`` clones the labels before rolling them, so a tensor equal to the labels handed in is the labels at depth
0. Activation recomputation that runs a roll again gets the same answer. Anything else is refused with the tensor's
shape, never guessed.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["install", "MTPRolls"]

_ROLLS = ("input_ids", "position_ids")  # what multi_token_prediction rolls, in this order per depth
_LOSS_ROLLS = ("labels", "loss_mask")  # what gpt_model rolls


class MTPRolls:
    """One FCP micro-batch's tensors ``k`` places ahead for Megatron's MTP (module docstring). ``ids``,
    ``positions``, ``labels`` (ignored labels as 0), ``loss_mask``: ``[1, s]`` as handed to the model; ``future``:
    the collator's ``(future_ids, future_labels, future_valid)``, each ``[D, s]``."""

    def __init__(self, ids: torch.Tensor, positions: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor,
                 future: tuple[torch.Tensor, torch.Tensor, torch.Tensor], ignore_index: int = -100) -> None:
        f_ids, f_labels, f_valid = (t.to(ids.device) for t in future)
        self.depth = int(f_ids.shape[0])
        self._future = (f_ids, f_labels, f_valid)
        self._labels, self._positions, self._ignore = labels, positions, int(ignore_index)
        self._known: dict[int, tuple[str, int, torch.Tensor]] = {}  # id(tensor) -> (kind, depth, tensor): held
        for kind, t in (("input_ids", ids), ("position_ids", positions), ("loss_mask", loss_mask)):
            self._note(kind, 0, t)

    def _note(self, kind: str, depth: int, tensor: torch.Tensor) -> torch.Tensor:
        self._known[id(tensor)] = (kind, depth, tensor)
        return tensor

    def _which(self, tensor: torch.Tensor, kinds: tuple[str, ...]) -> tuple[str, int]:
        known = self._known.get(id(tensor))
        if known is not None and known[2] is tensor and known[0] in kinds:
            return known[0], known[1]
        if "labels" in kinds and tensor.shape == self._labels.shape and torch.equal(tensor, self._labels):
            return "labels", 0  # GPTModel rolls labels.clone()
        raise RuntimeError(f"Megatron's multi-token prediction rolled a tensor of shape {tuple(tensor.shape)} that is "
                           f"none of the {' / '.join(kinds)} FCP handed it or returned: this megatron-core rolls in a "
                           "way fcp_exec.integrations.megatron_mtp does not know")

    def roll(self, kinds: tuple[str, ...], tensor: torch.Tensor, shifts: int, dims: int) -> tuple[torch.Tensor, Any]:
        """``(tensor one place further ahead, its sum)``, as Megatron's ``roll_tensor`` returns."""
        if shifts != -1 or dims not in (-1, tensor.dim() - 1):
            raise RuntimeError(f"FCP rolls Megatron's MTP tensors one place left along the sequence, not "
                               f"shifts={shifts} dims={dims}")
        kind, depth = self._which(tensor, kinds)
        depth += 1
        if depth > self.depth:
            raise RuntimeError(f"the model's multi-token prediction looks {depth} tokens ahead but the collator gave "
                               f"{self.depth}: FCPCollator(future_tokens=<mtp_num_layers>)")
        f_ids, f_labels, f_valid = (t[depth - 1][None] for t in self._future)
        if kind == "input_ids":
            out = torch.where(f_valid, f_ids, 0).to(tensor.dtype)
        elif kind == "position_ids":
            out = torch.where(f_valid, self._positions + depth, 0).to(tensor.dtype)
        elif kind == "labels":
            out = torch.where(f_labels != self._ignore, f_labels, 0).to(tensor.dtype)
        else:  # its sum is the count GPTModel divides the logged MTP loss by: at least 1 (an idle rank's dummy has 0)
            out = (f_labels != self._ignore).to(tensor.dtype)
            return self._note(kind, depth, out), out.sum().clamp(min=1)
        return self._note(kind, depth, out), out.sum()


def _fcp_roll(original: Callable, kinds: tuple[str, ...]) -> Callable:
    def roll_tensor(tensor, shifts=-1, dims=-1, cp_group=None, packed_seq_params=None):
        rolls = getattr(packed_seq_params, "fcp_mtp", None)
        if rolls is None:  # not an FCP micro-batch: Megatron's own roll
            return original(tensor, shifts=shifts, dims=dims, cp_group=cp_group, packed_seq_params=packed_seq_params)
        return rolls.roll(kinds, tensor, shifts, dims)

    roll_tensor.fcp_original = original
    return roll_tensor


def install() -> None:
    """Give ``megatron.core.transformer.multi_token_prediction`` and ``megatron.core.models.gpt.gpt_model`` FCP's
    ``roll_tensor`` (module docstring); idempotent, and Megatron's own roll wherever no FCP micro-batch runs."""
    from megatron.core.models.gpt import gpt_model
    from megatron.core.transformer import multi_token_prediction

    for module, kinds in ((multi_token_prediction, _ROLLS), (gpt_model, _LOSS_ROLLS)):
        current = getattr(module, "roll_tensor", None)
        if current is None:
            raise RuntimeError(f"{module.__name__} has no roll_tensor: this megatron-core computes its multi-token "
                               "prediction in a way fcp_exec.integrations.megatron_mtp does not know")
        if not hasattr(current, "fcp_original"):
            module.roll_tensor = _fcp_roll(current, kinds)
