"""A document that failed to read on *some* ranks of its CP group is skipped on all of them, before the forward.

Every rank of a CP group reads every document of the group (:mod:`fcp_data.slots`), so a read that fails on one
rank only — a flaky mount, one node's corrupted cache, a file replaced between two reads — leaves the group with
the document packed as label-free filler on that rank and as the real document, with labels, on its peers. Left
so, the peers would train their zigzag halves of it on a context that is partly filler, and the denominator would
lose the document's labels on one rank while its peers still count theirs.

:func:`agree_skips` (called by :func:`fcp_exec.step.train_step` and ``eval_step`` on every micro-batch, before its
forward) makes the group agree: each rank sends its batch's ``read_status`` (one small int64 tensor, P2P to each
peer of the group; nothing at degree 1 or on an idle rank) and takes the union. A document skipped anywhere in the
group then has no label on any rank (its tokens still run, so every shape and collective stays as planned; a
document without labels contributes exact zeros to the gradients, whatever its tokens or pixels), and the
denominator loses its labels exactly once: with the sampler's count (``FCPCollator(sample_labels=False)``) the
group's CP rank 0 adds the document's ``planned_labels`` to ``num_skipped_labels`` unless it had skipped it itself;
with the samples' own labels the ranks' ``num_label_tokens_local`` drop by the labels masked, before they are summed.

The images/videos of such a document must still line up across the group (the frame exchange of
:mod:`fcp_exec.vision_exchange` sends rows by the group's frame table): a rank whose read failed packs the sample's
skeleton (``IndexedDataset.skeleton``; a dataset of your own can have a ``skeleton(i)`` method) or, without one,
plain pads. Plain pads against a peer's real images/videos would leave the group with two different frame tables;
the statuses say so (``LAYOUT_UNKNOWN`` on one rank, ``VISUAL`` on another) and every rank of the group raises
the same :class:`~fcp_data.read_errors.SampleReadError` naming the sample and the ranks, instead of hanging in the
exchange.

A training loop of your own calls ``batch = agree_skips(batch, device)`` on every rank for every micro-batch before
its forward (after reading, for ``sample_labels=True``, before :func:`fcp_exec.step.fill_num_tokens_global`).

After the step, :func:`leave_out_later` leaves the samples any rank skipped out of the sampler's later epochs (a
damaged file is not read, and its slot not padded, again), on every rank alike.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from fcp_data.read_errors import LAYOUT_UNKNOWN, SKIPPED, VISUAL, SampleReadError
from fcp_data.sampler_exclude import ExclusionRefused
from fcp_data.sampler_inputs import dist_rank_and_world
from fcp_exec.comm import validate_ranks

logger = logging.getLogger("fcp_exec")

__all__ = ["agree_skips", "leave_out_later"]

_TAG = 7300


def agree_skips(batch: dict, device: torch.device | str | None = None, *, ignore_index: int = -100) -> dict:
    """``batch`` with the group's skips agreed (module docstring): a new dict where anything changed (``labels``
    cloned), ``batch`` itself at degree 1, on an idle rank or when it was agreed already. ``device``: where the
    process group's backend takes tensors (the model's device; CPU for gloo). Every rank of the group must call it
    for the same micro-batch."""
    ranks = tuple(batch.get("ranks") or ())
    if len(ranks) < 2 or batch.get("skips_agreed") or "read_status" not in batch:
        return batch
    ranks = validate_ranks(ranks)  # duplicates or negatives: one error here, not an IndexError in a p2p of torch's
    if not 0 <= int(batch["cp_rank"]) < len(ranks):
        raise ValueError(f"cp_rank {batch['cp_rank']} is outside the CP group ranks={list(ranks)}")
    own = torch.tensor(batch["read_status"], dtype=torch.int64)
    statuses = _exchange(own, ranks, int(batch["cp_rank"]), device)
    out = dict(batch, skips_agreed=True)
    union = torch.zeros_like(own)
    for s in statuses.values():
        union |= s
    if not bool((union & SKIPPED).any()):
        return out
    _check_layouts(batch, statuses, union)
    newly = torch.nonzero((union & SKIPPED).bool() & ~(own & SKIPPED).bool()).flatten().tolist()
    if newly:
        _mask_documents(out, newly, ignore_index)
    out["read_status"] = tuple(int(x) for x in union.tolist())  # the group's statuses: skipped anywhere = skipped
    return out


def _exchange(own: torch.Tensor, ranks: tuple[int, ...], cp_rank: int, device) -> dict[int, torch.Tensor]:
    """Every group rank's ``read_status`` (CPU), by global rank: one send to and one receive from each peer."""
    me = ranks[cp_rank]
    wire = own.to(device) if device is not None else own
    recvs = {p: torch.empty_like(wire) for p in ranks if p != me}
    if own.numel():
        ops = [dist.P2POp(dist.isend, wire, p, tag=_TAG) for p in recvs]
        ops += [dist.P2POp(dist.irecv, t, p, tag=_TAG) for p, t in recvs.items()]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    out = {p: t.cpu() for p, t in recvs.items()}
    out[me] = own
    return out


