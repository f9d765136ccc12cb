"""Per-sample predictions of FCP micro-batches, for ``FCPTrainer``'s ``compute_metrics`` and ``predict()``.

Under FCP a document's tokens are split over its CP group in zigzag chunks, so no rank holds a sample's logits whole.
For each micro-batch, after the forward that also gives the evaluation loss, :class:`PredictionCollector` sends every
rank's logits and labels to the group's CP rank 0 (one batched P2P exchange inside the group), which puts the
document back in order (:func:`fcp_data.layout.zigzag_index`), cuts it to its tokens (no padding), applies
``preprocess_logits_for_metrics`` to the whole document — as the stock Trainer applies it to a batch — and keeps the
result by dataset index. :meth:`PredictionCollector.gather` then gives every rank all samples (one
``all_gather_object``), in dataset order, padded with -100 like the stock Trainer's evaluation loop.

Labels are given the way the stock Trainer gives them to ``compute_metrics``: not shifted (``label_ids[:, t]`` is the
target of position ``t - 1``; FCP's collator shifts them, so they are shifted back: ``label_ids[:, 0]`` is -100, no
position predicts it). A document that failed to read on any rank of its group has no prediction (it is left out, as
from the loss). Memory: a group's whole micro-batch of logits sits on its first rank for the exchange, as one batch's
logits do in the stock loop; pass ``preprocess_logits_for_metrics`` (e.g. an argmax) to keep only what the metric needs.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from fcp_data.layout import zigzag_index
from fcp_data.read_errors import SKIPPED

__all__ = ["PredictionCollector", "pad_stack"]

_TAG = 31  # P2P tag of the exchange (ring attention uses 0-8, skip agreement its own)


class PredictionCollector:
    """Collects whole-document predictions of the micro-batches it sees (module docstring). ``preprocess``: the
    Trainer's ``preprocess_logits_for_metrics(logits [1, n, V], labels [1, n]) -> [1, n, ...]`` or None."""

    def __init__(self, preprocess: Callable | None = None, ignore_index: int = -100) -> None:
        self.preprocess, self.ignore_index = preprocess, ignore_index
        self.own: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def add(self, logits: torch.Tensor, batch: dict) -> None:
        """This rank's ``logits`` ``[L_local, V]`` of micro-batch ``batch`` (every rank of its group calls it)."""
        if batch.get("idle") or not batch.get("ranks"):
            return
        ranks, cp_rank = tuple(int(r) for r in batch["ranks"]), int(batch.get("cp_rank", 0))
        labels = batch["labels"].to(logits.device)
        if len(ranks) > 1:
            shards = _to_first(logits.detach(), labels, ranks, cp_rank)
            if shards is None:
                return
            logits, labels = _in_order(shards, batch["cu_seqlens"], len(ranks))
        cu = [int(c) * len(ranks) for c in batch["cu_seqlens"].tolist()]
        for j, index in enumerate(batch["sample_indices"]):
            if int(batch["read_status"][j]) & SKIPPED:
                continue
            n = int(batch["sample_tokens"][j])
            doc = logits[cu[j]:cu[j] + n].detach()
            shifted = labels[cu[j]:cu[j] + n]
            unshifted = torch.cat([shifted.new_full((1,), self.ignore_index), shifted[:-1]])
            if self.preprocess is not None:
                doc = self.preprocess(doc[None], unshifted[None])[0]
            if doc.dtype == torch.bfloat16:  # numpy has no bfloat16 (the stock loop casts it the same way)
                doc = doc.float()
            self.own[int(index)] = (doc.cpu().numpy(), unshifted.cpu().numpy())

    def gather(self) -> tuple[np.ndarray | None, np.ndarray | None, list[int]]:
        """``(predictions, label_ids, sample indices)`` of every rank's samples, in dataset order, padded with -100
        along the sequence; ``(None, None, [])`` when nothing was collected anywhere."""
        parts = [self.own]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            parts = [None] * dist.get_world_size()
            dist.all_gather_object(parts, self.own)
        merged: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for part in parts:
            merged.update(part)
        if not merged:
            return None, None, []
        order = sorted(merged)
        return (pad_stack([merged[i][0] for i in order]), pad_stack([merged[i][1] for i in order]), order)


