"""The torch APIs whose home or behaviour changed between the releases fcp supports (``torch>=2.4``).

Ascend's ``torch_npu`` pins a torch release (2.4 and 2.5 are common on MindSpeed clusters), so the executor must not
assume the newest one. What moved:

* FSDP2 (``fully_shard``, ``FSDPModule``, ``MixedPrecisionPolicy``): public in ``torch.distributed.fsdp`` from 2.6,
  ``torch.distributed._composable.fsdp`` before.
* ``DTensor``: ``torch.distributed.tensor`` from 2.5, ``torch.distributed._tensor`` before.
* FSDP2's gradient reduction: from 2.8 ``set_gradient_divide_factor(1.0)`` makes it a SUM in every dtype; 2.5–2.7
  have ``set_reduce_scatter_divide_factor`` (a PreMulSum op) but still pre/post-divide float16 and float64 reductions
  by the data-parallel size, so those came out as the mean (seen: float64 FSDP2 gradients half the all-reduce's on 2
  ranks, torch 2.7.1) — :func:`undo_fsdp_gradient_average` multiplies them back; 2.4 has no divide factor at all,
  so fcp's FSDP2 reducer (a SUM) needs 2.5.
* FSDP2 on the CPU: before 2.6 it creates CUDA streams whatever the device ("CUDA driver version is insufficient",
  seen with 2.4.1 and 2.5.1); 2.6.0 takes the device's stream class, but the CPU's has no ``record_event`` (an
  AttributeError at the first all-gather); it runs from 2.7 (:data:`CPU_FSDP2_RELEASE`, 2.7.1 measured).
  :func:`check_fsdp2_device` makes an older release one clear error.
* ``torch.nn.utils.get_total_norm`` (2.6): :func:`total_norm` computes the same norm on older releases.
* transformers 5 imports on an older torch but disables its models ("PyTorch >= 2.6 is required"); what fails then is
  deep inside it (a ``NameError`` in its pipeline-parallel module, a multi-line ``ImportError``).
  :func:`hf_models_problem` says so in one line, :func:`require_hf_models` raises it as :class:`MissingDependency`.
* transformers itself (:data:`TRANSFORMERS_RELEASE`, 5.18): fcp hands a vision-language model the rows its CP group
  encoded through ``mm_encoder_outputs``, which transformers reads from 5.18; an older one takes the argument into
  ``**kwargs`` and ignores it, so the model trained without its images (the suite's Qwen2-VL run: its first loss
  8.8e-4 off the stock model's on 5.15.1). :func:`hf_models_problem` refuses it too. Before 5.24 the ``Trainer`` resumes
  mid-epoch through the module function ``skip_first_batches`` (accelerate's: it rebuilds a ``DataLoader`` from the
  loader's ``batch_sampler``) instead of ``Trainer.get_resumed_dataloader``, which ``FCPTrainer`` overrides;
  :func:`resumable_trainer` routes fcp's loader to the override for the length of ``train()``.

Imports are lazy (inside the functions): ``torch.distributed.fsdp`` costs time that a planning command never needs.
The tests run on the installed torch; ``benchmarks/torch_compat.py`` runs the whole suite on 2.4.1, 2.5.1, 2.6.0,
2.7.1 and 2.8.0.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

__all__ = ["CPU_FSDP2_RELEASE", "HF_MODELS_RELEASE", "HSDP_RELEASE", "TRANSFORMERS_RELEASE", "MissingDependency",
           "check_fsdp2_device", "dtensor_type", "fsdp2_api", "fsdp_divide_factor_setter", "hf_models_problem",
           "release_of", "require_hf_models", "resumable_trainer", "torch_release", "total_norm",
           "undo_fsdp_gradient_average"]


CPU_FSDP2_RELEASE = (2, 7)  # the first torch release whose FSDP2 runs on the CPU (benchmarks/torch_compat.py)
HF_MODELS_RELEASE = (2, 6)  # the first torch release on which transformers 5 builds models
TRANSFORMERS_RELEASE = (5, 18)  # the first transformers that reads mm_encoder_outputs (benchmarks/torch_compat.py)
HSDP_RELEASE = (2, 8)  # before it FSDP2 averages HSDP's all-reduce across replicas (benchmarks/hsdp_probe.py)


class MissingDependency(ImportError):
    """An optional dependency is missing or does not run with the installed torch; the message says what to install.
    :func:`fcp_exec.script.run_main` and the ``fcp`` CLI print it as one line (exit 2)."""


def hf_models_problem() -> str | None:
    """Why Hugging Face models cannot be built here (one line), or None when transformers runs on this torch."""
    try:
        transformers = _import_transformers()
    except ImportError:
        return "Hugging Face models need transformers: pip install 'fcp[hf]' (transformers>=5.18,<6)"
    if not transformers.utils.is_torch_available():
        return (f"transformers {transformers.__version__} does not run on torch {torch.__version__} (transformers 5 "
                "needs torch>=2.6): upgrade torch for Hugging Face models; fcp's planner, sampler, collator, ring "
                "attention and its own models run on this torch")
    if release_of(transformers.__version__) < TRANSFORMERS_RELEASE:
        need = ".".join(map(str, TRANSFORMERS_RELEASE))
        return (f"transformers {transformers.__version__} is older than fcp's Hugging Face integration supports: "
                f"pip install 'transformers>={need},<6' (before {need} a vision-language model ignores the vision "
                "rows fcp hands it, mm_encoder_outputs, and trains without its images)")
    return None


def _import_transformers():
    """transformers; on torch < 2.6 imported with its import-time warnings ("Disabling PyTorch ...", "PyTorch was not
    found ...") silenced, as :func:`hf_models_problem` says it in one line, then its default verbosity restored."""
    if "transformers" in sys.modules or torch_release() >= HF_MODELS_RELEASE:
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
    return release_of(torch.__version__)


def release_of(version: str) -> tuple[int, int]:
    """(major, minor) of a version: ``2.5.1+cu124`` → (2, 5), ``5.18.0.dev0`` → (5, 18), ``2.10rc1`` → (2, 10)."""
    major, minor = (version.split("+")[0].split(".") + ["0"])[:2]
    digits = len(minor) - len(minor.lstrip("0123456789"))  # "10rc1" → 10
    return int(major), int(minor[:digits] or 0)


def check_fsdp2_device(device) -> None:
    """Refuse FSDP2 on the CPU before :data:`CPU_FSDP2_RELEASE`: one :class:`MissingDependency` naming the versions."""
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]  # "npu" needs torch_npu
    if kind == "cpu" and torch_release() < CPU_FSDP2_RELEASE:
        need = ".".join(map(str, CPU_FSDP2_RELEASE))
        raise MissingDependency(f"FSDP2 (fully_shard) of torch {torch.__version__} does not run on the CPU; it needs "
                                f"torch>={need} there (or use the 'ddp' reducer)")


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


