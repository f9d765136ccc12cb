"""fcp executor side (torch): ring P2P over logical CP groups, attention kernels,
ring attention, the frame-share vision exchange, the micro-batch train step with its reducers (all-reduce,
DDP, FSDP2), tiny models, the training loop, the profiler and the executor CLI commands. Integrations live in
``fcp_exec.integrations`` and are imported on demand. The names below load their modules (and torch) on first
access, so importing a torch-free module of the package (``fcp_exec.names``, ``fcp_exec.train_config``) stays
cheap (``fcp train --help``)."""

import sys
import types

_LAZY = {
    "exchange_rows": "fcp_exec.vision_exchange",
    "frame_shares": "fcp_exec.vision_exchange",
    "frame_table": "fcp_exec.vision_exchange",
    "make_reducer": "fcp_exec.step",
    "ring_attention": "fcp_exec.ring_attention",
    "train_step": "fcp_exec.step",
    "zigzag_index": "fcp_data.layout",
    "zigzag_shard": "fcp_data.layout",
    "zigzag_unshard": "fcp_data.layout",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fcp_exec' has no attribute {name!r}")


class _Package(types.ModuleType):
    """``fcp_exec.ring_attention`` names a submodule and the function the package exports: importing the submodule
    would set the package's attribute to the module; the function stays (as when the package imported it eagerly)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
