"""The ``fcp`` console script: it sees both the data side (:mod:`fcp_data.commands`) and the executor
(:mod:`fcp_exec.commands`), which never import it (docs/ARCHITECTURE.md)."""
