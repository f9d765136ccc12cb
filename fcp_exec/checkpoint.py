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

import copy
import json
import numbers
import pickle
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


def _check_save_args(path: Path, step: Any, sampler, grad_scaler) -> int:
    """Refuse what :func:`save_checkpoint` could not save before anything is written (a half checkpoint otherwise)."""
    for folder in (path, *path.parents):  # the first one that exists must be a folder
        if folder.exists():
            if not folder.is_dir():
                what = "a file of that name exists" if folder == path else f"Not a directory: {folder} is a file"
                raise OSError(f"checkpoint {path} could not be written: {what}")
            break
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise TypeError(f"save_checkpoint: step must be an int (the number of steps trained), got {step!r}")
    if step < 0:
        raise ValueError(f"save_checkpoint: step must be >= 0 (the number of steps trained), got {step}")
    if not callable(getattr(sampler, "state_after", None)):
        raise TypeError("save_checkpoint: sampler must be the run's FCPSampler (its state_after(last) is saved), got "
                        f"{type(sampler).__name__}")
    if grad_scaler is not None and not callable(getattr(grad_scaler, "state_dict", None)):
        raise TypeError(f"save_checkpoint: grad_scaler must be a GradScaler or None, got {type(grad_scaler).__name__}")
    return int(step)


def _agreed(check, path: Path, what: str) -> Any:
    """``check()`` (this rank's checks before a collective read or write), agreed over the default process group: a
    rank whose check failed raises its own error, every other rank a ``ValueError`` naming it. No rank enters
    ``torch.distributed.checkpoint``'s collectives alone, to wait there for peers that refused (a trainer that catches
    the refusal and goes on, e.g. to start afresh, would otherwise hang until the backend's timeout)."""
    err = out = None
    try:
        out = check()
    except Exception as e:  # noqa: BLE001 - any failure is agreed first (re-raised below with its own type)
        err = e
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, None if err is None else f"{type(err).__name__}: {err}")
        failed = [(r, m) for r, m in enumerate(every) if m is not None]
        if failed and err is None:
            more = f" (and {len(failed) - 1} more rank(s))" if len(failed) > 1 else ""
            raise ValueError(f"checkpoint {path} was not {what}: rank {failed[0][0]} refused it{more}: {failed[0][1]}")
    if err is not None:
        raise err
    return out


def save_checkpoint(path: str | Path, step: int, model, optimizer, sampler, last: Any, *, grad_scaler=None) -> Path:
    """Write a checkpoint of ``step`` steps to folder ``path`` (created) on every rank (a collective): model and
    optimizer state, and this rank's ``sampler.state_after(last)`` (``last``: ``train_step``'s result, or the last
    batch the loop consumed), and fp16's ``grad_scaler`` state (its scale and growth tracker). Returns ``path``.
    Arguments that cannot be saved (``step`` not an int >= 0, no sampler, ``last`` not a batch or result, ``path``
    a file) are refused before anything is written, on every rank when one rank refuses."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)

    def check() -> dict:
        state = {"step": _check_save_args(path, step, sampler, grad_scaler), "sampler": sampler.state_after(last)}
        if grad_scaler is not None:
            state["grad_scaler"] = dict(grad_scaler.state_dict())  # floats and ints
        return state

    state = _agreed(check, path, "written")
    model_sd, optim_sd = _states(model, optimizer)
    try:
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
    except (OSError, ValueError, CheckpointException) as e:  # DCP wraps every rank's error (a BaseException)
        raise OSError(f"checkpoint {path} could not be written: {_first_line(e)}") from e
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


def _damaged(f: Path, why: str) -> ValueError:
    return ValueError(f"checkpoint file {f} is damaged or truncated ({why})")


def _read_metadata(path: Path) -> Any:
    """The ``torch.distributed.checkpoint`` metadata of ``path``, whose data files all hold what it points at (their
    sizes, a cheap test: a truncated or missing file is found here, not halfway through loading it)."""
    from torch.distributed.checkpoint import FileSystemReader

    f = path / ".metadata"
    try:
        meta = FileSystemReader(str(path)).read_metadata()
        keys, where = meta.state_dict_metadata, meta.storage_data
        if not isinstance(keys, dict) or not isinstance(where, dict):
            raise TypeError("no state dict metadata")
        ends: dict[str, int] = {}
        for info in where.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), int(info.offset) + int(info.length))
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError, IndexError,
            KeyError, MemoryError) as e:
        raise _damaged(f, f"{type(e).__name__}: {e}"[:200]) from None
    for name, end in sorted(ends.items()):
        data = path / name
        size = data.stat().st_size if data.is_file() else None
        if size is None or size < end:
            got = "missing" if size is None else f"{size} bytes"
            raise _damaged(data, f"{got}, .metadata has data up to byte {end}")
    return meta


def _check_keys(path: Path, state: dict, meta: Any) -> None:
    """The checkpoint's keys are those this model and optimizer load, as ``torch.distributed.checkpoint`` flattens
    them (it reads only the keys asked for: a model with a subset of the saved keys would load without a word)."""
    try:
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict  # private: in torch 2.4 ... 2.13
    except ImportError:  # a torch that moved it: its own load still refuses missing keys (not extra ones)
        return
    mine, saved = set(flatten_state_dict(state)[0]), set(meta.state_dict_metadata)
    missing, extra = sorted(mine - saved), sorted(saved - mine)
    if not missing and not extra:
        return
    parts = [f"Missing key in checkpoint state_dict: {', '.join(missing[:3])}"
             + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")] if missing else []
    if extra:
        parts.append(f"{len(extra)} key(s) of the checkpoint are not in this model and optimizer: "
                     f"{', '.join(extra[:3])}" + (" …" if len(extra) > 3 else ""))
    raise ValueError(f"checkpoint {path} does not fit this model and optimizer (saved from another model or "
                     f"config?): {'; '.join(parts)}")


def _rank_state(path: Path, sampler, grad_scaler) -> dict:
    """This rank's saved state (rank 0's for a rank the saving run did not have: the same position), checked against
    rank 0's and loaded into a copy of ``sampler``: a state the sampler refuses is found before anything changed."""
    first = _saved(path)  # rank 0's sampler state: every checkpoint has it
    own = _sampler_file(path, _rank())
    saved = _saved(path, _rank()) if own.is_file() else first
    where = ("epoch", "global_batch", "micro_batch")
    if not isinstance(saved.get("sampler"), dict) or not isinstance(first.get("sampler"), dict):
        raise ValueError(f"checkpoint {own}: its sampler state is not a dict (not written by save_checkpoint)")
    if saved["step"] != first["step"] or [saved["sampler"].get(k) for k in where] != [first["sampler"].get(k) for k in where]:
        raise ValueError(f"checkpoint {path}: {own.name} is at step {saved['step']} and another position than "
                         f"sampler-rank0.json (step {first['step']}): files of two different saves")
    if not callable(getattr(sampler, "load_state_dict", None)):
        raise TypeError(f"load_checkpoint: sampler must be the run's FCPSampler, got {type(sampler).__name__}")
    if grad_scaler is not None and not callable(getattr(grad_scaler, "load_state_dict", None)):
        raise TypeError(f"load_checkpoint: grad_scaler must be a GradScaler or None, got {type(grad_scaler).__name__}")
    if not isinstance(saved.get("grad_scaler") or {}, dict):
        raise ValueError(f"checkpoint {own}: its grad_scaler state is not a dict (not written by save_checkpoint)")
    # into a copy: FCPSampler.load_state_dict sets the state's later exclusions before checking it (check_state
    # alone would refuse a state with exclude_later's), and the sampler itself changes only once the model is loaded
    try:
        copy.deepcopy(sampler).load_state_dict(saved["sampler"])
    except (TypeError, ValueError) as e:
        name = own.name if own.is_file() else "sampler-rank0.json"
        raise type(e)(f"checkpoint {path / name} does not fit this sampler: {e}") from None
    return saved