def _to_first(logits: torch.Tensor, labels: torch.Tensor, ranks: tuple[int, ...], cp_rank: int):
    """Every rank's ``(logits, labels)`` shard on the group's CP rank 0 (a list in CP-rank order); None elsewhere.
    All ranks of a group hold the same number of tokens, so the shapes are known."""
    if cp_rank != 0:
        ops = [dist.P2POp(dist.isend, logits.contiguous(), ranks[0], tag=_TAG),
               dist.P2POp(dist.isend, labels.contiguous(), ranks[0], tag=_TAG + 1)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return None
    got = [(logits, labels)] + [(torch.empty_like(logits), torch.empty_like(labels)) for _ in ranks[1:]]
    ops = []
    for peer, (lg, lb) in zip(ranks[1:], got[1:]):
        ops += [dist.P2POp(dist.irecv, lg, peer, tag=_TAG), dist.P2POp(dist.irecv, lb, peer, tag=_TAG + 1)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    return got


def _in_order(shards: list, local_cu: torch.Tensor, degree: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The group's documents back in token order from the CP ranks' zigzag shards."""
    cu = local_cu.to(torch.int64) * degree
    total = int(cu[-1])
    logits = shards[0][0].new_empty((total,) + tuple(shards[0][0].shape[1:]))
    labels = shards[0][1].new_empty((total,))
    for r, (lg, lb) in enumerate(shards):
        idx = zigzag_index(cu, degree, r).to(lg.device)
        logits[idx] = lg
        labels[idx] = lb
    return logits, labels


def pad_stack(arrays: list[np.ndarray], pad: Any = -100) -> np.ndarray:
    """``arrays`` (each ``[n_i, ...]``) stacked into ``[len, max n_i, ...]``, padded with ``pad``."""
    longest = max(a.shape[0] for a in arrays)
    out = np.full((len(arrays), longest) + arrays[0].shape[1:], pad,
                  dtype=np.result_type(arrays[0].dtype, np.asarray(pad).dtype))
    for i, a in enumerate(arrays):
        out[i, :a.shape[0]] = a
    return out


def evaluate_dataset(trainer: Any, data: Any, prefix: str, collector: PredictionCollector | None) -> dict:
    """``FCPTrainer``'s evaluation of ``data``: every global batch through :func:`fcp_exec.step.eval_step` (forwards
    only, every rank in lock-step), the token-weighted ``{prefix}_loss`` and ``{prefix}_num_tokens``; with a
    ``collector``, each micro-batch's logits go to it from the same forward."""
    from transformers.trainer_utils import speed_metrics

    from fcp_exec.integrations.hf import batch_inputs, model_loss
    from fcp_exec.step import eval_step

    def loss_fn(model, batch):
        out = model(**batch_inputs(batch, model))
        if collector is not None:
            collector.add(out.logits[0], batch)
        return model_loss(model, out, batch)

    loader = trainer._fcp_loader(data, "eval", trainer._data_seed() + 1)
    count = len(loader) if trainer.fcp_eval_batches is None else min(trainer.fcp_eval_batches, len(loader))
    model = trainer.model_wrapped if trainer.model_wrapped is not None else trainer.model
    was_training = model.training
    model.eval()
    total, tokens, start = 0.0, 0, time.time()
    try:
        for _, batch in zip(range(count), loader):
            with trainer.compute_loss_context_manager():
                res = eval_step(model, batch, loss_fn, pad_token_id=trainer._pads["eval"])
            total, tokens = total + res.loss * res.num_tokens, tokens + res.num_tokens
    finally:
        model.train(was_training)
    samples = sum(len(loader.sampler.global_batch_indices(k)) for k in range(count))
    # the stock loop's speed metrics ({prefix}_runtime, _samples_per_second, _steps_per_second: one step a global batch)
    return {f"{prefix}_loss": total / max(tokens, 1), f"{prefix}_num_tokens": tokens,
            **speed_metrics(prefix, start, num_samples=samples, num_steps=count)}


def metrics_of(compute_metrics: Callable, predictions, label_ids, prefix: str) -> dict:
    """The Trainer's ``compute_metrics(EvalPrediction)`` with its keys prefixed as the stock loop does."""
    from transformers import EvalPrediction

    if predictions is None:
        return {}
    out = compute_metrics(EvalPrediction(predictions=predictions, label_ids=label_ids))
    return {(k if k.startswith(f"{prefix}_") else f"{prefix}_{k}"): v for k, v in dict(out or {}).items()}
