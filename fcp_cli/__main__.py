"""``python -m fcp_cli ...`` is the ``fcp`` command.

Guarded: a forkserver or ``spawn`` start of a DataLoader's workers imports the main module again (as
``__mp_main__``), and without the guard the command would run again there (fcp_data.workers warns about such
scripts and falls back to forking)."""

from fcp_cli.main import console

if __name__ == "__main__":
    console()
