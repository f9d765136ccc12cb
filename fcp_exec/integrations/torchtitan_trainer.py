"""torchtitan's own ``Trainer`` trained with FCP: one config function, no training loop of your own.

    # my_configs.py — torchrun --nproc-per-node 8 -m torchtitan.train --module my_configs --config llama3_8b_fcp
    from torchtitan.models.llama3.config_registry import llama3_8b
    from fcp_exec.integrations.torchtitan_trainer import fcp_config

    def llama3_8b_fcp():
        return fcp_config(llama3_8b(), dataset_path="my-index", cost_model="cost.json", global_batch_size=256)

:func:`fcp_config` turns any of torchtitan's ``Trainer.Config`` into an :class:`FCPTitanTrainer.Config` whose
dataloader is an :class:`FCPTitanDataLoader` (every field stays overridable on the command line:
``--dataloader.global_batch_size 512``). What changes against torchtitan's own run:

* **Data.** :class:`FCPTitanDataLoader` is ``FCPSampler`` → ``FCPDataset`` → ``FCPCollator`` over an fcp length
  index (``fcp index``), a Megatron ``PREFIX.bin/.idx`` pair or a dataset of your own (``dataset="pkg.mod:fn"``);
  ``tokens_per_rank`` is what one rank holds per micro-batch (default ``training.seq_len``), ``training.seq_len`` the
  longest document (the RoPE length: longer ones are cut, dropped or refused, ``on_overlong``). Its state (the sampler's position after the last trained global batch
  and the samples left out after failed reads) is in torchtitan's checkpoints: a resumed run trains as the one that
  never stopped. Epochs follow one another (``infinite``, like torchtitan's text loaders).
* **Attention.** The model's ``parallelize_fn`` first runs :func:`fcp_exec.integrations.torchtitan.apply_fcp` (ring
  attention over each micro-batch's CP group as every ``GQAttention``'s inner attention); the ring travels in
  torchtitan's ``attention_masks`` argument, each token's position in its document in ``positions``.
* **The step.** :meth:`FCPTitanTrainer.train_step` runs torchtitan's own step over the global batch's planned
  micro-batches — their number is the plan's, so ``gradient_accumulation_steps`` follows it per step — after the
  ranks' plans were compared, failed reads agreed within each CP group and idle ranks given a label-free dummy
  (every rank runs every micro-batch, so FSDP2 stays in lock-step). torchtitan already normalises the loss by the
  global count of label tokens and sums gradients over ranks (FSDP2's divide factor 1): with FCP that is the
  single-process gradient of the global batch.
* **DeepSeek-V3's multi-token prediction** (``deepseek_v3_debugmodel_mtp`` and any config with ``mtp_layers`` and
  ``MTPLoss``): ``fcp_config`` gives the loader one look-ahead token per MTP module (``future_tokens``), the trainer
  hands each micro-batch's look-ahead targets to torchtitan's loss (:class:`~fcp_exec.integrations.torchtitan_mtp.
  FCPMTPLoss`: its ``mtp_scale`` and cross-entropy), and the model's MTP modules read their inputs from the collator
  (:mod:`fcp_exec.integrations.torchtitan_mtp`). gpt-oss's sliding windows (varlen or flex configs) move into the ring.
* **torch.compile.** ``--compile.enable`` is torchtitan's own: each block compiled with ``fullgraph=True``, the ring
  inside as one opaque op (``torch.ops.fcp.ring_attention``, :mod:`fcp_exec.ring_op`), activation checkpointing
  included; a new micro-batch is a new op input, not a recompilation (dynamic shapes after the first lengths).
* **Metrics.** Beside torchtitan's own (loss, gradient norm, throughput, MFU), each logged step sends
  :func:`fcp_step_metrics` — the plan's micro-batches, this rank's ring degrees, idle micro-batches, skipped samples —
  to torchtitan's TensorBoard / W&B logger.
* **Validation.** :class:`FCPTitanValidator` in torchtitan's validator slot (``--validator.enable --validator.freq
  100 --validator.steps 10``; data: ``--validator.dataloader.dataset_path``, by default the training data sampled
  with another seed): the global-batch mean loss through :func:`fcp_exec.step.eval_step`.
* **Refused with one error:** tensor, pipeline, context and expert parallelism (FCP is the context parallelism;
  every rank is data-parallel to torchtitan), CUDA graphs (the micro-batches change shape every step), ``torch.compile``
  with MoE layers' auxiliary-loss-free load balancing (eager runs keep FCP's padding and idle ranks' dummies out of its
  token counts: :mod:`fcp_exec.integrations.torchtitan_moe`), the
  ``spmd_types`` / ``full_dtensor`` backends (``fcp_config`` sets ``partial_dtensor``) and torchtitan's own
  validator (it feeds its own batches).

Tested on CPU (``tests/exec/test_torchtitan_trainer.py``, torchtitan 0.3.0, through
:func:`fcp_exec.integrations.torchtitan_cpu.torchtitan_on_cpu`): ``Trainer.train()`` of torchtitan's Qwen3 debug
model on 2 gloo processes with its own FSDP2, selective activation checkpointing, optimizer, schedule, clipping,
checkpointer and this validator equals the stock model trained in one process on the same global batches — eager,
compiled (``-m slow``), over data with failed reads (against the stock model without them), and within bf16
tolerances under torchtitan's bf16 policy; a run resumed from its checkpoint equals the run that did not stop; the
Qwen3 MoE debug model with its expert-bias balancing and ``deepseek_v3_debugmodel_mtp`` (MLA, MTP) within the
tolerances of their bfloat16 experts.
Never run on a GPU.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch

try:
    from torchtitan.components.dataloader import DataloaderExhaustedError
    from torchtitan.components.validate import BaseValidator
    from torchtitan.trainer import Trainer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"fcp_exec.integrations.torchtitan_trainer needs torchtitan's Trainer ({e}): pip install "
                      "'torchtitan>=0.3' with its dependencies (tensorboard, tyro, torchdata)") from None

from fcp_exec.integrations.torchtitan import apply_fcp, batch_inputs, model_shape
from fcp_exec.integrations.torchtitan_data import FCPTitanDataLoader, PreTokenized
from fcp_exec.integrations.torchtitan_mtp import FCPMTPLoss, trainer_loss
from fcp_exec.skips import leave_out_later
from fcp_exec.step import denominator, eval_step, next_global_batch

__all__ = ["FCPTitanDataLoader", "FCPTitanTrainer", "FCPTitanValidator", "PreTokenized", "fcp_config",
           "fcp_step_metrics"]


class FCPTitanValidator(BaseValidator):
    """torchtitan's validator slot for FCP: every ``freq`` steps (and after step 1), the global-batch mean loss over
    ``steps`` global batches of its own :class:`FCPTitanDataLoader` (``-1``: its whole epoch; FCP's global batches are
    the same on every rank, so no rank runs out early), each through :func:`fcp_exec.step.eval_step` with the
    trainer's loss, the same batches every time; logged as torchtitan's validation loss."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseValidator.Config):
        enable: bool = False
        steps: int = 1
        """global batches per validation (-1: the whole validation epoch)"""
        dataloader: FCPTitanDataLoader.Config = dataclasses.field(default_factory=FCPTitanDataLoader.Config)
        """the validation data (fcp_config: the training data's config, with another seed)"""

    def __init__(self, config: Config, *, loss_fn: Any, metrics_processor: Any, seq_len: int, **_: Any) -> None:
        super().__init__(config=config)
        if config.steps == 0 or config.steps < -1:
            raise ValueError(f"FCPTitanValidator: steps must be >= 1 or -1 (the whole epoch), got {config.steps}")
        self.loss_fn = _ChunkPadding(loss_fn) if _is_chunked(loss_fn) else loss_fn
        if hasattr(loss_fn, "mtp_scale"):  # torchtitan's MTPLoss (the model's MTP depth is checked by the trainer)
            self.loss_fn = FCPMTPLoss(loss_fn)
        self.metrics_processor, self.seq_len, self.loader, self._start = metrics_processor, seq_len, None, None

    def _batch_loss(self, model: torch.nn.Module, batch: dict) -> torch.Tensor:
        kwargs = batch_inputs(batch, model)
        if isinstance(self.loss_fn, FCPMTPLoss):
            self.loss_fn.targets = batch["future_labels"].to(kwargs["tokens"].device)
        pred = model(kwargs["tokens"], positions=kwargs["positions"], attention_masks=kwargs["attention_masks"])
        total = torch.tensor(float(denominator(batch)), device=kwargs["tokens"].device)
        return self.loss_fn(pred, batch["labels"].to(kwargs["tokens"].device)[None], total)[0]

    def _counted(self, batches: Iterator[dict]) -> Iterator[dict]:
        for batch in batches:  # torchtitan's validation throughput counts this rank's tokens
            self.metrics_processor.ntokens_since_last_log += int(batch["input_ids"].numel())
            yield batch

    def validate(self, model_parts: list[torch.nn.Module], step: int) -> None:
        from fcp_data.sampler_inputs import dist_rank_and_world

        if self.loader is None:
            rank, world = dist_rank_and_world()
            self.loader = self.config.dataloader.build(dp_world_size=world, dp_rank=rank, seq_len=self.seq_len)
            self._start = self.loader.sampler.state_dict()
        self.loader.sampler.load_state_dict(self._start)  # the same global batches every time
        num = self.loader.sampler.num_global_batches() if self.config.steps == -1 else self.config.steps
        model, batches, loss, tokens = model_parts[0], self._counted(iter(self.loader.loader)), 0.0, 0
        model.eval()
        for _ in range(num):
            res = eval_step(model, batches, self._batch_loss, pad_token_id=self.loader.pad_token_id)
            loss, tokens = loss + res.loss * res.num_tokens, tokens + res.num_tokens
        model.train()
        self.metrics_processor.log_validation(loss=loss / max(tokens, 1), step=step)


