"""What :class:`fcp_exec.integrations.hf_trainer.FCPTrainer` trains on: its loader of whole global batches, and the
token counts, labels and kind of a dataset it is handed (an fcp index, a ``datasets.Dataset``, a list of dicts)."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

__all__ = ["GlobalBatch", "GlobalBatchLoader", "count_lengths", "load_skip_exclusions", "save_skip_exclusions"]

EXCLUSIONS_FILE = "fcp_sampler.json"  # in a Trainer checkpoint folder: the samples left out of later epochs


def save_skip_exclusions(sampler: Any, checkpoint_dir: str) -> None:
    """Write the training sampler's later exclusions (samples that failed to read, left out of the epochs after
    their step) into a Trainer checkpoint folder, so that a run resumed from it plans the same epochs."""
    late = sampler.state_dict()["excluded_later"]
    if late and os.path.isdir(checkpoint_dir):
        with open(os.path.join(checkpoint_dir, EXCLUSIONS_FILE), "w", encoding="utf-8") as f:
            json.dump({"excluded_later": late}, f)


def load_skip_exclusions(sampler: Any, checkpoint_dir: str | None) -> int:
    """Apply a checkpoint's later exclusions (:func:`save_skip_exclusions`) to a training sampler still at the start
    of epoch 0; returns how many samples they leave out. A checkpoint without the file (no sample skipped, or one
    written before it existed) changes nothing."""
    path = os.path.join(checkpoint_dir, EXCLUSIONS_FILE) if checkpoint_dir else ""
    if not path or not os.path.isfile(path):
        return 0
    try:
        with open(path, encoding="utf-8") as f:
            late = json.load(f)["excluded_later"]
        return sum(sampler.exclude_later(indices, epoch) for epoch, indices in late)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is damaged ({e}); delete it to resume without the samples it leaves out, "
                         "which are then read and skipped again") from None


class GlobalBatch(list):
    """This rank's micro-batches (collator dicts, in order) of one global batch: one Trainer step."""

    @property
    def epoch(self) -> int:
        return int(self[0]["epoch"])

    @property
    def global_batch(self) -> int:
        return int(self[0]["global_batch"])


class GlobalBatchLoader:
    """A ``DataLoader`` over an ``FCPSampler`` whose items are whole global batches (:class:`GlobalBatch`).

    ``len()`` is the number of global batches per epoch (the Trainer's steps per epoch); ``set_epoch`` selects the
    sampler's epoch (a position moved by :meth:`skip_to` in that epoch survives it); each ``iter()`` yields the
    rest of the sampler's epoch from where it stands."""

    def __init__(self, loader: DataLoader, sampler: Any) -> None:
        self.loader, self.sampler = loader, sampler
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return self.sampler.num_global_batches()

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def skip_to(self, epoch: int, global_batch: int) -> "GlobalBatchLoader":
        """Start the next iteration at ``global_batch`` of ``epoch`` (global batches before it are not read)."""
        if global_batch > 0:
            last = SimpleNamespace(epoch=epoch, global_batch=global_batch - 1)
            self.sampler.load_state_dict(self.sampler.state_after(last))
        else:
            self.sampler.set_epoch(epoch)
        return self

    def __iter__(self):
        current = GlobalBatch()
        for mb in self.loader:
            current.append(mb)
            if int(mb["micro_batch"]) == int(mb["num_micro_batches"]) - 1:
                yield current
                current = GlobalBatch()
        if current:  # the sampler never ends an epoch inside a global batch
            raise RuntimeError(f"the loader ended inside global batch {current.global_batch} "
                               f"({len(current)} of {current[0]['num_micro_batches']} micro-batches)")


def _is_indexed(data: Any) -> bool:
    """An ``fcp_data.IndexedDataset`` (its ``index`` is a LengthIndex; a list's ``index`` is a method)."""
    return hasattr(data, "placeholder_runs") and not callable(getattr(data, "index", None))


def count_lengths(data: Any, which: str = "train") -> np.ndarray:
    """Every sample's token count, ``len(sample["input_ids"])`` — or the ones of its ``attention_mask``: padding is
    stripped when read (:func:`fcp_exec.integrations.hf_samples.strip_padding`) — read sample by sample (a progress
    bar from 10,000 samples on): what the sampler plans with when the dataset is not an fcp index and no lengths
    were given. An fcp
    index (``fcp index``) or ``{which}_lengths=`` avoids reading the data; each rank counts for itself. A sample
    without tokens is one error naming it (nothing to train on; the planner takes no empty sequence)."""
    if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
        raise ValueError(f"FCPTrainer: the {which} dataset ({type(data).__name__}) is not map-style (len() and [i]): "
                         "the sampler picks each sample by its index; pass a map-style dataset (a datasets.Dataset, "
                         "not streaming) or an fcp_data.IndexedDataset (`fcp index ... --out DIR`)")
    from fcp_exec.integrations.hf_samples import _attended_counts

    out = _attended_counts(data)  # a padded datasets.Dataset: its attended tokens (padding is stripped when read)
    if out is None:
        out = _arrow_lengths(data)
    if out is None:
        out = _read_lengths(data, which)
    empty = np.flatnonzero(out == 0)
    if len(empty):
        raise ValueError(f"FCPTrainer: {len(empty)} {which} sample(s) have no tokens (first: sample {empty[0]}); there "
                         "is nothing to train on in them: leave them out (datasets: .filter(lambda s: "
                         "len(s['input_ids']) > 0))")
    return out


