"""The sampler's one background mechanism, :class:`fcp_data.prefetch.PlanWindow`, on its own: keys in yield
order across epochs, bounded look-ahead, ordered consumption, errors with the planner's traceback, attach /
detach / close, ``depth=0`` synchronous; and through ``FCPSampler``: an abandoned iterator is freed by
reference counting alone (no cycle), and plans equal those made without a thread.

Reference for the window: a plan function that records its calls (which keys, on which thread) — the
expected key sequence is written out by hand from the epoch sizes.
"""

from __future__ import annotations

import threading
import time
import traceback
import weakref

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.prefetch import PlanWindow
from fcp_data.sampler import FCPSampler

SIZES = {0: 3, 1: 1, 2: 2, 3: 4}  # global batches per epoch (2 for later epochs)


def _num(epoch):
    return SIZES.get(epoch, 2)


class Recorder:
    """``plan_fn``: returns ``("plan", epoch, g)``, records each call; ``fail``: the key that raises;
    ``gate``: planning waits for it (to observe the window while the worker is blocked)."""

    def __init__(self, fail=None, gate=None):
        self.calls, self.threads, self.fail, self.gate = [], set(), fail, gate

    def __call__(self, epoch, g):
        if self.gate is not None:
            self.gate.wait(10)
        self.calls.append((epoch, g))
        self.threads.add(threading.current_thread().name)
        if (epoch, g) == self.fail:
            raise ValueError(f"cannot plan {(epoch, g)}")
        return ("plan", epoch, g)


def _wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.005)
    return cond()


@pytest.mark.parametrize("depth", [0, 1, 2, 5])
def test_keys_follow_yield_order_across_epochs_and_stay_within_depth(depth):
    """Taking the keys (0,0)(0,1)(0,2)(1,0)(2,0)(2,1)(3,0) returns their plans in order; the worker never
    plans more than `depth` keys past the last one taken, nor past the epoch after its epoch; depth 0 plans in
    the caller's thread."""
    rec = Recorder()
    w = PlanWindow(rec, _num, (0, 0), depth)
    expected = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (3, 0)]
    for i, key in enumerate(expected):
        assert w.head == key
        plan, wait = w.take(key)
        assert plan == ("plan", *key) and wait >= 0
        assert len(rec.calls) <= i + 1 + depth  # bounded look-ahead ...
        assert all(e <= key[0] + 1 for e, _ in rec.calls)  # ... into the next epoch at most
    seq = expected + [(3, 1), (3, 2), (3, 3), (4, 0), (4, 1)]
    assert _wait_for(lambda: len(rec.calls) == len(expected) + depth)  # the window fills up to depth ...
    assert rec.calls == seq[:len(expected) + depth]  # ... in yield order, each key once
    assert rec.threads == ({"MainThread"} if depth == 0 else {"fcp-planner"})
    w.close()
    w.close()  # idempotent
    assert w.thread is None and w.closed
    with pytest.raises(RuntimeError, match="closed"):
        w.take(w.head)


def test_one_batch_epochs_plan_only_the_next_epoch_ahead():
    """Epochs of one global batch, depth 3: the window holds the next epoch's plan only (as many as the old
    speculation made), and moves on one epoch per take."""
    rec = Recorder()
    w = PlanWindow(rec, lambda e: 1, (0, 0), 3)
    assert w.take((0, 0))[0] == ("plan", 0, 0)
    assert _wait_for(lambda: len(rec.calls) == 2)
    time.sleep(0.05)
    assert rec.calls == [(0, 0), (1, 0)] and w.scheduled() == 1
    assert w.take((1, 0))[0] == ("plan", 1, 0)
    assert _wait_for(lambda: len(rec.calls) == 3) and rec.calls[2] == (2, 0)
    w.close()


def test_out_of_order_take_is_refused():
    w = PlanWindow(Recorder(), _num, (0, 1), 2)
    with pytest.raises(RuntimeError, match=r"in order: asked for \(0, 2\), the next one is \(0, 1\)"):
        w.take((0, 2))
    assert w.take((0, 1))[0] == ("plan", 0, 1)
    w.close()


