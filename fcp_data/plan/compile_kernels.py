"""``python -m fcp_data.plan.compile_kernels``: compile (or load from numba's disk cache) every planner kernel of
:mod:`fcp_data.jit` now — e.g. when building an image or right after ``pip install fcp[fast]`` — so that the
first large plan of a process does not pay the compilation (~18 s on 2 slow cores; ~1 s from the cache). ``make``
runs it after installing."""

from __future__ import annotations

import time

import fcp_data.plan.solvers  # noqa: F401 - imports every module that registers a kernel
from fcp_data.jit import KERNELS

__all__ = ["warm"]


def warm() -> list[str]:
    """Compile every kernel; the names compiled (none without numba or with ``FCP_JIT=0``)."""
    return [name for name, get in KERNELS.items() if get() is not None]


def main() -> int:
    t0 = time.perf_counter()
    names = warm()
    print(f"fcp: planner kernels compiled ({', '.join(names)}) in {time.perf_counter() - t0:.1f} s" if names else
          "fcp: numba not installed or FCP_JIT=0: the planner runs its numpy path (pip install fcp[fast] to compile)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
