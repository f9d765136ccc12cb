"""Preloaded first by the forkservers fcp starts, and imported by nothing else: its import imports the rest of the
server's preload one module at a time, so that a module whose import raises (not only ImportError) is skipped instead
of ending the server (:func:`fcp_data.frozen_heap.import_guarded`, which says why). Elsewhere it does nothing."""

from fcp_data.frozen_heap import import_guarded

skipped = import_guarded()  # the modules whose import raised in this server
