"""Gradient and module-state bookkeeping for :func:`fcp_exec.step.train_step` and its reducers.

* **Gradient accumulation over several ``train_step`` calls** (one ``opt.step()`` after k global batches): a reducer
  that reduces the whole ``.grad`` (the all-reduce reducer's flat all-reduce, DDP's SUM comm hook) would sum again
  the gradients an earlier ``train_step`` already summed over ranks (times the world size), and the skipped-read
  rescale (:func:`fcp_exec.step.rescale_skipped`) would rescale them again. :func:`set_aside` takes the gradients
  present when the step starts out of the parameters (``.grad`` None, as after ``zero_grad()``), the step reduces
  only its own, and :func:`add_back` adds the earlier ones again afterwards. FSDP1 (whose flat-parameter gradients
  cannot be taken out safely) accumulates its reduced shards itself: a step that starts with gradients present
  (:func:`holds_grads`) takes its failed reads out of the denominator before its first forward instead, so nothing
  is rescaled afterwards (no copy of the gradients is kept).
* **Ranks start from the same weights** (:func:`broadcast_module_states`): the all-reduce reducer wraps nothing, so
  unlike DDP (which broadcasts rank 0's states) and FSDP2 (which shards one copy) it would train ranks that were
  initialised apart on different weights; rank 0's parameters and buffers are broadcast, bit for bit, once per model.
* **An optimizer built before FSDP2 sharded the model** (:func:`mark_replaced`) holds the parameters ``fully_shard``
  replaced: they get no gradient and it trains nothing, silently. The replaced ones are marked, and the first
  ``step()`` of an optimizer that holds one is a clear error (one global optimizer step pre-hook, checking each
  optimizer once).
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch import nn

from fcp_data.sampler_inputs import dist_rank_and_world

__all__ = ["add_back", "broadcast_module_states", "holds_grads", "mark_replaced", "set_aside"]

_BUCKET_BYTES = 256 << 20  # at most this much extra memory per broadcast


def set_aside(model: nn.Module, reducer) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(parameter, its gradient)]`` for every parameter that holds a gradient, those gradients taken out (``.grad``
    None) — for a reducer with ``sets_aside_grads`` (else nothing is touched and ``[]`` comes back). A DDP model
    with ``gradient_as_bucket_view`` keeps a copy (its next backward writes into the bucket the old view shares)."""
    if not getattr(reducer, "sets_aside_grads", False):
        return []
    copy = bool(getattr(model, "gradient_as_bucket_view", False))
    out = []
    for p in model.parameters():
        if p.grad is not None:
            out.append((p, p.grad.detach().clone() if copy else p.grad))
            p.grad = None
    return out


def add_back(kept: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Add the gradients :func:`set_aside` took out back onto the step's (in place; put back where none came)."""
    with torch.no_grad():
        for p, old in kept:
            if p.grad is None:
                p.grad = old
            else:
                p.grad.add_(old)


def holds_grads(model: nn.Module, reducer) -> bool:
    """True for a reducer with ``exact_when_accumulating`` (FSDP1) and a model holding gradients when a step starts
    (accumulation over steps, or ``zero_grad(set_to_none=False)``): a rescale after the backward would scale the
    earlier steps' gradients too, so :func:`fcp_exec.step.train_step` counts the failed reads first."""
    return bool(getattr(reducer, "exact_when_accumulating", False)) and any(
        p.grad is not None for p in model.parameters())


def broadcast_module_states(model: nn.Module, src: int = 0) -> None:
    """Make every rank's parameters and buffers rank ``src``'s, bit for bit (their bytes, viewed as int8 — a dtype NCCL
    and HCCL broadcast, unlike uint8 on HCCL — in buckets of at most 256 MiB), as ``DistributedDataParallel`` does when
    it wraps a model. Once per model (a collective: every rank calls it); nothing in a world of one."""
    if dist_rank_and_world()[1] == 1 or getattr(model, "_fcp_states_broadcast", False):
        return
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.device.type != "meta" and t.numel()]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    with torch.no_grad():
        for group in by_device.values():
            bucket, size = [], 0
            for t in group:
                bucket.append(t)
                size += t.numel() * t.element_size()
                if size >= _BUCKET_BYTES:
                    _broadcast_bucket(bucket, src)
                    bucket, size = [], 0
            if bucket:
                _broadcast_bucket(bucket, src)
    model._fcp_states_broadcast = True


def _broadcast_bucket(tensors: list[torch.Tensor], src: int) -> None:
    flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.int8) for t in tensors])
    dist.broadcast(flat, src=src)
    offset = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        t.copy_(flat[offset:offset + n].clone().view(t.dtype).view(t.shape))
        offset += n


_CHECKED: "weakref.WeakSet" = weakref.WeakSet()  # optimizers whose parameters were checked
_HOOK: list = []


def mark_replaced(old: list[torch.Tensor], model: nn.Module) -> None:
    """Mark the parameters of ``old`` that ``model`` no longer holds (``fully_shard`` replaced them) and install, once,
    the optimizer step pre-hook that refuses an optimizer holding one (module docstring)."""
    kept = {id(p) for p in model.parameters()}
    for p in old:
        if id(p) not in kept:
            p._fcp_replaced = True
    import torch.optim.optimizer as optimizer_module

    register = getattr(optimizer_module, "register_optimizer_step_pre_hook", None)
    if not _HOOK and register is not None:
        _HOOK.append(register(_check_optimizer))


def _check_optimizer(opt, args, kwargs) -> None:
    if opt in _CHECKED:
        return None
    if any(getattr(p, "_fcp_replaced", False) for g in opt.param_groups for p in g["params"]):
        raise ValueError(f"{type(opt).__name__} holds parameters that make_reducer('fsdp2', model) replaced with "
                         "sharded ones: it was built before make_reducer, so they get no gradient and it would train "
                         "nothing; build the optimizer after make_reducer "
                         "(opt = torch.optim.AdamW(model.parameters()))")
    _CHECKED.add(opt)
    return None
