"""Skips for tests whose optional stack is missing or cannot run on the installed torch.

``pytest.importorskip("transformers")`` is not enough: transformers 5 imports on torch 2.4/2.5 but disables its
models ("PyTorch >= 2.6 is required"), so every Hugging Face test would fail instead of being skipped when the suite
runs on an older torch (``benchmarks/torch_compat.py``)."""

from __future__ import annotations

import pytest
import torch

from fcp_exec.compat import CPU_FSDP2_RELEASE, TRANSFORMERS_RELEASE, release_of, torch_release


def transformers_models():
    """The transformers module, or a skip (of the module where called at module level) where it is not installed or
    its models do not run on this torch, or it is older than fcp supports (fcp_exec.compat.TRANSFORMERS_RELEASE)."""
    transformers = pytest.importorskip("transformers")
    if not transformers.utils.is_torch_available():
        pytest.skip(f"transformers {transformers.__version__} does not run on torch {torch.__version__}",
                    allow_module_level=True)
    if release_of(transformers.__version__) < TRANSFORMERS_RELEASE:
        pytest.skip(f"transformers {transformers.__version__} is older than fcp supports "
                    f"({'.'.join(map(str, TRANSFORMERS_RELEASE))}; fcp refuses it in one line)", allow_module_level=True)
    return transformers


CPU_FSDP2 = torch_release() >= CPU_FSDP2_RELEASE  # FSDP2 runs on the CPU with this torch


def without_cpu_fsdp2(runs):
    """``runs`` (tuples whose second item is a reducer name) without the FSDP2 ones where FSDP2 cannot run on the
    CPU: the suite's run matrices keep their other runs on an older torch."""
    return [r for r in runs if CPU_FSDP2 or r[1] != "fsdp2"]


needs_cpu_fsdp2 = pytest.mark.skipif(not CPU_FSDP2, reason=f"FSDP2 runs on the CPU from torch 2.7 (installed "
                                                            f"{torch.__version__})")


def cpu_fsdp2():
    """Skip where FSDP2 cannot run on the CPU (torch < 2.7: fcp_exec.compat.CPU_FSDP2_RELEASE)."""
    if not CPU_FSDP2:
        pytest.skip(f"FSDP2 runs on the CPU from torch 2.7 (installed {torch.__version__})")
