"""The torch APIs whose home or behaviour changed between the releases fcp supports (``torch>=2.4``).

Ascend's ``torch_npu`` pins a torch release (2.4 and 2.5 are common on MindSpeed clusters), so the executor must not
assume the newest one. What moved:

* FSDP2 (``fully_shard``, ``FSDPModule``, ``MixedPrecisionPolicy``): public in ``torch.distributed.fsdp`` from 2.6,
  ``torch.distributed._composable.fsdp`` before.
* ``DTensor``: ``torch.distributed.tensor`` from 2.5, ``torch.distributed._tensor`` before.
* FSDP2's gradient reduction: 2.6 has ``set_gradient_divide_factor``, 2.5 ``set_reduce_scatter_divide_factor``; 2.4
  has neither and always *averages* over the data-parallel ranks, so fcp's FSDP2 reducer (a SUM) needs 2.5.
* FSDP2 before 2.6 creates CUDA streams whatever the device: on the CPU it fails inside torch ("CUDA driver version is
  insufficient", seen with 2.4.1 and 2.5.1); :func:`check_fsdp2_device` makes that one clear error.
* ``torch.nn.utils.get_total_norm`` (2.6): :func:`total_norm` computes the same norm on older releases.
* transformers 5 imports on an older torch but disables its models ("PyTorch >= 2.6 is required"); what fails then is
  deep inside it (a ``NameError`` in its pipeline-parallel module, a multi-line ``ImportError``).
  :func:`hf_models_problem` says so in one line, :func:`require_hf_models` raises it as :class:`MissingDependency`.

Imports are lazy (inside the functions): ``torch.distributed.fsdp`` costs time that a planning command never needs.
The tests run on the installed torch; ``benchmarks/torch_compat.py`` runs the executor's suite on older releases.
"""

from __future__ import annotations

import os
import sys

import torch

__all__ = ["MissingDependency", "check_fsdp2_device", "dtensor_type", "fsdp2_api", "fsdp_divide_factor_setter",
           "hf_models_problem", "require_hf_models", "torch_release", "total_norm"]


class MissingDependency(ImportError):
    """An optional dependency is missing or does not run with the installed torch; the message says what to install.
    :func:`fcp_exec.script.run_main` and the ``fcp`` CLI print it as one line (exit 2)."""


def hf_models_problem() -> str | None:
    """Why Hugging Face models cannot be built here (one line), or None when transformers runs on this torch."""
    try:
        transformers = _import_transformers()
    except ImportError:
        return "Hugging Face models need transformers: pip install 'fcp[hf]' (tested with transformers 5.24 and 5.25)"
    if not transformers.utils.is_torch_available():
        return (f"transformers {transformers.__version__} does not run on torch {torch.__version__} (transformers 5 "
                "needs torch>=2.6): upgrade torch for Hugging Face models; fcp's planner, sampler, collator, ring "
                "attention and its own models run on this torch")
    return None


def _import_transformers():
    """transformers; on torch < 2.6 imported with its import-time warnings ("Disabling PyTorch ...", "PyTorch was not
    found ...") silenced, as :func:`hf_models_problem` says it in one line, then its default verbosity restored."""
    if "transformers" in sys.modules or torch_release() >= (2, 6):
        import transformers

        return transformers
    before = os.environ.get("TRANSFORMERS_VERBOSITY")
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"  # read once, when its library logger is first configured
    try:
        import transformers
    finally:
        if before is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = before
    levels = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}  # transformers' own names
    transformers.utils.logging.set_verbosity(levels.get((before or "warning").lower(), 30))
    return transformers


def require_hf_models() -> None:
    """Raise :class:`MissingDependency` with :func:`hf_models_problem`'s line, if any."""
    problem = hf_models_problem()
    if problem is not None:
        raise MissingDependency(problem)


def torch_release() -> tuple[int, int]:
    """(major, minor) of the installed torch: ``2.5.1+cu124`` → (2, 5), a nightly ``2.6.0a0+git...`` → (2, 6)."""
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    digits = len(minor) - len(minor.lstrip("0123456789"))  # "10rc1" → 10
    return int(major), int(minor[:digits] or 0)


def check_fsdp2_device(device) -> None:
    """Refuse FSDP2 on the CPU before torch 2.6 (it runs there from 2.6): one :class:`MissingDependency` naming the
    versions."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]  # "npu" needs torch_npu
    if kind == "cpu" and torch_release() < (2, 6):
        raise MissingDependency(f"FSDP2 (fully_shard) of torch {torch.__version__} runs on CUDA devices only; on the "
                                "CPU it needs torch>=2.6 (or use the 'ddp' reducer)")


def fsdp2_api() -> tuple:
    """``(fully_shard, FSDPModule, MixedPrecisionPolicy)`` of the installed torch."""
    try:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # torch >= 2.6
    except ImportError:  # torch 2.4-2.5
        from torch.distributed._composable.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    return fully_shard, FSDPModule, MixedPrecisionPolicy


def dtensor_type() -> type:
    """The ``DTensor`` class of the installed torch (FSDP2's sharded parameters and gradients)."""
    try:
        from torch.distributed.tensor import DTensor  # torch >= 2.5
    except ImportError:  # torch 2.4
        from torch.distributed._tensor import DTensor
    return DTensor


def fsdp_divide_factor_setter(module):
    """The bound method that sets an FSDP module's gradient divide factor, or None where torch has none (2.4)."""
    for name in ("set_gradient_divide_factor", "set_reduce_scatter_divide_factor"):  # torch >= 2.6, torch 2.5
        setter = getattr(module, name, None)
        if setter is not None:
            return setter
    return None


def total_norm(grads: list) -> torch.Tensor:
    """The L2 norm of all ``grads`` together (a 0-d tensor; a DTensor for FSDP2's sharded gradients, whose
    ``full_tensor()`` is the global norm): ``torch.nn.utils.get_total_norm`` where torch has it, else the same
    computation (each gradient's norm, then the norm of those, on the first gradient's device)."""
    get_total_norm = getattr(torch.nn.utils, "get_total_norm", None)  # torch >= 2.6
    if get_total_norm is not None:
        return get_total_norm(grads, 2.0, foreach=False)
    norms = [torch.linalg.vector_norm(g.detach(), 2.0) for g in grads]
    first = norms[0].device
    return torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
