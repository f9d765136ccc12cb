"""The optimizer side of a step that every trainer has: the learning-rate schedule and gradient clipping.

:func:`lr_at` is the learning rate of step ``k`` as a pure function of the step number (no scheduler state, so a run
resumed at step K continues the same schedule from a checkpoint that holds only K); :func:`clip_grad_norm` clips the
global gradient norm after :func:`fcp_exec.step.train_step` has reduced the gradients (every reducer: the all-reduce
and DDP leave the full gradient on every rank, FSDP2 leaves shards, whose norm torch combines across ranks, FSDP1
flat-parameter shards, whose squares one all-reduce sums) and
returns the norm before clipping as a float, identical on every rank. ``fcp train`` uses both
(``--lr-schedule``/``--warmup-steps``/``--min-lr``, ``--max-grad-norm``); the examples call them in their loops.
:func:`check_finite` stops a diverged run (a NaN/inf loss, or gradient norm without a loss scaler) before its
optimizer step, on every rank alike (both numbers are global), as Megatron-LM's NaN check does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from fcp_exec.compat import total_norm
from fcp_exec.names import LR_SCHEDULES

__all__ = ["LR_SCHEDULES", "TrainingDiverged", "check_finite", "lr_at", "clip_grad_norm", "set_lr"]



def lr_at(step: int, *, lr: float, steps: int, warmup_steps: int = 0, schedule: str = "constant",
          min_lr: float = 0.0) -> float:
    """Learning rate of step ``step`` (0-based) of a ``steps``-step run.

    Warm-up: steps ``0 … W−1`` (``W = warmup_steps``) ramp linearly, ``lr · (k + 1) / (W + 1)``, so step 0 already
    trains. After it, ``constant`` keeps ``lr``; ``linear`` and ``cosine`` go from ``lr`` at step ``W`` to ``min_lr``
    at the last step ``steps − 1`` (progress ``p = (k − W) / (steps − 1 − W)``, ``lr · (1 − p) + min_lr · p`` or
    ``min_lr + (lr − min_lr) · (1 + cos πp) / 2``); a step past the last stays at ``min_lr``.
    """
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
    if step < warmup_steps:
        return lr * (step + 1) / (warmup_steps + 1)
    if schedule == "constant":
        return lr
    p = min(1.0, (step - warmup_steps) / max(1, steps - 1 - warmup_steps))
    if schedule == "linear":
        return lr * (1.0 - p) + min_lr * p
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * p))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every parameter group of ``optimizer`` at learning rate ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(parameters: Iterable[torch.nn.Parameter] | torch.nn.Module, max_norm: float | None) -> float:
    """Clip the gradients to global L2 norm ``max_norm`` (``None`` or 0: only measure) and return the norm before
    clipping, a float equal on every rank. Call it after ``train_step`` (and, under a loss scaler, after
    ``scaler.unscale_(optimizer)``), before the optimizer step, on every rank (FSDP2's norm is a collective).
    A non-finite norm (an fp16 overflow the scaler will skip) is returned as it is and the gradients are left alone.
    A DeepSpeed engine is refused (its gradients are not in ``.grad``; it clips by its config's ``gradient_clipping``)."""
    from fcp_exec.reducers import _is_deepspeed_engine

    if isinstance(parameters, torch.nn.Module) and _is_deepspeed_engine(getattr(parameters, "_orig_mod", parameters)):
        raise TypeError("a DeepSpeed engine keeps its gradients in its own partitions and clips them itself: set "
                        "\"gradient_clipping\" in its config (engine.step() applies it) instead of clip_grad_norm")
    params = parameters.parameters() if isinstance(parameters, torch.nn.Module) else parameters
    grads = [p for p in params if p.grad is not None]
    group = _fsdp1_shard_group(parameters)
    if group is not None:  # FSDP1: each rank holds a shard of every flat gradient (a rank's may be empty)
        norm = _sharded_norm([p.grad for p in grads], group, next(parameters.parameters()).device)
    elif not grads:
        return 0.0
    else:
        norm = total_norm([p.grad for p in grads])  # FSDP2: a DTensor whose full tensor combines the shards
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if max_norm and math.isfinite(norm):
        coef = min(1.0, float(max_norm) / (norm + 1e-6))  # torch's clip_grad_norm_ rule
        if coef < 1.0:
            with torch.no_grad():
                for p in grads:
                    p.grad.mul_(coef)
    return norm


def _fsdp1_shard_group(module) -> object | None:
    """The process group over which an FSDP1-wrapped ``module``'s gradients are sharded, or None (not FSDP1, or
    ``NO_SHARD``: every rank holds the whole gradient)."""
    if not isinstance(module, torch.nn.Module):
        return None
    from torch.distributed.fsdp import FullyShardedDataParallel

    units = FullyShardedDataParallel.fsdp_modules(module)
    sharded = [m for m in units if "NO_SHARD" not in str(m.sharding_strategy)]
    if sharded and len(sharded) < len(units):
        raise ValueError("clip_grad_norm: an FSDP1 model with NO_SHARD units next to sharded ones; use one sharding "
                         "strategy for every unit")
    return sharded[0].process_group if sharded else None


def _sharded_norm(grads: list, group, device) -> float:
    """The global L2 norm of gradient shards that partition the gradients across ``group`` (one all-reduce)."""
    import torch.distributed as dist

    from fcp_exec.launch import collective_dtype

    sq = torch.zeros((), dtype=torch.float64, device=device)
    for g in grads:
        sq += torch.linalg.vector_norm(g.detach(), 2.0, dtype=torch.float64) ** 2
    sq = sq.to(collective_dtype(sq.dtype))  # float64 where the backend has it
    dist.all_reduce(sq, group=group)
    return float(sq.sqrt())


class TrainingDiverged(FloatingPointError):
    """A step's loss (or, without a loss scaler, its gradient norm) is NaN or infinite."""


def check_finite(step: int, loss: float, grad_norm: float, lr: float, *, loss_scaler: bool = False) -> None:
    """Raise :class:`TrainingDiverged` when the step's global loss is not finite, or its gradient norm without a
    loss scaler (with one, an infinite norm is the overflow the scaler skips). Call it before the optimizer step,
    on every rank: the weights and the last checkpoint stay those of the step before."""
    if math.isfinite(loss) and (loss_scaler or math.isfinite(grad_norm)):
        return
    raise TrainingDiverged(
        f"step {step}: the loss is {loss} and the gradient norm {grad_norm} at learning rate {lr:g}: training "
        "diverged, and this step was not applied (the weights are those of the step before); lower the learning "
        "rate, clip the gradients (--max-grad-norm) or warm up (--warmup-steps)")
