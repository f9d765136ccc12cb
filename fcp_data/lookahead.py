"""Look-ahead tokens for multi-token prediction (MTP), computed before the zigzag split.

DeepSeek-V3's MTP modules predict, at depth ``k``, the token ``k + 1`` places ahead of each position from the
embedding of the token ``k`` places ahead (torchtitan's ``MTPDecoder``, Megatron-core's ``mtp_num_layers``). A model
that shifts its own tokens along the sequence (``roll_mtp_sequence``) gets them wrong under context parallelism: a
rank holds two chunks of each document (``fcp_data.layout.zigzag_index``), and the tokens after a chunk's last ones sit
on another rank. The collator knows every document whole, so it hands each token its look-ahead tokens and their labels
directly; no rank exchanges anything.

For depth ``k`` (1 … ``depth``) and a token at position ``p`` of a document of ``n`` kept tokens:

* ``ids[k-1]``: the token at ``p + k`` where ``p + k < n``, else the pad id;
* ``labels[k-1]``: the label (already shifted: the next token's id, or ``ignore_index``) at ``p + k``, else
  ``ignore_index`` — exactly torchtitan's ``roll_mtp_sequence(labels, shift=k, positions=...)`` on one document;
* ``valid[k-1]``: ``p + k < n`` (torchtitan's ``return_valid_mask``; pads and the positions past the end are False).
"""

from __future__ import annotations

import torch

__all__ = ["lookahead"]


def lookahead(input_ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, kept: torch.Tensor,
              depth: int, *, pad_token_id: int, ignore_index: int,
              index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, labels, valid)``, each ``[depth, L]``, for packed documents (module docstring). ``input_ids``,
    ``labels``, ``positions`` ``[T]``: the packed (padded, not yet sharded) tokens, their shifted labels and their
    positions inside their documents; ``kept`` ``[T]``: the kept tokens of each token's document; ``index``: the
    packed positions of this rank's tokens (``fcp_data.layout.zigzag_index``; None: all ``T``), whose look-ahead is
    computed — and only theirs."""
    if index is None:  # degree 1: every token is this rank's, and shifted slices are the cheapest gather
        return _sliced(input_ids, labels, positions, kept, depth, int(pad_token_id), int(ignore_index))
    ahead = torch.arange(1, depth + 1)[:, None]
    valid = positions[index][None] + ahead < kept[index][None]
    src = torch.where(valid, index[None] + ahead, 0)  # inside the same document wherever valid
    ids = torch.where(valid, input_ids[src], int(pad_token_id))
    out_labels = torch.where(valid, labels[src], int(ignore_index))
    return ids, out_labels, valid


def _sliced(input_ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, kept: torch.Tensor, depth: int,
            pad: int, ignore: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    total = int(input_ids.numel())
    ids = input_ids.new_full((depth, total), pad)
    out_labels = labels.new_full((depth, total), ignore)
    valid = torch.zeros((depth, total), dtype=torch.bool)
    for k in range(1, min(depth, total - 1) + 1):
        ok = positions[: total - k] + k < kept[: total - k]
        valid[k - 1, : total - k] = ok
        ids[k - 1, : total - k] = torch.where(ok, input_ids[k:], pad)
        out_labels[k - 1, : total - k] = torch.where(ok, labels[k:], ignore)
    return ids, out_labels, valid
