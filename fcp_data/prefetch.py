"""Plan global batches ahead (used by :class:`fcp_data.sampler.FCPSampler`): one mechanism, :class:`PlanWindow`.

A :class:`PlanWindow` is a bounded window of futures keyed by ``(epoch, global_batch)``. Keys follow the
order the sampler yields them — ``(e, 0) … (e, n_e − 1), (e + 1, 0), …`` — so when an epoch's last global
batch is scheduled, planning runs on into the next epoch's first ones (an epoch's order is a pure function
of ``(seed, epoch)``), but never further than the epoch after the last key taken (with one global batch per
epoch, the window holds one plan, not ``depth`` epochs). The window holds the ``depth`` keys after the last
one taken: :meth:`take` hands out the next key's plan (ordered consumption; it waits for it and reports the
wait) and schedules one more. One worker thread (``fcp-planner``) plans the scheduled keys in order; there is no polling — it
sleeps on a condition variable when nothing is scheduled. An exception raised by planning is re-raised by
:meth:`take` in the consumer's thread, with the planning thread's traceback (the future carries it).

The worker waits for more work only while a consumer is *attached*; :meth:`detach` (an iterator that
finished its epoch or was superseded by a newer ``iter()``) lets it finish the scheduled keys — at most
``depth`` plans, which is how the next epoch's first global batches get planned — and end by itself; an
iterator that continues from the window's head (:attr:`PlanWindow.head`) attaches (:meth:`attach`) and
takes those plans. :meth:`close` (idempotent; an iterator's ``close()``, re-positioning or garbage collection)
cancels what is not started and joins the thread (at most one planning call; garbage collection does not wait for
it, :meth:`SamplerIterator.__del__`). The thread holds the
window, never an iterator, so an abandoned iterator is collected — and closes its window.
``depth = 0`` means no thread: :meth:`take` plans synchronously and reports the planning time as the wait.
At interpreter exit every window still open is closed (``atexit``, before Python stops its daemon threads): a
planner thread stopped inside numpy's C++ code (``np.unique`` of an epoch's layout, e.g. right after
``exclude_later``) aborted the process ("terminate called without an active exception") after a finished run.

:class:`SamplerIterator` is what ``iter(FCPSampler)`` returns: one epoch from a position, taking each
global batch's per-rank lists from the sampler's window; it is stateful (``state_dict``/``load_state_dict``),
which is the hook torchdata's ``StatefulDataLoader`` uses to resume a batch sampler without replaying it.
The iterator created last by the sampler (its *owner* generation) reports each new position to the sampler,
which is how ``FCPSampler.state_dict()`` stays exact after a ``break`` or the end of an epoch (the state
itself: :mod:`fcp_data.sampler_state`). A new ``iter()`` that continues where an iterator left off mid-epoch logs
a warning (:func:`warn_continued`): DataLoader workers had taken lists ahead that the loop never received. An
iterator whose epoch ``exclude_later`` (or a loaded state) changed afterwards refuses to go on (:meth:`stale_from`).
The state an iterator gives (torchdata snapshots it when it hands a list to a worker, ahead of the loop) carries
the sampler's later exclusions as they are when it is saved, not as they were at the snapshot.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable

__all__ = ["PlanWindow", "SamplerIterator", "warn_continued"]

logger = logging.getLogger("fcp_data.sampler")

_OPEN: "weakref.WeakSet[PlanWindow]" = weakref.WeakSet()  # windows not closed yet, closed at interpreter exit


@atexit.register
def _close_open_windows() -> None:
    for window in list(_OPEN):
        window.close()

Key = tuple[int, int]  # (epoch, global batch)


class PlanWindow:
    """Plans of the ``depth`` keys after the last one taken, from ``start`` on (module docstring).

    ``plan_fn(epoch, g)`` plans one global batch; ``num_fn(epoch)`` is the number of global batches of an
    epoch (it decides when the keys move on to the next epoch)."""

    def __init__(self, plan_fn: Callable[[int, int], Any], num_fn: Callable[[int], int], start: Key,
                 depth: int) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._plan_fn, self._num_fn, self._depth = plan_fn, num_fn, int(depth)
        self._cond = threading.Condition()
        self._futures: dict[Key, Future] = {}  # the window, oldest key first (insertion order)
        self._todo: collections.deque[tuple[Key, Future]] = collections.deque()  # scheduled, not started
        self._next: Key = (int(start[0]), int(start[1]))  # the key scheduled after the window's last
        self._last_epoch = self._next[0] + 1  # keys are scheduled up to this epoch: the one after the consumer's
        self._attached = True
        self._closed = False
        self.thread: threading.Thread | None = None
        _OPEN.add(self)
        with self._cond:
            self._fill()

    @property
    def head(self) -> Key:
        """The key :meth:`take` hands out next."""
        with self._cond:
            return next(iter(self._futures), self._next)

    @property
    def closed(self) -> bool:
        return self._closed

    def scheduled(self) -> int:
        """How many keys are scheduled (planned, being planned or waiting): at most ``depth``."""
        return len(self._futures)

    def _successor(self, key: Key) -> Key:
        e, g = key
        return (e, g + 1) if g + 1 < self._num_fn(e) else (e + 1, 0)

    def _fill(self) -> None:
        """Schedule keys until the window holds ``depth`` or reaches ``_last_epoch``'s end (under the lock)."""
        while len(self._futures) < self._depth and self._next[0] <= self._last_epoch:
            key, fut = self._next, Future()
            self._futures[key] = fut
            self._todo.append((key, fut))
            self._next = self._successor(key)
        if self._todo and self.thread is None:
            self.thread = threading.Thread(target=_plan_ahead, args=(self,), name="fcp-planner", daemon=True)
            self.thread.start()
        self._cond.notify_all()

    def take(self, key: Key) -> tuple[Any, float]:
        """``(plan of key, seconds waited)``; ``key`` must be :attr:`head`. Re-raises the planning error."""
        t0 = time.perf_counter()
        with self._cond:
            if self._closed:
                raise RuntimeError("the plan window is closed")
            head = next(iter(self._futures), self._next)
            if tuple(key) != head:
                raise RuntimeError(f"plans are taken in order: asked for {tuple(key)}, the next one is {head}")
            if not self._depth:
                self._next = self._successor(head)
            else:
                fut = self._futures.pop(head)
                self._last_epoch = head[0] + 1
                self._fill()
        if not self._depth:
            result = self._plan_fn(*head)
        else:
            result = fut.result()  # blocks on the future (no polling); re-raises with the planner's traceback
        return result, time.perf_counter() - t0

    def forget_from(self, epoch: int) -> None:
        """Drop the keys of ``epoch`` and later (their data changed: ``FCPSampler.exclude_later``) and schedule them
        again; a plan of one being made now finishes and is thrown away."""
        with self._cond:
            stale = [k for k in self._futures if k[0] >= epoch]
            if not stale and self._next[0] < epoch:
                return
            for k in stale:
                self._futures.pop(k).cancel()
            self._todo = collections.deque(job for job in self._todo if job[0][0] < epoch)
            self._next = min(stale + [self._next]) if stale else self._next
            if self._next[0] >= epoch:
                self._next = min(self._next, (epoch, 0))
            self._fill()

    def attach(self) -> None:
        """A consumer continues from :attr:`head`: the worker keeps planning as keys are taken."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the plan window is closed")
            self._attached = True
            self._fill()

    def detach(self) -> None:
        """No consumer for now: the worker plans what is scheduled (at most ``depth``) and ends."""
        with self._cond:
            self._attached = False
            self._cond.notify_all()

    def close(self, join: bool = True) -> None:
        """Cancel the plans not started and join the worker (at most one planning call); idempotent. ``join=False``
        only tells the worker to end (it does after the plan in progress; until then the window stays in
        :data:`_OPEN`, so that an exit meanwhile still joins it)."""
        if join:
            _OPEN.discard(self)
        with self._cond:
            self._closed, self._attached = True, False
            for _, fut in self._todo:
                fut.cancel()
            self._todo.clear()
            self._futures.clear()
            thread = self.thread
            self._cond.notify_all()
        if join and thread is not None and thread is not threading.current_thread():
            thread.join()

    def _next_job(self) -> tuple[Key, Future] | None:
        """The next scheduled key to plan, waiting while attached and nothing is scheduled; None: end."""
        with self._cond:
            while not self._todo and self._attached and not self._closed:
                self._cond.wait()
            if self._closed or not self._todo:
                self.thread = None
                return None
            key, fut = self._todo.popleft()
            fut.set_running_or_notify_cancel()
            return key, fut


def _plan_ahead(window: PlanWindow) -> None:
    """The worker: plan the scheduled keys in order until the window is closed or detached and done."""
    while (job := window._next_job()) is not None:
        key, fut = job
        try:
            fut.set_result(window._plan_fn(*key))
        except BaseException as exc:  # surfaced by take() in the consumer's thread
            fut.set_exception(exc)
        del job, fut  # a finished future lives in the window only


class SamplerIterator:
    """One epoch of an ``FCPSampler``'s lists from position ``(global_batch, micro_batch)``; while
    ``owner`` is the sampler's current generation, every move is reported to ``sampler._moved`` and the
    plans come from the sampler's shared window (a superseded iterator goes on with a private one)."""

    def __init__(self, sampler: Any, epoch: int, global_batch: int, micro_batch: int, owner: int = -1) -> None:
        self._sampler = sampler
        self._owner = owner
        self._window: PlanWindow | None = None
        self._shared = False  # whether _window is the sampler's (kept for the next iterator) or this one's
        self._adopted = 0  # plans this iterator found scheduled when it attached (speculative hits to count)
        self._stale: str | None = None  # why this iterator cannot go on (its epoch changed under it)
        self._reset(epoch, global_batch, micro_batch)

    def _reset(self, epoch: int, g: int, m: int) -> None:
        self.close()
        self._epoch = epoch
        self._num_g = self._sampler.num_global_batches(epoch)
        self._g, self._m = g, m  # position of the next list to yield
        self._lists: list | None = None
        self._lists_g = -1
        self._sampler._moved(self._owner, self.position)

    @property
    def position(self) -> tuple[int, int, int]:
        """``(epoch, global_batch, micro_batch)`` of the next list."""
        return self._epoch, self._g, self._m

    @property
    def planner_thread(self) -> threading.Thread | None:
        return None if self._window is None else self._window.thread

    def __iter__(self) -> "SamplerIterator":
        return self

    def _take_lists(self) -> list:
        """This rank's lists of global batch ``_g`` from the window (attached at the first need)."""
        key = (self._epoch, self._g)
        if self._window is None:  # at the first next(), after DataLoader workers have forked
            self._window, self._shared, self._adopted = self._sampler._window_at(key, self._owner)
        try:
            lists, wait = self._window.take(key)
        except BaseException:
            self.close()
            raise
        if self._adopted:
            self._adopted -= 1
            self._sampler.num_speculative_hits += 1
        self._sampler.planner_waits.append(wait)
        self._sampler.planner_wait_total += wait
        self._sampler._record_count(self._epoch, self._g, len(lists))
        return lists

    def stale_from(self, epoch: int, why: str) -> None:
        """Epochs ``epoch`` and later were changed (``why``): if this iterator is in one, mid-way, it stops there."""
        if self._epoch >= epoch and self._g < self._num_g:
            self._stale = f"{why} changed epoch {self._epoch} while this iterator was in it"

    def __next__(self):
        if self._stale is not None:
            raise RuntimeError(f"FCPSampler: {self._stale} (an iterator retired by set_epoch or load_state_dict); "
                               "iterate the sampler again for that epoch's new global batches")
        if self._g >= self._num_g:
            self._release()  # the window plans on into the next epoch for the next iterator
            raise StopIteration
        if self._lists_g != self._g:
            lists = self._take_lists()
            self._lists, self._lists_g = lists, self._g
            if self._m >= len(lists):
                raise ValueError(f"resume position micro-batch {self._m} of global batch {self._g} is past its "
                                 f"{len(lists)} micro-batches — the state was saved by a different planner")
        assert self._lists is not None
        out = self._lists[self._m]
        self._m += 1
        if self._m == len(self._lists):
            self._g, self._m = self._g + 1, 0
        self._sampler._moved(self._owner, self.position, True)  # before the hand-over: a `break` keeps it
        return out

    def state_dict(self) -> dict[str, Any]:
        """The state at this iterator's position; its ``excluded_later`` is the sampler's live list (module doc)."""
        return dict(self._sampler._state(self._epoch, self._g, self._m), excluded_later=self._sampler._late_live)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Re-position this iterator (its planning stops; the new position is planned afresh), taking over the
        state's later exclusions as ``FCPSampler.load_state_dict`` does."""
        from fcp_data.sampler_exclude import load_late

        e, g, m = load_late(self._sampler, state, loading=self)
        self._reset(e, g, m)

    def _release(self) -> None:
        """Let go of the window: the sampler's is detached (its scheduled plans stay for the next iterator),
        a private one is closed."""
        window, self._window = self._window, None
        if window is not None:
            window.detach() if self._shared else window.close()

    def close(self, join: bool = True) -> None:
        """Stop planning for this iterator: its window is closed (and dropped by the sampler); ``join``: wait for the
        plan in progress."""
        window, self._window = self._window, None
        if window is not None:
            window.close(join)
            if self._shared:
                self._sampler._drop_window(window)

    def __del__(self) -> None:  # abandoned mid-epoch (or done, then it holds no window)
        """Close without waiting for the planner: the cycle collector may free this iterator in any thread, at any
        allocation — also in one holding the sampler's layout lock that the planning in progress waits for, where a
        join would wait forever. The thread ends by itself after that plan."""
        try:
            self.close(join=False)
        except Exception:
            pass


def warn_continued(position: tuple[int, int, int]) -> None:
    """One warning when a new ``iter()`` continues, mid-epoch, where the sampler's previous iterator handed out its
    last list — after a ``break`` or an error in the loop: with DataLoader workers, that iterator had handed out lists
    the loop never received (up to ``num_workers · prefetch_factor``), which the continuation does not yield again."""
    e, g, m = position
    logger.warning("FCPSampler: a new iterator continues epoch %d at global batch %d, micro-batch %d, where the previous "
                   "one stopped mid-epoch; the lists DataLoader workers had taken ahead of the loop are not yielded "
                   "again. To go on right after the last batch the loop received, call sampler.load_state_dict("
                   "sampler.state_after(batch)) before iter()", e, g, m)
