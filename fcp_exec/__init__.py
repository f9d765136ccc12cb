"""fcp executor side (torch): zigzag layout, ring P2P over logical CP groups, attention kernels,
ring attention, tiny models, the training loop and the profiler."""
from fcp_exec.layout import zigzag_index, zigzag_shard, zigzag_unshard
from fcp_exec.ring_attention import ring_attention

__all__ = ["ring_attention", "zigzag_index", "zigzag_shard", "zigzag_unshard"]
