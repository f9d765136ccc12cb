"""Skips for tests whose optional stack is missing or cannot run on the installed torch.

``pytest.importorskip("transformers")`` is not enough: transformers 5 imports on torch 2.4/2.5 but disables its
models ("PyTorch >= 2.6 is required"), so every Hugging Face test would fail instead of being skipped when the suite
runs on an older torch (``benchmarks/torch_compat.py``)."""

from __future__ import annotations

import pytest
import torch

from fcp_exec.compat import torch_release


def transformers_models():
    """The transformers module, or a skip (of the module where called at module level) where it is not installed or
    its models do not run on this torch."""
    transformers = pytest.importorskip("transformers")
    if not transformers.utils.is_torch_available():
        pytest.skip(f"transformers {transformers.__version__} does not run on torch {torch.__version__}",
                    allow_module_level=True)
    return transformers


def cpu_fsdp2():
    """Skip where FSDP2 cannot run on the CPU (torch < 2.6)."""
    if torch_release() < (2, 6):
        pytest.skip(f"FSDP2 runs on the CPU from torch 2.6 (installed {torch.__version__})")
