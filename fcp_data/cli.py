"""The ``fcp`` command.

Each sub-command lives in its own module under :mod:`fcp_data.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``. Modules are imported
only to build the parser; heavy imports (torch, cvxpy, decord, ray) belong inside ``func``.

User errors (``ValueError``, ``OSError`` such as ``FileNotFoundError``, :class:`UsageError`) print one
line ``fcp <cmd>: error: ...`` and exit with code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["main", "UsageError", "COMMANDS"]

# (module under fcp_data.commands, one-line summary shown by `fcp --help`)
COMMANDS = (
    ("plan", "plan one global batch of sequence lengths into CP groups"),
    ("compare", "compare FCP against the ILP, the exhaustive search and the baselines"),
    ("simulate", "simulate step times of every solver over batches drawn from a workload"),
    ("presets", "list the model and hardware presets of the cost model"),
    ("index", "build a length index (token counts) of text, image and video datasets"),
    ("train", "train a tiny LLM / video MLLM with FCP plans and ring attention on N processes"),
    ("profile", "time the real executor and fit the cost model coefficients"),
)


class UsageError(Exception):
    """A user error that the CLI reports in one line (exit code 2)."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fcp")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fcp",
        description="Flexible Context Parallelism: plan CP groups per micro-batch, index datasets, run ring attention.",
        epilog="Run `fcp <command> --help` for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"fcp {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, summary in COMMANDS:
        try:
            mod = importlib.import_module(f"fcp_data.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"fcp_data.commands.{name}":
                raise
            continue  # command not built yet
        mod.register(sub, summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except (UsageError, ValueError, FileNotFoundError) as e:
        print(f"fcp {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fcp {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `fcp presets | head`: the reader went away; not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:  # unreadable/unwritable paths (a directory, no permission, a full disk)
        print(f"fcp {args.command}: error: {e}", file=sys.stderr)
        return 2
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
