"""FCPSampler (a plan-annotated batch sampler), SampleSlot, SlotList and FCPDataset (DESIGN.md §7).

Every rank builds the same plan from ``(seed, epoch, lengths, config)`` with no communication:

* **Epoch order.** The kept samples (see ``on_overlong``) are permuted with
  ``numpy.random.default_rng([seed, epoch])`` and cut into global batches in that order — consecutive
  ``global_batch_size`` sequences, or greedily up to ``global_batch_tokens`` tokens (a batch always holds at
  least one sequence). ``drop_last=False`` keeps the last partial global batch (planned like any other);
  ``drop_last=True`` drops it (in token mode: the last batch unless it is exactly full).
* **Planning.** Each global batch is planned by :func:`fcp_data.plan.plan_batch` into micro-batches of CP
  groups over all ``num_ranks`` ranks; each sample lands in exactly one group of one micro-batch per epoch.
  ``solver_options`` (a dict of JSON scalars, e.g. ``{"degree": 2}`` for ``solver="static-cp"``) are
  passed to every ``plan_batch`` call; they are part of the state's config fingerprint.
* **Yield.** For every micro-batch this rank gets one :class:`SlotList` of :class:`SampleSlot` — the
  samples of its CP group in packing order, or an empty list if it is idle in that micro-batch. So every
  rank yields the same number of lists, in the same order. The micro-batch's metadata is one
  :class:`MicroBatchMeta` shared by the list and its slots (:mod:`fcp_data.slots`).
* **Over-long samples** (more than ``num_ranks · tokens_per_rank`` tokens: no micro-batch could hold
  them): ``"error"`` raises ``ValueError`` at construction naming the first one; ``"truncate"`` keeps the
  first ``num_ranks · tokens_per_rank`` tokens (the slot's ``num_tokens``; the collator cuts the sample);
  ``"drop"`` removes them from every epoch. ``num_truncated``/``num_dropped`` count them and one warning
  is logged (with a visual layout, one more for cuts inside an image's placeholders).
* **Excluded samples** (``exclude=``: indices, or a file of them, e.g. the read errors an earlier run recorded:
  :func:`fcp_data.sampler_inputs.load_exclusions`) are left out of every epoch (``excluded``; one warning logged);
  ``exclude_later(indices, epoch)`` leaves samples out of a later epoch on (:mod:`fcp_data.sampler_exclude`).
* **Label counts.** ``num_tokens_global`` = Σ (num_tokens − 1) over the global batch;
  ``num_text_labels_global`` = the same without labels whose target is a visual placeholder (what
  ``FCPCollator(mask_visual_labels=True)`` reports as the loss denominator), computed exactly — truncation
  included — with a *visual layout* (:mod:`fcp_data.visual_layout`): taken from a ``LengthIndex`` automatically
  (``num_visual_tokens`` + its spec), or given as ``visual_layout=`` (a callable ``(i, n) → placeholders
  among positions 1..n−1``, e.g. :class:`SpanVisualLayout`). With plain lengths and no layout it is
  ``None`` and the collator refuses to mask visual labels.
* **Visual tokens in the cost.** The planner charges the vision encoder (cost model v2, DESIGN §4.1) for
  ``index.num_visual_tokens`` of a ``LengthIndex``, or for ``visual=`` (one count per sample) with plain lengths.
* **Micro-batches.** ``micro_batches="auto"`` lets the planner choose the count per global batch (fewest
  that fit, a few more tried, smallest summed makespan); an int ``M`` asks for exactly ``M`` per global
  batch (``min(M, size)`` for a last batch with fewer sequences) and raises if they do not fit in memory.
* **len()** is the number of lists of the current epoch, equal on all ranks and what an iterator from its start
  yields (after a mid-epoch ``load_state_dict``, the next iterator yields the rest of it); O(1) for an int
  ``micro_batches``. With ``"auto"`` the micro-batch count of a global batch is known only after
  planning it, so the first ``len()`` of an epoch plans every global batch of the epoch (in the calling
  thread; cached per epoch, and batches already planned by an iterator are not planned again). Iteration
  itself never needs ``len()``.
* **Position and resume**: :mod:`fcp_data.sampler_state` (the sampler is a cursor; ``state_dict()`` resumes
  at the exact next list, strictly checked; at a global-batch boundary also under another world size).
* **Prefetch.** The sampler plans ``prefetch`` global batches ahead of its current iterator, in the order
  they are yielded, on one daemon thread (``fcp-planner``) started at the iterator's first ``next()`` (after
  DataLoader workers have forked): :class:`fcp_data.prefetch.PlanWindow`, futures keyed by
  ``(epoch, global batch)``. Planner errors are re-raised in the training process with the planner's
  traceback. ``close()`` on the iterator, re-positioning it or its garbage collection stops the thread;
  when the epoch ends, or the iterator is superseded by a newer ``iter()``, the thread plans what is
  scheduled (at most ``prefetch`` global batches) and ends by itself. ``planner_waits`` holds the seconds
  the consumer waited for the plans of the latest 100,000 global batches (``planner_wait_total``: the whole
  run's). ``prefetch=0`` plans in the consumer's thread.
* **Across epochs.** The window runs on past the last global batch of epoch ``e`` into the first
  ``prefetch`` global batches of epoch ``e+1`` (whose order is a pure function of ``(seed, e+1)``), so
  that the first step of the next epoch does not wait either (with one global batch per epoch, every
  step). The next iterator that starts where the window is (epoch ``e+1``, global batch 0) takes those
  plans instead of planning again (``num_speculative_hits`` counts plans an iterator found scheduled when
  it started); ``set_epoch(x)`` with another start, and ``load_state_dict``, cancel and discard them.
  The plans are the same either way: a plan depends only on ``(epoch, global batch)`` and the config.
* **DataLoader.** ``batch_sampler`` is iterated in the main process, also with workers. A plain
  DataLoader with workers pulls ``prefetch_factor · num_workers`` lists ahead of the training loop, so
  ``sampler.state_dict()`` is that far ahead of what was trained on (without workers it is exact): checkpoint
  ``sampler.state_after(last batch or train_step's result)`` (:mod:`fcp_exec.checkpoint` does), or use torchdata's
  ``StatefulDataLoader`` (it snapshots the sampler iterator per batch). A DataLoader started after
  ``load_state_dict`` yields exactly the remaining lists, with or without workers. A DataLoader with
  ``persistent_workers`` (and any ``StatefulDataLoader``) keeps its last iterator (and an idle planning thread)
  until its next ``iter()`` or deletion. Workers: ``multiprocessing_context=worker_context(...)`` (fcp_data.workers).
* **Epochs.** As with ``DistributedSampler``, call ``set_epoch(e)`` (an ``int``) before each epoch. Without
  it, ``iter()`` after a finished epoch starts the next one (position above).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import weakref
from typing import Any, Iterator

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan.types import Plan
from fcp_data.sampler_config import SamplerConfig
from fcp_data.prefetch import PlanWindow, SamplerIterator, warn_continued
from fcp_data.sampler_state import check_int, check_state, make_state, state_after
from fcp_data.sampler_exclude import exclude_later, kept_at, load_late
from fcp_data.sampler_inputs import (apply_overlong, check_epoch_possible, check_lengths, check_visual, data_digest,
                                    dist_rank_and_world, load_exclusions, resolve_exclusions, warn_cut_visual,
                                    warn_drop_last)
from fcp_data.slots import FCPDataset, MicroBatchMeta, SampleSlot, SlotList, rank_lists
from fcp_data.visual_layout import IndexVisualLayout, SpanVisualLayout

__all__ = ["FCPSampler", "SampleSlot", "SlotList", "MicroBatchMeta", "FCPDataset", "dist_rank_and_world",
           "IndexVisualLayout", "SpanVisualLayout"]

logger = logging.getLogger(__name__)
_KEEP_PLANS = 256  # plans len() keeps for the iteration (a few MB at 512 sequences per global batch)
_KEEP_WAITS = 100_000  # planner_waits: the latest global batches' waits (bounded over a long run)
_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplerConfig))


class FCPSampler:
    """Batch sampler yielding this rank's :class:`SlotList` for every planned micro-batch (module doc)."""

    def __init__(self, lengths_or_index: Any, num_ranks: int | None = None, rank: int | None = None, *,
                 cost_model: CostModel, global_batch_size: int | None = None,
                 global_batch_tokens: int | None = None, seed: int = 0, drop_last: bool = False,
                 on_overlong: str = "error", prefetch: int = 2, solver: str = "fcp",
                 micro_batches: str | int = "auto", etas: Any = None,
                 solver_options: dict[str, Any] | None = None, visual_layout: Any = None, visual: Any = None,
                 exclude: Any = None) -> None:
        d_rank, d_world = dist_rank_and_world()
        self.config = SamplerConfig(
            num_ranks=d_world if num_ranks is None else num_ranks, rank=d_rank if rank is None else rank,
            cost_model=cost_model, global_batch_size=global_batch_size, global_batch_tokens=global_batch_tokens,
            seed=seed, drop_last=drop_last, on_overlong=on_overlong, prefetch=prefetch, solver=solver,
            micro_batches=micro_batches, solver_options=solver_options)
        self._init_data(lengths_or_index, etas, visual, visual_layout, exclude)
        self._position = (0, 0, 0)  # (epoch, global_batch, micro_batch) of the next list (module doc)
        self._owner = 0  # generation of the iterator that moves the position; bumped to retire it
        self._live: weakref.ref | None = None  # that iterator, to release the plan window when retired
        self._handed_out = False  # whether the owner iterator yielded a list since the position was set
        self._layouts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._layout_lock = threading.Lock()
        self._counts: dict[int, dict[int, int]] = {}
        self._planned: dict[tuple[int, int], Any] = {}  # plans len() made, taken by the iteration (at most _KEEP_PLANS)
        self.planner_waits: collections.deque[float] = collections.deque(maxlen=_KEEP_WAITS)
        self.planner_wait_total = 0.0  # seconds over every global batch (planner_waits keeps the latest)
        self._iterators: weakref.WeakSet = weakref.WeakSet()  # live iterators (exclude_later: prefetch.stale_from)
        self.num_speculative_hits = 0
        self._window: PlanWindow | None = None  # plans ahead of the owner iterator, across epochs (prefetch.py)
        self._late: tuple = ()  # exclude_later's (first epoch, indices) (sampler_exclude.py)
        self._late_live: list = []  # their JSON form, updated in place (iterator states hold it: prefetch.py)

    def _init_data(self, lengths_or_index: Any, etas: Any, visual: Any, visual_layout: Any, exclude: Any) -> None:
        """Lengths, η, visual tokens and layout of the data; the over-long policy, exclusions; the data digest."""
        reader = None
        if hasattr(lengths_or_index, "placeholder_runs") and hasattr(lengths_or_index, "index"):
            reader, lengths_or_index = lengths_or_index, lengths_or_index.index  # an IndexedDataset: its index
        lengths, self.etas = check_lengths(lengths_or_index, etas)
        self.visual = check_visual(lengths_or_index, visual, lengths)  # §4.1 cost; a LengthIndex gives its own
        if visual_layout is not None and not callable(visual_layout):
            raise ValueError("visual_layout must be a callable (i, n) -> placeholder tokens among positions 1..n-1 "
                             "of sample i's first n tokens, e.g. SpanVisualLayout")
        if visual_layout is None and hasattr(lengths_or_index, "manifest") and \
                hasattr(lengths_or_index, "num_visual_tokens"):  # a LengthIndex
            visual_layout = IndexVisualLayout(lengths_or_index, reader=reader)
        self.visual_layout = visual_layout
        self.lengths = lengths
        if hasattr(lengths_or_index, "manifest") and hasattr(lengths_or_index, "keys"):  # an index names its samples
            exclude = resolve_exclusions(exclude, lengths_or_index.keys.__getitem__, lengths_or_index.keys.index_of)
        self.excluded = load_exclusions(exclude, lengths.size)
        self.capacity, over_kept, self.num_truncated, self.num_dropped = apply_overlong(  # the solver's largest group
            lengths, self.on_overlong, self.num_ranks, self.cost_model.tokens_per_rank, self.solver_options,
            self.solver)
        self.num_tokens = np.minimum(lengths, self.capacity)
        if self.num_truncated and visual_layout is not None:
            warn_cut_visual(visual_layout, over_kept[lengths[over_kept] > self.capacity], self.capacity)
        kept = np.setdiff1d(over_kept, self.excluded, assume_unique=True)
        if kept.size == 0:
            raise ValueError("no sample is left after dropping over-long and excluded ones")
        if self.excluded.size:
            logger.warning("FCPSampler leaves out %d excluded sample(s) (exclude=), first: sample %d",
                           self.excluded.size, int(self.excluded[0]))
        check_epoch_possible(self.num_tokens[kept], drop_last=self.drop_last, global_batch_size=self.global_batch_size,
                             global_batch_tokens=self.global_batch_tokens, micro_batches=self.micro_batches,
                             num_ranks=self.num_ranks, tokens_per_rank=self.cost_model.tokens_per_rank)
        self._kept = kept
        self._data_digest = data_digest(lengths, self.etas, self.visual, self.excluded)

    def __getattr__(self, name: str) -> Any:
        """The configuration's fields read as attributes (``sampler.num_ranks``, ``sampler.solver``, …)."""
        config = self.__dict__.get("config")
        if config is not None and name in _CONFIG_FIELDS:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # ------------------------------------------------------------------ epoch layout
    @property
    def epoch(self) -> int:
        """The epoch of the position (what the next iterator yields, unless that epoch is finished)."""
        return self._position[0]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iterator yields: its start, or the current position if ``epoch`` is the
        position's epoch (a loaded mid-epoch state survives the usual ``set_epoch(saved_epoch)``)."""
        epoch = check_int("epoch", epoch, "set_epoch(epoch)")
        if not 0 <= epoch < 2**62:  # plan digests and seeds hold it in an int64
            raise ValueError(f"set_epoch(epoch): epoch must be in [0, 2**62), got {epoch}")
        if epoch != self._position[0]:
            self._retire_iterator()
            self._position, self._handed_out = (epoch, 0, 0), False
            if self._window is not None and self._window.head != (epoch, 0):
                self._discard_window()  # stale: plans of an epoch that is not next

    def _epoch_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """``(order, bounds)``: the epoch's permutation of kept indices and global batch boundaries."""
        with self._layout_lock:
            cached = self._layouts.get(epoch)
            if cached is None:
                cached = self._layouts[epoch] = self._compute_layout(epoch)
                while len(self._layouts) > 2:  # the live iterator's epoch and the next one
                    self._layouts.pop(next(iter(self._layouts)))
            return cached

    def _compute_layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        kept = kept_at(self._kept, self._late, epoch)
        order = kept[rng.permutation(kept.size)]
        n = order.size
        if self.global_batch_size is not None:
            b = self.global_batch_size
            num = n // b if self.drop_last else -(-n // b)
            bounds = np.minimum(np.arange(num + 1, dtype=np.int64) * b, n)
        else:
            csum = np.concatenate([[0], np.cumsum(self.num_tokens[order])])
            budget = self.global_batch_tokens
            starts = [0]
            while starts[-1] < n:
                s = starts[-1]
                e = int(np.searchsorted(csum, csum[s] + budget, side="right")) - 1
                starts.append(max(e, s + 1))
            if self.drop_last and len(starts) > 1 and csum[starts[-1]] - csum[starts[-2]] < budget:
                starts.pop()
            bounds = np.asarray(starts, dtype=np.int64)
        if self.drop_last:
            warn_drop_last(self, epoch, order, bounds)
        return order, bounds

    def num_global_batches(self, epoch: int | None = None) -> int:
        return int(self._epoch_layout(self.epoch if epoch is None else epoch)[1].size - 1)

    def global_batch_indices(self, g: int, epoch: int | None = None) -> np.ndarray:
        """Dataset indices of global batch ``g`` of ``epoch`` (plan ``seq_ids`` index this array)."""
        order, bounds = self._epoch_layout(self.epoch if epoch is None else epoch)
        if not 0 <= g < bounds.size - 1:
            raise IndexError(f"global batch {g} out of range [0, {bounds.size - 1})")
        return order[bounds[g]:bounds[g + 1]]

    def plan_global_batch(self, g: int, epoch: int | None = None) -> Plan:
        """The plan of global batch ``g`` (same on every rank; ``seq_ids`` index ``global_batch_indices``)."""
        from fcp_data.plan import plan_batch

        ids = self.global_batch_indices(g, epoch)
        plan = plan_batch(self.num_tokens[ids], num_ranks=self.num_ranks, cost_model=self.cost_model,
                          etas=None if self.etas is None else self.etas[ids], solver=self.solver, visual=None if
                          self.visual is None else np.minimum(self.visual[ids], self.num_tokens[ids]),
                          micro_batches=self._micro_batches_of(ids.size), **self.solver_options)
        if sorted(plan.seq_ids) != list(range(ids.size)):
            raise RuntimeError(f"planner returned a plan that does not hold each of the {ids.size} sequences "
                               f"of global batch {g} exactly once (solver={self.solver!r})")
        return plan

    def _micro_batches_of(self, size: int) -> str | int:
        return self.micro_batches if self.micro_batches == "auto" else min(int(self.micro_batches), size)

    def _rank_lists(self, epoch: int, g: int) -> list[SlotList]:
        """Plan global batch ``g`` and return this rank's list for each of its micro-batches."""
        ids = self.global_batch_indices(g, epoch)
        plan = self._planned.pop((epoch, g), None)
        if plan is None:
            plan = self.plan_global_batch(g, epoch)
        return rank_lists(plan, epoch, g, ids, self.num_tokens[ids], self.lengths[ids], self.visual_layout,
                          rank=self.rank, num_ranks=self.num_ranks, num_samples=self.lengths.size)

    def _window_at(self, key: tuple[int, int], owner: int) -> tuple[PlanWindow, bool, int]:
        """The plan window an iterator starting at ``key`` takes from: ``(window, shared, adopted)``. The owner
        iterator continues the sampler's window when its head is ``key`` (``adopted`` = the plans already
        scheduled there, e.g. the next epoch's first ones) or starts a new one; a superseded iterator plans
        on a private window."""
        def new() -> PlanWindow:
            return PlanWindow(self._rank_lists, self.num_global_batches, key, self.prefetch)

        if owner != self._owner:
            return new(), False, 0
        old = self._window
        if old is not None and not old.closed and old.head == key:
            old.attach()
            return old, True, old.scheduled()
        self._discard_window()
        self._window = new()
        return self._window, True, 0

    def _drop_window(self, window: PlanWindow) -> None:
        if self._window is window:
            self._window = None

    def _discard_window(self) -> None:
        """Close the shared window (stale plans: another epoch or a loaded state)."""
        old, self._window = self._window, None
        if old is not None:
            old.close()

    def _record_count(self, epoch: int, g: int, count: int) -> None:
        if epoch not in self._counts:  # a cache: the counts of epochs long past are not kept over a long run
            self._counts = {e: c for e, c in self._counts.items() if e >= epoch - 1}
        self._counts.setdefault(epoch, {})[g] = count

    # ------------------------------------------------------------------ iteration
    def __len__(self) -> int:
        """Number of lists of the epoch the next iterator yields (the next one at an epoch's end): O(1) for an int
        ``micro_batches``; with ``"auto"`` it plans the epoch's not yet planned global batches once (counts cached per
        epoch; the first ``_KEEP_PLANS`` plans are kept for the iteration, which then does not plan them again)."""
        epoch = self._position[0] + (self._position[1] >= self.num_global_batches(self._position[0]))
        if self.micro_batches != "auto":
            _, bounds = self._epoch_layout(epoch)
            return int(np.minimum(np.diff(bounds), int(self.micro_batches)).sum())
        counts = self._counts.setdefault(epoch, {})
        missing = [g for g in range(self.num_global_batches(epoch)) if g not in counts]
        if len(missing) > 16:
            logger.warning("len(FCPSampler) plans the %d unplanned global batches of epoch %d once to count their "
                           "micro-batches; pass micro_batches=<int> for an O(1) len()", len(missing), epoch)
        self._planned = {k: v for k, v in self._planned.items() if k[0] == epoch}  # another epoch's: stale
        for g in missing:
            plan = self.plan_global_batch(g, epoch)
            counts[g] = len(plan.micro_batches)
            if len(self._planned) < _KEEP_PLANS:
                self._planned[(epoch, g)] = plan
        return int(sum(counts[g] for g in range(self.num_global_batches(epoch))))

    def __iter__(self) -> Iterator[SlotList]:
        """An iterator from the position; it becomes the one that moves the position (module doc)."""
        e, g, m = self._position
        if g >= self.num_global_batches(e):  # epoch e is finished: never replay it
            logger.info("FCPSampler: epoch %d is finished, iterating epoch %d (call set_epoch(e) to choose)", e, e + 1)
            e, g, m = e + 1, 0, 0
            self._position, self._handed_out = (e, g, m), False
        if self._handed_out:  # the previous iterator yielded lists up to here: a continuation mid-epoch
            warn_continued(self._position)
        self._retire_iterator()
        self._handed_out = False
        it = SamplerIterator(self, e, g, m, owner=self._owner)
        self._live = weakref.ref(it)
        self._iterators.add(it)
        return it

    def _retire_iterator(self) -> None:
        """The current iterator stops moving the position and lets go of the shared plan window (whose
        scheduled plans the next iterator takes if it starts at the window's head); it can go on, planning
        from where it is on a private window, as an independent cursor."""
        self._owner += 1
        it = self._live() if self._live is not None else None
        self._live = None
        if it is not None:
            it._release()

    def _moved(self, owner: int, position: tuple[int, int, int], handed: bool = False) -> None:
        """Called by an iterator after each yield (``handed``) and re-position: the position follows its owner."""
        if owner == self._owner:
            self._position = position
            self._handed_out = self._handed_out or handed

    # ------------------------------------------------------------------ state
    def _state(self, epoch: int, g: int, m: int) -> dict[str, Any]:
        return make_state(self, epoch, g, m)

    def state_dict(self) -> dict[str, Any]:
        """The position of the next list and the config fingerprint (JSON types); checkpoints: :meth:`state_after`."""
        return self._state(*self._position)

    def state_after(self, last: Any) -> dict[str, Any]:
        """The state right after ``last``: the last batch the loop consumed, or train_step's result (sampler_state)."""
        return state_after(self, last)

    def check_state(self, state: dict[str, Any]) -> tuple[int, int, int]:
        """Validate a state (strict keys, same config) and return ``(epoch, global_batch, micro_batch)``."""
        return check_state(self, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Set the position (the next ``iter()`` starts there; a finished epoch: at the next epoch) and the state's
        later exclusions (``exclude_later``)."""
        e, g, m = load_late(self, state)  # before the check: the epochs' global batches depend on them
        self._retire_iterator()
        self._discard_window()
        self._position, self._handed_out = (e, g, m), False

    def exclude_later(self, indices: Any, epoch: int, *, same_num_global_batches: bool = False) -> int:
        """Leave ``indices`` out of ``epoch`` and every later one; every rank calls it alike, before ``epoch`` begins
        (:mod:`fcp_data.sampler_exclude`). Returns how many were not left out already. ``same_num_global_batches``:
        refuse (``ValueError``, nothing changed) what would change an epoch's number of global batches."""
        return exclude_later(self, indices, epoch, same_num_global_batches=same_num_global_batches)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_live"] = d["_window"] = None  # an iterator weakref and a thread belong to this process
        del d["_layout_lock"], d["_iterators"]
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._layout_lock, self._iterators = threading.Lock(), weakref.WeakSet()
