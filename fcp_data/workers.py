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

:func:`worker_context` is the ``multiprocessing_context`` to give such a DataLoader: where forking is safe, torch's
default (``fork`` on Linux, as :func:`~fcp_data.frozen_heap.frozen_fork_context`: each worker forked with the rank's
heap frozen, so that its garbage collections do not walk and copy it); on an affected interpreter, ``forkserver``: the
workers are forked by a single-threaded server process, started at once (its imports overlap the model's
construction) with the main script, torch, fcp's data side and the modules the objects passed (the dataset, the
collate function) need imported once (its heap then frozen, :mod:`fcp_data.frozen_heap`): every module a worker
would import to unpickle them (found by pickling them, :func:`_modules`) and every module of those packages
this rank has imported already (what a worker reaches lazily, :func:`_imported_under`). Preloading only the
objects' own types, each worker of the video example imported ``transformers`` and ``torch._dynamo`` itself, at
every epoch: its loader's first batch after new workers took 3.1 s, now 0.85 s (1.1 s with ``fork``); the
server's own start stays (4.3 s to the first batch against 1.2 s with ``fork``; ``benchmarks/bench_worker_start.py``).
The dataset and the collate function are then pickled to each worker (cheap for an index over files or a
memory-mapped dataset; a dataset that holds all its samples in memory is copied), and the main script needs the usual
``if __name__ == "__main__":`` guard — a script that runs its work at import without one
(:func:`main_script_unguarded`) would run again inside the server, so its workers are forked as torch does, with one
warning. ``persistent_workers=True`` starts them once per run instead of once per epoch.
"""

from __future__ import annotations

import functools
import inspect
import logging
import multiprocessing
import operator
import os
import pickle
import sys
from multiprocessing import forkserver

from fcp_data.frozen_heap import frozen_fork_context, preload_with_freeze

__all__ = ["fork_may_deadlock", "worker_context", "started_forkserver", "preload_from_env", "main_script_unguarded"]

logger = logging.getLogger("fcp_data")

_PICKLE_LIMIT = 64 << 20  # bytes of the objects' pickle looked at for the modules they need
_warned: set[str] = set()  # main scripts main_script_unguarded named in a warning (once each)
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


class _Stop(Exception):
    """Raised by :class:`_Sink` past its limit: the modules seen so far are kept."""


class _Sink:
    """A file that keeps nothing, and stops the pickler after ``limit`` bytes."""

    def __init__(self, limit: int):
        self.left = limit

    def write(self, data) -> int:
        self.left -= len(data)
        if self.left < 0:
            raise _Stop
        return len(data)


class _ModuleRecorder(pickle.Pickler):
    """Pickles into nothing and records the module of every class, function and instance's type it meets: what a
    worker imports when it unpickles the same objects."""

    def __init__(self, limit: int):
        super().__init__(_Sink(limit), protocol=pickle.HIGHEST_PROTOCOL)
        self.modules: dict[str, None] = {}

    def reducer_override(self, obj):
        self.modules[_module_of(obj)] = None
        return NotImplemented


def _module_of(obj) -> str:
    """The module defining ``obj`` (a class or function: its own; an instance: its type's); "builtins" if none."""
    owner = obj if inspect.isclass(obj) or inspect.isroutine(obj) else type(obj)
    module = getattr(owner, "__module__", None)
    return module if isinstance(module, str) else "builtins"


def _modules(objects, limit: int = _PICKLE_LIMIT) -> list[str]:
    """The modules a worker imports to unpickle ``objects`` (the dataset, the collate function: the classes and
    functions inside them too — a collate function of fcp's Hugging Face integration needs ``transformers``, ~3 s of
    imports per worker otherwise), found by pickling them into nothing (the first ``limit`` bytes; the DataLoader
    pickles them again for each worker), without ``__main__`` (preloaded as the main script) and builtins. Objects
    that do not pickle name their own type's module only: the DataLoader reports their error itself."""
    found: dict[str, None] = {}
    for obj in objects:
        found[_module_of(obj)] = None
        recorder = _ModuleRecorder(limit)
        try:
            recorder.dump(obj)
        except Exception:  # noqa: BLE001 - past the limit (_Stop), or not picklable: the DataLoader reports that
            pass
        found.update(recorder.modules)
    return [m for m in found if m not in ("__main__", "__mp_main__", "builtins")]


def _imported_under(modules) -> list[str]:
    """Every module this process has imported from the top-level packages of ``modules`` (in the order their imports
    completed; importing one imports its parents first): what the workers' code reaches lazily after unpickling (a
    model family's modeling module and ``torch._dynamo`` behind it), which a forked worker would have inherited from
    its rank. Aliases (``os.path``) and modules without an import spec are left out."""
    packages = {m.partition(".")[0] for m in modules}
    out = []
    for name, module in list(sys.modules.items()):
        spec = getattr(module, "__spec__", None)
        if name.partition(".")[0] in packages and getattr(spec, "name", None) == name:
            out.append(name)
    return out


def _main_module() -> list[str]:
    """The main module's name where it ran as ``python -m NAME`` (``torchrun -m torchtitan.train``): the forkserver
    imports only a main *script* as ``__main__``, and each worker would run the module again (its imports included)
    when it starts; imported once in the server, a worker's run of it costs its own statements only."""
    name = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", None)
    return [name] if name and name != "__main__" and not name.endswith(".__main__") else []


def preload_from_env() -> list[str]:
    """``FCP_FORKSERVER_PRELOAD``: more modules, comma-separated, for every forkserver fcp starts — this module's
    and the launcher's (:mod:`fcp_exec.forkserver`) — e.g. the package of the function the workers run, which each
    worker would otherwise import when it unpickles the task."""
    return [m.strip() for m in os.environ.get("FCP_FORKSERVER_PRELOAD", "").split(",") if m.strip()]


def _default_start_method() -> str | None:
    """The start method a DataLoader given no context would use, without fixing it (``get_start_method()`` would)."""
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None:
        default = getattr(multiprocessing.context._default_context, "_default_context", None)
        method = default.get_start_method() if default is not None else None
    return method


def worker_context(num_workers: int, *objects, start_method: str | None = None):
    """The ``multiprocessing_context`` for a DataLoader with ``num_workers`` workers in this process (module
    docstring): None without workers; on an interpreter with the fork deadlock a ``forkserver`` context that preloads
    the main script, torch, fcp's sampler and collator and what unpickling ``objects`` (pass the dataset and the
    collate function) and running them needs; elsewhere torch's default — ``fork`` as
    :func:`~fcp_data.frozen_heap.frozen_fork_context` (the workers leave the rank's heap out of their collections)
    where the default start method is ``fork``, else None. ``start_method`` forces a method ("fork", "spawn",
    "forkserver") and returns its plain context. A forkserver that is already running keeps its preload."""
    global _started
    if start_method is not None:
        if start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"start method {start_method!r} is not available here (available: "
                             f"{', '.join(multiprocessing.get_all_start_methods())})")
        return multiprocessing.get_context(start_method)
    if isinstance(num_workers, bool) or not hasattr(type(num_workers), "__index__"):  # an int, or numpy's
        raise TypeError(f"num_workers must be an int, got {num_workers!r}")
    if operator.index(num_workers) <= 0:
        return None
    unguarded = fork_may_deadlock() and main_script_unguarded()
    if unguarded and unguarded not in _warned:  # a forkserver would run its training again: torch's default instead
        logger.warning("fcp: %s runs its work at import (no `if __name__ == \"__main__\":` guard), so its DataLoader "
                       "workers are forked from this process, as torch does, not started by a forkserver; on this "
                       "Python (%s) such a fork can deadlock (CPython gh-112275): add the guard", unguarded,
                       ".".join(map(str, sys.version_info[:3])))
        _warned.add(unguarded)
    if unguarded or not fork_may_deadlock() or "forkserver" not in multiprocessing.get_all_start_methods():
        return frozen_fork_context() if _default_start_method() == "fork" else None
    ctx = multiprocessing.get_context("forkserver")
    if getattr(forkserver._forkserver, "_forkserver_pid", None) is None:
        needed = ["torch", "fcp_data.sampler", "fcp_data.collator", *_modules(objects)]
        preload = list(dict.fromkeys(["__main__", *_main_module(), *needed, *_imported_under(needed),
                                      *preload_from_env()]))
        ctx.set_forkserver_preload(preload_with_freeze(preload))  # fcp_data.frozen_heap: the server's heap frozen
        forkserver.ensure_running()  # its imports run now, beside whatever this rank does before its first batch
        _started = (forkserver._forkserver._forkserver_pid, tuple(preload))
    return ctx


