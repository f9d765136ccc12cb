"""Run Megatron-core on the CPU (gloo), to try an FCP + Megatron training loop on a laptop or in CI before a GPU job.

Megatron-core is written for CUDA and hard-codes the device in places that are about placement, not computation:
buffers created on ``torch.cuda.current_device()``, a few ``device="cuda"`` counters in the schedules, the rotary
table moved to the GPU, a CUDA RNG tracker forked around attention dropout, and the CUDA RNG state saved and restored
around recomputed activations. :func:`megatron_on_cpu` redirects those to the CPU for the rest of the process — a
``TorchFunctionMode`` that rewrites a CUDA ``device=`` argument, ``.to("cuda")`` and ``.cuda()`` to the CPU,
``torch.cuda.current_device`` returning the CPU device, a CPU generator standing in for the CUDA one in activation
recomputation — and installs Megatron's own no-op (inference) RNG tracker, so attention/hidden dropout must be 0. Everything else is
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
        if func is torch.autograd.backward or func is torch.Tensor.backward:
            return self._backward(func, args, kwargs)
        return func(*args, **kwargs)

    def _backward(self, func, args, kwargs):
        """A backward with this mode active inside it: a mode is off while its handler runs, and the backward of
        recomputed activations runs the layers' forwards again (their CUDA placement must be redirected too)."""
        try:
            from torch.autograd import _make_grads, _tensor_or_tensors_to_tuple
            from torch.autograd.graph import _engine_run_backward
        except ImportError:  # another torch: backward without the mode (activation recomputation then fails)
            return func(*args, **kwargs)
        if func is torch.Tensor.backward:
            names = ("gradient", "retain_graph", "create_graph", "inputs")
            opts = dict(zip(names, args[1:]), **kwargs)
            tensors, grads = (args[0],), opts.get("gradient")
        else:
            names = ("grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
            opts = dict(zip(names, args[1:]), **kwargs)
            tensors, grads = args[0], opts.get("grad_tensors")
        tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
        create = bool(opts.get("create_graph", False))
        retain = opts.get("retain_graph")
        inputs = opts.get("inputs")
        inputs = () if inputs is None else ((inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs))
        with self:
            grads = _make_grads(tensors, _tensor_or_tensors_to_tuple(grads, len(tensors)), is_grads_batched=False)
            _engine_run_backward(tensors, grads, create if retain is None else retain, create, inputs,
                                 allow_unreachable=True, accumulate_grad=True)
        return None


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
    # activation recomputation saves and restores "the CUDA RNG state" around the recomputed forward: a generator of
    # its own stands in for the device's (the tracker above never forks it; no dropout runs)
    stand_in = torch.Generator()
    random._get_cuda_rng_state = lambda *args, **kwargs: stand_in.get_state()
    random._set_cuda_rng_state = lambda new_state, *args, **kwargs: stand_in.set_state(new_state)
