"""Start N worker processes with an initialised process group, or join one started by torchrun.

``launch(fn, nproc, *args)`` runs ``fn(*args)`` on every rank and returns the per-rank results:

* **Under torchrun** (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` in the environment) the current
  process is one rank: the process group is initialised from the environment (``env://``), ``fn`` runs
  here and the result list holds only this rank's value (at its index; other entries ``None``).
* **Otherwise** ``nproc`` processes are started on this machine (forked by a ``forkserver`` that has
  imported torch and fcp once, so repeated launches are cheap; ``spawn`` where there is none), rendezvous on
  a free localhost port, and each runs ``fn``; a worker's exception is re-raised here with its traceback
  and the other workers are stopped; ``timeout`` bounds the whole run.

Backend: NCCL when CUDA is available (one device per local rank), HCCL with ``torch_npu``, else gloo on
CPU. With gloo every worker gets ``max(1, cpu_count // nproc)`` torch threads so N workers share the
machine fairly. Workers inherit stdout/stderr, so rank 0 can stream its output.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import time
import traceback
from typing import Any, Callable

from fcp_data.slots import dist_rank_and_world as dist_info  # the one rank/world helper

__all__ = ["launch", "resolve_nproc", "default_backend", "current_device", "in_torchrun", "dist_info",
           "init_distributed", "collective_dtype", "check_devices", "WorkerFailure"]


_PRELOAD = ["torch", "torch.distributed", "fcp_exec.launch", "fcp_exec.train", "fcp_exec.ring_attention",
            "transformers", "fcp_exec.integrations.hf", "fcp_exec.integrations.hf_positions",
            "fcp_exec.models", "fcp_data.sampler", "fcp_data.collator", "fcp_data.plan"]


def in_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def resolve_nproc(nproc: int | None, default: int = 2) -> int:
    """The ``--nproc`` of a command: torchrun's ``WORLD_SIZE`` under torchrun, else ``nproc`` or ``default``."""
    if in_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc not in (None, world):
            raise ValueError(f"running under torchrun with WORLD_SIZE={world}; drop --nproc or pass {world}")
        return world
    nproc = default if nproc is None else nproc
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    return nproc


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
_COLLECTIVE_DTYPES = {
    "hccl": ("int8", "int16", "int32", "int64", "float16", "float32", "bfloat16"),
}


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str | None = None, timeout_s: float = 300.0, num_threads: int | None = None):
    """Initialise this rank's process group from the environment (``env://``) the one way fcp does everywhere:
    pick the device (:func:`current_device`) and make it current (``torch.cuda.set_device`` /
    ``torch.npu.set_device``) *before* ``init_process_group``, pass ``device_id`` so NCCL/HCCL communicators are
    created eagerly, then run one warm-up barrier on the world group — so the first communication of every rank
    is a world collective (a first partial-group batched P2P is undefined on NCCL/HCCL and would stall micro-batch
    0 until every rank arrives). Returns the device."""
    import torch
    import torch.distributed as dist

    backend = backend or default_backend()
    if num_threads:
        torch.set_num_threads(num_threads)
    device = current_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif device.type == "npu":  # pragma: no cover - needs an Ascend NPU
        torch.npu.set_device(device)
    kwargs = {}
    if device.type in ("cuda", "npu") and backend in ("nccl", "hccl"):
        kwargs["device_id"] = device
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    if device.type in ("cuda", "npu") and backend in ("nccl", "hccl"):
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    return device


def _init(backend: str, timeout_s: float, num_threads: int | None) -> None:
    init_distributed(backend, timeout_s, num_threads)


def _worker(rank: int, nproc: int, port: int, backend: str, threads: int, pg_timeout: float,
            results, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        _init(backend, pg_timeout, threads if backend == "gloo" else None)
        value = fn(*args)
        results.put((rank, "ok", value))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, "err", (type(e).__name__, str(e), traceback.format_exc())))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


class WorkerFailure(RuntimeError):
    """One or more ranks failed. ``errors`` maps rank to ``(exception type name, message, traceback text)``;
    a rank that died without a Python exception has type name ``"exit"``. ``str()`` shows every traceback."""

    def __init__(self, errors: dict[int, tuple[str, str, str]]):
        self.errors = dict(errors)
        detail = "".join(f"\n--- rank {r} ---\n{tb}" for r, (_, _, tb) in sorted(self.errors.items()))
        super().__init__(f"{len(self.errors)} worker(s) failed{detail}")


