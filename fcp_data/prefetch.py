"""Plan global batches ahead on a background thread (used by :class:`fcp_data.sampler.FCPSampler`).

:class:`PlanPrefetcher` runs ``plan_fn(g)`` for ``g = start, start+1, …, stop−1`` on one daemon thread and
hands the results over a bounded queue of ``depth`` entries, so at most ``depth`` planned global batches
wait ahead of the consumer. ``get()`` returns them in order together with the seconds the consumer
waited; an exception raised by ``plan_fn`` is re-raised by ``get()`` in the consumer's thread (with the
planning thread's traceback attached). ``close()`` stops the thread and joins it; it is idempotent and
is also called when the consumer reaches the end. The thread holds no reference to the consumer, so an
abandoned sampler iterator is garbage-collected and closes its prefetcher. ``on_done()`` is called on the
thread once the last global batch is planned (before it is handed over); :class:`SamplerIterator` uses it
to start a :class:`Speculation` of the next epoch's first global batches.

``depth = 0`` means no thread: ``get()`` plans synchronously and reports the planning time as the wait.

:class:`SamplerIterator` is what ``iter(FCPSampler)`` returns: one epoch from a position, drawing each
global batch's per-rank lists from a prefetcher; it is stateful (``state_dict``/``load_state_dict``), which
is the hook torchdata's ``StatefulDataLoader`` uses to resume a batch sampler without replaying it. The
iterator created last by the sampler (its *owner* generation) reports each new position to the sampler,
which is how ``FCPSampler.state_dict()`` stays exact after a ``break`` or the end of an epoch (the state
itself: :mod:`fcp_data.sampler_state`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any, Callable

__all__ = ["PlanPrefetcher", "Speculation", "SamplerIterator"]

logger = logging.getLogger(__name__)


_POLL_S = 0.05


class PlanPrefetcher:
    """Ordered producer of ``plan_fn(g)`` for ``g`` in ``[start, stop)``, ``depth`` results ahead."""

    def __init__(self, plan_fn: Callable[[int], Any], start: int, stop: int, depth: int,
                 on_done: Callable[[], None] | None = None) -> None:
        if depth < 0:
            raise ValueError(f"prefetch depth must be >= 0, got {depth}")
        self._plan_fn = plan_fn
        self._on_done = on_done
        self._next = int(start)
        self._stop_at = int(stop)
        self._depth = int(depth)
        self._stop = threading.Event()
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> None:
        """Start planning now instead of at the first ``get()`` (no-op without a thread or when started)."""
        if self._depth and self._thread is None and not self._closed:
            self._start()

    def _start(self) -> None:
        self._queue = queue.Queue(maxsize=self._depth)
        self._thread = threading.Thread(
            target=_produce,
            args=(self._plan_fn, self._next, self._stop_at, self._queue, self._stop, self._on_done),
            name="fcp-planner", daemon=True)
        self._thread.start()

    def get(self) -> tuple[int, Any, float]:
        """Next ``(g, plan, wait_s)``; raises ``StopIteration`` past ``stop`` and re-raises planner errors."""
        if self._closed:
            raise RuntimeError("the plan prefetcher is closed")
        if self._next >= self._stop_at:
            self.close()
            raise StopIteration
        g = self._next
        t0 = time.perf_counter()
        if self._depth == 0:
            result = self._plan_fn(g)
            self._next += 1
            return g, result, time.perf_counter() - t0
        if self._thread is None:
            self._start()
        assert self._queue is not None and self._thread is not None
        while True:
            try:
                got_g, ok, result = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the planning thread ended without producing global batch "
                                       f"{g}") from None
        wait = time.perf_counter() - t0
        assert got_g == g, (got_g, g)
        self._next += 1
        if not ok:
            self.close()
            raise result
        return g, result, wait

    def close(self) -> None:
        """Stop the planning thread and wait for it (at most one planning call's time)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._queue is not None:
            _drain(self._queue)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _drain(q: queue.Queue) -> None:
    while True:
        try:
            q.get_nowait()
        except queue.Empty:
            return


def _produce(plan_fn: Callable[[int], Any], start: int, stop: int, q: queue.Queue, stop_event: threading.Event,
             on_done: Callable[[], None] | None) -> None:
    for g in range(start, stop):
        if stop_event.is_set():
            return
        try:
            item = (g, True, plan_fn(g))
        except BaseException as exc:  # surfaced in the consumer by get()
            item = (g, False, exc)
        if g == stop - 1 and item[1] and on_done is not None:
            try:  # before the hand-over, so the consumer never reaches the end before it ran
                on_done()
            except Exception:  # an optimisation only: the next epoch then plans as usual
                logger.warning("speculative planning of the next epoch failed to start", exc_info=True)
        while not stop_event.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                break
            except queue.Full:
                continue
        if not item[1]:
            return
    if start >= stop and on_done is not None:  # nothing left to plan in this epoch
        try:
            on_done()
        except Exception:
            logger.warning("speculative planning of the next epoch failed to start", exc_info=True)


class Speculation:
    """Plans of global batches ``0 … count−1`` of one ``epoch``, computed on a daemon thread
    (``fcp-speculate``) that ends by itself after ``count`` plans or when :meth:`cancel` is called.

    :meth:`take` hands out the future of one global batch once (``None`` if there is none); a cancelled
    or failed future means "plan it yourself". The thread holds only ``plan_fn``, never an iterator."""

    def __init__(self, plan_fn: Callable[[int], Any], epoch: int, count: int) -> None:
        self.epoch = int(epoch)
        self._futures = {g: Future() for g in range(int(count))}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=_speculate, args=(plan_fn, list(self._futures.items()), self._stop),
                                       name="fcp-speculate", daemon=True)
        self.thread.start()

    def take(self, g: int) -> Future | None:
        with self._lock:
            return self._futures.pop(g, None)

    def take_done(self, g: int) -> tuple[bool, Any]:
        """``(True, plan)`` and removes it if the plan of ``g`` is ready; else ``(False, None)`` (never blocks)."""
        with self._lock:
            fut = self._futures.get(g)
            if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
                return False, None
            del self._futures[g]
            return True, fut.result()

    def cancel(self) -> None:
        """Stop after the plan in progress (at most one planning call) and join the thread."""
        self._stop.set()
        with self._lock:
            for fut in self._futures.values():
                fut.cancel()
            self._futures.clear()
        if self.thread is not threading.current_thread():
            self.thread.join()


