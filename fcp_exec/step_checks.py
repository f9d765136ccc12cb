"""What :func:`fcp_exec.step.train_step` and :func:`~fcp_exec.step.eval_step` check on the way: the stream of
micro-batches (:func:`next_micro_batch`; an epoch that has no global batch left is :class:`EpochEnded`), the loss a
``loss_fn`` returns (:func:`check_loss`), and an enclosing ``torch.autocast`` (:func:`autocast_active`: its cache of
weight casts is cleared between micro-batches)."""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch
from torch import nn

from fcp_exec.grads import add_back, set_aside

__all__ = ["EpochEnded", "LOSS_CONTRACT", "autocast_active", "check_loss", "in_step", "inside_step",
           "next_micro_batch"]

NEEDED = ("ranks", "micro_batch", "num_micro_batches", "num_tokens_global")  # what a step reads (the model: the rest)
LOSS_CONTRACT = "loss_fn(model, batch) -> scalar tensor"


class EpochEnded(RuntimeError):
    """The loader had no global batch left when a step began: its epoch ended (a ``RuntimeError``, as every other
    stream error of a step). A loop across epochs catches it, or counts ``sampler.num_global_batches()`` steps::

        sampler.set_epoch(epoch); batches = iter(loader)
    """


def next_micro_batch(it: Iterator[dict], m: int, num_mb: int) -> dict:
    """Micro-batch ``m`` of the global batch from ``it``; a clear error when it ends early or is out of place."""
    try:
        batch = next(it)
    except StopIteration:
        if m == 0:
            raise EpochEnded("the loader has no global batch left: its epoch ended. For the next epoch call "
                             "sampler.set_epoch(epoch) and batches = iter(loader) (FCPSampler.num_global_batches() "
                             "steps per epoch; fcp_exec.step.EpochEnded, a RuntimeError, can be caught)") from None
        raise RuntimeError(f"the micro-batches ended after {m} of {num_mb}; pass one whole global batch") from None
    missing = [k for k in NEEDED if k not in batch] if isinstance(batch, dict) else None
    if missing is None or missing:
        raise ValueError(f"micro-batch {m} is not an FCPCollator batch (a dict with {', '.join(NEEDED)}): "
                         + (f"got a {type(batch).__name__}" if missing is None else f"it lacks {', '.join(missing)}"))
    if int(batch["micro_batch"]) != m:
        if m > 0 and int(batch["micro_batch"]) == 0:  # the loader moved on to the next global batch
            raise RuntimeError(f"micro-batch {m} of {num_mb} never came: the loader went on with micro-batch 0 of the "
                               "next global batch, so its epoch ended early (a DataLoader ends an epoch at a "
                               "StopIteration raised by its dataset, collate_fn or batch sampler)")
        raise RuntimeError(f"expected micro-batch {m} of the global batch, got {batch['micro_batch']}; "
                           "start train_step at a global-batch boundary")
    return batch


def check_loss(loss, grads: bool) -> None:
    """A clear error unless ``loss`` is what a step needs: a 0-d floating-point tensor (with ``grads``: one with a
    gradient), this rank's share of the global-batch mean loss."""
    if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point():
        if grads and not loss.requires_grad:
            raise ValueError(f"{LOSS_CONTRACT}: the loss has no gradient (computed under torch.no_grad(), detached, or "
                             "no parameter requires grad); return the loss the model's forward computed")
        return
    if isinstance(loss, torch.Tensor):
        got = f"a {loss.dtype} tensor of shape {tuple(loss.shape)}"
        hint = " (reduce it to the sum over this rank's tokens / batch['num_tokens_global'])"
    elif isinstance(loss, (int, float)):
        got, hint = f"a Python {type(loss).__name__}", " (a number has no gradient: return the tensor, not .item())"
    else:
        got = f"a {type(loss).__name__}"
        hint = (" (the model's output: return fcp_exec.integrations.hf.model_loss(model, out, batch), or use "
                "fcp_loss)" if hasattr(loss, "logits") else "")
    raise TypeError(f"{LOSS_CONTRACT}: the loss must be a 0-d floating-point tensor, this rank's share of the global-"
                    f"batch mean (its label-token loss sum / batch['num_tokens_global']); loss_fn returned {got}{hint}")


def autocast_active(model: nn.Module) -> bool:
    """True inside an enabled ``torch.autocast`` for the CPU or the model's device. Its weight-cast cache lives for the
    whole region: a later micro-batch would reuse casts of the first one's (FSDP2's re-gathered) parameters — wrong
    gradients — so a step clears it before and after every micro-batch (``torch.clear_autocast_cache()``)."""
    dev = next(model.parameters()).device.type
    try:
        return any(torch.is_autocast_enabled(d) for d in {"cpu", dev})
    except TypeError:  # torch before 2.4: no device argument
        return torch.is_autocast_enabled() or torch.is_autocast_cpu_enabled()


_IN_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar("fcp_in_step", default=False)


@contextlib.contextmanager
def in_step(model: nn.Module, reducer=None):
    """The body of a step: :func:`inside_step` is True, and (with a ``reducer`` that sets them aside) the gradients
    present at entry are out of ``.grad`` until the exit adds them back (:mod:`fcp_exec.grads`)."""
    kept = set_aside(model, reducer) if reducer is not None else []
    token = _IN_STEP.set(True)
    try:
        yield
    finally:
        _IN_STEP.reset(token)
        add_back(kept)


def inside_step() -> bool:
    """True while a ``train_step`` / ``eval_step`` runs its micro-batches (a model's call checks refuse, not warn)."""
    return _IN_STEP.get()
