"""fcp executor side (torch): ring P2P over logical CP groups, attention kernels,
ring attention, the frame-share vision exchange, the micro-batch train step with its reducers (all-reduce,
DDP, FSDP2), tiny models, the training loop, the profiler and the executor CLI commands. Integrations live in
``fcp_exec.integrations`` and are imported on demand."""
from fcp_data.layout import zigzag_index, zigzag_shard, zigzag_unshard
from fcp_exec.ring_attention import ring_attention
from fcp_exec.step import make_reducer, train_step
from fcp_exec.vision_exchange import exchange_rows, frame_shares, frame_table

__all__ = ["exchange_rows", "frame_shares", "frame_table", "make_reducer", "ring_attention", "train_step",
           "zigzag_index", "zigzag_shard", "zigzag_unshard"]