def test_error_is_reraised_in_the_consumer_with_the_planner_traceback():
    """A failing plan raises in take() (not on the thread), and the traceback shows the planning frames."""
    w = PlanWindow(Recorder(fail=(0, 1)), _num, (0, 0), 2)
    assert w.take((0, 0))[0] == ("plan", 0, 0)
    with pytest.raises(ValueError, match=r"cannot plan \(0, 1\)") as err:
        w.take((0, 1))
    names = [f.name for f in traceback.extract_tb(err.value.__traceback__)]
    assert "_plan_ahead" in names and "__call__" in names
    w.close()


def test_detach_finishes_the_scheduled_keys_and_ends_attach_resumes():
    """Detached, the worker plans what is scheduled (depth keys) and its thread ends; attached again, the
    scheduled plans are handed out without re-planning and the worker goes on. Attached with nothing to plan,
    the worker sleeps (no polling) and stays alive."""
    gate = threading.Event()
    rec = Recorder(gate=gate)
    w = PlanWindow(rec, _num, (0, 0), 3)
    thread = w.thread
    assert thread is not None and thread.is_alive() and w.scheduled() == 3
    gate.set()
    assert _wait_for(lambda: len(rec.calls) == 3)
    time.sleep(0.05)
    assert thread.is_alive()  # attached: waits for the consumer
    w.detach()
    thread.join(10)
    assert not thread.is_alive() and w.thread is None
    w.attach()
    assert [w.take(k)[0] for k in [(0, 0), (0, 1), (0, 2)]] == [("plan", 0, 0), ("plan", 0, 1), ("plan", 0, 2)]
    assert _wait_for(lambda: len(rec.calls) == 4)
    time.sleep(0.05)
    assert rec.calls == [(0, 0), (0, 1), (0, 2), (1, 0)]  # epoch 2 waits until a key of epoch 1 is taken
    assert w.take((1, 0))[0] == ("plan", 1, 0)
    assert _wait_for(lambda: len(rec.calls) == 6) and rec.calls[4:] == [(2, 0), (2, 1)]
    w.close()
    assert w.thread is None


def test_close_cancels_what_is_not_started_and_joins():
    gate = threading.Event()
    rec = Recorder(gate=gate)
    w = PlanWindow(rec, _num, (0, 0), 4)
    thread = w.thread
    threading.Timer(0.05, gate.set).start()
    w.close()  # returns after the plan in progress
    assert not thread.is_alive() and len(rec.calls) <= 1


class _OneWindowSampler:
    """What :class:`SamplerIterator` calls on its sampler, no more: 4 global batches per epoch, a private window of
    depth 2 over ``plan``."""

    def __init__(self, plan):
        self.plan, self.planner_waits, self.num_speculative_hits, self.planner_wait_total = plan, [], 0, 0.0

    def num_global_batches(self, epoch):
        return 4

    def _moved(self, owner, position, handed=False):
        pass

    def _window_at(self, key, owner):
        return PlanWindow(self.plan, self.num_global_batches, key, 2), False, 0

    def _record_count(self, epoch, g, count):
        pass


def test_an_iterator_freed_while_its_planner_waits_for_the_freeing_thread_does_not_deadlock():
    """Found in review: ``SamplerIterator.__del__`` joined the planner thread. The cycle collector frees an abandoned
    iterator in whichever thread allocates — also one holding the sampler's layout lock (``len()`` of a new epoch),
    which the planner's next plan waits for: both waited forever. Here the thread holding the lock drops the
    iterator while the planner waits for that lock; it must return, and the planner end once it gets the lock."""
    from fcp_data.prefetch import SamplerIterator

    layout_lock, waiting = threading.Lock(), threading.Event()

    def plan(epoch, g):
        if g > 0:  # every plan but the first needs the layout lock
            waiting.set()
            with layout_lock:
                pass
        return [[g]]

    planner = []

    def drop_under_the_lock():
        with layout_lock:
            it = SamplerIterator(_OneWindowSampler(plan), 0, 0, 0)
            assert next(it) == [0]
            planner.append(it.planner_thread)
            assert waiting.wait(10)  # the planner waits for the lock this thread holds
            del it  # freed here, as a collection in this thread would

    dropper = threading.Thread(target=drop_under_the_lock, daemon=True)
    dropper.start()
    dropper.join(10)
    assert not dropper.is_alive(), "freeing the iterator waited for its planner, which waits for the freeing thread"
    assert _wait_for(lambda: not planner[0].is_alive())


CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)


