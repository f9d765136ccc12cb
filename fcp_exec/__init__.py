"""fcp executor side (torch): zigzag layout, ring P2P over logical CP groups, attention kernels,
ring attention, tiny models, the training loop and the profiler."""
