"""Start N worker processes with an initialised process group, or join one started by torchrun: the one launcher.

Two ways to use it, one mechanism (:class:`WorkerPool`):

* ``launch(fn, nproc, *args)`` runs ``fn(*args)`` once on every rank and returns the per-rank results.
  **Under torchrun** (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` in the environment) the current process is
  one rank: the process group is initialised from the environment (``env://``), ``fn`` runs here and the
  result list holds only this rank's value (at its index; other entries ``None``). **Otherwise**: a one-shot pool.
* ``WorkerPool(n)`` keeps ``n`` processes, each with its process group, and runs many functions on them:
  ``pool.run(fn, *args)`` calls ``fn(rank, *args)`` on every rank (tests and benchmarks reuse one pool for
  many cases, so the start-up is paid once).

Workers are forked by a ``forkserver`` that imported torch (for :func:`launch` also fcp's training stack) once,
so a start costs ~0.1 s (``spawn`` where there is none; a launch that needs more modules restarts an idle forkserver
with them, :mod:`fcp_exec.forkserver`); they rendezvous on a ``TCPStore`` the parent hosts on a free port (no port
race). A worker's exception is re-raised here as :class:`WorkerFailure` with each failing rank's traceback (peers
get 2 s to report theirs: the first error is often a peer's symptom); ``timeout`` bounds the start-up and every run:
a hanging or dying worker makes the pool kill all workers and raise ``TimeoutError`` / :class:`WorkerFailure`, never
hang. Tasks and results are pickled before they are queued (one that cannot cross processes fails at once); after a
failure the pool restarts on the next ``run`` (a failed ring leaves stale messages); workers end with the parent
(how, and how results come back: :mod:`fcp_exec.launch_procs`).

Backend: NCCL with CUDA (one device per local rank), HCCL with ``torch_npu``, else gloo (a worker: ``max(1, cpu_count
// nproc)`` torch threads, freed memory kept: :mod:`fcp_exec.host_memory`). Workers inherit stdout/stderr.
"""

from __future__ import annotations

import atexit
import datetime
import math
import multiprocessing.util  # registers its exit hook before ours, so atexit runs _close_all first
import os
import queue
import time
import traceback
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any, Callable, Sequence

from fcp_data.frozen_heap import frozen_fork_context
from fcp_data.sampler_inputs import dist_rank_and_world as dist_info  # the one rank/world helper
from fcp_exec.devices import (check_devices, collective_dtype, current_device, default_backend, init_distributed,
                               settle_collectives)
from fcp_exec.compat import HF_MODELS_RELEASE, torch_release
from fcp_exec import forkserver
from fcp_exec.host_memory import keep_freed_memory
from fcp_exec.launch_procs import (ResultPipes, check_backend, check_seconds, lead_group, next_task, report,
                                   start_all, stop, watch_parent)

__all__ = ["launch", "WorkerPool", "WorkerFailure", "resolve_nproc", "default_backend", "current_device",
           "in_torchrun", "dist_info", "init_distributed", "collective_dtype", "check_devices", "settle_collectives",
           "dataloader_context"]

_HOST = "127.0.0.1"
# torch._dynamo: torch imports it on a process's first dynamo-disabled call (optimizer step, FSDP): ~1 s per worker
_PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "fcp_exec.launch")
# launch() serves training: its forkserver also imports the training stack once (later launches start in ~0.1 s)
# (transformers 5 only on torch >= 2.6: older, it disables its models and its model code fails on import)
_HF_PRELOAD = "transformers fcp_exec.integrations.hf fcp_exec.integrations.hf_positions"
_TRAIN_PRELOAD = _PRELOAD + tuple(("fcp_exec.train fcp_exec.ring_attention fcp_exec.models fcp_data.sampler "
                                   "fcp_data.collator fcp_data.plan").split()
                                  + (_HF_PRELOAD.split() if torch_release() >= HF_MODELS_RELEASE else []))
_START_TIMEOUT_S = 300.0  # launch(timeout=math.inf): how long the ranks may take to start and join the process group
_GRACE_S = 2.0  # after the first failure, how long the other ranks may still report theirs


def in_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def resolve_nproc(nproc: int | None, default: int = 2) -> int:
    """The ``--nproc`` of a command: torchrun's ``WORLD_SIZE`` under torchrun, else ``nproc`` or ``default``."""
    if in_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc not in (None, world):
            raise ValueError(f"running under torchrun with WORLD_SIZE={world}; drop --nproc or pass {world}")
        return world
    nproc = default if nproc is None else nproc
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    return nproc


