"""Run Megatron-core on the CPU (gloo), to try an FCP + Megatron training loop on a laptop or in CI before a GPU job.

Megatron-core is written for CUDA and hard-codes the device in places that are about placement, not computation:
buffers created on ``torch.cuda.current_device()``, a few ``device="cuda"`` counters in the schedules, the rotary
table moved to the GPU, and a CUDA RNG tracker forked around attention dropout. :func:`megatron_on_cpu` redirects
those to the CPU for the rest of the process — a ``TorchFunctionMode`` that rewrites a CUDA ``device=`` argument,
``.to("cuda")`` and ``.cuda()`` to the CPU, ``torch.cuda.current_device`` returning the CPU device — and installs
Megatron's own no-op (inference) RNG tracker, so attention/hidden dropout must be 0. Everything else is
megatron-core's own code: the model, DDP, the schedule, ``finalize_model_grads`` and the optimizer compute what
they compute on a GPU, in the dtype you ask for (build the model with ``use_cpu_initialization=True`` and the
``*_fusion`` options off; Megatron's gradient clipping asserts CUDA tensors, so use ``clip_grad=0``).

For debugging and tests only: it changes process-wide state (call it once, first, in each process) and adds a
Python hook to every torch call. ``fcp_exec/integrations/megatron.py`` itself needs none of it on a GPU.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["megatron_on_cpu"]


def _is_cuda(device) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)  # a CUDA ordinal


class _CudaOnCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        name = getattr(func, "__name__", "")
        if name == "cuda":
            return args[0]
        if name == "to" and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


_MODE: list = []


def megatron_on_cpu() -> None:
    """Redirect Megatron-core's CUDA device placement to the CPU in this process (module docstring). Idempotent;
    a no-op where CUDA is available (there Megatron runs as it is)."""
    if _MODE or torch.cuda.is_available():
        return
    torch.cuda.current_device = lambda: torch.device("cpu")
    mode = _CudaOnCpu()
    mode.__enter__()
    _MODE.append(mode)
    from megatron.core.tensor_parallel import random

    random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