def _check_layouts(batch: dict, statuses: dict[int, torch.Tensor], union: torch.Tensor) -> None:
    """Raise on every rank of the group alike when a document with images/videos was read by some ranks and packed as
    plain pads (no skeleton) by others: their frame tables would differ and the frame exchange could not match."""
    bad = torch.nonzero((union & LAYOUT_UNKNOWN).bool() & (union & VISUAL).bool()).flatten().tolist()
    if not bad:
        return
    j = bad[0]
    failed = sorted(r for r, s in statuses.items() if int(s[j]) & SKIPPED)
    read = sorted(r for r, s in statuses.items() if not int(s[j]) & SKIPPED)
    raise SampleReadError(
        f"sample {batch['sample_indices'][j]} failed to read on rank(s) {failed} but was read, with images/videos, on "
        f"rank(s) {read} of CP group {tuple(batch['ranks'])} (global batch {batch.get('global_batch')}, micro-batch "
        f"{batch.get('micro_batch')}), and the dataset gives no skeleton for it, so the group's visual inputs would "
        "differ: give the dataset a skeleton(i) method (the sample without pixels: fcp_data.read_errors), or build "
        "it with fcp_data.readers.IndexedDataset, which has one")


def _mask_documents(out: dict, docs: list[int], ignore_index: int) -> None:
    """No label on documents ``docs`` of this rank's batch ``out`` (read here, skipped by a peer) and the denominator
    without them: this rank's ``num_label_tokens_local`` (samples' own labels), else ``num_skipped_labels`` on the
    group's CP rank 0 (the sampler's planned count, once per group)."""
    labels, cu = out["labels"].clone(), out["cu_seqlens"].tolist()
    masked = 0
    for j in docs:
        lo, hi = int(cu[j]), int(cu[j + 1])
        masked += int((labels[lo:hi] != ignore_index).sum())
        labels[lo:hi] = ignore_index
    out["labels"] = labels
    if "future_labels" in out:  # multi-token prediction's targets (fcp_data.lookahead): none for these documents either
        future = out["future_labels"].clone()
        for j in docs:
            future[:, int(cu[j]):int(cu[j + 1])] = ignore_index
        out["future_labels"] = future
    if "num_label_tokens_local" in out:
        out["num_label_tokens_local"] = int(out["num_label_tokens_local"]) - masked
    elif int(out["cp_rank"]) == 0:
        out["num_skipped_labels"] = int(out.get("num_skipped_labels", 0)) + sum(int(out["planned_labels"][j]) for j in docs)


def leave_out_later(sampler, step, *, same_num_global_batches: bool = False) -> int:
    """After a training step, on every rank: the samples any rank skipped in it are left out of the epochs after the
    step's (``FCPSampler.exclude_later(indices, epoch + 1)``), so they are neither read nor planned again; the
    sampler's state (``state_after``) carries them to a resumed run. ``step``: :func:`fcp_exec.step.train_step`'s
    result — no collective when nothing was skipped anywhere (``num_skipped_global``, from the step's own
    all-reduce), else one ``all_gather_object`` of the indices — or this rank's micro-batch dicts of the global batch
    (a loop without ``train_step``, e.g. Megatron's schedule: one ``all_gather_object`` per step). Returns how many
    samples were newly left out (0, with a warning, when leaving them out would leave an epoch without a global batch,
    or with ``same_num_global_batches`` change its number of global batches — the Hugging Face Trainer's steps per
    epoch: they are then read and skipped again — the run goes on either way)."""
    if hasattr(step, "num_skipped_global"):
        if not step.num_skipped_global:
            return 0
        mine, epoch = sorted({int(r["index"]) for r in step.skipped}), int(step.epoch)
    else:
        batches = list(step)
        if not batches:
            raise ValueError("leave_out_later: no micro-batch given (pass train_step's result or the step's batches)")
        mine = sorted({int(r["index"]) for b in batches for r in b.get("skipped_samples", ())})
        epoch = int(batches[0]["epoch"])
    world = dist_rank_and_world()[1]
    every: list = [mine]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, mine)
    union = sorted({i for part in every for i in part})
    if not union:
        return 0
    lo, hi, why, newly = 0, len(union), None, 0  # the most of them (in index order) that can go: all, unless refused
    while lo < hi:  # a refusal changes nothing, a success adds to the last: binary search, alike on every rank
        mid = (lo + hi + 1) // 2
        try:
            newly += sampler.exclude_later(union[:mid], epoch + 1, same_num_global_batches=same_num_global_batches)
            lo = mid
        except ExclusionRefused as e:  # the next epoch would be empty or (HF Trainer) change length: read them again
            hi, why = mid - 1, e
    if lo < len(union):
        logger.warning("fcp: %d of the %d skipped sample(s) stay in later epochs, read and skipped again (%s)",
                       len(union) - lo, len(union), why)
    return newly