class WorkerFailure(RuntimeError):
    """One or more ranks failed. ``errors`` maps rank to ``(exception type name, message, traceback text)``;
    a rank that died without a Python exception has type name ``"exit"``. ``str()`` shows every traceback."""

    def __init__(self, errors: dict[int, tuple[str, str, str]], what: str = "workers"):
        self.errors = dict(errors)
        detail = "".join(f"\n--- rank {r} ---\n{tb}" for r, (_, _, tb) in sorted(self.errors.items()))
        super().__init__(f"{what}: {len(self.errors)} worker(s) failed (ranks {sorted(self.errors)}){detail}")


def _failure(e: BaseException) -> tuple[str, str, str]:  # what WorkerFailure.errors holds per rank
    return type(e).__name__, str(e), traceback.format_exc()


def max_local_ranks() -> int:
    """The most ranks one :class:`WorkerPool` starts on this machine: 8 per usable CPU core, at least 64."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(64, 8 * cores)


def _pickled(obj: Any, what: str) -> bytes:
    """``obj`` pickled here, not in a queue's feeder thread: there a pickling error is only printed and the item
    dropped, so the other side would wait for it until its timeout (a lambda as ``fn`` hung ``launch`` 30 min)."""
    try:
        return bytes(ForkingPickler.dumps(obj))
    except Exception as e:  # noqa: BLE001 - pickle raises AttributeError, TypeError, PicklingError, ...
        raise TypeError(f"{what} cannot be pickled to cross processes ({type(e).__name__}: {e}); use a module-level "
                        "function (not a lambda or a nested function) and picklable arguments and results") from None


def _worker_main(rank: int, world: int, port: int, backend: str, pg_timeout: float, threads: int | None,
                 tasks, results) -> None:
    """One rank: join the process group on the parent's store, then run tasks until told to stop (or until the
    parent is gone: :func:`~fcp_exec.launch_procs.watch_parent`). ``results``: this rank's pipe to the parent."""
    import torch.distributed as dist

    global _LAUNCHED_RANK
    _LAUNCHED_RANK = True
    lead_group()
    watch_parent()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR=_HOST, MASTER_PORT=str(port))
    try:
        store = dist.TCPStore(_HOST, port, None, False, timeout=datetime.timedelta(seconds=pg_timeout))
        keep_freed_memory(current_device())  # CPU ranks only; before init_distributed starts gloo's threads
        init_distributed(backend, pg_timeout, threads, store=store)
        report(results, -1, "ok", _pickled(None, "start-up"))
        while (task := next_task(tasks)) is not None:
            task_id, blob = task
            try:
                fn, args = ForkingPickler.loads(blob)
                value = fn(rank, *args)
                name = getattr(args[0] if fn is _without_rank else fn, "__qualname__", fn)
                report(results, task_id, "ok", _pickled(value, f"the value {name} returned"))
            except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
                report(results, task_id, "err", _failure(e))
    except BaseException as e:  # noqa: BLE001 - start-up failures (and a task that cannot be unpickled)
        report(results, -1, "err", _failure(e))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def _spawn(world: int, worker_args: tuple, preload: Sequence[str], timeout: float):
    """Start ``world`` workers within ``timeout`` s: ``(processes, task queues, result pipes)``. Through the forkserver
    when there is one, by ``spawn`` if there is none or its socket vanished (e.g. its temp dir was cleaned)."""
    import torch.multiprocessing as mp

    for method in (["forkserver"] if "forkserver" in mp.get_all_start_methods() else []) + ["spawn"]:
        ctx, before = mp.get_context(method), None
        if method == "forkserver":
            preload, before = forkserver.set_preload(ctx, preload)
        results, tasks = ResultPipes(ctx, world), [ctx.Queue() for _ in range(world)]
        procs = [ctx.Process(target=_worker_main, name=f"fcp-rank-{r}", daemon=False,  # ranks may start DataLoader workers
                             args=(r, world, *worker_args, tasks[r], results.writers[r])) for r in range(world)]
        try:
            start_all(procs, timeout, before)
            if method == "forkserver":
                forkserver.note_started(preload, before)
            results.started()
            return procs, tasks, results
        except BaseException as e:
            stop(procs)
            results.abandon()
            if method == "spawn" or not isinstance(e, OSError) or isinstance(e, TimeoutError):
                raise


_LAUNCHED_RANK = False  # True in a rank that _worker_main runs (forked by this launcher's forkserver)


