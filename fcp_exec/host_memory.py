"""Keep freed host memory inside a CPU rank's process (glibc malloc), so large tensors are not page-faulted in anew
on every step.

glibc serves an allocation of 32 MiB or more (the largest mmap threshold it allows; smaller ones until its dynamic
threshold has grown) with a fresh ``mmap`` and returns it to the kernel on ``free``: every such tensor is then
zero-filled by the kernel page by page each time it is allocated again. On the CPU executor the logits are that
size from a few thousand local tokens on (tiny-llm: 2000-token vocabulary, 8 KB per token in fp32, 32.8 MB at 4096
tokens), and ``fcp profile --nproc 2`` measured a group of 16 documents × 256 tokens on one rank at 177–197 ms with
glibc's defaults against 127–148 ms with mmap off: a per-rank cost that grows past a size threshold, which neither
cost model has, so it skewed every fit (BENCHMARKS.md, "Cost model v2 fit by the profiler"). GPU and NPU
activations live in the device's caching allocator and never see this.

:func:`keep_freed_memory` turns mmap off for the process and keeps freed memory in its heap (``mallopt``), the
knobs PyTorch's CPU performance guides tune through ``MALLOC_*`` variables or a different allocator; it also allows no
further arenas, so threads started afterwards share that heap (a thread's own arena holds at most 64 MiB per
sub-heap, so a larger tensor allocated there is still mmapped every time). Arenas that already exist stay, e.g. in
a process forked from one that held several: call it early (the launcher does: before ``init_distributed`` starts
gloo's threads). The cost: a
rank's resident memory stays at its peak instead of shrinking between steps. fcp's launcher applies it to the CPU
ranks it starts (:func:`fcp_exec.launch.launch`: ``fcp train``, ``fcp profile``), and so do these commands under
torchrun; a CPU trainer of your own can call it at start-up. ``FCP_KEEP_FREED_MEMORY=0`` leaves glibc's defaults
(set it before the first launch: ranks read the environment of the launcher's forkserver, started with the first).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["keep_freed_memory"]

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -2, -4, -8
_TRIM_THRESHOLD = 2**31 - 1  # (C int) release the heap's free top only past 2 GiB
_TOP_PAD = 256 << 20  # grow the heap 256 MiB at a time (fewer brk calls)


def keep_freed_memory(device=None) -> bool:
    """Turn glibc's mmap of large blocks off and keep freed memory in this process's heap (module docstring).
    True when applied; False where there is nothing to do: ``device`` (a ``torch.device``, None: this process is a
    CPU rank) is an accelerator, not glibc (macOS, Windows, musl), or ``FCP_KEEP_FREED_MEMORY=0``. Idempotent."""
    if (device is not None and device.type != "cpu") or os.environ.get("FCP_KEEP_FREED_MEMORY", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: AttributeError elsewhere
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all(mallopt(p, v) == 1 for p, v in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _TRIM_THRESHOLD),
                                                (_M_TOP_PAD, _TOP_PAD), (_M_ARENA_MAX, 1)))