def main_script_unguarded() -> str | None:
    """The main script's path when importing it runs work — a top-level statement that calls something, beyond
    imports, definitions and assignments of literals — and it has no top-level ``if __name__ == "__main__":``; None
    when it is guarded, does nothing at import, or cannot be read (``python -c``, an interactive session)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    try:
        st = os.stat(path) if path else None
    except (OSError, ValueError):
        return None
    return _unguarded(str(path), st.st_mtime_ns, st.st_size) if st else None


@functools.lru_cache(maxsize=8)
def _unguarded(path: str, mtime_ns: int, size: int) -> str | None:
    """:func:`main_script_unguarded` for the script at ``path`` as of ``mtime_ns`` / ``size``: parsed once per
    version of the file (a loader per epoch asks)."""
    import ast

    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    quiet = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) and "__main__" in ast.unparse(node.test):
            return None
    calls = any(not isinstance(node, quiet) and any(isinstance(n, ast.Call) for n in ast.walk(node)) for node in tree.body)
    return path if calls else None


def started_forkserver() -> tuple[int, tuple[str, ...]] | None:
    """``(pid, preload)`` of the forkserver :func:`worker_context` started in this process (None: none), which
    :mod:`fcp_exec.forkserver` adopts as fcp's own (a later launch may restart it with more modules)."""
    return _started
