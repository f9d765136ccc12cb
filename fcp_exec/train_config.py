"""``TrainConfig``: every option of a training run, declared once.

Each field carries its documentation in ``metadata["help"]``; ``fcp train`` derives its command-line options
from these fields (:func:`fcp_exec.commands.add_config_options`: name, type, default, choices, help), so a new
field appears in the CLI without a second edit and the CLI's defaults cannot diverge from the dataclass's.
Fields whose values have no plain command-line form (a dict, a tuple, API-only switches) say ``cli=False``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections import Counter
from typing import Any

from fcp_data.cost import CostModel
from fcp_data.commands.argtypes import check_output_dir
from fcp_data.sampler_config import MAX_COUNT
from fcp_exec.names import LR_SCHEDULES, REDUCER_NAMES, SUPPORTED_MODEL_TYPES

__all__ = ["TrainConfig", "AMP_NAMES", "DTYPE_NAMES", "builtin_cost_model", "format_degrees", "format_step",
           "parse_planner"]

DTYPE_NAMES = ("float32", "float64", "bfloat16")
AMP_NAMES = ("none", "bfloat16", "float16")
_FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max, without importing torch here


def max_workers() -> int:
    """The most DataLoader worker processes per rank: 4 per CPU core this process may use, at least 8 (a
    DataLoader starts every worker at once, so 10**20 of them would not fail: it would exhaust the machine)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(8, 4 * cores)


def _opt(default: Any, help: Any, **extra: Any):  # noqa: A002 - the argparse word
    """A field with its documentation (a string, or a zero-argument callable evaluated when a parser is built)
    and, optionally, ``choices``, ``metavar`` or ``cli=False``."""
    return field(default=default, metadata={"help": help, **extra})


