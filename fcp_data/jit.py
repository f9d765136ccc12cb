"""Optional compiled kernels for the planner's hottest loops and the cost model's group times (``pip install
fcp[fast]``, numba).

A kernel is a plain-Python function over numpy arrays and floats that repeats, operation for operation, what the
numpy path computes: compiled by numba (``njit``, no fastmath: no reassociation, no fused multiply-adds; tested on
x86-64) it returns bit-for-bit the same floats, so plans do not depend on whether numba is installed (the tests run
every kernel against its numpy path). Without numba, or with ``FCP_JIT=0`` in the environment, the numpy path runs.
numba is imported on the first call that wants a kernel, never by ``import fcp_data``; compiled code is cached on
disk (numba's ``cache=True``), so the compilation (~18 s for all of them on 2 slow cores) is paid once per machine
(``python -m fcp_data.plan.compile_kernels`` pays it ahead), and a process ~1 s after (numba's import, the cache).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

__all__ = ["active", "compiled", "jit_enabled", "kernel", "KERNELS"]  # ahead-of-time: python -m fcp_data.plan.compile_kernels

_CACHE: dict[tuple[Callable, str], Callable | None] = {}
KERNELS: dict[str, Callable[[], Callable | None]] = {}  # every kernel's getter, by name (registered at import)
_ACTIVE = [False]  # a kernel was compiled in this process (numba is loaded)


def active() -> bool:
    """Whether a kernel has been compiled (or loaded from the cache) in this process. Kernels too small to justify
    numba's import on their own (the cost model's, :mod:`fcp_data.cost_kernel`) run only from then on: a process
    that never plans a large micro-batch never imports numba."""
    return _ACTIVE[0]


def jit_enabled() -> bool:
    """Whether kernels may be compiled: numba importable and ``FCP_JIT`` not ``0``."""
    if os.environ.get("FCP_JIT", "1").strip() in ("0", "false", "no", "off"):
        return False
    try:
        import numba  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or broken against this numpy: the numpy path runs
        return False
    return True


def compiled(fn: Callable, signature: str) -> Callable | None:
    """``fn`` compiled by numba for ``signature`` (eagerly, so a failure shows here), or None: no numba,
    ``FCP_JIT=0``, or compilation failed (warned once; the numpy path runs)."""
    key = (fn, signature)
    if key in _CACHE:
        return _CACHE[key]
    out = None
    if jit_enabled():
        import numba

        for cache in (True, False):  # no writable cache directory (read-only install): compile per process
            try:
                out = numba.njit(signature, cache=cache, nogil=True)(fn)
                break
            except Exception as err:  # noqa: BLE001 - never fail a plan over an accelerator
                if not cache:
                    warnings.warn(f"fcp: numba could not compile {fn.__name__} ({err}); using the numpy path",
                                  stacklevel=2)
    _CACHE[key] = out
    _ACTIVE[0] = _ACTIVE[0] or out is not None
    return out


def kernel(fn: Callable, signature: str) -> Callable[[], Callable | None]:
    """Register ``fn`` as a kernel: returns a getter that gives ``compiled(fn, signature)`` on call (compiling
    lazily), listed in :data:`KERNELS` so that ``compile_kernels`` compiles every kernel without a list of its own."""
    def get() -> Callable | None:
        return compiled(fn, signature)

    KERNELS[fn.__name__] = get
    return get
