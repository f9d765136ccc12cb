"""Checkpoints that resume exactly: model and optimizer through ``torch.distributed.checkpoint`` (sharded FSDP2
parameters, DDP or a plain module alike), and each rank's :class:`~fcp_data.FCPSampler` state *after the global
batch the loop consumed* (:meth:`~fcp_data.FCPSampler.state_after`).

Why not ``sampler.state_dict()``: a DataLoader with workers takes lists from the sampler ahead of the loop
(``prefetch_factor`` per worker), so the sampler's own position is past batches that were never trained on, and a
run resumed from it skips them silently. ``state_after(res)`` is the position right after the step's global batch
whatever the workers hold.

Layout of one checkpoint folder (``save_checkpoint(path, ...)``): the ``torch.distributed.checkpoint`` files of
``{"model", "optim"}`` and one ``sampler-rank{r}.json`` per rank (``{"step", "sampler"}``). It resumes on another
number of ranks too: ``torch.distributed.checkpoint`` reshards the model and optimizer, and a sampler state taken
at a global-batch boundary loads into a sampler of another world size or cost model when the epoch's global batches
are the same (:func:`fcp_data.sampler_state.check_state`); a rank the saving run did not have reads rank 0's state.
Saving over a folder written by more ranks removes their sampler states (rank 0); loading checks that a rank's
state and rank 0's are of the same save (files of two saves would let the ranks plan different global batches).
A trainer of your own can call these two functions, or copy the few lines each of them is. A model whose state-dict
hooks rename its parameters (torchtitan's fused QKV) is marked by its adapter and saved through its own keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_step", "save_hf_model", "fsdp1_optimizer_template"]


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _first_line(e: BaseException) -> str:
    """The first informative line of ``e`` (DCP's CheckpointException lists each rank's traceback after a header)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    useful = [ln for ln in lines if ("Error" in ln or "size" in ln or "key" in ln.lower()) and not ln.startswith("File ")]
    return (useful[-1] if useful else lines[0] if lines else type(e).__name__)[:300]


def _sampler_file(path: Path, rank: int) -> Path:
    return path / f"sampler-rank{rank}.json"


def _own_keys(model) -> Any:
    """The module whose ``state_dict()`` keys are its own (a DDP wrapper unwrapped), or None. A model marked
    ``_fcp_own_state_dict`` (torchtitan's: its fused QKV saves ``wq``/``wk``/``wv`` through state-dict hooks that
    torch's canonical-name mapping cannot follow) is saved and loaded through its own ``state_dict()`` /
    ``load_state_dict()``; every other model through torch's ``get_state_dict`` / ``set_state_dict``."""
    inner = getattr(model, "module", model)
    return inner if getattr(inner, "_fcp_own_state_dict", False) else None


def _states(model, optimizer) -> tuple[dict, dict]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, get_state_dict

    own = _own_keys(model)
    return (own.state_dict(), get_optimizer_state_dict(model, optimizer)) if own is not None else \
        get_state_dict(model, optimizer)


def _restore(model, optimizer, state: dict) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict, set_state_dict

    own = _own_keys(model)
    if own is None:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    else:
        own.load_state_dict(state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])


