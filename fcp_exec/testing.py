"""Run functions on N local gloo worker processes (for tests and CPU benchmarks).

:class:`WorkerPool` spawns ``world_size`` processes once, each with an initialised process group
(``init_process_group`` on a ``TCPStore`` hosted by the parent on a free port, so there is no
port race; started through a forkserver that has imported torch once, so a restart costs ~0.1 s
instead of a fresh interpreter per worker), and then runs many functions on all of them: ``pool.run(fn, *args)`` calls
``fn(rank, *args)`` on every rank and returns the per-rank results. Robustness:

* a worker exception is re-raised in the parent as :class:`WorkerError` carrying every failing
  rank's traceback text;
* ``timeout`` bounds every ``run`` (and the start-up); a worker that hangs or dies makes the pool
  kill all workers and raise, never hang the caller;
* after any failure the pool restarts lazily on the next ``run`` (a half-finished ring may leave
  unmatched messages behind, so the old process group is not reused);
* workers always destroy their process group on the way out.

Functions and arguments must be picklable (module-level functions). ``torch`` threads per worker
default to 1 so several workers share a small machine fairly.

:func:`dense_attention` is the single-process ground truth the ring is compared against.
"""
from __future__ import annotations

import datetime
import queue
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["WorkerError", "WorkerPool", "dense_attention", "run_workers"]

_HOST = "127.0.0.1"
_PRELOAD = ["torch", "torch.distributed", "fcp_exec.testing"]


class WorkerError(RuntimeError):
    """One or more workers raised; ``tracebacks`` maps rank to the worker's traceback text."""

    def __init__(self, message: str, tracebacks: dict[int, str] | None = None):
        self.tracebacks = dict(tracebacks or {})
        details = "".join(f"\n--- worker rank {r} ---\n{tb}" for r, tb in sorted(self.tracebacks.items()))
        super().__init__(message + details)


def _worker_main(rank, world_size, port, backend, pg_timeout, num_threads, tasks, results):
    try:
        torch.set_num_threads(num_threads)
        timeout = datetime.timedelta(seconds=pg_timeout)
        store = dist.TCPStore(_HOST, port, None, False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        results.put((rank, -1, "ok", None))
    except BaseException:  # noqa: BLE001 - everything must reach the parent
        results.put((rank, -1, "err", traceback.format_exc()))
        return
    try:
        while True:
            item = tasks.get()
            if item is None:
                break
            task_id, fn, args = item
            try:
                value = fn(rank, *args)
                results.put((rank, task_id, "ok", value))
            except BaseException:  # noqa: BLE001
                results.put((rank, task_id, "err", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class WorkerPool:
    """``world_size`` gloo workers that run functions on demand; use as a context manager."""

    def __init__(self, world_size: int, *, backend: str = "gloo", pg_timeout: float = 60.0,
                 start_timeout: float = 120.0, num_threads: int = 1, start_method: str | None = None):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        self.world_size = world_size
        self.backend = backend
        self.pg_timeout = float(pg_timeout)
        self.start_timeout = float(start_timeout)
        self.num_threads = num_threads
        if start_method is None:
            start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self.start_method = start_method
        self._procs: list = []
        self._tasks: list = []
        self._results = None
        self._store = None
        self._next_id = 0

    # ------------------------------------------------------------------ lifecycle
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def start(self) -> "WorkerPool":
        if self.alive:
            return self
        self._kill()
        ctx = mp.get_context(self.start_method)
        if self.start_method == "forkserver":
            ctx.set_forkserver_preload(_PRELOAD)
        self._store = dist.TCPStore(_HOST, 0, None, True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=self.pg_timeout))
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        for rank in range(self.world_size):
            p = ctx.Process(target=_worker_main, daemon=True, name=f"fcp-worker-{rank}",
                            args=(rank, self.world_size, self._store.port, self.backend,
                                  self.pg_timeout, self.num_threads, self._tasks[rank], self._results))
            p.start()
            self._procs.append(p)
        self._collect(-1, self.start_timeout, what="start-up (init_process_group)")
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Ask workers to exit (they destroy their process group), then kill stragglers."""
        if not self._procs:
            return
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
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(5.0)
        self._procs, self._tasks, self._results, self._store = [], [], None, None

    def __enter__(self) -> "WorkerPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ running
    def run(self, fn: Callable[..., Any], *args, timeout: float = 120.0) -> list:
        """Call ``fn(rank, *args)`` on every worker; return the results ordered by rank."""
        self.start()
        task_id = self._next_id
        self._next_id += 1
        for q in self._tasks:
            q.put((task_id, fn, args))
        name = getattr(fn, "__qualname__", repr(fn))
        return self._collect(task_id, timeout, what=f"{name}{args!r}"[:200])

    def _collect(self, task_id: int, timeout: float, *, what: str) -> list:
        values: dict[int, Any] = {}
        errors: dict[int, str] = {}
        deadline = time.monotonic() + timeout
        grace_deadline = None
        while len(values) + len(errors) < self.world_size:
            now = time.monotonic()
            limit = deadline if grace_deadline is None else min(deadline, grace_deadline)
            if now >= limit:
                missing = sorted(set(range(self.world_size)) - set(values) - set(errors))
                self._kill()
                if errors:
                    raise WorkerError(f"{what}: worker(s) {sorted(errors)} raised; ranks {missing} did "
                                      "not finish afterwards (pool restarted)", errors)
                raise TimeoutError(f"{what}: ranks {missing} did not finish within {timeout:g} s "
                                   "(pool killed and will restart)")
            try:
                rank, tid, status, payload = self._results.get(timeout=min(0.5, limit - now))
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(self._procs)
                        if not p.is_alive() and r not in values and r not in errors]
                if dead:
                    self._kill()
                    raise WorkerError(f"{what}: worker(s) died without reporting: "
                                      + ", ".join(f"rank {r} exit code {c}" for r, c in dead), errors)
                continue
            if tid != task_id:
                continue  # a stale reply from an earlier, failed task
            if status == "ok":
                values[rank] = payload
            else:
                errors[rank] = payload
                if grace_deadline is None:
                    grace_deadline = time.monotonic() + min(10.0, self.pg_timeout)
        if errors:
            self._kill()
            raise WorkerError(f"{what}: worker(s) {sorted(errors)} raised (pool restarted)", errors)
        return [values[r] for r in range(self.world_size)]


def run_workers(fn: Callable[..., Any], world_size: int, *args, timeout: float = 120.0, **pool_kwargs) -> list:
    """One-shot: spawn ``world_size`` gloo workers, run ``fn(rank, *args)`` on each, tear down."""
    with WorkerPool(world_size, **pool_kwargs) as pool:
        return pool.run(fn, *args, timeout=timeout)



def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens, *, causal: bool = True,
                    softmax_scale: float | None = None) -> torch.Tensor:
    """Plain dense attention of packed documents (``[T, H, D]``, GQA), differentiable, in float64.

    Builds the full ``[T, T]`` block-diagonal (and causal) mask, so it is for small tests only.
    """
    cu = [int(c) for c in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else cu_seqlens)]
    t, h_q, d = q.shape
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    groups = h_q // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    doc = torch.zeros(t, dtype=torch.long)
    for i in range(len(cu) - 1):
        doc[cu[i]:cu[i + 1]] = i
    pos = torch.arange(t)
    allowed = doc[:, None] == doc[None, :]
    if causal:
        allowed &= pos[:, None] >= pos[None, :]
    s = torch.einsum("qhd,khd->hqk", q64, k64) * scale
    s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, v64)
