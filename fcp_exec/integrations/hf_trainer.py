"""``FCPTrainer``: a ``transformers.Trainer`` whose optimizer step trains one FCP global batch.

For users whose trainer *is* the Hugging Face ``Trainer`` (TRL's ``SFTTrainer`` and most fine-tuning recipes derive
from it): replace ``Trainer`` by ``FCPTrainer``, give it an fcp length index as ``train_dataset`` and a cost model,
and launch with ``torchrun`` as before::

    from fcp_data import CostModel, IndexedDataset
    from fcp_exec.integrations.hf_trainer import FCPTrainer

    trainer = FCPTrainer(model=model, args=TrainingArguments(..., per_device_train_batch_size=4),
                         train_dataset=IndexedDataset("my-index"), cost_model=CostModel.load("cost.json"))
    trainer.train()

What changes inside the stock loop (everything else — optimizer and its weight-decay groups, learning-rate
schedule, gradient clipping, logging, callbacks, ``save_steps`` checkpoints, ``resume_from_checkpoint`` — is the
Trainer's own):

* **Data.** :meth:`FCPTrainer.get_train_dataloader` builds ``FCPSampler`` → ``FCPDataset`` → the model's collator
  (``hf_collator`` for Qwen-VL) in a ``DataLoader`` (``dataloader_num_workers``), and groups its micro-batches
  per global batch (:class:`GlobalBatchLoader`): one Trainer step is one global batch of ``global_batch_size``
  sequences (default ``per_device_train_batch_size`` × world size × ``gradient_accumulation_steps``, the number the
  stock Trainer would put in one optimizer step), split into as many micro-batches as the planner needs. The
  sampler's seed is ``args.data_seed``, else ``args.seed``. A dataset that is not an fcp index may be padded
  (``attention_mask`` zeros: stripped when read, counted without them) and, for Qwen-VL, hold its samples as the
  processor returns them (images and videos apart, converted when read; placeholder runs read once, for the exact
  loss denominator): :mod:`~fcp_exec.integrations.hf_samples`.
* **Step.** :meth:`FCPTrainer.training_step` runs :func:`fcp_exec.step.train_step` over the global batch: ring
  attention inside each micro-batch's CP group, idle ranks on a zero-weighted dummy, gradients synchronised once,
  in the last micro-batch's backward, as a SUM (the loss is Σ CE / the global batch's label tokens, so the sum is
  the single-process mean). The model Accelerate wrapped decides how: DDP (a SUM comm hook replaces its mean),
  FSDP2 (``fsdp=True``: divide factor 1 on every sharded module), FSDP1 (``fsdp_config={"version": 1}``: a SUM comm
  hook), a DeepSpeed engine (``deepspeed=`` a ZeRO 0–3 config: the backward through the engine, which then steps), or
  none. It returns the global batch's mean loss, the same on every rank, which the Trainer logs; ``fcp_steps`` keeps
  the latest steps' :class:`~fcp_exec.step.StepResult` (loss, denominator, CP groups, idle micro-batches, skips).
* **Samples that fail to read** (or that the model cannot take) are recorded and skipped where they fail, and left
  out of the later epochs (:func:`fcp_exec.skips.leave_out_later`, as ``fcp train`` does) as far as that keeps the
  number of global batches per epoch — the Trainer's steps per epoch, fixed for ``max_steps`` and for where a
  resumed run starts (without ``drop_last``: fewer than the last global batch holds); the rest are read and skipped
  again, with a warning. The exclusions travel in each checkpoint (``fcp_sampler.json``).
* **Resume.** ``trainer.train(resume_from_checkpoint=...)`` continues at the checkpoint's global batch by moving the
  sampler there (no batch is read to skip it); with the same ``global_batch_size`` the sampler of another world size
  plans the same global batches, so a checkpoint resumes on another number of ranks. Under FSDP1 the fresh optimizer
  gets its state before Accelerate's sharded load (:func:`~fcp_exec.checkpoint.fsdp1_optimizer_template`).
* **Evaluation.** :meth:`FCPTrainer.evaluate` runs :func:`fcp_exec.step.eval_step` over the evaluation index
  (its own sampler, that seed + 1) and reports ``eval_loss``: the mean over all evaluated label tokens, and
  ``compute_metrics`` of the whole-document predictions; :meth:`FCPTrainer.predict` returns them
  (:mod:`~fcp_exec.integrations.hf_predict`).
* **Gradient accumulation.** ``gradient_accumulation_steps`` = G folds into the global batch: one optimizer step
  trains ``per_device_train_batch_size`` × world size × G sequences (what the stock Trainer accumulates into one
  step), planned as one FCP global batch and split into as many micro-batches as memory needs, the loss the mean
  over all its label tokens (the stock Trainer's with ``num_items_in_batch``). The Trainer itself runs with
  G = 1 on a copy of the arguments (``trainer.args``; the caller's object is not changed), so its step counts,
  schedule, logging and checkpoints are per optimizer step as before; ``fcp_gradient_accumulation_steps`` keeps G.

``ddp_find_unused_parameters`` None becomes False: every rank runs every micro-batch through the whole model.

Refused with one clear error (not silently changed): ``gradient_accumulation_steps`` > 1 together with an explicit
``global_batch_size`` (they say the same thing twice), ``model_init``, ``batch_eval_metrics``,
``label_smoothing_factor``, ``compute_loss_func``, ``data_collator`` (FCP collates: labels to mask go in the samples),
``include_for_metrics`` and any ``compute_loss`` override but TRL ``SFTTrainer``'s plain NLL (``class
FCPSFTTrainer(FCPTrainer, SFTTrainer)``: TRL prepares the data, FCP trains). ``dataloader_drop_last`` is the training
sampler's ``drop_last``; ``evaluate("name")`` evaluates that dataset of a dict ``eval_dataset``.
``fp16=True`` trains through Accelerate's loss scaler (every micro-batch's backward scaled, overflowing steps skipped
on every rank alike); on a CPU Accelerate has no fp16 and trains in fp32, as the stock Trainer does there.
Tested on CPU/gloo (``test_hf_trainer.py``): DDP, one process, bf16 autocast, fp16 with a loss scaler, LoRA, TRL SFT,
datasets.Dataset, DeepSpeed ZeRO-2/-3, Accelerate's FSDP2 (sharded checkpoints, bf16 policy) and FSDP1 (float32,
sharded checkpoints; CPU gate lifted by the test: Accelerate keeps DDP on a CPU), InternVL, LLaVA-OneVision.
"""

