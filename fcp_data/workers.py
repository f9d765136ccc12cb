"""A DataLoader's worker processes in a training rank: the start method that cannot deadlock them.

A rank is multi-threaded before its DataLoader starts workers (gloo's or NCCL's threads, a tokenizer's pool, fcp's
``fcp-planner`` thread, C++ threads that call into Python), and torch forks the workers by default on Linux. CPython
before 3.12 (and before its September 2024 releases 3.11.10, 3.10.15, 3.9.20, 3.8.20; CPython issue gh-112275) has a
fork bug: the child takes the interpreter's thread-list lock (``HEAD_LOCK``) *before* it re-creates it, so a fork
while another thread holds that lock — which a C thread entering Python does, without the GIL, while it makes its
thread state — leaves the child blocked in ``PyOS_AfterFork_Child`` forever, and the rank waits for that worker
forever. Seen in this project's CI: the Megatron example under ``torchrun`` (CPython 3.11.7) printed nothing for 180
s; its first DataLoader worker was stuck in ``_PyThreadState_DeleteExcept``. ``benchmarks/fork_deadlock.py``
reproduces it with four C threads entering Python: 9–15 of 3,000 forks deadlocked on 3.11.7 (three runs), 0–1 on
3.10.13, none on 3.12.1.

:func:`worker_context` is the ``multiprocessing_context`` to give such a DataLoader: None (torch's default) where
forking is safe; on an affected interpreter, ``forkserver``: the workers are forked by a single-threaded server
process, started at once (its imports overlap the model's construction) with the main script, torch, fcp's data
side and the modules of the objects passed (the dataset, the collate function) imported once. The dataset and the
collate function are then pickled to each worker (cheap for an index over files or a memory-mapped dataset; a
dataset that holds all its samples in memory is copied), and the main script needs the usual
``if __name__ == "__main__":`` guard. ``persistent_workers=True`` starts them once per run instead of once per epoch.
"""

from __future__ import annotations

import inspect
import multiprocessing
import sys
from multiprocessing import forkserver

__all__ = ["fork_may_deadlock", "worker_context", "started_forkserver"]

_started: tuple[int, tuple[str, ...]] | None = None  # (pid, preload) of the forkserver worker_context started

# the first release of each older branch with the gh-112275 fix (the releases of 2024-09-07); 3.12 has it
_FIXED_IN = {(3, 8): 20, (3, 9): 20, (3, 10): 15, (3, 11): 10}


def fork_may_deadlock(version: tuple[int, ...] | None = None, implementation: str | None = None) -> bool:
    """Whether this interpreter (or ``version`` of ``implementation``) has CPython's fork deadlock gh-112275."""
    version = tuple(sys.version_info[:3] if version is None else version)
    if (implementation or sys.implementation.name) != "cpython" or version[:2] >= (3, 12):
        return False
    fixed = _FIXED_IN.get(version[:2])
    return fixed is None or version[2] < fixed


def _modules(objects) -> list[str]:
    """The modules defining ``objects`` (a class or function: its own; an instance: its type's), without
    ``__main__`` (preloaded as the main script) and builtins."""
    out = []
    for obj in objects:
        module = obj.__module__ if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj).__module__
        if module and module not in ("__main__", "builtins"):
            out.append(module)
    return out


def _main_module() -> list[str]:
    """The main module's name where it ran as ``python -m NAME`` (``torchrun -m torchtitan.train``): the forkserver
    imports only a main *script* as ``__main__``, and each worker would run the module again (its imports included)
    when it starts; imported once in the server, a worker's run of it costs its own statements only."""
    name = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
    return [name] if name and name != "__main__" and not name.endswith(".__main__") else []


def worker_context(num_workers: int, *objects, start_method: str | None = None):
    """The ``multiprocessing_context`` for a DataLoader with ``num_workers`` workers in this process (module
    docstring): None where torch's default is safe (no workers, or an interpreter without the fork deadlock), else a
    ``forkserver`` context that preloads the main script, torch, fcp's sampler and collator and the modules of
    ``objects`` (pass the dataset and the collate function). ``start_method`` forces a method ("fork", "spawn",
    "forkserver") and returns its context. A forkserver that is already running keeps its preload."""
    global _started
    if start_method is not None:
        if start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start method {start_method!r} is not available here (available: "
                             f"{', '.join(multiprocessing.get_all_start_methods())})")
        return multiprocessing.get_context(start_method)
    if num_workers <= 0 or not fork_may_deadlock() or "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    ctx = multiprocessing.get_context("forkserver")
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        preload = ["__main__", *_main_module(), "torch", "fcp_data.sampler", "fcp_data.collator", *_modules(objects)]
        preload = list(dict.fromkeys(preload))
        ctx.set_forkserver_preload(preload)
        forkserver.ensure_running()  # its imports run now, beside whatever this rank does before its first batch
        _started = (forkserver._forkserver._forkserver_pid, tuple(preload))
    return ctx


def started_forkserver() -> tuple[int, tuple[str, ...]] | None:
    """``(pid, preload)`` of the forkserver :func:`worker_context` started in this process (None: none), which
    :mod:`fcp_exec.forkserver` adopts as fcp's own (a later launch may restart it with more modules)."""
    return _started
