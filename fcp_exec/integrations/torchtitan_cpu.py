"""Run torchtitan's ``Trainer`` on the CPU (gloo), to try an FCP + torchtitan job on a laptop or in CI before a GPU one.

torchtitan picks its device once, at import: ``torchtitan.tools.utils.device_type`` is ``"cuda"`` whenever no
accelerator is found, and the trainer, its distributed set-up, its memory monitor and its profiler call
``torch.cuda`` through ``device_module`` (``set_device``, ``memory_stats``, ``get_device_properties``, ...).
:func:`torchtitan_on_cpu` points every one of those module-level names at the CPU: ``device_type = "cpu"`` (so the
model is built on the CPU, the process group is gloo, the device mesh is a CPU mesh) and ``device_module`` = a stand-in
of the few ``torch.cuda`` calls the trainer makes, answering for the CPU (one device, no memory statistics: the
memory monitor reports 0 GiB). Everything that computes — the model, FSDP2, the loss, the optimizer, the
checkpointer — is torchtitan's and torch's own code.

For debugging and tests only: call it once per process, after importing ``torchtitan.trainer`` and before building
a Trainer; set ``training.disable_cuda_graphs``. ``fcp_exec.integrations.torchtitan_trainer`` needs none of it on a
GPU.
"""

from __future__ import annotations

import importlib
import os
from types import SimpleNamespace

import torch

__all__ = ["torchtitan_on_cpu"]

# the torchtitan modules that bind ``device_type`` / ``device_module`` by name at import (0.3.0)
_MODULES = ("torchtitan.tools.utils", "torchtitan.trainer", "torchtitan.distributed.utils",
            "torchtitan.distributed.parallel_dims", "torchtitan.components.metrics", "torchtitan.tools.profiler")


class CpuDeviceModule:
    """The part of ``torch.cuda`` torchtitan's Trainer calls, answered for the CPU."""

    def set_device(self, device=None) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def is_available(self) -> bool:
        return True

    def get_device_name(self, device=None) -> str:
        return "CPU"

    def get_device_properties(self, device=None) -> SimpleNamespace:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return SimpleNamespace(name="CPU", total_memory=total)

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def memory_stats(self, device=None) -> dict[str, int]:
        keys = ("active_bytes.all.peak", "active_bytes.all.current", "reserved_bytes.all.peak",
                "reserved_bytes.all.current", "num_alloc_retries", "num_ooms")
        return dict.fromkeys(keys, 0)

    def synchronize(self, device=None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


def torchtitan_on_cpu() -> None:
    """Point torchtitan's device choice at the CPU for the rest of the process (module docstring)."""
    try:
        import torchtitan.components.metrics as metrics
    except ImportError as e:
        raise ImportError(f"torchtitan_on_cpu: torchtitan's trainer does not import here ({e}); it needs torchtitan "
                          "and its trainer's dependencies (tensorboard, tyro, torchdata, spmd_types)") from None
    device = CpuDeviceModule()
    for name in _MODULES:
        module = importlib.import_module(name)
        if hasattr(module, "device_type"):
            module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = device
    metrics.DeviceMemoryMonitor.__init__.__defaults__ = ("cpu:0",)  # its default device string was bound at import
