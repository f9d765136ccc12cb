"""Processes fcp forks leave the heap they inherit out of their garbage collections (:func:`gc.freeze`).

Two ways: the forkservers fcp starts freeze their heap after their preload (collect the server's garbage, then
freeze), and :func:`frozen_fork_context` — what :func:`fcp_data.workers.worker_context` gives a DataLoader where
forking is safe — forks each worker with the parent's heap frozen for the moment of the fork.

Why: a server that preloaded torch, transformers and ``torch._dynamo`` holds ~370,000 objects that the garbage
collector tracks; each process it forks (an fcp rank, a DataLoader worker) inherits them, and each full collection
there walks all of them — and writes their headers, so the first one also copies every page of the inherited heap
(copy-on-write). Hugging Face's ``Trainer`` runs ``gc.collect()`` at the start of every ``train()`` (through
Accelerate's ``free_memory``): 0.30 s in a fresh rank of such a server, 0.8 s in a rank that has trained a while;
with the heap frozen, 0.15 ms in the fresh rank. Frozen objects are still freed by reference counting; only reference
cycles among the preloaded modules' objects are never collected (the recipe of the :func:`gc.freeze` documentation:
freeze in the parent right before forking).

The servers preload :data:`MODULE` (``fcp_data._freeze_heap``, which nothing else imports: a module runs its body
once, and the freeze must follow every other import) last; its body calls :func:`freeze_if_forkserver`, which
freezes only when ``multiprocessing.forkserver.main``'s preload loop itself imports it — imported anywhere else it
does nothing, so an accidental import cannot pin a process's garbage.

A DataLoader worker forked from a rank inherits the rank's heap the same way (torch, transformers, the model's
Python objects: 385,000 objects in a rank holding a tiny Qwen3; its worker's first full collection took 250 ms and
copied 97 MB, frozen 0.7 ms and 0.6 MB; ``benchmarks/bench_frozen_heap.py``). :class:`FrozenForkContext` freezes
the parent's heap around each worker's ``fork`` and unfreezes it right after (both are O(1) list moves): the child
keeps the frozen view, the parent collects as before (what was young is then in the oldest generation, collected by
the next full collection). A process that holds frozen objects already — a rank forked from a frozen server, or one
that called :func:`gc.freeze` itself — is left as it is (unfreezing would undo that freeze). ``FCP_GC_FREEZE=0``
turns both off.
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing.context as mp_context
import os
import sys
import threading

__all__ = ["MODULE", "in_forkserver", "freeze_if_forkserver", "preload_with_freeze", "FrozenForkContext",
           "frozen_fork_context"]

MODULE = "fcp_data._freeze_heap"  # what a forkserver's preload lists, last
_OWN = (__file__, os.path.join(os.path.dirname(__file__), "_freeze_heap.py"))


def in_forkserver() -> bool:
    """Whether :data:`MODULE` is being imported by ``multiprocessing.forkserver.main``'s preload loop itself: the
    first caller outside these two files and the import machinery is that function."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename in _OWN
                                 or frame.f_code.co_filename.startswith("<frozen importlib")):
        frame = frame.f_back
    return (frame is not None and frame.f_code.co_name == "main"
            and frame.f_code.co_filename.replace("\\", "/").endswith("multiprocessing/forkserver.py"))


def _enabled() -> bool:
    return os.environ.get("FCP_GC_FREEZE", "1") != "0"


def freeze_if_forkserver() -> bool:
    """Collect, then move every tracked object to the permanent generation — in a forkserver only (module docstring).
    Returns whether it froze."""
    if not _enabled() or not in_forkserver():
        return False
    gc.collect()
    gc.freeze()
    # The server's own exit (its parent gone) unfreezes first, so that the interpreter's last collection frees the
    # cycles as without the freeze (else nanobind-bound libraries, triton's, report "leaked" objects on stderr).
    # Its forked children leave by os._exit and do not run this.
    atexit.register(gc.unfreeze)
    return True


def preload_with_freeze(preload) -> list[str]:
    """``preload`` with :data:`MODULE` at its end (the freeze must follow every other import)."""
    return [m for m in preload if m != MODULE] + [MODULE]


_FORK_LOCK = threading.Lock()  # two loaders starting workers in two threads: one freeze window at a time


def _new_fork_lock() -> None:
    """The child of a fork made under :data:`_FORK_LOCK` inherits it held by a thread it does not have: a fresh one,
    so that a worker can start workers of its own (a nested loader) instead of waiting forever."""
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_fork_lock)

if hasattr(mp_context, "ForkContext"):  # POSIX
    class _FrozenForkProcess(mp_context.ForkProcess):
        def start(self) -> None:
            with _FORK_LOCK:
                freeze = _enabled() and gc.get_freeze_count() == 0
                if freeze:
                    gc.freeze()
                try:
                    super().start()
                finally:
                    if freeze:
                        gc.unfreeze()

    class FrozenForkContext(mp_context.ForkContext):
        """The ``fork`` context whose processes start with the parent's heap frozen (module docstring)."""

        Process = _FrozenForkProcess

    _FROZEN_FORK = FrozenForkContext()
else:  # pragma: no cover - Windows has no fork
    FrozenForkContext = None
    _FROZEN_FORK = None


def frozen_fork_context():
    """The :class:`FrozenForkContext` (``get_start_method() == "fork"``), or None where this platform cannot fork."""
    return _FROZEN_FORK
