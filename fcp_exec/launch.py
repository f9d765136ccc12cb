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

__all__ = ["launch", "resolve_nproc", "default_backend", "current_device", "in_torchrun", "dist_info"]


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


def current_device():
    """This rank's device: ``cuda:LOCAL_RANK`` / ``npu:LOCAL_RANK`` when present, else CPU."""
    import torch

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        return torch.device("cuda", local % torch.cuda.device_count())
    if hasattr(torch, "npu") and torch.npu.is_available():  # pragma: no cover
        return torch.device("npu", local)
    return torch.device("cpu")


def dist_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised process group, ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(backend: str, timeout_s: float, num_threads: int | None) -> None:
    import torch
    import torch.distributed as dist

    if num_threads:
        torch.set_num_threads(num_threads)
    if torch.cuda.is_available():
        torch.cuda.set_device(current_device())
    dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))


def _worker(rank: int, nproc: int, port: int, backend: str, threads: int, pg_timeout: float,
            results, fn: Callable, args: tuple) -> None:
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        _init(backend, pg_timeout, threads if backend == "gloo" else None)
        value = fn(*args)
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, "err", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass


def launch(fn: Callable[..., Any], nproc: int, *args: Any, backend: str | None = None,
           timeout: float = 1800.0, pg_timeout: float = 300.0) -> list:
    """Run ``fn(*args)`` on ``nproc`` ranks (module docstring); returns the results by rank."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    if in_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if nproc not in (1, world):
            raise ValueError(f"running under torchrun with WORLD_SIZE={world}; drop --nproc or pass {world}")
        import torch.distributed as dist

        if not dist.is_initialized():
            _init(backend or default_backend(), pg_timeout, None)
        out: list = [None] * world
        out[dist.get_rank()] = fn(*args)
        return out
    import torch.multiprocessing as mp

    backend = backend or default_backend()
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
            break
        except OSError:  # the forkserver's socket vanished (e.g. its temp dir was cleaned): start by spawn
            for p in procs:
                if p.pid is not None and p.is_alive():
                    p.terminate()
                    p.join(timeout=5.0)
            if not use_forkserver:
                raise
            use_forkserver = False
    values: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) + len(errors) < nproc:
            try:
                rank, status, value = results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)
                        and i not in values and i not in errors]
                if dead:
                    errors.update({i: f"worker exited with code {procs[i].exitcode}" for i in dead})
                if time.monotonic() > deadline:
                    raise TimeoutError(f"workers did not finish within {timeout:.0f} s "
                                       f"({len(values)} of {nproc} done)") from None
                continue
            if status == "ok":
                values[rank] = value
            else:
                errors[rank] = value
                break  # the others may be blocked on the failed rank: stop them
    finally:
        for p in procs:
            p.join(timeout=5.0 if not errors else 0.5)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
    if errors:
        detail = "".join(f"\n--- rank {r} ---\n{tb}" for r, tb in sorted(errors.items()))
        raise RuntimeError(f"{len(errors)} worker(s) failed{detail}")
    return [values[r] for r in range(nproc)]
