"""The device and process-group set-up every fcp rank shares (re-exported by :mod:`fcp_exec.launch`, the launcher):
the default backend (NCCL / HCCL / gloo), this rank's device, the dtype a backend's collectives take, the refusal of
two ranks on one accelerator, and :func:`init_distributed`."""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from typing import Any

__all__ = ["default_backend", "current_device", "collective_dtype", "check_devices", "init_distributed",
           "settle_collectives"]


def default_backend() -> str:
    import torch

    if torch.cuda.is_available():
        return "nccl"
    try:  # pragma: no cover - needs an Ascend NPU
        import torch_npu  # noqa: F401

        if torch.npu.is_available():
            return "hccl"
    except ImportError:
        pass
    return "gloo"


def _npu_available() -> bool:
    import torch

    return hasattr(torch, "npu") and torch.npu.is_available()


def current_device():
    """This rank's device: ``cuda:LOCAL_RANK`` / ``npu:LOCAL_RANK`` (modulo the device count) when present,
    else CPU. The one place that maps a local rank to a device."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        return torch.device("cuda", local % torch.cuda.device_count())
    if _npu_available():  # pragma: no cover - needs an Ascend NPU
        return torch.device("npu", local % torch.npu.device_count())
    return torch.device("cpu")


# dtypes each backend's collectives accept (HCCL all-reduce: int8/16/32/64, fp16, fp32, bf16 — no fp64)
_COLLECTIVE_DTYPES = {"hccl": ("int8", "int16", "int32", "int64", "float16", "float32", "bfloat16")}


def collective_dtype(dtype, backend: str | None = None):
    """The dtype to run a collective on ``dtype`` data with on ``backend`` (default: the initialised one):
    ``dtype`` itself where the backend takes it, else float32 (fp64 statistics on HCCL)."""
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "gloo"
    allowed = _COLLECTIVE_DTYPES.get(str(backend).lower())
    if allowed is None or str(dtype).replace("torch.", "") in allowed:
        return dtype
    return torch.float32


def check_devices(backend: str, nproc_local: int) -> None:
    """Refuse, before any process starts, a launch that would put two ranks on one accelerator (NCCL ends in
    "Duplicate GPU detected"; HCCL likewise)."""
    import torch

    if backend == "nccl" and torch.cuda.is_available() and nproc_local > torch.cuda.device_count():
        raise ValueError(f"{nproc_local} processes on this node but only {torch.cuda.device_count()} CUDA device(s): "
                         "NCCL needs one GPU per rank; use --nproc <= the GPU count, or --backend gloo")
    if backend == "hccl" and _npu_available() and nproc_local > torch.npu.device_count():  # pragma: no cover
        raise ValueError(f"{nproc_local} processes on this node but only {torch.npu.device_count()} NPU(s): "
                         "HCCL needs one NPU per rank")


def init_distributed(backend: str | None = None, timeout_s: float = 300.0, num_threads: int | None = None, *,
                     store=None):
    """Initialise this rank's process group the one way fcp does everywhere: pick the device
    (:func:`current_device`) and make it current (``torch.cuda.set_device`` / ``torch.npu.set_device``) *before*
    ``init_process_group``, pass ``device_id`` so NCCL/HCCL communicators are created eagerly, then run one
    warm-up barrier on the world group — so the first communication of every rank is a world collective (a
    first partial-group batched P2P is undefined on NCCL/HCCL and would stall micro-batch 0 until every rank
    arrives). Rendezvous on ``store`` (rank and world size from ``RANK``/``WORLD_SIZE``) when given, else
    ``env://`` (torchrun). A script started without torchrun (none of ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/
    ``MASTER_PORT`` set) is one rank of a world of one (an in-memory store); a partial set is a ValueError naming
    what is missing. Returns the device."""
    import torch
    import torch.distributed as dist

    if store is None:
        store = _single_process_store()
    backend = backend or default_backend()
    if num_threads:
        torch.set_num_threads(num_threads)
    device = current_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":  # pragma: no cover - needs an Ascend NPU
        torch.npu.set_device(device)
    kwargs: dict[str, Any] = {"init_method": "env://"}
    if store is not None:
        kwargs = {"store": store, "rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])}
    accelerator = device.type in ("cuda", "npu") and backend in ("nccl", "hccl")
    if accelerator:
        kwargs["device_id"] = device
    with stdout_to_stderr():  # gloo of torch 2.8 prints "[Gloo] Rank 0 is connected to ..." on stdout
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
        dist.barrier(**({"device_ids": [device.index]} if accelerator else {}))
    return device


@contextlib.contextmanager
def stdout_to_stderr():
    """File descriptor 1 onto 2 for the block: what is printed there — by native code (torch 2.8's gloo announces every
    connection on stdout) or by a library's logging handler that kept the original ``sys.stdout`` (DeepSpeed's, which
    transformers' ``save_pretrained`` imports) — goes to stderr, so ``fcp train --json`` and a user's own
    machine-readable stdout keep only their lines. ``sys.stdout`` is flushed before and after."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no fd 1 (a closed or replaced stdout): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        try:
            sys.stdout.flush()
        except (OSError, ValueError, AttributeError):
            pass
        os.dup2(saved, 1)
        os.close(saved)


_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _single_process_store():
    """An in-memory store for a world of one when the script was started without torchrun (``python train.py``:
    no rendezvous variable set; also sets ``RANK``/``WORLD_SIZE``), else None (``env://``). A partial set of the
    variables is a ValueError that names the missing ones instead of torch's rendezvous traceback."""
    import torch.distributed as dist

    present = [k for k in _TORCHRUN_ENV if os.environ.get(k)]
    if present and len(present) < len(_TORCHRUN_ENV):
        missing = [k for k in _TORCHRUN_ENV if k not in present]
        raise ValueError(f"{', '.join(present)} set but not {', '.join(missing)}: start the script with torchrun "
                         "(every rank gets all four) or with none of them (one process)")
    if present:
        return None
    os.environ["RANK"], os.environ["WORLD_SIZE"] = "0", "1"
    os.environ.setdefault("LOCAL_RANK", "0")
    return dist.HashStore()


def settle_collectives(pause_s: float = 0.05, *, barrier: bool = True) -> None:
    """Before a gloo rank lets go of its last references to the process group (a DDP model's reducer holds one: at
    the end of a script, ``del trainer``), let gloo's worker threads finish destroying the collectives they ran.

    A gloo worker thread destroys a finished collective's work object *after* the caller's ``wait()`` returned, and
    that destroys Python tensors, which takes the GIL. The process group's destructor joins those threads without
    releasing the GIL (pytorch/pytorch#56297); if the last reference goes while a destruction is pending, the rank
    deadlocks at exit (seen here: 1 run in 6 of the Trainer example, main thread in ``~ProcessGroupGloo`` joining, a
    gloo thread in ``~AsyncAllgatherWork`` waiting for the GIL). A barrier completes only after every earlier
    collective has run (its own buffer is created in C++: nothing of it needs the GIL), and the pause releases the
    GIL so their destruction finishes. The same destruction pending while the interpreter finalises aborts the
    process instead ("terminate called without an active exception": Python ends a thread that takes the GIL then,
    and gloo's thread cannot unwind; seen in 3 of about 100 exits after an error in a one-rank run), so this runs
    on one rank too. ``barrier=False``: only the pause (after an error, when peers may never reach a barrier).
    No-op without a process group or on NCCL/HCCL."""
    import time

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_backend() != "gloo":
        return
    if barrier:
        dist.barrier()
    time.sleep(pause_s)

