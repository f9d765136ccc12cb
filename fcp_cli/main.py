"""The ``fcp`` command.

Each sub-command lives in its own module under :mod:`fcp_data.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``. Modules are imported
only to build the parser; heavy imports (torch, cvxpy, decord, ray) belong inside ``func``.

One error boundary for every command (:func:`main`): a user error — a bad option value or combination
(argparse errors, :class:`UsageError`, ``ValueError``), a bad path (``OSError`` such as
``FileNotFoundError``), an unavailable backend, or a ``ValueError`` raised inside a worker process — prints
one line ``fcp <cmd>: error: ...`` on stderr and exits with code 2, never a traceback. Anything else is a
bug and keeps its traceback. ``fcp --debug ...`` (or ``FCP_DEBUG=1``) prints the traceback of user errors
too. Commands validate cheap things (values, paths, backend, process count) before expensive ones (model,
data, starting processes): :func:`check_launch` is the shared check of ``--nproc``/``--backend``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback

__all__ = ["main", "UsageError", "COMMANDS", "check_launch", "MAX_PROCS_PER_CORE"]

# (module under fcp_data.commands, one-line summary shown by `fcp --help`)
COMMANDS = (
    ("plan", "plan one global batch of sequence lengths into CP groups"),
    ("compare", "compare FCP against the ILP, the exhaustive search and the baselines"),
    ("simulate", "simulate step times of every solver over batches drawn from a workload"),
    ("presets", "list the model and hardware presets of the cost model"),
    ("index", "build a length index (token counts) of text, image and video datasets"),
    ("train", "train a tiny or Hugging Face LLM / video MLLM with FCP plans and ring attention on N processes"),
    ("profile", "time the real executor and fit the cost model coefficients"),
)

# gloo on CPU: more processes than this per core only thrash (and a typo like --nproc 100000 would hang in
# the rendezvous or exhaust memory); larger jobs run under torchrun across machines
MAX_PROCS_PER_CORE = 4

# exception names a worker may raise for bad user input (fcp_exec.launch.WorkerFailure carries each rank's
# exception type, message and traceback)
_WORKER_USER_ERRORS = ("ValueError", "UsageError", "fcp_data.cli.UsageError", "FileNotFoundError")


class UsageError(Exception):
    """A user error that the CLI reports in one line (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: a bad option is one line on stderr (exit 2), not usage + error."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fcp")
    except PackageNotFoundError:  # a source checkout that was never installed
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="fcp",
        description="Flexible Context Parallelism: plan CP groups per micro-batch, index datasets, run ring attention.",
        epilog="Run `fcp <command> --help` for the options of one command. User errors print one line and exit 2; "
               "--debug (or FCP_DEBUG=1) adds their traceback.",
    )
    parser.add_argument("--version", action="version", version=f"fcp {_version()}")
    debug_help = "print the traceback of user errors too (default: one line, exit code 2)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, summary in COMMANDS:  # a command whose module fails to import is an error, never silently dropped
        importlib.import_module(f"fcp_data.commands.{name}").register(sub, summary)
    for p in sub.choices.values():  # `fcp train ... --debug` as well as `fcp --debug train ...`
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    return parser


def _one_line(text: str) -> str:
    return "; ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())


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


def main(argv: list[str] | None = None) -> int:
    from fcp_data.plan.registry import load_plugins

    try:  # solver plugins first: their names are choices of the parser (README "Adding a solver")
        load_plugins()
    except ValueError as e:
        print(f"fcp: error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = bool(getattr(args, "debug", False)) or os.environ.get("FCP_DEBUG", "") not in ("", "0")

    def user_error(message: str) -> int:
        if debug:
            traceback.print_exc()
        print(f"fcp {args.command}: error: {_one_line(message)}", file=sys.stderr)
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
    except OSError as e:  # unreadable/unwritable paths (a directory, no permission, a full disk)
        return user_error(str(e))
    except ImportError as e:  # an optional dependency the chosen option needs
        if e.name and e.name.split(".")[0] in ("transformers", "cvxpy", "highspy", "decord", "av", "ray",
                                                "matplotlib", "tokenizers", "webdataset", "torch_npu"):
            return user_error(f"{e} (install the matching extra, e.g. pip install 'fcp[all]')")
        raise
    except RuntimeError as e:
        msg = _worker_user_error(e)
        if msg is None:
            raise
        return user_error(msg)
    return int(rc or 0)


def check_launch(nproc: int | None, backend: str | None, *, default: int = 2) -> tuple[int, str | None]:
    """``(nproc, backend)`` of a command that starts ranks, checked before anything starts (``UsageError``);
    ``backend`` comes back lower-cased, or None when not given (the launcher then picks the device's).

    ``nproc``: torchrun's ``WORLD_SIZE`` under torchrun, else ``--nproc`` (default ``default``); without
    torchrun at most :data:`MAX_PROCS_PER_CORE` processes per CPU core for gloo, one per device for
    NCCL/HCCL. ``backend``: ``--backend`` or the device's default; it must be built into this torch and
    have its devices (NCCL needs CUDA GPUs, HCCL torch_npu and NPUs)."""
    import torch
    import torch.distributed as dist

    from fcp_exec.launch import default_backend, in_torchrun, resolve_nproc

    try:
        nproc = resolve_nproc(nproc, default)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed; install a build with it")
    name = (backend or default_backend()).lower()
    known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")] + ["hccl"]
    if name not in known:
        raise UsageError(f"unknown --backend {backend!r}; use one of gloo, nccl (CUDA), hccl (Ascend NPU), or leave "
                         "it out for the device's default")
    num_devices = None
    if name == "nccl":
        if not (dist.is_nccl_available() and torch.cuda.is_available()):
            raise UsageError("--backend nccl needs CUDA GPUs and a torch build with NCCL; this one has "
                             f"{'no NCCL' if not dist.is_nccl_available() else 'no visible GPU'} (use gloo on CPU)")
        num_devices = torch.cuda.device_count()
    elif name == "hccl":
        try:
            import torch_npu  # noqa: F401
        except ImportError:
            raise UsageError("--backend hccl needs torch_npu (pip install 'fcp[npu]', with CANN)") from None
        if not torch.npu.is_available():
            raise UsageError("--backend hccl needs Ascend NPUs; none is visible (use gloo on CPU)")
        num_devices = torch.npu.device_count()
    elif not dist.is_backend_available(name):
        raise UsageError(f"--backend {name} is not built into this torch; use gloo on CPU")
    if not in_torchrun():
        if num_devices is not None and nproc > num_devices:
            raise UsageError(f"--nproc {nproc} needs {nproc} devices for {name}, this machine has {num_devices}; pass "
                             f"--nproc <= {num_devices}, or use torchrun across machines")
        cores = os.cpu_count() or 1
        if num_devices is None and nproc > MAX_PROCS_PER_CORE * cores:
            raise UsageError(f"--nproc {nproc} is more than {MAX_PROCS_PER_CORE} processes per CPU core on this "
                             f"machine ({cores} cores: at most {MAX_PROCS_PER_CORE * cores}); pass fewer, or use "
                             "torchrun across machines")
    return nproc, (name if backend else None)


if __name__ == "__main__":
    # `python -m fcp_data.cli` runs this file as __main__: use the importable module, whose UsageError is the
    # class the commands raise (this file's own copy would not catch it)
    from fcp_data.cli import main as _main

    sys.exit(_main())
