"""Compatibility alias: the zigzag layout lives on the data side, :mod:`fcp_data.layout` (the collator shards
with it and the executor reads the same layout; the data side never imports the executor)."""

from fcp_data.layout import check_cu_seqlens, zigzag_chunk_ids, zigzag_index, zigzag_shard, zigzag_unshard

__all__ = ["check_cu_seqlens", "zigzag_chunk_ids", "zigzag_index", "zigzag_shard", "zigzag_unshard"]