def _is_chunked(loss_fn: Any) -> bool:
    """torchtitan's ChunkedLossWrapper (it applies lm_head chunk by chunk; its rows need padding for FCP)."""
    return hasattr(loss_fn, "num_chunks") and hasattr(loss_fn, "set_lm_head")


class FCPTitanTrainer(Trainer):
    """torchtitan's ``Trainer`` over FCP micro-batches (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        # FCP's own slots, typed as such (torchtitan's command line then offers their fields directly)
        tokenizer: PreTokenized.Config = dataclasses.field(default_factory=PreTokenized.Config)
        dataloader: FCPTitanDataLoader.Config = dataclasses.field(default_factory=FCPTitanDataLoader.Config)
        validator: FCPTitanValidator.Config = dataclasses.field(default_factory=FCPTitanValidator.Config)
        ring_timeout: float = 0.0
        """seconds a ring exchange may wait before it raises (0: the process group's timeout)"""
        leave_out_skipped: bool = True
        """samples that failed to read are left out of the later epochs (fcp_exec.skips.leave_out_later)"""

        def __post_init__(self) -> None:
            Trainer.Config.__post_init__(self)
            _check_config(self)

    def __init__(self, config: Config) -> None:
        _check_config(config)
        _public_set_timeout()
        _stacks_when_stopped()
        config.model_spec = _fcp_model_spec(config.model_spec, config.ring_timeout or None)
        super().__init__(config)
        if not isinstance(self.dataloader, FCPTitanDataLoader):
            raise ValueError(f"FCPTitanTrainer: the dataloader is {type(self.dataloader).__name__}, not "
                             "FCPTitanDataLoader (build the config with fcp_config)")
        self.dataloader.trainer_bound = True
        self.last_groups: list[tuple[int, ...]] = []
        _log_fcp(self.dataloader, config.training.seq_len)
        for m in (m for part in self.model_parts for m in part.modules()):
            # torchtitan set FSDP2's divide factor to 1; a plain SUM then (PREMUL_SUM(1) is the same, but gloo lacks it)
            if hasattr(m, "set_force_sum_reduction_for_comms"):
                m.set_force_sum_reduction_for_comms(True)
        if _is_chunked(self.loss_fn):
            self.loss_fn = _ChunkPadding(self.loss_fn)
        self.loss_fn = trainer_loss(self.loss_fn, self.model_parts[0], self.dataloader.config.future_tokens)

    def batch_generator(self, data_iterable: Iterable[dict]) -> Iterator[dict]:
        """The loader's micro-batches as they come (torchtitan's data-loading metrics kept)."""
        it = iter(data_iterable)
        while True:
            start = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration as ex:
                raise DataloaderExhaustedError() from ex
            self.metrics_processor.ntokens_since_last_log += int(batch["input_ids"].numel())
            self.metrics_processor.data_loading_times.append(time.perf_counter() - start)
            yield batch

    def train_step(self, data_iterator: Iterator[dict]) -> None:
        """torchtitan's step over this global batch's micro-batches, prepared (module docstring)."""
        model = self.model_parts[0]
        batches = next_global_batch(data_iterator, self.device, pad_token_id=self.dataloader.pad_token_id)
        pairs = []
        for b in batches:
            kwargs = batch_inputs(b, model)
            inputs = {"input": kwargs["tokens"], "positions": kwargs["positions"],
                      "attention_masks": kwargs["attention_masks"]}
            if isinstance(self.loss_fn, FCPMTPLoss):  # each MTP depth's targets, for the loss of this micro-batch
                inputs["fcp_future_labels"] = b["future_labels"].to(self.device)
            pairs.append((inputs, b["labels"][None]))
            self.ntokens_seen += 0 if b.get("idle") else int(b["input_ids"].numel())
        self.gradient_accumulation_steps = len(pairs)
        super().train_step(iter(pairs))
        self.dataloader.consumed(batches[-1])
        self.last_groups = [tuple(int(r) for r in b["ranks"]) for b in batches]  # this rank's CP group per micro-batch
        if self.metrics_processor.should_log(self.step):  # to torchtitan's TensorBoard / W&B logger, beside its own
            self.metrics_processor.logger.log(fcp_step_metrics(batches), self.step)
        if self.config.leave_out_skipped:
            leave_out_later(self.dataloader.sampler, batches)

    def post_dataloading_process(self, input_dict: dict[str, Any], labels: torch.Tensor):
        """``(tokens, labels, model kwargs)``: the ring and positions are FCP's already (no mask building, no CP
        sharding: FCP sharded the documents); an MTP model's look-ahead targets go to its loss (FCPMTPLoss)."""
        if "fcp_future_labels" in input_dict:
            self.loss_fn.targets = input_dict["fcp_future_labels"]
        return input_dict["input"], labels, {k: v for k, v in input_dict.items() if k not in ("input", "fcp_future_labels")}


def fcp_step_metrics(batches: list[dict]) -> dict[str, float]:
    """What FCP did on this rank in one step (prepared micro-batches): ``fcp/micro_batches`` (the plan's count),
    ``fcp/max_ring_degree`` and ``fcp/mean_ring_degree`` of this rank's CP groups, ``fcp/idle_micro_batches`` (run on
    the dummy), ``fcp/skipped_samples`` (failed reads, agreed in their groups)."""
    busy = [len(b["ranks"]) for b in batches if not b.get("idle")]
    return {"fcp/micro_batches": len(batches), "fcp/max_ring_degree": max(busy, default=0),
            "fcp/mean_ring_degree": sum(busy) / len(busy) if busy else 0.0,
            "fcp/idle_micro_batches": len(batches) - len(busy),
            "fcp/skipped_samples": sum(len(b.get("skipped_samples", ())) for b in batches)}


def _log_fcp(loader: FCPTitanDataLoader, seq_len: int) -> None:
    """What FCP plans with (torchtitan's own line about local/global batch sizes and accumulation steps does not
    apply: the plan sets the micro-batches of every step)."""
    from torchtitan.tools.logging import logger

    s, c = loader.sampler, loader.config
    logger.info(f"FCP: global batches of {c.global_batch_size} documents ({s.num_global_batches()} per epoch), "
                f"{s.cost_model.tokens_per_rank} tokens per rank, documents up to {seq_len} tokens, micro-batches "
                f"per step: {c.micro_batches or 'planned per global batch'}, solver {c.solver}")


def _stacks_when_stopped() -> None:
    """A rank that torchrun stops with SIGTERM (after a peer failed, e.g. timed out waiting for this one) first writes
    where each of its threads was to stderr (``faulthandler``), then stops as before: the other side of a hang."""
    import faulthandler
    import signal

    try:
        faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    except (AttributeError, ValueError, RuntimeError, OSError):  # no SIGTERM (Windows) or no usable stderr
        pass


def _public_set_timeout() -> None:
    """torchtitan 0.3's ``Trainer.train`` calls ``torch.distributed.set_timeout`` after the first step, which torch
    releases up to 2.13 have only as the private ``_set_pg_timeout`` (same arguments): that one, where it is missing."""
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout") and hasattr(dist.distributed_c10d, "_set_pg_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout


class _ChunkPadding:
    """torchtitan's ``ChunkedLossWrapper`` (the loss computes ``lm_head`` chunk by chunk) takes rows whose length is a
    multiple of its ``num_chunks``; an FCP row has any length, so the hidden states, labels and positions are padded
    at the end (zeros, ignored labels: nothing is added to the loss or the gradients)."""

    def __init__(self, loss_fn: Any) -> None:
        self.loss_fn = loss_fn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loss_fn, name)

    def __call__(self, pred: torch.Tensor, labels: torch.Tensor, global_valid_tokens: Any = None, **kwargs: Any):
        import torch.nn.functional as F

        pad = (-pred.shape[1]) % int(self.loss_fn.num_chunks)
        if pad:
            pred = F.pad(pred, (0, 0, 0, pad))
            labels = F.pad(labels, (0, pad), value=-100)
            kwargs = {k: F.pad(v, (0, pad)) if isinstance(v, torch.Tensor) and v.dim() == 2 else v
                      for k, v in kwargs.items()}
        return self.loss_fn(pred, labels, global_valid_tokens, **kwargs)


