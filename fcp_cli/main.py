"""The ``fcp`` command (``python -m fcp_cli``).

Each sub-command lives in its own module — data side under :mod:`fcp_data.commands`, executor side under
:mod:`fcp_exec.commands` — and exposes ``register(subparsers, summary)``, which adds its parser and sets
``func(args) -> int``. Modules are imported only to build the parser; heavy imports (torch, cvxpy, decord,
ray) belong inside ``func``. This package is the only one that sees both sides (docs/ARCHITECTURE.md).

One error boundary for every command (:func:`main`): a user error — a bad option value or combination
(argparse errors, :class:`UsageError`, ``ValueError``), a bad path (``OSError`` such as
``FileNotFoundError``), an unavailable backend, a dataset too broken to read (``SampleReadError``), or a
``ValueError`` raised inside a worker process — prints
one line ``fcp <cmd>: error: ...`` on stderr and exits with code 2, never a traceback. Anything else is a
bug and keeps its traceback. ``fcp --debug ...`` (or ``FCP_DEBUG=1``) prints the traceback of user errors
too. Commands validate cheap things (values, paths, backend, process count) before expensive ones (model,
data, starting processes): :func:`fcp_exec.commands.check_launch` is the shared check of ``--nproc``/``--backend``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

from fcp_data.commands import UsageError
from fcp_data.commands.argtypes import ArgumentParser, one_line

__all__ = ["main", "UsageError", "COMMANDS", "build_parser"]

# (command, module, one-line summary shown by `fcp --help`)
COMMANDS = (
    ("plan", "fcp_data.commands.plan", "plan one global batch of sequence lengths into CP groups"),
    ("compare", "fcp_data.commands.compare", "compare FCP against the ILP, the exhaustive search and the baselines"),
    ("simulate", "fcp_data.commands.simulate", "simulate step times of every solver over batches drawn from a workload"),
    ("presets", "fcp_data.commands.presets", "list the model and hardware presets of the cost model"),
    ("index", "fcp_data.commands.index", "build a length index (token counts) of text, image and video datasets"),
    ("train", "fcp_exec.commands.train",
     "train a tiny or Hugging Face LLM / video MLLM with FCP plans and ring attention on N processes"),
    ("profile", "fcp_exec.commands.profile", "time the real executor and fit the cost model coefficients"),
    ("env", "fcp_exec.commands.env", "print versions, devices, backends, kernels and optional packages (bug reports)"),
)

_NAMES = frozenset(name for name, _, _ in COMMANDS)

# exception names a worker may raise for bad user input (fcp_exec.launch.WorkerFailure carries each rank's
# exception type, message and traceback)
_WORKER_USER_ERRORS = ("ValueError", "UsageError", "fcp_data.commands.UsageError", "FileNotFoundError", "OSError",
                       "SampleReadError",  # the data itself is broken (fcp_data.read_errors)
                       "MissingDependency",  # fcp_exec.compat: e.g. FSDP2 on the CPU before torch 2.7
                       "TrainingDiverged")  # a NaN/inf loss (fcp_exec.optim.check_finite): the settings, not a bug


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fcp")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "(not installed)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``fcp`` parser. With ``command`` only that command's module is imported (the others get a parser that
    only shows their summary), so ``fcp plan`` never loads the executor (torch); ``""`` imports none (``fcp --help``,
    ``fcp --version``: 0.2 s instead of the 3 s of importing torch); None imports every command."""
    parser = ArgumentParser(
        prog="fcp",
        description="Flexible Context Parallelism: plan CP groups per micro-batch, index datasets, run ring attention.",
        epilog="Run `fcp <command> --help` for the options of one command. User errors print one line and exit 2; "
               "--debug (or FCP_DEBUG=1) adds their traceback.",
    )
    parser.add_argument("--version", action="version", version=f"fcp {_version()}")
    debug_help = "print the traceback of user errors too (default: one line, exit code 2)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, module, summary in COMMANDS:  # a module that fails to import is an error, never silently dropped
        if command is None or name == command:
            importlib.import_module(module).register(sub, summary)
        else:
            sub.add_parser(name, help=summary, description=f"{summary} (`fcp {name} --help` for its options)")
    for p in sub.choices.values():  # `fcp train ... --debug` as well as `fcp --debug train ...`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    parser.commands = sub.choices  # name -> the command's parser (its errors name the command)
    return parser


def _worker_user_error(e: RuntimeError) -> str | None:
    """The message of a worker's user error (a ``ValueError`` ...) from :class:`fcp_exec.launch.WorkerFailure`;
    None when any failed worker died of something else (a bug: keep the traceback)."""
    errors = getattr(e, "errors", None)
    if not isinstance(errors, dict) or not errors:
        return None
    found = None
    for _, (kind, message, _tb) in sorted(errors.items()):
        if kind in _WORKER_USER_ERRORS:
            found = found or message
        elif kind != "exit":  # peers of a failed rank may be stopped: their exit codes are not the cause
            return None
    return found


