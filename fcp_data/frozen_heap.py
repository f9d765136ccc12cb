"""Processes fcp forks leave the heap they inherit out of their garbage collections (:func:`gc.freeze`).

Two ways: the forkservers fcp starts freeze their heap after their preload (collect the server's garbage, then
freeze), and :func:`frozen_fork_context` — what :func:`fcp_data.workers.worker_context` gives a DataLoader where
forking is safe — forks each worker with the parent's heap frozen for the moment of the fork. Those servers import
their preload guarded (:data:`GUARD`).

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

They preload :data:`GUARD` (``fcp_data._guarded_preload``) first: :func:`import_guarded` imports the modules listed
after it one by one and takes those whose import raised off the server's list. ``multiprocessing.forkserver.main``
skips a module that raises ImportError only; any other error — a module of the dataset's package that parses
``sys.argv`` at import (``SystemExit`` in the server, whose argv is ``['-c']``), or one that needs the program's run
time state (RuntimeError) — ended the server, and the DataLoader or the launch failed with "unexpected EOF". Skipped,
such a module is imported by each worker that needs it, as without the preload.

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
import importlib
import multiprocessing.context as mp_context
import os
import sys
import threading

__all__ = ["MODULE", "GUARD", "in_forkserver", "freeze_if_forkserver", "import_guarded", "preload_with_freeze",
           "FrozenForkContext", "frozen_fork_context"]

MODULE = "fcp_data._freeze_heap"  # what a forkserver's preload lists, last
GUARD = "fcp_data._guarded_preload"  # what it lists first
_OWN = tuple(os.path.join(os.path.dirname(__file__), f) for f in ("frozen_heap.py", "_freeze_heap.py",
                                                                   "_guarded_preload.py")) + (__file__,)


def _preload_loop():
    """The frame of ``multiprocessing.forkserver.main`` when it is the first caller outside these three files and
    the import machinery (its preload loop imports :data:`MODULE` or :data:`GUARD`); else None."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename in _OWN
                                 or frame.f_code.co_filename.startswith("<frozen importlib")):
        frame = frame.f_back
    if (frame is not None and frame.f_code.co_name == "main"
            and frame.f_code.co_filename.replace("\\", "/").endswith("multiprocessing/forkserver.py")):
        return frame
    return None


def in_forkserver() -> bool:
    """Whether :data:`MODULE` is being imported by ``multiprocessing.forkserver.main``'s preload loop itself."""
    return _preload_loop() is not None


def import_guarded() -> list[str]:
    """In a forkserver's preload loop (its import of :data:`GUARD`): import the modules listed after it, one at a
    time, catching whatever their import raises, and take the failed ones off the loop's own list (its ``preload``
    argument, changed in place after the loop's position), which then finds the others imported; returns the failed.
    :data:`MODULE` is left to the loop (the freeze follows every import). Elsewhere it does nothing."""
    frame = _preload_loop()
    preload = frame.f_locals.get("preload") if frame is not None else None
    if not isinstance(preload, list) or GUARD not in preload:
        return []
    after = preload.index(GUARD) + 1
    failed = []
    for name in preload[after:]:
        if name in ("__main__", MODULE):
            continue
        try:
            importlib.import_module(name)
        except ImportError:  # what the loop itself skips, silently
            failed.append(name)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - what would end the server (module docstring)
            failed.append(name)
            print(f"fcp: the forkserver skips preloading {name} ({type(exc).__name__}: {exc}); the processes it starts "
                  "import it themselves where they need it", file=sys.stderr, flush=True)
    preload[after:] = [m for m in preload[after:] if m not in failed]
    return failed


def _enabled() -> bool:
    """``FCP_GC_FREEZE``: off for 0, false, no or off (as ``FCP_JIT``, :mod:`fcp_data.jit`)."""
    return os.environ.get("FCP_GC_FREEZE", "1").strip() not in ("0", "false", "no", "off")


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
    """``preload`` with :data:`GUARD` at its start (its modules imported one at a time, those that raise skipped) and
    :data:`MODULE` at its end (the freeze must follow every other import)."""
    return [GUARD] + [m for m in preload if m not in (GUARD, MODULE)] + [MODULE]


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