from __future__ import annotations

import collections
import os
import warnings
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from fcp_exec.devices import settle_collectives
from fcp_exec.integrations.hf_trainer_args import (check_fcp_kwargs, check_loss, check_trainer_kwargs, eval_by_name,
                                                   given_lengths, run_args)
from fcp_exec.integrations.hf_trainer_data import (GlobalBatch, GlobalBatchLoader, _has_labels, _is_indexed,
                                                   load_skip_exclusions, save_skip_exclusions,
                                                   count_lengths, input_tokens)
from fcp_exec.integrations.hf import apply_fcp, fcp_loss, model_type_of, unwrap
from fcp_exec.integrations.hf_models import MLLM_MODEL_TYPES
from fcp_exec.skips import leave_out_later
from fcp_exec.compat import resumable_trainer, torch_release
from fcp_exec.checkpoint import fsdp1_optimizer_template
from fcp_exec.step import StepResult, reducer_for, train_step

try:
    from transformers import Trainer, TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint
except ImportError as e:  # pragma: no cover - the hf extra is not installed
    raise ImportError("fcp_exec.integrations.hf_trainer needs transformers and accelerate: "
                      "pip install 'fcp[hf]'") from e

__all__ = ["FCPTrainer", "GlobalBatch", "GlobalBatchLoader", "count_lengths"]


