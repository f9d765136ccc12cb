"""Sub-commands of the ``fcp`` CLI, one module each (see :mod:`fcp_data.cli`)."""