def dataloader_context(num_workers: int, *objects: Any) -> Any:
    """The ``multiprocessing_context`` for a DataLoader with ``num_workers`` workers in this process (``objects``: its
    dataset and collate function): :func:`fcp_data.workers.worker_context`'s preloaded forkserver where this
    interpreter's fork can deadlock a worker (CPython gh-112275); else ``fork`` (with the heap frozen:
    :func:`fcp_data.frozen_heap.frozen_fork_context`) in a rank this launcher started (its default start method is
    the forkserver's, whose server preloads nothing: every worker imported torch again, 2 s per iteration with 2
    workers; forked, the workers also end with the rank), else worker_context's (torch's default)."""
    from fcp_data.workers import worker_context

    safe = worker_context(num_workers, *objects)
    if safe is not None:
        return safe
    if num_workers <= 0 or not _LAUNCHED_RANK:
        return None
    if multiprocessing.get_start_method(allow_none=True) != "forkserver" or "fork" not in \
            multiprocessing.get_all_start_methods():
        return None
    return frozen_fork_context()


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At exit, before multiprocessing joins its (non-daemon) children: stop every pool still open."""
    for pool in list(_LIVE):
        pool.close(timeout=2.0)


class WorkerPool:
    """``world_size`` ranks that run functions on demand (module docstring); use as a context manager.
    ``backend`` None: the device's (:func:`default_backend`); ``num_threads`` None: the gloo share of the cores."""

    def __init__(self, world_size: int, *, backend: str | None = None, pg_timeout: float = 300.0,
                 start_timeout: float = 300.0, num_threads: int | None = None, preload: Sequence[str] = _PRELOAD):
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"nproc must be a positive int, got {world_size!r}")
        if world_size > max_local_ranks():  # 10**9 started processes until "Too many open files"
            raise ValueError(f"nproc={world_size} is more processes than this machine can run (at most "
                             f"{max_local_ranks()}: 8 per CPU core this process may use, at least 64)")
        pg_timeout = check_seconds("pg_timeout", pg_timeout, finite=True)  # before any process starts
        start_timeout = check_seconds("start_timeout", start_timeout)
        check_backend(backend)
        self.world_size = world_size
        self.backend = backend or default_backend()
        check_devices(self.backend, world_size)
        if num_threads is None and self.backend == "gloo":
            num_threads = max(1, (os.cpu_count() or 1) // world_size)
        self.num_threads, self.pg_timeout, self.start_timeout = num_threads, float(pg_timeout), float(start_timeout)
        self.preload = tuple(preload)
        self._procs, self._tasks = [], []  # processes and their task queues, by rank
        self._results, self._store, self._next_id = None, None, 0

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> "WorkerPool":
        """Start the workers (no-op while they are alive) and wait until every rank joined the process group."""
        if self.alive:
            return self
        self._kill()
        import torch.distributed as dist

        self._store = dist.TCPStore(_HOST, 0, None, True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=self.pg_timeout))
        worker_args = (self._store.port, self.backend, self.pg_timeout, self.num_threads)
        deadline = time.monotonic() + self.start_timeout
        self._procs, self._tasks, self._results = _spawn(self.world_size, worker_args, self.preload, self.start_timeout)
        _LIVE.add(self)
        self._collect(-1, max(0.0, deadline - time.monotonic()), what="start-up (init_process_group)")
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Ask the workers to leave (they destroy their process group), then kill stragglers."""
        for q in self._tasks:
            try:
                q.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        stop(self._procs)
        for q in self._tasks:  # end each queue's feeder thread now, not whenever the queue is collected
            q.cancel_join_thread()
            q.close()
        _LIVE.discard(self)
        self._procs, self._tasks, self._results, self._store = [], [], None, None

    def __enter__(self) -> "WorkerPool":
        return self.start()

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:  # the workers may be busy with the interrupted task: do not wait for them
            self._kill()

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 1800.0) -> list:
        """Call ``fn(rank, *args)`` on every rank; the results by rank (restarts the pool first if needed)."""
        self.start()
        task_id, self._next_id = self._next_id, self._next_id + 1
        target = args[0] if fn is _without_rank else fn
        what = getattr(target, "__qualname__", repr(target))
        for q in self._tasks:  # pickled once per queue, as the queue itself would (tensors' shared memory handles)
            q.put((task_id, _pickled((fn, args), f"{what} with its arguments")))
        return self._collect(task_id, timeout, what=what)

    def _collect(self, task_id: int, timeout: float, *, what: str) -> list:
        """Every rank's result of ``task_id``; on a failure, a hang past ``timeout`` or a dead worker the workers
        are killed and WorkerFailure / TimeoutError is raised."""
        values, errors = {}, {}  # rank -> result; rank -> (type name, message, traceback)
        deadline, grace = time.monotonic() + timeout, float("inf")
        while len(values) + len(errors) < self.world_size:
            limit = min(deadline, grace)
            if time.monotonic() >= limit:
                break
            try:
                rank, tid, status, payload = self._results.get(timeout=max(0.01, min(0.5, limit - time.monotonic())))
            except queue.Empty:  # a rank that ended, its pipe held open by a child of it: gone all the same
                errors.update((r, self._died(r)) for r in self._results.silent(self._procs, values.keys() | errors))
            else:
                if status == "eof":  # the rank's pipe ended: the rank is gone, after everything it sent
                    if rank not in values and rank not in errors:
                        errors[rank] = self._died(rank)
                elif tid != task_id and not (tid == -1 and status == "err"):
                    continue  # a stale reply from an earlier, failed task
                elif status != "ok":
                    errors[rank] = payload
                else:
                    try:
                        values[rank] = ForkingPickler.loads(payload)
                    except Exception as e:  # noqa: BLE001 - e.g. its class cannot be imported here
                        errors[rank] = (type(e).__name__, str(e), f"rank {rank}'s result cannot be unpickled here: {e}")
            if errors:
                grace = min(grace, time.monotonic() + _GRACE_S)
        if len(values) == self.world_size:
            return [values[r] for r in range(self.world_size)]
        missing = sorted(set(range(self.world_size)) - set(values) - set(errors))
        self._kill()
        if errors:
            raise WorkerFailure(errors, f"{what}" + (f"; ranks {missing} did not finish afterwards" if missing else ""))
        raise TimeoutError(f"{what}: ranks {missing} did not finish within {timeout:g} s (workers killed; the pool "
                           "restarts on the next run)")

    def _died(self, rank: int) -> tuple[str, str, str]:
        p = self._procs[rank]
        p.join(1.0)  # its exit status follows its pipe's end
        return "exit", _death(rank, p.exitcode), f"rank {rank} exit code {p.exitcode} (died without reporting)"


def _death(rank: int, code: int | None) -> str:
    """How a rank that reported nothing ended, in words: "rank 1 was killed by SIGKILL (out of memory?)"."""
    import signal

    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"rank {rank} was killed by {name}" + (" (out of memory?)" if -code == signal.SIGKILL else "")
    return f"rank {rank} ended with exit code {code} without reporting an error"


def _without_rank(rank: int, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def launch(fn: Callable[..., Any], nproc: int, *args: Any, backend: str | None = None,
           timeout: float = 1800.0, pg_timeout: float = 300.0, preload: Sequence[str] = ()) -> list:
    """Run ``fn(*args)`` on ``nproc`` ranks (module docstring); returns the results by rank. ``timeout`` bounds
    the whole run (start-up included); ``math.inf``: no deadline for the run (a training run takes as long as it takes;
    a hung collective still ends at ``pg_timeout``), the start-up bounded by :data:`_START_TIMEOUT_S`. ``preload``: more
    modules the forkserver imports once (an idle one that lacks them is restarted), e.g.
    ``transformers.modeling_utils`` (~3 s per rank otherwise)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    check_seconds("timeout", timeout)
    check_seconds("pg_timeout", pg_timeout, finite=True)
    check_backend(backend)
    if in_torchrun():
        return _in_torchrun(fn, nproc, args, backend, pg_timeout)
    _pickled((fn, args), f"{getattr(fn, '__qualname__', fn)!s} with its arguments")  # before any process starts
    deadline = time.monotonic() + timeout
    with WorkerPool(nproc, backend=backend, pg_timeout=pg_timeout, preload=_TRAIN_PRELOAD + tuple(preload),
                    start_timeout=timeout if math.isfinite(timeout) else _START_TIMEOUT_S) as pool:
        return pool.run(_without_rank, fn, *args, timeout=max(0.0, deadline - time.monotonic()))


def _in_torchrun(fn: Callable[..., Any], nproc: int, args: tuple, backend: str | None, pg_timeout: float) -> list:
    """Under torchrun this process is one rank: initialise the process group once and run ``fn`` here."""
    import torch.distributed as dist

    world = int(os.environ["WORLD_SIZE"])
    if nproc not in (1, world):
        raise ValueError(f"running under torchrun with WORLD_SIZE={world}; drop --nproc or pass {world}")
    if not dist.is_initialized():
        init_distributed(backend or default_backend(), pg_timeout)
    out: list = [None] * world
    out[dist.get_rank()] = fn(*args)
    return out
