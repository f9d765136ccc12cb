"""Samples left out of later epochs while a run goes on (:meth:`fcp_data.sampler.FCPSampler.exclude_later`).

A sample that failed to read is skipped where it fails (:mod:`fcp_data.read_errors`), but it stays in the plans of
later epochs: read and skipped again each time, its slot's GPU time spent on padding. ``exclude_later(indices,
epoch)`` leaves those samples out of ``epoch`` and every later one; the training loop calls it on every rank after
each step with the union of every rank's skips, from the next epoch on (:func:`fcp_exec.skips.leave_out_later`;
``fcp train`` and the examples do).

Rules that keep every rank's plans equal:

* An epoch's order is ``kept[permutation(len(kept))]`` with ``kept`` the samples of *that* epoch: the sampler's own
  (over-long policy, ``exclude=``) minus every later exclusion registered for an epoch ≤ it. So the epochs before
  ``epoch`` are untouched, and ``epoch`` is planned exactly as a sampler built with those samples in ``exclude=``.
* ``epoch`` must come after the position's epoch (whose iterator may exist already: ``FCPSampler(exclude=...)``
  leaves samples out from the start). Plans the planner thread made ahead for ``epoch`` or later (it runs into the
  next epoch's first global batches) are dropped and made again; the layout caches of those epochs too (under the
  layout lock, so a planning call running meanwhile sees either the old data and is discarded, or the new).
* The exclusions are part of the sampler's state (``excluded_later``, state version 3): a resumed run plans the same
  epochs. They accumulate (a second call adds to the first) and never empty an epoch (a ``ValueError`` instead).
* ``same_num_global_batches=True`` (``FCPTrainer``: the Hugging Face Trainer takes the number of steps per epoch
  as fixed, for ``max_steps`` and for where a resumed run starts) refuses, with a ``ValueError`` and no change,
  exclusions that would change the number of global batches of an epoch they reach: with ``drop_last=False``
  fewer samples than the last global batch holds, with ``drop_last=True`` no more than the epoch drops.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from fcp_data.sampler_inputs import load_exclusions
from fcp_data.strict import flag

logger = logging.getLogger("fcp_data")

__all__ = ["ExclusionRefused", "exclude_later", "kept_at", "late_from_state", "late_to_state", "load_late", "set_late"]


class ExclusionRefused(ValueError):
    """Exclusions that would leave an epoch with no global batch (or, with ``same_num_global_batches``, another
    number of them): nothing changed. A loop that leaves skipped samples out may go on reading them instead."""

Late = tuple[tuple[int, np.ndarray], ...]  # (first epoch, sorted distinct indices), in order of first epoch


def kept_at(kept: np.ndarray, late: Late, epoch: int) -> np.ndarray:
    """The samples of ``epoch``: ``kept`` without the later exclusions registered for an epoch ≤ it."""
    out = [idx for first, idx in late if first <= epoch]
    return kept if not out else np.setdiff1d(kept, np.concatenate(out), assume_unique=False)


def late_to_state(late: Late) -> list[list[Any]]:
    """JSON form: ``[[epoch, [index, …]], …]``."""
    return [[int(first), [int(i) for i in idx]] for first, idx in late]


def late_from_state(value: Any, num_samples: int) -> Late:
    """The later exclusions of a state (``excluded_later``), strictly checked: a list of ``[epoch, [indices]]``
    with int epochs ≥ 0 in increasing order and indices in ``[0, num_samples)``."""
    where = "FCPSampler state excluded_later"
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of [epoch, [sample indices]], got {type(value).__name__}")
    out, last = [], -1
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int) and not isinstance(item[0], bool)
                and isinstance(item[1], list)):
            raise ValueError(f"{where}: {item!r} is not [epoch, [sample indices]]")
        if item[0] <= last:
            raise ValueError(f"{where}: epochs must be increasing, got {item[0]} after {last}")
        idx = load_exclusions(item[1], num_samples)
        out.append((int(item[0]), idx))
        last = item[0]
    return tuple(out)


def exclude_later(sampler: Any, indices: Any, epoch: int, *, same_num_global_batches: bool = False) -> int:
    """Register ``indices`` as left out of ``epoch`` and later on ``sampler`` (module docstring); returns how many
    were not left out already."""
    from fcp_data.sampler_state import check_int

    epoch = check_int("epoch", epoch, "FCPSampler.exclude_later")
    same_num_global_batches = flag("same_num_global_batches", same_num_global_batches)
    if epoch >= 2**62:  # as set_epoch: plan digests hold the epoch in an int64
        raise ValueError(f"FCPSampler.exclude_later: epoch must be < 2**62, got {epoch}")
    indices = load_exclusions(indices, sampler.lengths.size)
    e, g, m = sampler._position
    if epoch <= e:  # the position's epoch may have an iterator already (its global batch count taken)
        raise ValueError(f"FCPSampler.exclude_later: epoch {epoch} is not after the sampler's position (epoch {e}, "
                         f"global batch {g}, micro-batch {m}); exclude from a later epoch, e.g. {e + 1} "
                         "(from the start: FCPSampler(exclude=...))")
    have = [idx for _, idx in sampler._late] + [sampler.excluded]
    new = np.setdiff1d(indices, np.concatenate(have))
    if not new.size:
        return 0
    late = dict(sampler._late)
    late[epoch] = np.union1d(late.get(epoch, np.zeros(0, dtype=np.int64)), new)
    set_late(sampler, tuple(sorted(late.items())), epoch, same_num_global_batches=same_num_global_batches)
    _stale(sampler, epoch, "exclude_later")
    logger.warning("FCPSampler leaves %d more sample(s) out of epoch %d and later (exclude_later), first: sample %d",
                   new.size, epoch, int(new[0]))
    return int(new.size)


def set_late(sampler: Any, late: Late, first: int = 0, *, same_num_global_batches: bool = False) -> None:
    """Make ``late`` the sampler's later exclusions, changing epochs ``first`` and later: their layout caches, counts
    and plans are dropped (layouts under the layout lock) and the plan window plans their keys again. An epoch left
    with no global batch — or, with ``same_num_global_batches``, with another number of them — is an
    :class:`ExclusionRefused` (a ``ValueError``) and nothing changes."""
    old = sampler._late
    if late_to_state(late) == late_to_state(old):
        return
    before = {f: sampler.num_global_batches(f) for f, _ in late} if same_num_global_batches else {}
    _swap(sampler, late, first)
    try:
        for f, _ in late:
            n = sampler.num_global_batches(f)
            if n == 0:
                raise ExclusionRefused(f"FCPSampler.exclude_later: epoch {f} would have no global batch left (every "
                                       "sample excluded, or drop_last=True with less than one global batch)")
            if same_num_global_batches and n != before[f]:
                raise ExclusionRefused(f"FCPSampler.exclude_later: epoch {f} would have {n} global batches instead "
                                       f"of {before[f]} (same_num_global_batches)")
    except ValueError:
        _swap(sampler, old, first)
        raise
    if sampler._window is not None:
        sampler._window.forget_from(first)


def load_late(sampler: Any, state: Any, loading: Any = None) -> tuple[int, int, int]:
    """Take over ``state``'s later exclusions (they decide the epochs' global batches), then check the state:
    ``(epoch, global_batch, micro_batch)``; a refused state leaves the sampler's exclusions as they were. Other
    iterators than ``loading`` (the one being re-positioned, if any) stop where new exclusions changed their epoch."""
    late, old = late_from_state(state.get("excluded_later", []) if isinstance(state, dict) else [],
                                sampler.lengths.size), sampler._late
    set_late(sampler, late)
    try:
        position = sampler.check_state(state)
    except (TypeError, ValueError):
        set_late(sampler, old)
        raise
    if late_to_state(late) != late_to_state(old):
        _stale(sampler, 0, "a loaded state's exclusions", loading)
    return position


def _stale(sampler: Any, first: int, why: str, keep: Any = None) -> None:
    """Iterators other than ``keep`` in epoch ``first`` or later, mid-way, stop: their epoch changed (the owner
    iterator's epoch is never one ``exclude_later`` may change)."""
    for it in list(sampler._iterators):
        if it is not keep:
            it.stale_from(first, why)


def _swap(sampler: Any, late: Late, first: int) -> None:
    with sampler._layout_lock:
        sampler._late = late
        sampler._late_live[:] = late_to_state(late)  # in place: iterator states hold this list (prefetch.py)
        for cache in (sampler._layouts, sampler.__dict__.get("_batch_digests", {}), sampler._counts):
            for k in [k for k in cache if k >= first]:
                del cache[k]
        sampler._planned = {k: v for k, v in sampler._planned.items() if k[0] < first}
