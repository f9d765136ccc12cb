"""Attention kernels behind one interface (:class:`AttentionKernel`, see ``base.py``).

``CpuFlashKernel`` (aten flash attention for CPU), ``ReferenceKernel`` (fp64 math), ``CudaKernel``
(flash-attn varlen or SDPA) and ``NpuKernel`` (torch_npu fusion attention, TND). Optional
dependencies (flash-attn, torch_npu) are imported only when a kernel that needs them is built.
"""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import AttentionKernel
from fcp_exec.kernels.cpu import CpuFlashKernel
from fcp_exec.kernels.cuda import CudaKernel, flash_attn_available
from fcp_exec.kernels.npu import NpuKernel
from fcp_exec.kernels.reference import ReferenceKernel

__all__ = [
    "AttentionKernel",
    "CpuFlashKernel",
    "CudaKernel",
    "KERNEL_NAMES",
    "NpuKernel",
    "ReferenceKernel",
    "default_kernel",
    "flash_attn_available",
    "get_kernel",
]

KERNEL_NAMES = ("cpu", "cpu_block_diag", "reference", "cuda", "torch_flash", "sdpa", "npu")


def get_kernel(name: str) -> AttentionKernel:
    """Build a kernel by name: one of :data:`KERNEL_NAMES`."""
    if name == "cpu":
        return CpuFlashKernel("per_doc")
    if name == "cpu_block_diag":
        return CpuFlashKernel("block_diag")
    if name == "reference":
        return ReferenceKernel()
    if name == "cuda":
        return CudaKernel("auto")
    if name == "sdpa":
        return CudaKernel("sdpa")
    if name == "torch_flash":
        return CudaKernel("torch_flash")
    if name == "npu":
        return NpuKernel()
    raise ValueError(f"unknown kernel {name!r}; choose one of {', '.join(KERNEL_NAMES)}")


def default_kernel(device, dtype: torch.dtype | None = None) -> AttentionKernel:
    """The kernel for tensors on ``device``: CPU flash on CPU, CUDA on cuda, NPU on npu,
    the math reference anywhere else."""
    kind = torch.device(device).type
    if kind == "cpu":
        return CpuFlashKernel("per_doc")
    if kind == "cuda":
        return CudaKernel("auto")
    if kind == "npu":
        return NpuKernel()
    return ReferenceKernel()