def launch(fn: Callable[..., Any], nproc: int, *args: Any, backend: str | None = None,
           timeout: float = 1800.0, pg_timeout: float = 300.0) -> list:
    """Run ``fn(*args)`` on ``nproc`` ranks (module docstring); returns the results by rank."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    if in_torchrun():
        return _in_torchrun(fn, nproc, args, backend, pg_timeout)
    backend = backend or default_backend()
    check_devices(backend, nproc)
    procs, results = _start(fn, nproc, args, backend, pg_timeout)
    values: dict[int, Any] = {}
    errors: dict[int, tuple[str, str, str]] = {}
    try:
        _collect(procs, results, values, errors, timeout)
    finally:
        for p in procs:
            p.join(timeout=5.0 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
    if errors:
        raise WorkerFailure(errors)
    return [values[r] for r in range(nproc)]


def _in_torchrun(fn: Callable[..., Any], nproc: int, args: tuple, backend: str | None, pg_timeout: float) -> list:
    """Under torchrun this process is one rank: initialise the process group once and run ``fn`` here."""
    world = int(os.environ["WORLD_SIZE"])
    if nproc not in (1, world):
        raise ValueError(f"running under torchrun with WORLD_SIZE={world}; drop --nproc or pass {world}")
    import torch.distributed as dist

    if not dist.is_initialized():
        _init(backend or default_backend(), pg_timeout, None)
    out: list = [None] * world
    out[dist.get_rank()] = fn(*args)
    return out


def _start(fn: Callable[..., Any], nproc: int, args: tuple, backend: str, pg_timeout: float):
    """Start the ``nproc`` worker processes; ``(processes, result queue)``."""
    import torch.multiprocessing as mp

    threads = max(1, (os.cpu_count() or 1) // nproc)
    use_forkserver = "forkserver" in mp.get_all_start_methods()
    while True:
        # a server that has imported torch and fcp once forks every worker: later launches start in ~0.1 s
        ctx = mp.get_context("forkserver" if use_forkserver else "spawn")
        if use_forkserver:
            ctx.set_forkserver_preload(_PRELOAD)
        results = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_worker, args=(r, nproc, port, backend, threads, pg_timeout, results, fn, args),
                             daemon=False) for r in range(nproc)]  # ranks may start DataLoader workers
        try:
            for p in procs:
                p.start()
            return procs, results
        except OSError:  # the forkserver's socket vanished (e.g. its temp dir was cleaned): start by spawn
            for p in procs:
                if p.pid is not None and p.is_alive():
                    p.terminate()
                    p.join(timeout=5.0)
            if not use_forkserver:
                raise
            use_forkserver = False


def _exited(procs, values: dict, errors: dict) -> dict[int, tuple[str, str, str]]:
    """The ranks that exited with a non-zero code without reporting, as errors."""
    return {i: ("exit", f"exit code {p.exitcode}", f"worker exited with code {p.exitcode}")
            for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in values and i not in errors}


def _collect(procs, results, values: dict, errors: dict, timeout: float) -> None:
    """Fill ``values``/``errors`` by rank until every rank reported, one failed (then the others get 2 s to
    report their own failure: the first error is often a peer's symptom) or ``timeout`` passed."""
    nproc = len(procs)
    deadline = time.monotonic() + timeout
    while len(values) + len(errors) < nproc:
        try:
            rank, status, value = results.get(timeout=1.0)
        except queue.Empty:
            errors.update(_exited(procs, values, errors))
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers did not finish within {timeout:.0f} s "
                                   f"({len(values)} of {nproc} done)") from None
            continue
        if status == "ok":
            values[rank] = value
            continue
        errors[rank] = value
        grace = time.monotonic() + 2.0
        while time.monotonic() < grace and len(values) + len(errors) < nproc:
            try:
                r2, st2, v2 = results.get(timeout=0.2)
            except queue.Empty:
                continue
            (values if st2 == "ok" else errors)[r2] = v2
        errors.update(_exited(procs, values, errors))
        return
