"""fcp executor side (torch): ring P2P over logical CP groups, attention kernels, ring attention, the frame-share
vision exchange, the micro-batch train step with its reducers (all-reduce, DDP, FSDP2), tiny models, the training
loop, the profiler and the executor's CLI commands. Integrations (Hugging Face) live in ``fcp_exec.integrations``.

The names below are imported on first use (PEP 562), so ``import fcp_exec.commands`` — what ``fcp --help`` and
``fcp plan`` do to build the parser — does not load torch."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "zigzag_index": "fcp_data.layout", "zigzag_shard": "fcp_data.layout", "zigzag_unshard": "fcp_data.layout",
    "ring_attention": "fcp_exec.ring_attention", "make_reducer": "fcp_exec.step", "train_step": "fcp_exec.step",
    "exchange_rows": "fcp_exec.vision_exchange", "frame_shares": "fcp_exec.vision_exchange",
    "frame_table": "fcp_exec.vision_exchange",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fcp_exec' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
