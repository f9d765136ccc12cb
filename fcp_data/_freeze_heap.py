"""Preloaded last by the forkservers fcp starts, and imported by nothing else: its import freezes the server's heap
(:mod:`fcp_data.frozen_heap`, which says why). Imported anywhere but a forkserver's preload loop, it does nothing."""

from fcp_data.frozen_heap import freeze_if_forkserver

frozen = freeze_if_forkserver()  # whether this import froze the heap
