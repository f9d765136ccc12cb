"""Execution engines for the per-shard function: a local process pool and Ray tasks.

Both call :func:`fcp_data.index.build.index_task` once per task and report each finished task through
``on_done(result)``; results may arrive in any order (the merge orders parts by task id, so the index
does not depend on the engine or on completion order).

No process of a run outlives it:

- local pool workers ask the kernel for SIGKILL when their parent dies (``prctl(PR_SET_PDEATHSIG)`` through
  ctypes on Linux) and also run a watchdog thread that exits when ``os.getppid()`` changes (every
  ``WATCHDOG_S`` seconds; the only guard on other systems). When the parent fails or is interrupted
  (Ctrl-C), pending tasks are cancelled and the workers are killed, rather than waited for.
- Ray: a Ray that ``fcp index`` starts itself (no ``--address``) is started by ``ray.init`` with Ray's own
  fate sharing (GCS and raylet get PR_SET_PDEATHSIG on Linux). Measured with Ray 2.60 on Linux, SIGKILL of the
  driver: GCS, raylet and every ``ray::index_task`` worker are gone within 5 s; Ray's two helper processes
  (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``, which never touch the data) notice the raylet's death
  and exit by themselves about 60 s later. On an existing cluster (``--address``) the cluster outlives the
  driver by design and Ray's job cleanup ends the driver's tasks (not measured here). Either way, parts
  written by then stay in ``OUT/parts`` for ``--resume``; in-flight tasks are cancelled on Ctrl-C.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable

from fcp_data.index.build import index_task

__all__ = ["run_local", "run_ray", "ENGINES", "die_with_parent", "WATCHDOG_S"]

ENGINES = ("local", "ray")
WATCHDOG_S = 0.5
_PR_SET_PDEATHSIG = 1


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(WATCHDOG_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def die_with_parent(parent_pid: int) -> None:
    """Make this (worker) process end when ``parent_pid`` dies: PR_SET_PDEATHSIG on Linux + a watchdog thread."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the watchdog still guards
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="fcp-index-parent-watchdog", daemon=True).start()


def run_local(tasks: list[dict], cfg: dict, workers: int, on_done: Callable[[dict], None]) -> None:
    """Run tasks in this process (``workers <= 1``) or in a pool of ``workers`` processes.

    A crashed worker surfaces as ``concurrent.futures.process.BrokenProcessPool`` in the caller; parts
    already written stay on disk for ``--resume``. Workers die with this process (see the module docstring).
    """
    if workers <= 1:
        for t in tasks:
            on_done(index_task(t, cfg))
        return
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    # never more processes than tasks (a huge --workers must not ask the OS for a huge semaphore or pool)
    pool = ProcessPoolExecutor(max_workers=max(1, min(workers, len(tasks))), mp_context=ctx, initializer=die_with_parent, initargs=(os.getpid(),))
    try:
        pending = {pool.submit(index_task, t, cfg) for t in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                on_done(fut.result())
    except BaseException:  # a failed task, a broken pool or Ctrl-C: do not wait for the remaining tasks
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops the reference
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        _join_manager(manager)
        raise
    pool.shutdown(wait=True)


def _join_manager(manager: threading.Thread | None, timeout: float = 10.0) -> None:
    """Wait for a broken pool's manager thread to finish its clean-up. Otherwise a CLI that reports the failure and
    exits at once races it at interpreter exit: CPython's exit hook (3.11) wakes the thread through a pipe the
    thread is closing, and prints "Exception ignored ... OSError: Bad file descriptor" under the one-line error."""
    if manager is not None and manager.is_alive():
        manager.join(timeout)


def run_ray(tasks: list[dict], cfg: dict, on_done: Callable[[dict], None], address: str | None = None,
            max_in_flight: int = 256) -> None:
    """Run tasks as Ray tasks (one CPU each) on the cluster at ``address``, or on an already-initialised Ray.

    With no ``address`` and no running Ray, a local Ray is started (``ray.init()``). At most
    ``max_in_flight`` tasks are submitted at once, so millions of shards do not flood the scheduler.
    """
    try:
        import ray
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'fcp[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    remote = ray.remote(num_cpus=1, max_retries=0)(index_task)
    cfg_ref = ray.put(cfg)
    queue = list(reversed(tasks))
    in_flight = []
    try:
        while queue or in_flight:
            while queue and len(in_flight) < max_in_flight:
                in_flight.append(remote.remote(queue.pop(), cfg_ref))
            done, in_flight = ray.wait(in_flight, num_returns=1)
            for ref in done:
                on_done(ray.get(ref))
    except BaseException:  # a failed task or Ctrl-C: stop the tasks still running
        for ref in in_flight:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        raise