def _speculate(plan_fn: Callable[[int], Any], futures: list, stop_event: threading.Event) -> None:
    for g, fut in futures:
        if stop_event.is_set():
            fut.cancel()  # also wakes a consumer that took this future before cancel()
            continue
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(plan_fn(g))
        except BaseException as exc:  # the consumer re-plans and gets the error in its own call
            fut.set_exception(exc)


class SamplerIterator:
    """One epoch of an ``FCPSampler``'s lists from position ``(global_batch, micro_batch)``; while
    ``owner`` is the sampler's current generation, every move is reported to ``sampler._moved``."""

    def __init__(self, sampler: Any, epoch: int, global_batch: int, micro_batch: int, owner: int = -1) -> None:
        self._sampler = sampler
        self._owner = owner
        self._prefetcher: PlanPrefetcher | None = None
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
        return None if self._prefetcher is None else self._prefetcher.thread

    def __iter__(self) -> "SamplerIterator":
        return self

    def __next__(self):
        if self._g >= self._num_g:
            self.close()
            raise StopIteration
        if self._lists_g != self._g:
            t0 = time.perf_counter()
            ready = False
            if self._prefetcher is None:
                sampler = self._sampler
                # a speculative plan that is ready is taken here, without a thread hand-over; the planning
                # thread then starts at once with the next global batch
                ready, lists = sampler._speculative_lists(self._epoch, self._g)
                self._prefetcher = PlanPrefetcher(partial(sampler._planned_lists, self._epoch), self._g + ready,
                                                  self._num_g, sampler.prefetch,
                                                  on_done=partial(sampler._speculate, self._epoch + 1))
                if ready:
                    self._prefetcher.start()
            if ready:
                g, wait = self._g, time.perf_counter() - t0
            else:
                g, lists, wait = self._prefetcher.get()
            assert g == self._g, (g, self._g)
            self._sampler.planner_waits.append(wait)
            self._sampler._record_count(self._epoch, g, len(lists))
            self._lists, self._lists_g = lists, g
            if self._m >= len(lists):
                raise ValueError(f"resume position micro-batch {self._m} of global batch {g} is past its "
                                 f"{len(lists)} micro-batches — the state was saved by a different planner")
        assert self._lists is not None
        out = self._lists[self._m]
        self._m += 1
        if self._m == len(self._lists):
            self._g, self._m = self._g + 1, 0
        self._sampler._moved(self._owner, self.position)  # before the hand-over: a `break` keeps it
        return out

    def state_dict(self) -> dict[str, Any]:
        return self._sampler._state(self._epoch, self._g, self._m)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Re-position this iterator (stops its planning thread; the new position is planned afresh)."""
        e, g, m = self._sampler.check_state(state)
        self._reset(e, g, m)

    def close(self) -> None:
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