def _check_config(config: Any) -> None:
    """One error for what FCP does not run under torchtitan (module docstring)."""
    p = config.parallelism
    degrees = {"tensor_parallel_degree": p.tensor_parallel_degree, "pipeline_parallel_degree":
               p.pipeline_parallel_degree, "context_parallel_degree": p.context_parallel_degree,
               "expert_parallel_degree": p.expert_parallel_degree}
    wrong = {k: v for k, v in degrees.items() if v != 1}
    if wrong:
        raise ValueError(f"FCPTitanTrainer: {', '.join(f'parallelism.{k}={v}' for k, v in wrong.items())}; FCP "
                         "forms the context-parallel groups itself and every rank is data-parallel to torchtitan "
                         "(set them to 1)")
    if not config.training.disable_cuda_graphs:
        raise ValueError("FCPTitanTrainer: FCP's micro-batches change shape every step, which CUDA graphs cannot "
                         "replay: set training.disable_cuda_graphs (fcp_config does)")
    if config.validator.enable and not isinstance(config.validator, FCPTitanValidator.Config):
        raise ValueError("FCPTitanTrainer: torchtitan's own validator feeds its own batches to the model, which takes "
                         "FCP micro-batches: use FCPTitanValidator.Config (fcp_config sets it) or disable it")
    if p.spmd_backend != "partial_dtensor":
        raise ValueError(f"FCPTitanTrainer: parallelism.spmd_backend={p.spmd_backend!r}; FCP runs torchtitan's "
                         "\"partial_dtensor\" backend (plain tensors inside the model, FSDP2 over them; fcp_config sets it)")
    if not isinstance(config.dataloader, FCPTitanDataLoader.Config):
        raise ValueError(f"FCPTitanTrainer: dataloader is {type(config.dataloader).__name__}, not "
                         "FCPTitanDataLoader.Config (build the config with fcp_config)")
    balanced = [i for i, layer in enumerate(getattr(config.model_spec.model, "layers", []))
                if getattr(getattr(layer, "moe", None), "load_balance_coeff", None) is not None]
    if balanced and config.compile.enable and "model" in config.compile.components:
        raise ValueError(f"FCPTitanTrainer: MoE layer {balanced[0]} balances its experts (load_balance_coeff), whose "
                         "counts FCP keeps free of its padding with hooks that run eagerly only: disable "
                         "compile.enable, or set load_balance_coeff=None on every MoE layer")