def _sampler(prefetch):
    lengths = np.clip(np.random.default_rng(3).lognormal(5.0, 1.1, size=90), 1, 2000).astype(np.int64)
    return FCPSampler(lengths, num_ranks=4, rank=1, cost_model=CM, global_batch_size=12, prefetch=prefetch)


@pytest.mark.usefixtures("no_local_search")
def test_abandoned_iterator_is_freed_without_the_cycle_collector_and_closes_its_window():
    """An iterator dropped mid-epoch is freed by reference counting alone (nothing holds it: no cycle through
    the window or its thread) and closes its window (its thread ends after the plan in progress, not waited for:
    :func:`test_an_iterator_freed_while_its_planner_waits_for_the_freeing_thread_does_not_deadlock`); the next
    iterator continues from the position on a new window, with the lists of prefetch=0 (the reference)."""
    import gc

    ref = _sampler(0)
    full = [(x.global_batch, x.micro_batch, tuple(s.index for s in x)) for x in ref]
    s = _sampler(2)
    gc.disable()
    try:
        it = iter(s)
        head = [next(it)]
        while (head[-1].global_batch, head[-1].micro_batch) != (1, head[-1].num_micro_batches - 1):
            head.append(next(it))  # up to the end of global batch 1: the position is (0, 2, 0)
        alive = weakref.ref(it)
        window, thread = s._window, it.planner_thread
        assert thread is not None and thread.is_alive()
        del it
        assert alive() is None  # freed at once ...
        assert window.closed and s._window is None  # ... and its planning stopped
        assert _wait_for(lambda: not thread.is_alive())
    finally:
        gc.enable()
    assert s.state_dict()["global_batch"] == 2
    rest = list(s)
    got = [(x.global_batch, x.micro_batch, tuple(sl.index for sl in x)) for x in head + rest]
    assert got == full and s.num_speculative_hits == 0


@pytest.mark.usefixtures("no_local_search")
def test_superseded_iterator_hands_its_window_to_the_next_one():
    """A newer iter() at the same position (what a DataLoader does) takes the plans the previous iterator's
    window had scheduled (counted in num_speculative_hits) instead of planning them again; lists as prefetch=0."""
    ref = _sampler(0)
    full = [(x.global_batch, x.micro_batch, tuple(s.index for s in x)) for x in ref]
    s = _sampler(2)
    first = iter(s)
    head = [next(first)]
    while (head[-1].global_batch, head[-1].micro_batch) != (1, head[-1].num_micro_batches - 1):
        head.append(next(first))
    window = s._window
    second = iter(s)  # supersedes `first`, which lets go of the window without closing it
    assert first.planner_thread is None and not window.closed and window.head == (0, 2)
    rest = list(second)
    got = [(x.global_batch, x.micro_batch, tuple(sl.index for sl in x)) for x in head + rest]
    assert got == full and s.num_speculative_hits == 2


_EXIT_SCRIPT = """
import sys, time
import numpy as np
sys.path.insert(0, {root!r})
from fcp_data.prefetch import PlanWindow

small = np.random.default_rng(0).integers(0, 2**40, size=100_000)


def plan(epoch, g):  # ~1.5 s inside numpy's C++ np.unique, which releases and retakes the GIL on every call
    end = time.perf_counter() + 1.5
    while time.perf_counter() < end:
        np.unique(small)
    return g


window = PlanWindow(plan, lambda e: 4, (0, 0), depth=1)
time.sleep(0.3)
print("ok", flush=True)
"""


def test_a_planner_thread_busy_at_interpreter_exit_does_not_abort_the_process():
    """Found as a flaky ``fcp train`` over damaged videos (exit code 134 after a finished run, "terminate called
    without an active exception"; gdb: the fcp-planner daemon thread, replanning the next epoch after
    ``exclude_later``, was inside numpy's C++ ``np.unique`` when Python stopped its daemon threads, and the forced
    unwind through that frame called std::terminate). Windows still open are now closed at exit. Six processes end
    while their planner is in that state: each must exit 0 (without the fix about half of them abort, so all six
    passing by chance is ~2 %)."""
    import subprocess
    import sys
    from pathlib import Path

    script = _EXIT_SCRIPT.format(root=str(Path(__file__).resolve().parents[2]))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(6)]
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    assert all(rc == 0 and out.strip() == "ok" for rc, out, _ in results), results