class _SkipExclusionsCallback(TrainerCallback):
    """Writes the training sampler's later exclusions into each checkpoint the Trainer saves (where the Trainer
    writes its own files: rank 0, or each node's first rank with ``save_on_each_node``)."""

    def __init__(self, trainer: "FCPTrainer") -> None:
        self.trainer = trainer

    def on_save(self, args, state, control, **kwargs):
        sampler = self.trainer._train_sampler
        if sampler is not None and args.should_save:
            save_skip_exclusions(sampler, os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"))


class FCPTrainer(Trainer):
    """``transformers.Trainer`` training on FCP global batches (module docstring).

    ``train_dataset`` / ``eval_dataset``: an ``fcp_data.IndexedDataset`` (its index gives the sampler the lengths
    and, for Qwen-VL, the visual layout), or any map-style dataset of tokenized samples (dicts with ``input_ids``)
    with its ``train_lengths`` / ``eval_lengths`` (token count per sample; without them :func:`count_lengths` reads
    every sample once). ``cost_model``: an ``fcp_data.CostModel`` (required; ``fcp profile``'s fit, or this model's
    ``CostModel.preset(model.config, "h100")``). ``global_batch_size``: sequences per optimizer step (default ``per_device_train_batch_size`` × world size × ``gradient_accumulation_steps``).
    ``sampler_kwargs``: more ``FCPSampler`` options (``on_overlong``, ``solver``, ``micro_batches``, ``visual_layout``
    ...); ``collator_kwargs``: more collator options (``sample_labels``, training on the samples' own ``labels``,
    default the index's ``has_labels``, else whether the first sample has ``labels``); ``dataset_kwargs``: ``FCPDataset`` options
    (``on_error``, ``errors_path``); ``pad_token_id``: default the dataset's, else the model config's (else 0).
    ``eval_batches``: evaluate this many global batches (default: the whole evaluation set). ``history``: how many
    of the latest steps' results ``fcp_steps`` keeps (default 10,000; a long run does not grow without bound). Other
    arguments are the Trainer's."""

    def __init__(self, model: nn.Module | None = None, args: Any = None, *, cost_model: Any = None,
                 global_batch_size: int | None = None, train_lengths: Any = None, eval_lengths: Any = None,
                 sampler_kwargs: dict | None = None, collator_kwargs: dict | None = None,
                 dataset_kwargs: dict | None = None, pad_token_id: int | None = None, eval_batches: int | None = None,
                 history: int = 10_000, **kwargs: Any) -> None:
        check_trainer_kwargs(model, args, cost_model, kwargs)
        check_loss(type(self), args, kwargs)
        check_fcp_kwargs(model, global_batch_size=global_batch_size, sampler_kwargs=sampler_kwargs, history=history,
                         collator_kwargs=collator_kwargs, dataset_kwargs=dataset_kwargs, pad_token_id=pad_token_id,
                         eval_batches=eval_batches)
        if getattr(model, "_fcp_state", None) is None:
            apply_fcp(model)
        args, self.fcp_gradient_accumulation_steps = run_args(args, global_batch_size, model)
        super().__init__(model=model, args=args, **kwargs)
        self._check_fcp_args()
        world, per_device = max(int(self.args.world_size), 1), int(self.args.per_device_train_batch_size)
        self.fcp_global_batch_size = int(global_batch_size or per_device * world * self.fcp_gradient_accumulation_steps)
        self.fcp_cost_model, self.fcp_eval_batches = cost_model, eval_batches
        self._lengths = {"train": train_lengths, "eval": eval_lengths}
        self._sampler_kwargs, self._collator_kwargs = dict(sampler_kwargs or {}), dict(collator_kwargs or {})
        self._dataset_kwargs, self._pad = dict(dataset_kwargs or {}), pad_token_id
        self._reducers: dict[int, Any] = {}
        # id(dataset) -> (dataset, its counted token lengths; None for a checked fcp index)
        self._counted: dict[int, tuple[Any, np.ndarray | None]] = {}
        self._layouts: dict[int, tuple[Any, Any]] = {}  # id(dataset) -> (dataset, its placeholder runs)
        self._pads, self._in_train = {"train": 0, "eval": 0}, False
        self.fcp_steps: collections.deque[StepResult] = collections.deque(maxlen=history)
        self._unlogged: list[StepResult] = []  # training steps since the last log line
        self._train_sampler, self._resume_dir = None, None  # where skipped samples are left out of later epochs,
        self.add_callback(_SkipExclusionsCallback(self))  # and the checkpoints that carry that to a resumed run

    def _check_fcp_args(self) -> None:
        a = self.args
        if a.fsdp and not self.is_fsdp_enabled:  # Accelerate enables FSDP on GPU/NPU/XPU/... processes only
            warnings.warn(f"FCPTrainer: fsdp was requested but Accelerate did not enable it for "
                          f"{self.accelerator.state.distributed_type} (it does on accelerators, not on CPU): the model "
                          "trains with DistributedDataParallel, unsharded", stacklevel=3)
        if self.is_fsdp_enabled and getattr(self.accelerator.state.fsdp_plugin, "fsdp_version", 1) == 2 and \
                torch_release() < (2, 8):
            warnings.warn(f"FCPTrainer: FSDP2 through Accelerate on torch {torch.__version__} is not verified: on the "
                          "CPU with torch 2.7.1 it trained off the stock Trainer (fp16 gradient norms 45 % off); fcp's "
                          "own FSDP2 loop (train_step) was exact there. torch>=2.8 is verified", stacklevel=3)

    # ------------------------------------------------------------------------------------------------- data
    def _pad_id(self, data: Any) -> int:
        if self._pad is not None:
            return int(self._pad)
        pad = getattr(data, "pad_token_id", None)
        return int((self._text_config().pad_token_id if pad is None else pad) or 0)

    def _text_config(self) -> Any:
        """The language model's config (a VL model's ``text_config``): its vocabulary and pad id."""
        cfg = unwrap(self.model).config
        return getattr(cfg, "text_config", cfg)

    def _fcp_loader(self, data: Any, which: str, seed: int) -> GlobalBatchLoader:
        from fcp_data import FCPCollator, FCPDataset

        lengths = self._lengths_of(data, which)
        ckw, skw = dict(self._collator_kwargs), dict(self._sampler_kwargs)
        if which != "train":  # sampler_kwargs["exclude"]: indices into the training data
            skw.pop("exclude", None)
        else:  # TrainingArguments' dataloader_drop_last: the sampler's drop_last (the last, smaller global batch)
            skw.setdefault("drop_last", bool(self.args.dataloader_drop_last))
        ckw.setdefault("sample_labels", _has_labels(data))
        ckw.setdefault("pad_token_id", self._pad_id(data))
        self._pads[which] = int(ckw["pad_token_id"])  # the idle ranks' dummy documents
        inner, indexed = unwrap(self.model), _is_indexed(data)
        vl = model_type_of(inner) in MLLM_MODEL_TYPES
        if vl and not indexed and "visual_layout" not in skw and not ckw["sample_labels"]:
            skw["visual_layout"] = self._layout_of(data)
        if vl:
            from fcp_exec.integrations.hf_positions import hf_collator

            collate = hf_collator(inner.config, **ckw)
        else:
            collate = FCPCollator(**ckw)
        if not indexed:  # padding stripped; a Qwen-VL processor's samples put into FCP's format (when read)
            from fcp_exec.integrations.hf_samples import HFSamples

            data = HFSamples(data, inner.config if vl else None)
        sampler = self._sampler(data if lengths is None else lengths, seed, skw)
        from fcp_exec.launch import dataloader_context

        workers, vocab = int(self.args.dataloader_num_workers), int(self._text_config().vocab_size)
        dataset = FCPDataset(data, **{"vocab_size": vocab, **self._dataset_kwargs})  # ids past it: a skipped sample
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                            num_workers=workers, persistent_workers=workers > 0 and self.args.dataloader_persistent_workers,
                            pin_memory=bool(self.args.dataloader_pin_memory) and torch.cuda.is_available(),
                            multiprocessing_context=dataloader_context(workers, dataset, collate))
        return GlobalBatchLoader(loader, sampler)

    def _sampler(self, source: Any, seed: int, sampler_kwargs: dict) -> Any:
        from fcp_data import FCPSampler

        try:
            return FCPSampler(source, cost_model=self.fcp_cost_model, global_batch_size=self.fcp_global_batch_size,
                              seed=seed, **sampler_kwargs)
        except ValueError as e:  # the sampler names its own options: say where they go here
            if "on_overlong" not in str(e):
                raise
            raise ValueError(f"FCPTrainer: {e} (FCPTrainer(sampler_kwargs={{'on_overlong': 'truncate'}}))") from None

    def _layout_of(self, data: Any) -> Any:
        """The placeholder runs of a Qwen-VL dataset that is not an fcp index (its samples' ``input_ids``, read once
        per dataset), for the sampler's exact loss denominator with visual labels masked."""
        from fcp_data.visual_layout import SpanVisualLayout
        from fcp_exec.integrations.hf_samples import placeholder_spans

        held = self._layouts.get(id(data))
        if held is None or held[0] is not data:
            cfg = unwrap(self.model).config
            spans = placeholder_spans(data, tuple(int(t) for t in (cfg.image_token_id, getattr(cfg, "video_token_id", None))
                                                  if t is not None))
            held = self._layouts[id(data)] = (data, SpanVisualLayout(spans))
        return held[1]

    def _lengths_of(self, data: Any, which: str) -> np.ndarray | None:
        """The token counts the sampler plans ``data`` with: ``{which}_lengths`` for the dataset given with them, None
        for an fcp index (the sampler reads it; checked once against the model: vocabulary, spec, special ids,
        patches), else counted once per dataset (:func:`count_lengths`)."""
        owner = self.train_dataset if which == "train" else self.eval_dataset
        if self._lengths[which] is not None and data is owner:
            return given_lengths(self._lengths[which], data, which)
        if _is_indexed(data):
            if self._counted.get(id(data), (None,))[0] is not data:  # once per index: the model can read it
                from fcp_exec.train_data import check_index_fits

                check_index_fits(unwrap(self.model).config, data, f"the {which} index {data.index.path}")
                self._counted[id(data)] = (data, None)
            return None
        held = self._counted.get(id(data))
        if held is None or held[0] is not data:
            held = self._counted[id(data)] = (data, count_lengths(data, which))
        return held[1]

    def get_train_dataloader(self) -> GlobalBatchLoader:
        if self.train_dataset is None:
            raise ValueError("FCPTrainer: training requires a train_dataset")
        loader = self._fcp_loader(self.train_dataset, "train", self._data_seed())
        self._train_sampler = loader.sampler
        load_skip_exclusions(loader.sampler, self._resume_dir)  # a resumed run leaves out what the first one did
        return loader

    def _data_seed(self) -> int:
        """The Trainer's seed for data samplers: ``data_seed`` when set, else ``seed``."""
        seed = getattr(self.args, "data_seed", None)
        return int(self.args.seed if seed is None else seed)

    def train(self, *args: Any, **kwargs: Any):
        """The Trainer's ``train``; then, on gloo, :func:`~fcp_exec.devices.settle_collectives` (dropping the trainer,
        whose DDP model holds the process group, cannot deadlock the rank at exit)."""
        self._in_train = True
        resume = kwargs.get("resume_from_checkpoint", args[0] if args else None)
        if resume is True:  # as the Trainer resolves it (its own error when there is none)
            resume = get_last_checkpoint(self.args.output_dir) if os.path.isdir(self.args.output_dir) else None
        self._resume_dir = resume or None
        try:
            with resumable_trainer(self):  # transformers < 5.24 resumes through skip_first_batches
                out = super().train(*args, **kwargs)
        finally:
            self._in_train = False
        settle_collectives()
        return out

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is not None and self.is_fsdp_enabled:  # Accelerate's FSDP1 sharded load needs a full template
            fsdp1_optimizer_template(self.model_wrapped, self.optimizer)
        super()._load_optimizer_and_scheduler(checkpoint)

    def get_resumed_dataloader(self, dataloader: GlobalBatchLoader, num_batches: int) -> GlobalBatchLoader:
        """Resume at the checkpoint's global batch: the sampler moves there (nothing is read to skip batches)."""
        per_epoch = max(len(dataloader), 1)
        return dataloader.skip_to(int(self.state.global_step) // per_epoch, num_batches)

    # ------------------------------------------------------------------------------------------------- step
    def _reducer(self, model: nn.Module):
        """The fcp reducer for the model Accelerate prepared (:func:`fcp_exec.step.reducer_for`; one per wrapped
        model: DDP's comm hook is set once)."""
        key = id(model)
        if key not in self._reducers:
            self._reducers[key] = reducer_for(model)
        return self._reducers[key]

    def training_step(self, model: nn.Module, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """Every micro-batch of one global batch (:func:`fcp_exec.step.train_step`); the global mean loss."""
        if not isinstance(inputs, GlobalBatch):
            raise TypeError(f"FCPTrainer.training_step takes a GlobalBatch from its own loader, got "
                            f"{type(inputs).__name__}; do not override get_train_dataloader with a plain loader")
        model.train()
        with self.compute_loss_context_manager():
            res = train_step(model, inputs, fcp_loss, self._reducer(model), pad_token_id=self._pads["train"],
                             grad_scaler=self.accelerator.scaler)  # fp16: Accelerate's optimizer steps through it
        if self.is_deepspeed_enabled:  # the engine steps itself (clipping, optimizer, scheduler), as in its backward
            model.step()  # under Accelerate; the Trainer's optimizer.step() is then a no-op
        if self._train_sampler is not None:  # what any rank skipped is not read in later epochs, unless that would
            leave_out_later(self._train_sampler, res, same_num_global_batches=True)  # change the steps per epoch
        self.fcp_steps.append(res)
        self._unlogged.append(res)
        return torch.tensor(res.loss, device=self.args.device)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's log line, with what FCP did in the training steps since the previous one (the same on every
        rank): ``fcp_label_tokens`` (the loss denominators, summed) and ``fcp_micro_batches``."""
        if "loss" in logs and self._unlogged:
            logs = {**logs, "fcp_label_tokens": sum(r.num_tokens for r in self._unlogged),
                    "fcp_micro_batches": sum(len(r.groups) for r in self._unlogged)}
            self._unlogged.clear()
        super().log(logs, *args, **kwargs)

    def floating_point_ops(self, inputs: Any) -> int:
        if isinstance(inputs, GlobalBatch):
            return sum(super(FCPTrainer, self).floating_point_ops(mb) for mb in inputs if mb.get("ranks"))
        return super().floating_point_ops(inputs)

    def _track_num_input_tokens(self, inputs: Any) -> None:
        mode = self.args.include_num_input_tokens_seen
        if mode in ("no", False) or not isinstance(inputs, GlobalBatch):
            return
        local = input_tokens(inputs, mode)
        tokens = torch.as_tensor(local, device=self.args.device, dtype=torch.int64)
        self.state.num_input_tokens_seen += self.accelerator.gather(tokens).sum().item()

    # ------------------------------------------------------------------------------------------- evaluation
    def evaluate(self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval") -> dict:
        """``{prefix}_loss``: the mean loss over every label token of the evaluated global batches (each one
        :func:`fcp_exec.step.eval_step`: forwards only, every rank in lock-step), ``{prefix}_num_tokens``, and the
        ``compute_metrics`` of the whole-document predictions (:mod:`~fcp_exec.integrations.hf_predict`) when given. A
        dict of datasets (the Trainer's convention) is evaluated one by one, prefixed ``{prefix}_{name}``."""
        data = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(eval_dataset, str):  # the stock API: the name of one dataset of a dict eval_dataset
            data, metric_key_prefix = eval_by_name(self.eval_dataset, eval_dataset), f"{metric_key_prefix}_{eval_dataset}"
        if data is None:
            raise ValueError("FCPTrainer: evaluation requires an eval_dataset")
        if isinstance(data, dict):
            metrics: dict = {}
            for name, one in data.items():
                metrics.update(self.evaluate(one, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        metrics = self._fcp_evaluate(data, metric_key_prefix,  # prediction_loss_only: the loss, as the stock Trainer
                                     self.compute_metrics is not None and not self.args.prediction_loss_only)[0]
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_dataset: Any, ignore_keys: Any = None, metric_key_prefix: str = "test"):
        """The stock ``PredictionOutput``: every sample's logits (or ``preprocess_logits_for_metrics`` of them) and
        labels, in dataset order, padded with -100 (:mod:`~fcp_exec.integrations.hf_predict`), the loss and the
        ``compute_metrics`` in ``metrics``."""
        from transformers.trainer_utils import PredictionOutput

        metrics, preds, labels = self._fcp_evaluate(test_dataset, metric_key_prefix, not self.args.prediction_loss_only)
        return PredictionOutput(predictions=preds, label_ids=labels, metrics=metrics)

    def _fcp_evaluate(self, data: Any, prefix: str, collect: bool) -> tuple[dict, Any, Any]:
        from fcp_exec.integrations.hf_predict import PredictionCollector, evaluate_dataset, metrics_of

        collector = PredictionCollector(self.preprocess_logits_for_metrics) if collect else None
        metrics = evaluate_dataset(self, data, prefix, collector)
        preds = labels = None
        if collector is not None:
            preds, labels, _ = collector.gather()
            if self.compute_metrics is not None:
                metrics.update(metrics_of(self.compute_metrics, preds, labels, prefix))
        if not self._in_train:  # during train() (eval_strategy) the group lives on: train() settles at its end
            settle_collectives()
        return metrics, preds, labels
