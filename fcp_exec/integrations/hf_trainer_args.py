"""FCPTrainer's own arguments and the Trainer arguments it cannot honour, checked in its constructor: one clear
``ValueError``/``TypeError`` each, before Accelerate or a DataLoader starts
(:class:`~fcp_exec.integrations.hf_trainer.FCPTrainer`)."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Mapping
from typing import Any

from transformers import Trainer

__all__ = ["check_fcp_kwargs", "check_loss", "run_args"]

_MAX_HISTORY = 10**9


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_fcp_kwargs(model: Any, *, global_batch_size: Any, sampler_kwargs: Any, collator_kwargs: Any,
                     dataset_kwargs: Any, pad_token_id: Any, eval_batches: Any, history: Any) -> None:
    """Types and ranges of FCPTrainer's keyword arguments (found by a fuzz of each: a negative ``pad_token_id``
    was an ``IndexError`` inside the embedding at the first step, a huge one or a huge ``history`` an
    ``OverflowError``; ``global_batch_size=0`` or ``1.5``, ``eval_batches=-1`` and ``sampler_kwargs=0`` were
    silently taken; a list of options failed as "'int' object is not iterable"; a collator's ``ignore_index`` other
    than -100 ended the run at the first step)."""
    if global_batch_size is not None and not (_is_int(global_batch_size) and global_batch_size >= 1):
        raise ValueError(f"FCPTrainer: global_batch_size must be an integer >= 1 (sequences per optimizer step) or "
                         f"None, got {global_batch_size!r}")
    for name, value in (("sampler_kwargs", sampler_kwargs), ("collator_kwargs", collator_kwargs),
                        ("dataset_kwargs", dataset_kwargs)):
        if value is not None and not isinstance(value, Mapping):
            raise TypeError(f"FCPTrainer: {name} must be a dict of options or None, got {type(value).__name__}")
    owned = sorted(set(sampler_kwargs or {}) & set(_SAMPLER_OWNED))  # contradicting the world, silently
    if owned:
        raise ValueError(f"FCPTrainer: sampler_kwargs {', '.join(owned)} are FCPTrainer's own ("
                         + "; ".join(f"{k}: {_SAMPLER_OWNED[k]}" for k in owned) + ")")
    collator_pad = (collator_kwargs or {}).get("pad_token_id")
    if pad_token_id is not None and collator_pad is not None and collator_pad != pad_token_id:
        raise ValueError(f"FCPTrainer: pad_token_id={pad_token_id!r} and collator_kwargs pad_token_id={collator_pad!r}: "
                         "give it once")
    ignore = (collator_kwargs or {}).get("ignore_index", -100)
    if ignore != -100:
        raise ValueError(f"FCPTrainer: collator_kwargs ignore_index={ignore!r} is not supported: its loss, like the "
                         "Hugging Face models', ignores the labels -100 (set the samples' masked labels to -100)")
    if pad_token_id is not None:
        embeddings = getattr(model, "get_input_embeddings", lambda: None)()
        vocab = getattr(embeddings, "num_embeddings", None)
        if not _is_int(pad_token_id) or pad_token_id < 0 or (vocab is not None and pad_token_id >= vocab):
            raise ValueError(f"FCPTrainer: pad_token_id must be a token id in [0, {vocab or 'vocabulary size'}), "
                             f"got {pad_token_id!r}")
    if eval_batches is not None and not (_is_int(eval_batches) and eval_batches >= 0):
        raise ValueError(f"FCPTrainer: eval_batches must be an integer >= 0 or None (the whole set), "
                         f"got {eval_batches!r}")
    if history is not None and not (_is_int(history) and 0 <= history <= _MAX_HISTORY):
        raise ValueError(f"FCPTrainer: history must be an integer in [0, {_MAX_HISTORY}] (steps kept in fcp_steps) or "
                         f"None (all), got {history!r}")


_SAMPLER_OWNED = {"num_ranks": "the world size", "rank": "this process's rank",
                  "global_batch_size": "its global_batch_size argument", "global_batch_tokens": "global_batch_size",
                  "seed": "TrainingArguments' data_seed, else seed", "cost_model": "its cost_model argument",
                  "lengths_or_index": "the dataset, with train_lengths / eval_lengths"}


def given_lengths(lengths: Any, data: Any, which: str) -> Any:
    """``{which}_lengths`` as given, once it has one entry per sample of its dataset (fewer left the rest of the
    dataset out of training without a word; more planned samples that do not exist)."""
    if hasattr(data, "__len__") and len(lengths) != len(data):
        raise ValueError(f"FCPTrainer: {which}_lengths has {len(lengths)} entries but the {which} dataset has "
                         f"{len(data)} samples: give one token count per sample")
    return lengths


def check_trainer_kwargs(model: Any, args: Any, cost_model: Any, kwargs: dict) -> None:
    """The Trainer arguments FCPTrainer would otherwise ignore without a word, refused (each one ``ValueError``)."""
    if model is None or kwargs.get("model_init") is not None:
        raise ValueError("FCPTrainer needs model= (model_init is not supported: apply_fcp must see the model "
                         "before Accelerate wraps it)")
    if kwargs.get("compute_metrics") is not None and getattr(args, "batch_eval_metrics", False):
        raise ValueError("FCPTrainer: batch_eval_metrics=True is not supported; compute_metrics gets the whole "
                         "evaluation set's predictions at once")
    if cost_model is None:
        raise ValueError("FCPTrainer needs cost_model= (fcp_data.CostModel.load('cost.json') from `fcp profile`, "
                         "or CostModel.preset(model.config, 'h100'): this model's preset on a hardware preset)")
    if kwargs.get("compute_loss_func") is not None:
        raise ValueError("FCPTrainer: compute_loss_func= would never be called: FCPTrainer computes the loss itself "
                         "(cross-entropy over the global batch's label tokens); put per-token masking into the "
                         "samples' labels (-100) instead")
    if kwargs.get("data_collator") is not None:
        raise ValueError("FCPTrainer: data_collator= would never be called: FCPTrainer collates each rank's share of "
                         "a micro-batch itself (options: collator_kwargs=); labels a collator would mask (a "
                         "completion-only recipe) belong in the samples' labels (-100), trained with "
                         "collator_kwargs={'sample_labels': True}")
    if getattr(args, "include_for_metrics", None):
        raise ValueError(f"FCPTrainer: include_for_metrics={list(args.include_for_metrics)} is not supported: "
                         "compute_metrics gets the whole documents' predictions and labels only (EvalPrediction's "
                         "inputs and losses would stay None)")


def eval_by_name(eval_dataset: Any, name: str) -> Any:
    """``evaluate("name")``: that dataset of a dict ``eval_dataset`` (the stock Trainer's convention)."""
    if not isinstance(eval_dataset, dict) or name not in eval_dataset:
        have = f"its names: {', '.join(map(str, eval_dataset))}" if isinstance(eval_dataset, dict) else "none"
        raise ValueError(f"FCPTrainer: evaluate({name!r}) names a dataset of a dict eval_dataset; {have}")
    return eval_dataset[name]


def check_loss(cls: type, args: Any, kwargs: Mapping | None = None) -> None:
    """FCPTrainer computes the loss itself (Σ cross-entropy over the global batch's label tokens, ``fcp_loss``): a
    loss the Trainer class or its arguments would compute otherwise is refused, not silently replaced. TRL's
    ``SFTTrainer`` (mixed in: ``class FCPSFTTrainer(FCPTrainer, SFTTrainer)``) computes that same loss with
    ``loss_type="nll"`` (its labels, prompt or non-assistant tokens at -100, come from its dataset preparation)."""
    if float(getattr(args, "label_smoothing_factor", 0.0) or 0.0):
        raise ValueError("FCPTrainer: label_smoothing_factor is not supported (its loss is plain cross-entropy)")
    owner = next(c for c in cls.__mro__ if "compute_loss" in c.__dict__)
    if owner is Trainer:
        return
    if owner.__name__ == "SFTTrainer" and owner.__module__.startswith("trl."):
        if getattr(args, "packing", False):
            raise ValueError("FCPTrainer: TRL packing=True is not supported: FCP packs each micro-batch itself, "
                             "document by document; set packing=False")
        if getattr(args, "loss_type", "nll") != "nll":
            raise ValueError(f"FCPTrainer: TRL loss_type={args.loss_type!r} is not supported; use loss_type='nll'")
        _check_trl_data(kwargs or {})
        return
    raise ValueError(f"FCPTrainer: {owner.__qualname__}.compute_loss would never be called: FCPTrainer computes the "
                     "loss itself (cross-entropy over the global batch's label tokens); put per-token masking into "
                     "the samples' labels (-100) instead")


def _check_trl_data(kwargs: Mapping) -> None:
    """An fcp index given to TRL's SFTTrainer (which takes ``datasets`` rows only and would raise a TypeError of its
    own): one error saying what to do instead."""
    from fcp_exec.integrations.hf_trainer_data import _is_indexed

    evals = kwargs.get("eval_dataset")
    for data in [kwargs.get("train_dataset"), *(evals.values() if isinstance(evals, Mapping) else [evals])]:
        if _is_indexed(data):
            raise ValueError("FCPTrainer: TRL's SFTTrainer takes datasets.Dataset rows and tokenizes them itself; an "
                             "fcp index (IndexedDataset) is tokenized and labelled already: train it with FCPTrainer "
                             "alone (SFTTrainer's loss_type='nll' loss; `fcp index --assistant-only-loss` gives TRL's "
                             "assistant_only_loss labels, docs/SFT.md)")


def run_args(args: Any, global_batch_size: int | None, model: Any = None) -> tuple[Any, int]:
    """``(the arguments the Trainer runs with, G)``: a copy of ``args`` with gradient accumulation folded into the
    global batch (G = 1 inside: one Trainer step is one global batch) and ``ddp_find_unused_parameters`` None set to
    False (every rank runs every micro-batch through the whole model: idle ranks run the dummy) — True for a model
    type whose own forward leaves parameters unused (``UNUSED_PARAMETER_MODEL_TYPES``: LLaVA-OneVision)."""
    if args is None:
        return None, 1
    accumulate = int(args.gradient_accumulation_steps)
    if accumulate < 1:
        raise ValueError(f"FCPTrainer: gradient_accumulation_steps must be >= 1, got {accumulate}")
    if accumulate > 1 and global_batch_size is not None:
        raise ValueError(f"FCPTrainer: gradient_accumulation_steps={accumulate} and global_batch_size="
                         f"{global_batch_size} both set the sequences per optimizer step; give one of them "
                         "(G folds into the global batch: per_device_train_batch_size × world size × G)")
    args = copy.copy(args)
    args.gradient_accumulation_steps = 1
    if getattr(args, "ddp_find_unused_parameters", False) is None:
        from fcp_exec.integrations.hf_models import leaves_parameters_unused

        args.ddp_find_unused_parameters = leaves_parameters_unused(model)
    return args, accumulate