def _planner_help() -> str:
    from fcp_data.plan.registry import solver_names

    fixed = " / ".join(n + ":D" for n in solver_names(fixed_degree=True))
    return (f"the sampler's solver (a deterministic registered one): {', '.join(solver_names(deterministic=True))}; "
            f"{fixed} fix the degree (static-cp:1 = data parallel only)")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """One training run of :func:`fcp_exec.train.train` (each field's ``metadata["help"]`` says what it is)."""

    model: str = _opt("tiny-llm", "tiny-llm, tiny-mllm, or hf:PATH — a local transformers config.json (random "
                      "weights) or checkpoint folder (its weights, see --init) of a model type fcp is tested with: "
                      + ", ".join(SUPPORTED_MODEL_TYPES),
                      metavar="tiny-llm|tiny-mllm|hf:CONFIG.json|hf:FOLDER")
    init: str = _opt("auto", "hf: models: 'pretrained' loads the weights of the --model folder (model.safetensors or "
                     "pytorch_model.bin, sharded or not; local files only), 'random' initialises from --seed, 'auto' "
                     "loads them when the folder has them", choices=("auto", "pretrained", "random"))
    steps: int = _opt(3, "optimizer steps, one global batch each")
    seed: int = _opt(0, "seed of the weights, the data order and the synthetic data")
    dtype: str = _opt("float32", "dtype of the parameters and activations", choices=DTYPE_NAMES)
    amp: str = _opt("none", "mixed precision over float32 parameters (--dtype float32): the forward under "
                    "torch.autocast in this dtype; float16 also scales the loss (torch.amp.GradScaler: every "
                    "micro-batch's backward scaled, a step whose gradients overflow on any rank skipped on every "
                    "rank and the scale halved)", choices=AMP_NAMES)
    fsdp_mixed_precision: str = _opt("none", "--reducer fsdp2: FSDP2's MixedPrecisionPolicy — forward and backward on "
                                     "bfloat16 copies of the float32 sharded parameters, gradients reduced in "
                                     "float32 (torchtitan's default; needs --dtype float32 and no --amp)",
                                     choices=("none", "bfloat16"))
    initial_loss_scale: float = _opt(2.0 ** 16, "--amp float16: the loss scale to start from", metavar="S")
    loss_scale_window: int = _opt(2000, "--amp float16: steps without overflow before the loss scale doubles",
                                  metavar="N")
    planner: str = _opt("fcp", _planner_help)
    global_batch_size: int = _opt(8, "sequences per step")
    lr: float = _opt(1e-3, "AdamW learning rate")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    lr_schedule: str = _opt("constant", "the learning rate after the warm-up: constant, or from --lr down to --min-lr "
                            "at the last step, linearly or by a half cosine (fcp_exec.optim.lr_at)",
                            choices=LR_SCHEDULES)
    warmup_steps: int = _opt(0, "linear learning-rate warm-up: lr·(k+1)/(N+1) at step k < N", metavar="N")
    min_lr: float = _opt(0.0, "the learning rate of the last step under --lr-schedule linear or cosine")
    max_grad_norm: float = _opt(0.0, "clip the global gradient norm to this value before each optimizer step (after "
                                "the reducer; under --amp float16 after unscaling); 0: no clipping. Every step "
                                "reports the norm before clipping (grad_norm)", metavar="NORM")
    data: str | None = _opt(None, "a length index built by `fcp index`, or 'synthetic'; default: the bundled samples "
                            "(text for text models, videos/images for tiny-mllm and Qwen-VL), indexed once into "
                            "a cache folder")
    max_tokens: int = _opt(2304, "cap on a sample's tokens: text is truncated, longer multimodal samples are left "
                           "out (the default keeps every bundled video)")
    num_synthetic: int | None = _opt(None, "documents of --data synthetic (default: 24 text, 16 video)")
    synthetic_lengths: tuple[int, ...] | None = _opt(None, "exact document lengths of synthetic text", cli=False)
    cost: dict | None = _opt(None, "a §4 cost-model dict (default: fcp_exec.train.builtin_cost_model); the CLI's "
                             "--cost reads it from a JSON file", cli=False)
    tokens_per_rank: int | None = _opt(None, "override the cost model's memory budget (tokens per rank)")
    num_workers: int = _opt(0, "DataLoader worker processes per rank")
    prefetch: int = _opt(2, "global batches the sampler plans ahead in its background thread")
    json_lines: bool = _opt(False, "rank 0 prints one JSON object per step on stdout, nothing else", cli=False)
    verbose: bool = _opt(True, "rank 0 prints one line per step", cli=False)
    return_params: bool = _opt(False, "rank 0 returns the final parameters (numpy), for equivalence checks",
                               cli=False)
    return_grads: bool = _opt(False, "every step's record keeps its gradients and sample indices", cli=False)
    cache_dir: str | None = _opt(None, "folder of the bundled samples' cached length index (default: $FCP_CACHE or "
                                 "a per-user temporary folder)")
    reducer: str = _opt("allreduce", "gradient synchronisation (fcp_exec.step): one flat all-reduce, "
                        "DistributedDataParallel, FSDP2 (fully_shard per transformer block) or FSDP1 (FullyShardedDataParallel "
                        "per block); all sum gradients exactly once per step", choices=REDUCER_NAMES)
    grad_checkpointing: bool = _opt(False, "non-reentrant activation checkpointing of the hf: model's layers")
    sample_labels: bool = _opt(False, "train on each sample's own labels (FCPCollator(sample_labels=True): SFT "
                               "prompt masks; the loss denominator is counted over the global batch); with "
                               "--data synthetic an hf: model's samples mask a random prompt")
    caption_labels: bool = _opt(False, "an index's image/video samples train on their caption only (labels -100 over "
                                "the visual block: IndexedDataset(caption_labels=True)); turns sample_labels on")
    on_read_error: str = _opt("skip", "a sample that fails to read (a video damaged after its header, a file gone since "
                              "indexing): skip it — recorded, padded to its planned length with no label, left out "
                              "of the loss — or raise and end the run (FCPDataset(on_error=...))",
                              choices=("skip", "raise"))
    eval_steps: int = _opt(0, "after training, evaluate the mean loss of this many global batches drawn by a second "
                           "sampler (seed + 1) over --eval-data: forward only, no update (fcp_exec.step.eval_step)")
    eval_data: str | None = _opt(None, "a length index to evaluate on (default: the training data)", metavar="INDEX")
    retry_skipped: bool = _opt(False, "read a skipped sample again in later epochs (default: it is left out of the "
                               "epochs after the one it failed in, on every rank alike: FCPSampler.exclude_later)")
    read_errors_out: str | None = _opt(None, "append one JSON line per skipped sample to this file (key, reason, "
                                       "detail, epoch, global batch)", metavar="FILE")
    exclude: str | None = _opt(None, "leave these training samples out of every epoch: a --read-errors-out file of an "
                               "earlier run (JSON lines with \"index\") or one sample index per line "
                               "(FCPSampler(exclude=...))", metavar="FILE")
    checkpoint: str | None = _opt(None, "write checkpoints to DIR/step-K every --checkpoint-every steps: model and "
                                  "optimizer (torch.distributed.checkpoint) and each rank's sampler position after "
                                  "the step (fcp_exec.checkpoint)", metavar="DIR")
    checkpoint_every: int = _opt(0, "save a checkpoint every N steps (with --checkpoint; 0: never)", metavar="N")
    save_model: str | None = _opt(None, "hf: models: after training, write the model as a transformers checkpoint folder "
                                  "(config.json + model.safetensors; FSDP2 shards gathered) that from_pretrained and "
                                  "--model hf:DIR load (fcp_exec.checkpoint.save_hf_model)", metavar="DIR")
    resume: str | None = _opt(None, "continue from a checkpoint folder DIR/step-K at step K, on any number of ranks "
                              "(the same global batches, planned for this run; --steps counts from 0: the run trains "
                              "steps K .. steps-1)", metavar="DIR")

    def __post_init__(self) -> None:
        if self.model not in ("tiny-llm", "tiny-mllm") and not (self.model.startswith("hf:") and len(self.model) > 3):
            raise ValueError(f"model must be tiny-llm, tiny-mllm or hf:PATH/config.json, got {self.model!r}")
        if self.reducer not in REDUCER_NAMES:
            raise ValueError(f"reducer must be one of {', '.join(REDUCER_NAMES)}, got {self.reducer!r}")
        if self.save_model and not self.model.startswith("hf:"):
            raise ValueError(f"--save-model writes a transformers checkpoint: it needs an hf: model, got {self.model!r}")
        if self.init not in ("auto", "pretrained", "random"):
            raise ValueError(f"init must be auto, pretrained or random, got {self.init!r}")
        if self.init == "pretrained":
            from fcp_exec.integrations.hf_models import WEIGHT_FILES, has_weights

            if not (self.model.startswith("hf:") and has_weights(self.model[3:])):
                raise ValueError(f"--init pretrained needs --model hf:FOLDER holding a checkpoint ({WEIGHT_FILES[0]} or "
                                 f"{WEIGHT_FILES[2]}, sharded or not); {self.model!r} has none")
        if self.grad_checkpointing and not self.model.startswith("hf:"):
            raise ValueError("gradient checkpointing is available for hf: models (the tiny models do not implement it)")
        if not math.isfinite(self.lr) or self.lr < 0 or not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"lr and weight_decay must be finite and >= 0, got {self.lr}, {self.weight_decay}")
        if self.num_workers < 0 or self.prefetch < 0:
            raise ValueError(f"num_workers and prefetch must be >= 0, got {self.num_workers}, {self.prefetch}")
        if self.num_workers > max_workers():
            raise ValueError(f"num_workers={self.num_workers} is more DataLoader processes per rank than this machine "
                             f"can run (at most {max_workers()}: 4 per CPU core, at least 8)")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_NAMES)}, got {self.dtype!r}")
        self._check_amp()
        self._check_optim()
        self._check_outputs()
        self._check_unused()
        if self.eval_steps < 0:
            raise ValueError(f"eval_steps must be >= 0, got {self.eval_steps}")
        if self.checkpoint_every < 0 or bool(self.checkpoint) != bool(self.checkpoint_every):
            raise ValueError("checkpoints need both --checkpoint DIR and --checkpoint-every N >= 1, got "
                             f"checkpoint={self.checkpoint!r}, checkpoint_every={self.checkpoint_every}")
        if self.eval_data is not None and self.eval_steps == 0:
            raise ValueError("eval_data is evaluated after training: give eval_steps >= 1 (--eval-steps N) too")
        for name in ("steps", "global_batch_size", "max_tokens", "prefetch", "num_synthetic", "tokens_per_rank",
                     "eval_steps", "checkpoint_every"):
            v = getattr(self, name)
            if v is not None and v > MAX_COUNT:  # numpy's int64 would overflow deep inside; no real run is this big
                raise ValueError(f"{name}={v} is beyond any real run (at most {MAX_COUNT}); check the value")
        for name in ("steps", "global_batch_size", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_synthetic is not None and self.num_synthetic < 1:
            raise ValueError(f"num_synthetic must be >= 1, got {self.num_synthetic}")
        if self.cost is not None:
            CostModel.from_dict(self.cost)
        parse_planner(self.planner)
        if self.tokens_per_rank is not None and self.tokens_per_rank < 1:
            raise ValueError(f"tokens_per_rank must be >= 1, got {self.tokens_per_rank}")

    def _check_unused(self) -> None:
        """An option that has no effect in the combination given is refused, not ignored (a review found four)."""
        unused = [(self.lr_schedule == "constant" and self.min_lr != 0.0, "--min-lr is the last step's rate under "
                   "--lr-schedule linear or cosine; the constant schedule has none"),
                  (self.num_synthetic is not None and self.data != "synthetic",
                   "--num-synthetic sets the documents of --data synthetic"),
                  (self.retry_skipped and self.on_read_error == "raise", "--retry-skipped reads skipped samples again, "
                   "but --on-read-error raise ends the run at the first one"),
                  (self.init == "random" and not self.model.startswith("hf:"),
                   "--init applies to hf: models (the tiny models always start from --seed)")]
        for bad, why in unused:
            if bad:
                raise ValueError(f"{why}: it would have no effect here")

    def _check_outputs(self) -> None:
        """The checkpoint and --save-model folders can be written: found before the run, not at the first save; the
        --cache-dir is a folder (or nothing yet), not a file."""
        import os

        if self.cache_dir and os.path.exists(self.cache_dir) and not os.path.isdir(self.cache_dir):
            raise ValueError(f"--cache-dir {self.cache_dir} is a file, not a folder; give a folder (made if missing)")
        for name in ("checkpoint", "save_model"):
            if getattr(self, name):
                check_output_dir(getattr(self, name), f"--{name.replace('_', '-')}")

    def _check_optim(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if not 0 <= self.warmup_steps <= MAX_COUNT:
            raise ValueError(f"warmup_steps must be >= 0 (and at most {MAX_COUNT}), got {self.warmup_steps}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"min_lr must be finite, >= 0 and <= lr ({self.lr}), got {self.min_lr}")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            raise ValueError(f"max_grad_norm must be finite and >= 0 (0: no clipping), got {self.max_grad_norm}")

    def _check_amp(self) -> None:
        if self.amp not in AMP_NAMES:
            raise ValueError(f"amp must be one of {', '.join(AMP_NAMES)}, got {self.amp!r}")
        if self.amp != "none" and self.dtype != "float32":
            raise ValueError(f"--amp {self.amp} computes in {self.amp} over float32 parameters: give --dtype float32 "
                             f"(got {self.dtype})")
        if self.fsdp_mixed_precision not in ("none", "bfloat16"):
            raise ValueError(f"fsdp_mixed_precision must be none or bfloat16, got {self.fsdp_mixed_precision!r}")
        if self.fsdp_mixed_precision != "none" and (self.reducer != "fsdp2" or self.dtype != "float32"
                                                    or self.amp != "none"):
            raise ValueError("--fsdp-mixed-precision is FSDP2's policy over float32 parameters: give --reducer fsdp2, "
                             f"--dtype float32 and no --amp (got {self.reducer}, {self.dtype}, --amp {self.amp})")
        if not (math.isfinite(self.initial_loss_scale) and 0 < self.initial_loss_scale <= _FLOAT32_MAX):
            raise ValueError(f"initial_loss_scale must be finite, > 0 and at most float32's largest value "
                             f"({_FLOAT32_MAX:.4g}: the scaler holds it in float32), got {self.initial_loss_scale}")
        if not 1 <= self.loss_scale_window <= MAX_COUNT:
            raise ValueError(f"loss_scale_window must be >= 1 (and at most {MAX_COUNT}), got {self.loss_scale_window}")
        if self.amp != "float16" and (self.initial_loss_scale, self.loss_scale_window) != (2.0 ** 16, 2000):
            raise ValueError("--initial-loss-scale and --loss-scale-window set the loss scaler of --amp float16 "
                             f"(got --amp {self.amp}, which has none)")


def builtin_cost_model(max_tokens: int, num_ranks: int, dtype: str = "float32") -> CostModel:
    """A CPU §4 model for the tiny models: tiny-llm fitted by ``fcp profile --nproc 2 --seq-lens
    256,512,1024,2048,4096`` on a 2-core machine (float32, gloo; mean error 5 %), rounded; ``alpha3``
    absorbs gloo's per-message overheads. Run ``fcp profile`` and pass ``--cost`` for your machine.

    ``tokens_per_rank`` is ``max_tokens`` on one rank and ``ceil(max_tokens / 2)`` (rounded up to 8)
    otherwise, so the longest samples need a CP group of degree ≥ 2 while short ones run at degree 1:
    plans are non-trivial even on the small bundled samples."""
    scale = 2.0 if dtype == "float64" else 1.0
    e = max_tokens if num_ranks == 1 else -(-max_tokens // 2)
    e = -(-e // 8) * 8
    try:
        return CostModel(alpha1=5e-8 * scale, alpha2=7e-5 * scale, beta1=1e-2, alpha3=3.6e5 * scale, beta2=8e-3,
                         bandwidth_intra=2.9e9, bandwidth_inter=2.9e9, ranks_per_node=max(num_ranks, 1),
                         tokens_per_rank=e)
    except ValueError as err:  # the only input here is max_tokens: name it, not the cost model nobody passed
        raise ValueError(f"--max-tokens {max_tokens} is beyond what the built-in cost model can plan (a group of "
                         f"{e} tokens per rank: {str(err).split(';')[0]}); give a smaller --max-tokens, or --cost with "
                         "your machine's model") from None


def format_degrees(degrees: list[list[int]]) -> str:
    """``[[2, 1, 1], [1, 1, 1, 1]]`` → ``⟨2⟩×1 ⟨1⟩×2 | ⟨1⟩×4`` (one block per micro-batch)."""
    blocks = []
    for mb in degrees:
        c = Counter(mb)
        blocks.append(" ".join(f"⟨{d}⟩×{c[d]}" for d in sorted(c, reverse=True)) or "idle")
    return " | ".join(blocks)


def format_step(rec: dict, json_lines: bool = False) -> str:
    """One training step's record as ``fcp train`` prints it: a JSON object (``--json``) or one line of text."""
    if json_lines:
        import json

        def finite(v):  # an fp16 overflow's infinite gradient norm is null: NaN/Infinity are not JSON
            return None if isinstance(v, float) and not math.isfinite(v) else v

        return json.dumps({k: finite(rec[k]) for k in ("step", "loss", "num_tokens", "lr", "grad_norm", "degrees",
                                                       "step_time_s", "skipped_samples", "loss_scale", "skipped_step")
                           if k in rec}, allow_nan=False)
    gone = f"  skipped {len(rec['skipped_samples'])}" if rec["skipped_samples"] else ""
    if "loss_scale" in rec:
        gone += f"  loss scale {rec['loss_scale']:g}{' (overflow: step skipped)' if rec['skipped_step'] else ''}"
    return (f"step {rec['step']:>3}  loss {rec['loss']:.6f}  tokens {rec['num_tokens']:>6}  lr {rec['lr']:.2e}  "
            f"grad norm {rec['grad_norm']:.3g}  plan {format_degrees(rec['degrees'])}  step "
            f"{rec['step_time_s'] * 1e3:7.1f} ms  planner wait {rec['planner_wait_s'] * 1e3:.2f} ms{gone}")


def parse_planner(planner: str) -> tuple[str, int | None]:
    """``"fcp"`` → ``("fcp", None)``; ``"static-cp:2"`` → ``("static-cp", 2)``: a fixed degree for the
    fixed-degree solvers of the registry (static-cp, ulysses); ``static-cp:1`` is data parallelism only."""
    from fcp_data.plan.registry import SOLVER_NAMES, solver_names

    name, _, deg = planner.partition(":")
    if name not in SOLVER_NAMES:
        raise ValueError(f"unknown planner {name!r}; choose one of {', '.join(SOLVER_NAMES)}")
    if not deg:
        return name, None
    fixed = solver_names(fixed_degree=True)
    if name not in fixed or not deg.isdigit() or int(deg) < 1:
        raise ValueError(f"planner {planner!r}: a fixed degree ('NAME:D', D >= 1) only applies to "
                         f"{' and '.join(fixed)}")
    return name, int(deg)
