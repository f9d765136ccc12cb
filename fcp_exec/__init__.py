"""fcp executor side (torch): zigzag layout, ring P2P over logical CP groups, attention kernels,
ring attention, tiny models, the training loop and the profiler."""
from fcp_exec.layout import zigzag_index, zigzag_shard, zigzag_unshard

__all__ = ["zigzag_index", "zigzag_shard", "zigzag_unshard"]