def undo_fsdp_gradient_average(module) -> float:
    """Multiply the reduced gradients of FSDP ``module``'s own parameters by what FSDP2 divided them by although its
    divide factor is 1, and return that factor: the data-parallel size for a float16/float64 reduction on torch
    2.5–2.7 (which pre/post-divide those whatever the reduce-scatter op), else 1.0 and nothing is touched (torch >=
    2.8; float32/bfloat16 reductions, whose PreMulSum(1) is the SUM). Call after the last backward (the reduce dtype
    is set at FSDP's lazy initialisation); reads FSDP's private state of those releases."""
    if hasattr(module, "set_gradient_divide_factor"):
        return 1.0
    group = getattr(module._get_fsdp_state(), "_fsdp_param_group", None)
    if group is None or not group.fsdp_params:
        return 1.0
    first = group.fsdp_params[0]
    dtype = getattr(group, "_reduce_dtype", None) or first.param_dtype or first.orig_dtype
    if dtype in (torch.float32, torch.bfloat16):
        return 1.0
    factor = float(group.mesh_info.mesh.size())
    with torch.no_grad():
        for fsdp_param in group.fsdp_params:
            if fsdp_param.sharded_param.grad is not None:
                fsdp_param.sharded_param.grad.mul_(factor)
    return factor


def fsdp_divide_factor_setter(module):
    """The bound method that sets an FSDP module's gradient divide factor, or None where torch has none (2.4)."""
    for name in ("set_gradient_divide_factor", "set_reduce_scatter_divide_factor"):  # torch >= 2.8, 2.5-2.7
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


@contextlib.contextmanager
def resumable_trainer(trainer):
    """While inside, a ``transformers.Trainer`` without ``get_resumed_dataloader`` (transformers < 5.24) skips the
    trained batches of a loader with ``skip_to`` (fcp's ``GlobalBatchLoader``) through
    ``trainer.get_resumed_dataloader`` (the sampler moves there; nothing is read), any other loader as before."""
    import transformers.trainer as hf_trainer

    original = getattr(hf_trainer, "skip_first_batches", None)
    if hasattr(hf_trainer.Trainer, "get_resumed_dataloader") or original is None:
        yield
        return

    def skip_first_batches(dataloader, num_batches=0):
        if hasattr(dataloader, "skip_to"):
            return trainer.get_resumed_dataloader(dataloader, num_batches)
        return original(dataloader, num_batches)

    hf_trainer.skip_first_batches = skip_first_batches
    try:
        yield
    finally:
        hf_trainer.skip_first_batches = original
