"""``python -m fcp_cli ...`` is the ``fcp`` command."""

from fcp_cli.main import console

console()