def _read_lengths(data: Any, which: str) -> np.ndarray:
    from tqdm.auto import tqdm

    out = np.empty(len(data), dtype=np.int64)
    for i in tqdm(range(len(data)), desc=f"FCPTrainer: token lengths of the {which} dataset", unit="sample",
                  disable=len(data) < 10_000):
        sample = data[i]
        ids = sample.get("input_ids") if isinstance(sample, dict) else None
        if ids is None:
            raise ValueError(f"FCPTrainer: {which} sample {i} has no input_ids ({type(sample).__name__}); the sampler "
                             f"needs token counts: tokenize the dataset first, or pass an fcp_data.IndexedDataset "
                             f"(`fcp index ... --out DIR`) or {which}_lengths=")
        if _nested(ids):  # [1, L] from a tokenizer's return_tensors="pt": len() is 1, every sample read as "stale"
            raise ValueError(f"FCPTrainer: {which} sample {i}'s input_ids are nested (a batch of token lists, shape "
                             f"{tuple(np.shape(ids)) if hasattr(ids, 'shape') else (len(ids), '...')}), not one token "
                             "list: tokenize without return_tensors (or take [0] of a batch of one)")
        mask = sample.get("attention_mask")  # padded: its attended tokens (hf_samples.strip_padding)
        out[i] = len(ids) if mask is None else int(np.asarray(mask).sum())
    return out


def _nested(ids: Any) -> bool:
    """Whether ``input_ids`` hold token lists rather than tokens (a tensor or array of 2+ dims, a list of lists); a
    malformed sample of another kind (a string, a scalar) is left to FCPDataset, which records and skips it."""
    if getattr(ids, "ndim", None) is not None:
        return ids.ndim >= 2
    if not isinstance(ids, (list, tuple)) or not ids:
        return False
    return isinstance(ids[0], (list, tuple)) or getattr(ids[0], "ndim", 0) >= 1  # a 0-d tensor is one token


def _arrow_lengths(data: Any) -> np.ndarray | None:
    """A Hugging Face ``datasets.Dataset`` with an ``input_ids`` list column: its lengths from the Arrow column in one
    call (after ``shuffle``/``select``/``filter``, in the dataset's own order) instead of a read per sample (measured:
    149,000 rows in 0.23 s, against 0.38 s per 20,000 rows read one by one). None for anything else."""
    import pyarrow.compute as pc

    from fcp_exec.integrations.hf_samples import arrow_list_column

    column = arrow_list_column(data, "input_ids")
    if column is None:
        return None  # read sample by sample: a missing input_ids is then named by its index
    return pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)


def _has_labels(data: Any) -> bool:
    """Whether the samples carry their own ``labels`` (SFT): an fcp index says so; a list or tuple if any of its samples
    does (a sample without them trains on its ``input_ids``); another dataset's first sample."""
    if hasattr(data, "has_labels"):
        return bool(data.has_labels)
    labeled = None
    if isinstance(data, (list, tuple)):  # in memory: any sample's labels count, not only the first's (a review)
        labeled = next((s for s in data if isinstance(s, dict) and s.get("labels") is not None), None)
    try:
        first = data[0] if labeled is None else labeled
    except Exception:  # noqa: BLE001 - an unreadable first sample: the collator's own labels, as by default
        return False
    if not isinstance(first, dict):
        return False
    masks = [k for k in _LOSS_MASKS if first.get(k) is not None]
    if masks and first.get("labels") is None:  # a trainer's collator would have masked the loss with them
        raise ValueError(f"FCPTrainer: the samples carry {', '.join(masks)} but no labels; FCPTrainer trains on the "
                         "samples' labels (-100: no loss) and would train on every token: build labels from the "
                         "mask (TRL's SFTTrainer does from version 1.x on)")
    return first.get("labels") is not None


_LOSS_MASKS = ("completion_mask", "assistant_masks")


def input_tokens(batches: Any, mode: Any) -> int:
    """This rank's share of ``num_input_tokens_seen`` for one global batch: ``"non_padding"``, the samples' tokens
    (what the stock Trainer's ``attention_mask`` sums), each counted once (on its CP group's first rank; a sample that
    failed to read not at all); otherwise (``"all"``) every token the model ran on, FCP's padding included."""
    if mode == "non_padding":
        from fcp_data.read_errors import SKIPPED

        return sum(int(n) for mb in batches if mb.get("ranks") and int(mb.get("cp_rank", 0)) == 0
                   for n, st in zip(mb["sample_tokens"], mb["read_status"]) if not int(st) & SKIPPED)
    return sum(int(mb["input_ids"].numel()) for mb in batches if mb.get("ranks"))