def _fcp_model_spec(spec: Any, timeout: float | None) -> Any:
    """``spec`` whose ``parallelize_fn`` puts FCP's attention in first, and whose attention configs build SDPA (the
    module FCP replaces: flex or varlen would compile or need CUDA for nothing); the caller's spec is not changed."""
    if getattr(spec.parallelize_fn, "fcp_attention", False):
        return spec
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention, VarlenAttention

    model = copy.deepcopy(spec.model)
    for _, _, parent, attr in list(model.traverse((FlexAttention.Config, VarlenAttention.Config))):
        window = tuple(getattr(getattr(parent, attr), "window_size", None) or (-1, 0))
        size = getattr(parent, "sliding_window_size", None)  # gpt-oss: the layer's window, read by apply_fcp
        if window != (-1, 0) and (size is None or window != (size - 1, 0)):
            raise ValueError(f"FCPTitanTrainer: an attention has window_size={window}; FCP's torchtitan adapter "
                             "computes causal attention over whole documents or a sliding window its config names "
                             "(sliding_window_size)")
        setattr(parent, attr, ScaledDotProductAttention.Config())
    parallelize = spec.parallelize_fn

    def parallelize_fn(model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        return parallelize(apply_fcp(model, timeout=timeout), **kwargs)

    parallelize_fn.fcp_attention = True
    return dataclasses.replace(spec, model=model, parallelize_fn=parallelize_fn)


def fcp_config(config: Any, **dataloader: Any) -> FCPTitanTrainer.Config:
    """torchtitan's ``Trainer.Config`` ``config`` as an :class:`FCPTitanTrainer.Config` (``config`` is not changed):
    its dataloader an :class:`FCPTitanDataLoader.Config` of ``dataloader`` (its fields; ``vocab_size`` from the
    model), the tokenizer :class:`PreTokenized`, the validator :class:`FCPTitanValidator` (``config``'s enable, freq
    and steps; the training data with seed + 1, read in the training process: no DataLoader worker is forked in the
    middle of a run, when the trainer's threads may hold locks a forked child would inherit), CUDA graphs off, the
    ``partial_dtensor`` SPMD backend. Everything else — model, optimizer, schedule, FSDP2, checkpointing, metrics —
    stays ``config``'s."""
    if not isinstance(config, Trainer.Config):
        raise TypeError(f"fcp_config takes torchtitan's Trainer.Config, got {type(config).__name__}")
    names = {f.name for f in dataclasses.fields(FCPTitanDataLoader.Config)}
    unknown = sorted(set(dataloader) - names)
    if unknown:
        raise TypeError(f"fcp_config: FCPTitanDataLoader.Config has no field {', '.join(unknown)}; its fields: "
                        f"{', '.join(sorted(names))}")
    vocab = int(getattr(config.model_spec.model, "vocab_size", 0) or 0) if config.model_spec is not None else 0
    dataloader.setdefault("vocab_size", vocab)
    mtp = getattr(config.model_spec.model, "mtp_layers", None) if config.model_spec is not None else None
    dataloader.setdefault("future_tokens", len(mtp or ()))  # DeepSeek-V3's MTP modules: their look-ahead tokens
    shape = model_shape(config.model_spec.model) if config.model_spec is not None else None
    if shape is not None and "preset" not in dataloader and "cost_model" not in dataloader:
        dataloader.update(preset="", model_shape=json.dumps(shape))
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(Trainer.Config) if f.init}
    fields["training"] = dataclasses.replace(config.training, disable_cuda_graphs=True)
    fields["parallelism"] = dataclasses.replace(config.parallelism, spmd_backend="partial_dtensor")
    fields["tokenizer"] = PreTokenized.Config(vocab_size=vocab)
    fields["dataloader"] = train = FCPTitanDataLoader.Config(**dataloader)
    v = config.validator
    fields["validator"] = FCPTitanValidator.Config(enable=v.enable, freq=v.freq, steps=getattr(v, "steps", 1),
                                                   dataloader=dataclasses.replace(train, seed=train.seed + 1,
                                                                                  num_workers=0))
    return FCPTitanTrainer.Config(**fields)