def save_checkpoint(path: str | Path, step: int, model, optimizer, sampler, last: Any, *, grad_scaler=None) -> Path:
    """Write a checkpoint of ``step`` steps to folder ``path`` (created) on every rank (a collective): model and
    optimizer state, and this rank's ``sampler.state_after(last)`` (``last``: ``train_step``'s result, or the last
    batch the loop consumed), and fp16's ``grad_scaler`` state (its scale and growth tracker). Returns ``path``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    model_sd, optim_sd = _states(model, optimizer)
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    except (OSError, ValueError, CheckpointException) as e:  # DCP wraps every rank's error (a BaseException)
        raise OSError(f"checkpoint {path} could not be written: {_first_line(e)}") from e
    state = {"step": int(step), "sampler": sampler.state_after(last)}
    if grad_scaler is not None:
        state["grad_scaler"] = dict(grad_scaler.state_dict())  # floats and ints
    if _rank() == 0:  # a folder saved before by more ranks: their states are not this checkpoint's
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        for old in path.glob("sampler-rank*.json"):
            r = old.stem.removeprefix("sampler-rank")
            if r.isdigit() and int(r) >= world:
                old.unlink()
    tmp = _sampler_file(path, _rank()).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(_sampler_file(path, _rank()))  # whole or absent
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank's files are written before any rank goes on (and may be killed)
    return path


def _saved(path: Path, rank: int = 0) -> dict:
    """``sampler-rank{rank}.json`` of checkpoint ``path`` (``{"step", "sampler"}``); a clear error when ``path`` is
    not a complete checkpoint (a one-line message for ``fcp train --resume``)."""
    f = _sampler_file(path, rank)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} is not a folder (give DIR/step-K as written by --checkpoint)")
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"checkpoint {path} has no .metadata: its model and optimizer were not saved completely "
                                "(interrupted while saving?)")
    if not f.is_file():
        raise FileNotFoundError(f"checkpoint {path} has no {f.name}: not a complete checkpoint of rank {rank} "
                                "(saved on fewer ranks, or interrupted while saving)")
    try:
        saved = json.loads(f.read_text())
        saved["step"] = int(saved["step"])
        return saved
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint {f} is not a sampler state written by save_checkpoint ({e})") from None


def checkpoint_step(path: str | Path, rank: int = 0) -> int:
    """The step a checkpoint folder was saved at (from rank ``rank``'s sampler state); a clear error when ``path``
    is not a complete checkpoint."""
    return _saved(Path(path), rank)["step"]


def load_checkpoint(path: str | Path, model, optimizer, sampler, *, grad_scaler=None) -> int:
    """Restore what :func:`save_checkpoint` wrote into ``model``, ``optimizer`` and this rank's ``sampler`` (on
    every rank, before iterating the DataLoader), and into ``grad_scaler`` the saved scale (a checkpoint of a run
    without one leaves it at its initial scale); returns the step to continue at."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    first = _saved(path)  # rank 0's sampler state: every checkpoint has it
    model_sd, optim_sd = _states(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        dcp.load(state, checkpoint_id=str(path))
        _restore(model, optimizer, state)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's error (a BaseException)
        raise ValueError(f"checkpoint {path} does not fit this model and optimizer (another model or config?): "
                         f"{_first_line(e)}") from e
    own = _sampler_file(path, _rank())  # a rank the saving run did not have takes rank 0's (same position)
    saved = _saved(path, _rank()) if own.is_file() else first
    where = ("epoch", "global_batch", "micro_batch")
    if saved["step"] != first["step"] or [saved["sampler"].get(k) for k in where] != [first["sampler"].get(k) for k in where]:
        raise ValueError(f"checkpoint {path}: {own.name} is at step {saved['step']} and another position than "
                         f"sampler-rank0.json (step {first['step']}): files of two different saves")
    sampler.load_state_dict(saved["sampler"])
    if grad_scaler is not None and saved.get("grad_scaler"):
        grad_scaler.load_state_dict(saved["grad_scaler"])
    return first["step"]


def save_hf_model(model, path) -> Path:
    """Write a trained transformers model as a checkpoint folder that ``from_pretrained`` — and ``fcp train --model
    hf:DIR`` — loads (``config.json``, ``model.safetensors``). Call it on every rank: under FSDP2 the shards are
    gathered (a collective) into rank 0's memory, which writes; every rank returns once the folder is complete. A DDP or
    ``torch.compile`` wrapper is looked through; the attention implementation FCP set is not saved (the config keeps
    the model's own). Unlike :func:`save_checkpoint` this holds no optimizer or sampler state: it is for using the
    model, not for resuming the run."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"cannot save the model to {str(path)!r}: a file of that name exists")
    inner = getattr(model, "module", model)
    inner = getattr(inner, "_orig_mod", inner)
    if not hasattr(inner, "save_pretrained"):
        raise TypeError(f"save_hf_model needs a transformers model, got {type(inner).__name__}")
    from fcp_exec.reducers import fsdp1_roots

    distributed = dist.is_available() and dist.is_initialized()
    # FSDP1's offload of parameters already on the CPU crashes the gather (seen with torch 2.13 on gloo): gather there
    offload = distributed and not (fsdp1_roots(model) and next(model.parameters()).device.type == "cpu")
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if _rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        inner.save_pretrained(path, state_dict=state)
    if distributed:
        dist.barrier()
    return path


def fsdp1_optimizer_template(model, optimizer) -> None:
    """Before a loader that takes the optimizer's own state dict as the template of what to read — Accelerate's
    ``load_fsdp_optimizer`` for FSDP1's sharded checkpoints does (``FSDP.optim_state_dict(model, optimizer)``, then
    ``torch.distributed.checkpoint.load`` into it) — give a fresh optimizer its state: a zero-gradient step at learning
    rate 0 (torch's own ``_init_optim_state``; the parameters do not move, the loaded state replaces it). Without it the
    template holds no moments and the resumed run restarts AdamW from zero, silently. Only for an FSDP1 ``model`` whose
    optimizer has no state yet; anything else is left alone."""
    from fcp_exec.reducers import fsdp1_roots

    inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer
    if not fsdp1_roots(model) or getattr(inner, "state", None):
        return
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    _init_optim_state(inner)
