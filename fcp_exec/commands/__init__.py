"""Sub-commands of the ``fcp`` CLI on the executor side (train, profile); the dispatcher is :mod:`fcp_cli.main`.

:func:`check_launch` is the shared check of ``--nproc``/``--backend`` of every command that starts ranks;
:func:`add_config_options` / :func:`config_kwargs` derive a command's options from a config dataclass.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing

from fcp_data.commands import UsageError

__all__ = ["check_launch", "MAX_PROCS_PER_CORE", "add_config_options", "config_kwargs", "cli_fields"]

# gloo on CPU: more processes than this per core only thrash (and a typo like --nproc 100000 would hang in
# the rendezvous or exhaust memory); larger jobs run under torchrun across machines
MAX_PROCS_PER_CORE = 4


def check_launch(nproc: int | None, backend: str | None, *, default: int = 2) -> tuple[int, str | None]:
    """``(nproc, backend)`` of a command that starts ranks, checked before anything starts (``UsageError``);
    ``backend`` comes back lower-cased, or None when not given (the launcher then picks the device's).

    ``nproc``: torchrun's ``WORLD_SIZE`` under torchrun, else ``--nproc`` (default ``default``); without
    torchrun at most :data:`MAX_PROCS_PER_CORE` processes per CPU core for gloo, one per device for
    NCCL/HCCL. ``backend``: ``--backend`` or the device's default; it must be built into this torch and
    have its devices (NCCL needs CUDA GPUs, HCCL torch_npu and NPUs). Under torchrun, where this process is a rank,
    a CPU rank keeps freed memory (:mod:`fcp_exec.host_memory`), as the ranks of fcp's launcher do."""
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
    else:  # under torchrun this process is one of the ranks: on CPU it keeps freed memory as the launcher's ranks do
        from fcp_exec.host_memory import keep_freed_memory
        from fcp_exec.launch import current_device

        keep_freed_memory(current_device())
    return nproc, (name if backend else None)


def cli_fields(cls) -> list[dataclasses.Field]:
    """The fields of dataclass ``cls`` that are command-line options: all but those with ``metadata cli=False``."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", True)]


def _option_type(cls, f: dataclasses.Field, hint) -> type:
    """``int``/``float``/``str``/``bool`` of a field annotated with one of them (or ``X | None``)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if hint not in (int, float, str, bool):
        raise TypeError(f"{cls.__name__}.{f.name}: type {hint} has no command-line form; give the field a plain "
                        "type (int, float, str, bool, or one of them | None) or metadata cli=False")
    return hint


def add_config_options(parser, cls) -> None:
    """One ``--field-name`` option per :func:`cli_fields` field of dataclass ``cls``: its type, its default (the
    dataclass's: the two cannot diverge), ``metadata`` ``help`` (a string or a zero-argument callable),
    ``choices`` and ``metavar``. A bool defaulting to False is a flag; to True, ``--x/--no-x``."""
    import argparse

    hints = typing.get_type_hints(cls)
    for f in cli_fields(cls):
        kind = _option_type(cls, f, hints[f.name])
        help_text = f.metadata.get("help", "")
        help_text = help_text() if callable(help_text) else help_text
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kwargs: dict = {"dest": f.name} | ({"required": True} if default is dataclasses.MISSING else {"default": default})
        if kind is bool:
            kwargs["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
        else:
            kwargs.update(type=kind, choices=f.metadata.get("choices"), metavar=f.metadata.get("metavar"))
            if default not in (None, dataclasses.MISSING):
                help_text += f" (default {default})"
        parser.add_argument("--" + f.name.replace("_", "-"), help=help_text, **kwargs)


def config_kwargs(cls, args) -> dict:
    """The :func:`cli_fields` values of parsed ``args``, as keyword arguments of ``cls``."""
    return {f.name: getattr(args, f.name) for f in cli_fields(cls)}
