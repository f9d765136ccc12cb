"""The forkserver's preload across launches of one process (a notebook, a test session, a benchmark sweep).

``multiprocessing`` starts one forkserver per process and fixes its preloaded modules when it starts; a later
launch that needs more (``transformers.modeling_utils`` for a Hugging Face model, ~3.5 s of imports) would pay
those imports again in *every* worker it forks. :func:`set_preload` restarts a forkserver that fcp started itself
and that lacks modules the new launch needs, with the union of both preloads, when no process forked from it is
alive (their exit statuses reach the parent through the server: fcp's ranks, but also a DataLoader's workers).
Any other forkserver (started by user code) is left alone; so is ours while a process of it lives: the workers then
import what is missing themselves, as before.
Restarting relies on ``ForkServer._stop`` (CPython ≥ 3.8, used by its own tests); without it nothing changes.
``_stop`` closes the server's alive-pipe and waits for it to exit, without a timeout; a process this one *forked*
(a plain DataLoader's worker, torch's default on Linux) holds a copy of that pipe, so the server never saw its end
and the next launch hung. :func:`stop` waits a moment, then terminates the server itself (:func:`_halt`).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from multiprocessing import forkserver
from typing import Sequence

from fcp_data.frozen_heap import preload_with_freeze
from fcp_data.workers import preload_from_env, started_forkserver

__all__ = ["set_preload", "note_started", "start", "stop"]

_served: tuple[str, ...] = ()  # what the forkserver fcp started preloads, in import order
_pid: int | None = None  # that forkserver's pid (None: fcp started none, or it was stopped)
_STOP_WAIT_S = 2.0  # a server told to stop exits at once, unless a forked process holds its alive-pipe
_from_env = preload_from_env  # FCP_FORKSERVER_PRELOAD, which worker_context's forkserver honours too


def _running_pid() -> int | None:
    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _children_alive() -> bool:
    """Whether any live process of this one was forked by the forkserver: fcp's ranks, and anyone else's (a
    DataLoader's workers with a forkserver context, the default start method from Python 3.14 on)."""
    return any(type(getattr(p, "_popen", None)).__module__ == "multiprocessing.popen_forkserver"
               for p in multiprocessing.active_children())


def _adopt() -> None:
    """A forkserver that :func:`fcp_data.workers.worker_context` started (for a DataLoader's workers) is fcp's too."""
    global _served, _pid
    started = started_forkserver()
    if _pid is None and started is not None and started[0] == _running_pid():
        _pid, _served = started


def set_preload(ctx, preload: Sequence[str]) -> tuple[tuple[str, ...], int | None]:
    """Set the preload of ``ctx`` (a forkserver context) for the next start; restart fcp's running forkserver
    when it lacks some of ``preload`` (:func:`stop` refuses while a process it forked is alive). Returns the
    preload set and the pid of the forkserver running now (None: none), for :func:`note_started`."""
    _adopt()
    preload = [*preload, *_from_env()]
    wanted = tuple(dict.fromkeys([*preload, *_served]))  # a restart keeps what the old server had
    if not set(preload) <= set(_served):
        stop()
    ctx.set_forkserver_preload(preload_with_freeze(wanted))
    return wanted, _running_pid()


def start(preload: Sequence[str]) -> None:
    """Start fcp's forkserver now with ``preload`` (restarting an idle one of fcp's that lacks some of it) and return
    without waiting for its imports: the launch that follows finds it running. ``fcp train`` calls it before its
    checks and its data loading, which then overlap the server's imports (torch, fcp's training stack and, for a
    Hugging Face model, transformers: ~5 s of one core) instead of preceding them. A Ctrl-C meanwhile interrupts the
    command alone: the server ignores SIGINT (:func:`_sigint_ignored`) and a rank whose start it cut short exits
    without a traceback (:mod:`fcp_exec._forkserver_quiet`)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    ctx = multiprocessing.get_context("forkserver")
    wanted, before = set_preload(ctx, [*preload, "fcp_exec._forkserver_quiet"])
    with _sigint_ignored():
        forkserver.ensure_running()
    note_started(wanted, before)


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored in this process meanwhile (main thread only; elsewhere nothing changes). A server started in it
    inherits the ignored SIGINT through its ``exec``, from its first instruction: a terminal's Ctrl-C reaches the
    whole process group, and the server — still importing its preload, seconds long, before multiprocessing makes it
    ignore SIGINT itself — printed a KeyboardInterrupt traceback under ``fcp train: interrupted``. The command
    (this process) is interrupted as before and the server ends with it; the processes the server forks (fcp's ranks,
    which lead process groups of their own and are ended by their launcher, and their DataLoader workers) inherit the
    ignored SIGINT too. Starting the server takes milliseconds (a fork and an exec): a Ctrl-C within them is lost."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def stop() -> bool:
    """Stop the forkserver fcp started (it holds the preloaded modules' memory, ~0.5 GB with a Hugging Face
    model's) and forget what it preloaded; True if one was stopped. Not while a process it forked is alive (an fcp
    rank, a DataLoader worker): their exit statuses reach the parent through it."""
    global _pid, _served
    _adopt()
    halt = getattr(forkserver._forkserver, "_stop", None)
    if halt is None or _pid is None or _running_pid() != _pid or _children_alive():
        return False
    try:
        _halt(halt, _pid)
    except OSError:  # its socket file already gone (a cleaned temp dir): the server is stopped all the same
        pass
    _pid, _served = None, ()
    return True


def _halt(halt, pid: int) -> None:
    """``halt()`` (``ForkServer._stop``: close the alive-pipe, wait for the server's exit) with that wait bounded:
    after :data:`_STOP_WAIT_S` the server is sent SIGTERM, 2 s later SIGKILL (module docstring). None of its
    children is alive (:func:`stop` checked), so ending it loses nothing. A pidfd (Linux) names that very process
    even once ``halt`` has reaped it, so a recycled pid is never signalled."""
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None
    done = threading.Event()
    watchdog = threading.Thread(target=_end_unless, args=(done, pid, handle), name="fcp-forkserver-stop",
                                daemon=True)
    watchdog.start()
    try:
        halt()
    finally:
        done.set()
        watchdog.join(5.0)
        if handle is not None:
            os.close(handle)


def _end_unless(done: threading.Event, pid: int, handle: int | None) -> None:
    for sig, wait_s in ((signal.SIGTERM, _STOP_WAIT_S), (signal.SIGKILL, 2.0)):
        if done.wait(wait_s):
            return
        try:
            signal.pidfd_send_signal(handle, sig) if handle is not None else os.kill(pid, sig)
        except OSError:  # already gone
            return


def note_started(preload: Sequence[str], before: int | None) -> None:
    """After workers started: a forkserver that was not running before (pid ``before``) was started by this
    launch with ``preload``; record it as fcp's. One that was already running keeps its record."""
    global _served, _pid
    running = _running_pid()
    if running is not None and running != before:
        _served, _pid = tuple(preload), running
