"""``python -m fcp_cli ...`` is the ``fcp`` command."""

import sys

from fcp_cli.main import main

sys.exit(main())
