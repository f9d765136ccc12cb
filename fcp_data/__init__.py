"""fcp data side: length index, cost model, planner, sampler and collator.

The planning core (``cost``, ``plan``) imports numpy only. ``FCPSampler``/``FCPDataset``/``FCPCollator``
import torch and are loaded lazily on first access.
"""

from fcp_data.cost import CostModel
from fcp_data.plan.types import CPGroup, MicroBatchPlan, Plan

__version__ = "0.1.0"

_LAZY = {
    "FCPSampler": "fcp_data.sampler",
    "SampleSlot": "fcp_data.sampler",
    "FCPDataset": "fcp_data.sampler",
    "FCPCollator": "fcp_data.collator",
    "LengthIndex": "fcp_data.index",
    "IndexedDataset": "fcp_data.readers",
    "plan_batch": "fcp_data.plan",
    "bundled_path": "fcp_data._resources",
    "bundled_index": "fcp_data._resources",
    "worker_context": "fcp_data.workers",
}

__all__ = ["CostModel", "CPGroup", "MicroBatchPlan", "Plan", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fcp_data' has no attribute {name!r}")