def load_checkpoint(path: str | Path, model, optimizer, sampler, *, grad_scaler=None) -> int:
    """Restore what :func:`save_checkpoint` wrote into ``model``, ``optimizer`` and this rank's ``sampler`` (on
    every rank, before iterating the DataLoader), and into ``grad_scaler`` the saved scale (a checkpoint of a run
    without one leaves it at its initial scale); returns the step to continue at.

    Everything that can be checked before reading the model is, on every rank, and agreed between the ranks (when one
    refuses, every rank raises, none waits in the collective read), and a refused load changes nothing: a folder that is
    not a complete checkpoint, a sampler state this ``sampler`` refuses (another seed, data or batch size), a
    ``.metadata`` that does not unpickle, a data file (``*.distcp``) missing or shorter than ``.metadata`` says, keys
    of another model or optimizer (missing or extra) are each one ``ValueError`` naming the file. What only
    ``torch.distributed.checkpoint``'s read finds — a data file damaged inside at its full size — is a ``ValueError``
    too, but leaves ``model`` and ``optimizer`` in an undefined state (partly loaded): build them again."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    saved, meta = _agreed(lambda: (_rank_state(path, sampler, grad_scaler), _read_metadata(path)), path, "loaded")
    model_sd, optim_sd = _states(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    _agreed(lambda: _check_keys(path, state, meta), path, "loaded")
    try:
        dcp.load(state, checkpoint_id=str(path))
        _restore(model, optimizer, state)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - DCP wraps every rank's error (a BaseException)
        raise ValueError(f"checkpoint {path} does not fit this model and optimizer (another model or config?), or a "
                         f"data file of it is damaged inside: {_first_line(e)}") from e
    sampler.load_state_dict(saved["sampler"])
    if grad_scaler is not None and saved.get("grad_scaler"):
        grad_scaler.load_state_dict(saved["grad_scaler"])
    return saved["step"]


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
    from fcp_exec.devices import stdout_to_stderr
    from fcp_exec.reducers import fsdp1_roots

    distributed = dist.is_available() and dist.is_initialized()
    # FSDP1's offload of parameters already on the CPU crashes the gather (seen with torch 2.13 on gloo): gather there
    offload = distributed and not (fsdp1_roots(model) and next(model.parameters()).device.type == "cpu")
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if _rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
        with stdout_to_stderr():  # `fcp train --json`: stdout holds JSON objects only
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