def _worker_died(e: RuntimeError) -> str | None:
    """One line for a :class:`fcp_exec.launch.WorkerFailure` in which a rank died without reporting (killed by a
    signal: the OOM killer, a scheduler, a user): the dead rank is the cause, the others' errors (a collective whose
    peer vanished) its symptoms. None when no rank died that way."""
    errors = getattr(e, "errors", None)
    if not isinstance(errors, dict):
        return None
    dead = [(rank, message) for rank, (kind, message, _tb) in sorted(errors.items()) if kind == "exit"]
    if not dead:
        return None
    rank, message = dead[0]
    message = message if message.startswith("rank ") else f"rank {rank} died without reporting ({message})"
    return f"{message}; the other ranks stopped (--debug shows every rank's traceback)"


def _empty_value(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """The first option (or positional argument) given an empty string, e.g. ``--cost ''`` from an unset shell
    variable: taken as "not given" it would silently run with the default, so it is refused instead."""
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        values = value if isinstance(value, list) else [value]
        if action.default != "" and any(v == "" for v in values):
            if action.option_strings:
                return f"{action.option_strings[-1]}: an empty value (leave the option out for its default)"
            return f"{action.metavar or action.dest}: an empty value"
    return None


def console() -> None:
    """The ``fcp`` command (console script and ``python -m fcp_cli``): :func:`main`, then the process exit. A run
    interrupted after Ray was imported (``fcp index --engine ray``) leaves without Python's exit handlers (``os._exit``,
    streams flushed): a terminal's Ctrl-C reaches the whole process group, Ray's local GCS and raylet die with it, and
    Ray's own exit handler then crashed the process (SIGSEGV, exit 139, in 4 of 5 interrupts measured) instead of
    exiting 130. Everything fcp cleans up (staging folders, workers) was already cleaned up when :func:`main`
    returned."""
    rc = main()
    if rc == 130 and "ray" in sys.modules:  # ray.is_initialized() already says False there: imported is enough
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(rc)
    sys.exit(rc)


def main(argv: list[str] | None = None) -> int:
    from fcp_data.plan.registry import load_plugins

    try:  # solver plugins first: their names are choices of the parser (README "Adding a solver")
        load_plugins()
    except ValueError as e:
        print(f"fcp: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(next((a for a in argv if a in _NAMES), ""))
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # `fcp plan --bogus` is `fcp plan`'s error (see `fcp plan --help`); `fcp --bogus plan` the top level's
        command = getattr(args, "command", None)
        after = command in argv and unknown[0] in argv and argv.index(unknown[0]) > argv.index(command)
        (parser.commands[command] if after else parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "func", None):  # `fcp` alone: a usage error on stderr, like any other (`fcp --help` lists them)
        parser.error(f"a command is required: one of {', '.join(name for name, _, _ in COMMANDS)}")
    empty = _empty_value(parser.commands[args.command], args)
    if empty:
        parser.commands[args.command].error(empty)
    debug = bool(getattr(args, "debug", False)) or os.environ.get("FCP_DEBUG", "") not in ("", "0")

    def user_error(message: str) -> int:
        if debug:
            traceback.print_exc()
        print(f"fcp {args.command}: error: {one_line(message)}", file=sys.stderr)
        return 2

    try:
        rc = args.func(args)
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
    except (UsageError, ValueError) as e:
        return user_error(str(e))
    except TimeoutError:  # a launcher's deadline (a run that hung): not a bad input, keeps its traceback
        raise
    except OSError as e:  # unreadable/unwritable paths (a directory, no permission, a full disk)
        return user_error(str(e))
    except FloatingPointError as e:  # fcp_exec.optim.TrainingDiverged in a one-process run: the settings, not a bug
        if type(e).__name__ != "TrainingDiverged":
            raise
        return user_error(str(e))
    except ImportError as e:  # an optional dependency the chosen option needs
        if e.name and e.name.split(".")[0] in ("transformers", "cvxpy", "highspy", "decord", "av", "ray",
                                                "matplotlib", "tokenizers", "webdataset", "torch_npu"):
            return user_error(f"{e} (install the matching extra, e.g. pip install 'fcp[all]')")
        raise
    except RuntimeError as e:
        from fcp_data.read_errors import SampleReadError

        if isinstance(e, SampleReadError):
            return user_error(str(e))
        msg = _worker_user_error(e)
        if msg is not None:
            return user_error(msg)
        died = _worker_died(e)
        if died is None:
            raise
        if debug:
            traceback.print_exc()
        print(f"fcp {args.command}: error: {one_line(died)}", file=sys.stderr)
        return 1  # a failure, not a bad input (exit 2)
    return int(rc or 0)


if __name__ == "__main__":  # `python -m fcp_cli.main`; `python -m fcp_cli` is the same command
    sys.exit(main())
