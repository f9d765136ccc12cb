"""Sub-commands of the ``fcp`` CLI on the data side (index, plan, compare, simulate, presets), one module each;
the executor's commands (train, profile) are in :mod:`fcp_exec.commands` and the dispatcher is :mod:`fcp_cli.main`.

Each module exposes ``register(subparsers, summary)``, which adds its parser and sets ``func(args) -> int``."""

__all__ = ["UsageError"]


class UsageError(Exception):
    """A user error that the CLI reports in one line (exit code 2)."""
