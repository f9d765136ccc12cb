"""The user errors of the Hugging Face adapter (:mod:`fcp_exec.integrations.hf`) named where they are made, instead of
a wrong loss or an error from deep inside transformers:

* :func:`refuse_wrapped` — ``apply_fcp`` on a model already wrapped (DDP, FSDP1, a DeepSpeed engine).
* :func:`check_model_and_batch` — ``(model, batch)`` swapped, or something else in their place.
* :func:`check_call` — a forward pre-hook ``apply_fcp`` installs: the model called with an ``FCPCollator`` batch as it
  is (``model(**batch)``), or with HF ``labels=`` alone (HF would shift the collator's already-shifted labels again
  and average over this rank's tokens: a wrong loss). The latter is an error inside ``train_step`` / ``eval_step``
  and a warning elsewhere.
"""

from __future__ import annotations

import warnings

from torch import nn

from fcp_exec.step_checks import LOSS_CONTRACT, inside_step

__all__ = ["check_call", "check_model_and_batch", "refuse_wrapped"]

_COLLATOR_KEYS = ("cu_seqlens", "ranks", "num_tokens_global", "micro_batch")  # an FCPCollator batch, never a model's
_LABELS = ("the model was called with labels= but without shift_labels= and num_items_in_batch=: the collator's labels "
           "are already shifted (Hugging Face would shift them again) and the loss is the sum over this rank's tokens "
           "/ the global batch's label count, not this rank's mean; pass **fcp_exec.integrations.hf.hf_loss_kwargs("
           "batch) instead of labels=, or use fcp_loss")


def refuse_wrapped(model) -> None:
    """A clear error for ``apply_fcp`` on a DDP / FSDP1 / DeepSpeed wrapper (it changes the model inside; call it
    first)."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.nn.parallel import DistributedDataParallel

    from fcp_exec.reducers import _is_deepspeed_engine

    inner = getattr(model, "_orig_mod", model)
    what = None
    if isinstance(inner, DistributedDataParallel):
        what = "DistributedDataParallel"
    elif isinstance(inner, nn.Module) and _is_deepspeed_engine(inner):
        what = "a DeepSpeed engine"
    elif isinstance(inner, FullyShardedDataParallel):
        what = "FullyShardedDataParallel (FSDP1)"
    if what is not None:
        raise ValueError(f"apply_fcp got a model already wrapped in {what}: call apply_fcp(model) before make_reducer "
                         "/ DDP / FSDP (and before deepspeed.initialize or accelerator.prepare), e.g. "
                         "model, reducer = make_reducer('ddp', apply_fcp(model))")


def check_model_and_batch(model, batch, call: str) -> None:
    """``model`` must be an ``nn.Module`` and ``batch`` a dict (an ``FCPCollator`` batch); swapped, the error says
    so."""
    if isinstance(model, nn.Module) and isinstance(batch, dict):
        return
    if isinstance(model, dict) and isinstance(batch, nn.Module):
        raise TypeError(f"{call} got the batch (a dict) as the model and the model as the batch: the arguments are "
                        f"swapped (train_step calls {LOSS_CONTRACT}, the model first)")
    raise TypeError(f"{call}: the model must be an nn.Module and the batch a dict (an FCPCollator batch), got "
                    f"{type(model).__name__} and {type(batch).__name__}")


def check_call(module: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook (``with_kwargs``) of a model ``apply_fcp`` prepared (module docstring)."""
    if "fcp_context" not in kwargs:
        if any(k in kwargs for k in _COLLATOR_KEYS):
            raise ValueError("the model was called with an FCPCollator batch as it is (model(**batch)): call "
                             "model(**fcp_exec.integrations.hf.batch_inputs(batch, model)), or use fcp_loss as "
                             "train_step's loss_fn")
        return None
    if kwargs.get("labels") is not None and (kwargs.get("shift_labels") is None
                                             or kwargs.get("num_items_in_batch") is None):
        if inside_step():
            raise ValueError(_LABELS)
        warnings.warn(_LABELS, stacklevel=3)
    return None
