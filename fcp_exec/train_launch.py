"""How ``fcp train`` starts its ranks: :func:`run_training` (re-exported by :mod:`fcp_exec.train`) and the modules its
launcher's forkserver preloads (:func:`hf_preload`).

A training run has no overall deadline: it takes as long as its steps take, and a hang (a rank stuck in a collective)
ends at the process group's timeout. Under torchrun this process is one rank; the parameter checksums of every rank
are all-gathered here so that the caller can compare them (``"checksums"``), as after a launch of its own.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["run_training", "hf_preload"]


def run_training(cfg, nproc: int, *, backend: str | None = None, timeout: float | None = None) -> dict[str, Any]:
    """Start ``nproc`` ranks (or join torchrun's) and train; returns rank 0's result (under torchrun this rank's)
    with ``checksums`` (every rank's parameter checksum, which must agree) added. ``timeout``: seconds the whole run
    may take (None: no deadline, module docstring)."""
    from fcp_exec.launch import in_torchrun, launch
    from fcp_exec.train import train

    timeout = math.inf if timeout is None else timeout
    if in_torchrun():
        mine = next(r for r in launch(train, nproc, cfg, backend=backend, timeout=timeout) if r is not None)
        return {**mine, "checksums": all_checksums(mine["param_checksum"])}
    if nproc == 1 and backend is None:
        res = train(cfg)
        res["checksums"] = [res["param_checksum"]]
        return res
    results = launch(train, nproc, cfg, backend=backend, timeout=timeout, preload=hf_preload([cfg]))
    first = dict(next(r for r in results if r is not None))
    first["checksums"] = [r["param_checksum"] for r in results if r is not None]
    return first


def all_checksums(checksum: float) -> list[float]:
    """Every rank's ``checksum``, by rank (one all-gather; this rank's alone without a process group)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [checksum]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, checksum)
    return [float(c) for c in out]


def hf_preload(cfgs) -> tuple[str, ...]:
    """Modules worth importing once in the launcher's forkserver for these configurations (or ``--model`` strings):
    transformers' model machinery when any of them is an ``hf:`` model (else nothing: the tiny models do not need it)."""
    return ("transformers.modeling_utils",) if any(getattr(c, "model", c).startswith("hf:") for c in cfgs) else ()
