"""torchtitan's own ``Trainer.train()`` with FCP (``fcp_config`` → ``FCPTitanTrainer``) on 2 real gloo processes equals
torchtitan's stock model trained in one process; a run resumed from torchtitan's checkpoint equals the run that did
not stop.

FCP side: torchtitan's Qwen3 ``debugmodel`` config (2 layers, float64 through ``training.dtype`` and FSDP2's
mixed-precision dtypes — torchtitan's dtype table gains ``"float64"`` here, in the test), its ``ChunkedLossWrapper``
loss, selective activation checkpointing, AdamW with warm-up and decay, gradient clipping at 1.0, its FSDP2 through
its own ``parallelize_fn`` — all torchtitan's, built by ``Trainer`` from the config — on the bundled text index
(320 documents of 5–6,570 tokens, tokenized with a 2,000-token vocabulary), ``training.seq_len`` 128 (RoPE length:
longer documents are cut to 128), 96 tokens per rank (documents over 96 need a degree-2 ring), global batches of 4.
The CPU runs through :func:`fcp_exec.integrations.torchtitan_cpu.torchtitan_on_cpu`.

Reference: the stock model (torchtitan's SDPA inner attention, causal) in one process from the same initial weights,
one document per forward (positions from 0), the same global batches, Σ cross-entropy (float32 logits, as
torchtitan's loss) / label tokens, torch's ``clip_grad_norm_`` and the optimizer and schedule the config builds.

Asserted per step: the logged loss and gradient norm within LOSS_TOL / NORM_TOL (relative; torchtitan's loss takes
float32 logits, so float64 training agrees to float32 rounding, not to 1e-12), the final parameters within PARAM_TOL
of the largest; the validation loss ``FCPTitanValidator`` logs after steps 1 and 4 (2 global batches of the training
index sampled with another seed) within LOSS_TOL of the stock model's on the same documents; a degree-2 ring ran; a
run stopped after step 2 and resumed from torchtitan's checkpoint logs and ends exactly as the run that did not stop;
resumed on 1 process instead (DCP reshards the 2-rank checkpoint) it stays within the tolerances above.
torchtitan's usual precision (bf16 parameters and compute in FSDP2, float32 reductions) stays within bf16 tolerances
of exact training. Hostile input: a run over the same index where one sample fails to read everywhere and two fail on one rank of their
degree-2 ring (:func:`damaged_text`) meets the same tolerances against the stock model trained without them.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from fcp_exec.launch import launch
from test_torchtitan import _small_moe  # the MoE debug model cut to a CPU size (same folder)

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torchtitan", "triton", "tensorboard")),
                                reason="torchtitan's Trainer (with the triton its model code and the tensorboard its "
                                       "metrics import) is not installed; make test installs them on x86-64 Linux")

STEPS, SEQ_LEN, TOKENS_PER_RANK, GBS, LR, VAL_BATCHES = 4, 128, 96, 4, 2e-3, 2
# torchtitan's loss takes float32 logits: measured, FCP's losses are within 8.1e-8 of the reference's, gradient norms
# within 2.2e-7, final parameters within 1.04e-6 of the largest — and the reference itself moves by 1.10e-6 when its
# loss takes float64 logits instead (that much is float32 rounding amplified by 4 AdamW steps). A lost rank, a
# gradient summed twice or a wrong denominator is off by O(1e-2) or more.
LOSS_TOL, NORM_TOL, PARAM_TOL = 1e-6, 1e-5, 5e-6
# the MoE debug model's experts run in bfloat16 (test_moe_expert_bias_balancing_trains_like_...): losses within MOE_TOL
# (measured 6e-8 … 2.3e-6), final parameters within MOE_PARAM_TOL of the largest (measured 2.5e-3: AdamW turns the bf16
# rounding of ~0 gradient entries into lr-sized steps)
MOE_TOL, MOE_PARAM_TOL = 1e-4, 1e-2
# ... and so a token near a tie between two experts may pick the other one after a step (measured: one token, step 4,
# its two choices swapped between experts 2 and 3 of layer 0); the first step's counts are exact (same weights)
FLIPS, COEFF = 2, 1e-3  # tokens allowed to flip per step and layer; the debug model's load_balance_coeff


def _config(steps: int, dump: str, interval: int = 0, damaged: bool = False, bf16: bool = False,
            compiled: bool = False, tokens_per_rank: int = TOKENS_PER_RANK, family: str = "qwen3"):
    """torchtitan's qwen3_debugmodel config cut to 2 layers in float64, through fcp_config (``damaged``: over
    :func:`damaged_text`; ``family`` "qwen3_moe": its MoE debug model instead, cut to 8 experts, top 2, expert bias
    balancing on; "deepseek_v3": torchtitan's ``deepseek_v3_debugmodel_mtp`` — MLA, a dense and a MoE layer cut as
    above, one multi-token-prediction module, its ``MTPLoss``)."""
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.models.qwen3 import model_registry
    from torchtitan.models.qwen3.config_registry import qwen3_debugmodel

    from fcp_data import bundled_index
    from fcp_exec.integrations.torchtitan_trainer import fcp_config

    cfg = qwen3_debugmodel()
    if family == "qwen3_moe":
        cfg.model_spec = model_registry("debugmodel_moe")
    elif family == "deepseek_v3":
        from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel_mtp

        cfg = deepseek_v3_debugmodel_mtp()
    model_cfg = cfg.model_spec.model
    model_cfg.layers = model_cfg.layers[:2]
    for layer in model_cfg.layers + list(getattr(model_cfg, "mtp_layers", [])):
        if getattr(layer, "moe", None) is not None:
            _small_moe(layer.moe)
    precision = dict(dtype="float32", mixed_precision_param="bfloat16", mixed_precision_reduce="float32") if bf16 \
        else dict(dtype="float64", mixed_precision_param="float64", mixed_precision_reduce="float64")
    cfg.training = dataclasses.replace(cfg.training, seq_len=SEQ_LEN, steps=steps, **precision)
    cfg.optimizer = default_adamw(lr=LR)
    cfg.dump_folder = dump
    cfg.metrics.enable_tensorboard = False
    cfg.checkpoint = dataclasses.replace(cfg.checkpoint, enable=bool(interval), interval=interval or 10,
                                         last_save_model_only=False)
    cfg.validator = dataclasses.replace(cfg.validator, enable=True, freq=STEPS, steps=VAL_BATCHES)
    if compiled:  # torchtitan's own: each block compiled with fullgraph=True (the ring one op in it), SAC kept
        cfg.compile = dataclasses.replace(cfg.compile, enable=True, components=["model", "loss"])
    data = dict(dataset=f"{__name__}:damaged_text") if damaged else dict(dataset_path=str(bundled_index("text")))
    return fcp_config(cfg, tokens_per_rank=tokens_per_rank, global_batch_size=GBS, num_workers=0, **data)


# hostile input: sample 147 (56 tokens) fails to read everywhere; 230 (174 tokens: a degree-2 ring over both ranks)
# only on rank 1 and 247 (126 tokens, degree 2) only on rank 0 — all in the first two global batches (asserted)
DAMAGED_EVERYWHERE, DAMAGED_ON_RANK = (147,), {230: 1, 247: 0}


class _Damaged(torch.utils.data.Dataset):
    """The bundled text index with the samples above failing to read (OSError, as a bad file would)."""

    def __init__(self) -> None:
        from fcp_data import IndexedDataset, bundled_index

        self.data = IndexedDataset(bundled_index("text"))
        self.index, self.pad_token_id, self.has_labels = self.data.index, self.data.pad_token_id, False

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        if i in DAMAGED_EVERYWHERE or DAMAGED_ON_RANK.get(i) == rank:
            raise OSError(f"sample {i}: damaged file (rank {rank})")
        return self.data[i]


def damaged_text() -> _Damaged:
    return _Damaged()


def _float64() -> None:
    import torchtitan.config

    torchtitan.config.TORCH_DTYPE_MAP.setdefault("float64", torch.float64)  # the same dict object everywhere


def _stock_model(family: str = "qwen3"):
    """The stock debugmodel of ``family`` (_config; 2 layers, SDPA, RoPE over SEQ_LEN positions), float64, seed 0."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.deepseek_v3 import model_registry as deepseek
    from torchtitan.models.qwen3 import model_registry

    cfg = (deepseek("debugmodel", num_mtp_layers=1) if family == "deepseek_v3" else
           model_registry("debugmodel_moe" if family == "qwen3_moe" else "debugmodel")).model
    cfg.layers = cfg.layers[:2]
    for layer in cfg.layers + list(getattr(cfg, "mtp_layers", [])):
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        layer.attention.rope = dataclasses.replace(layer.attention.rope, max_seq_len=SEQ_LEN)
        if getattr(layer, "moe", None) is not None:
            _small_moe(layer.moe)
    torch.manual_seed(0)
    model = cfg.build().to(torch.float64)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model


def _counting(optimizers, model, log: list) -> None:
    """``optimizers.step`` first appends every MoE layer's tokens per expert, summed over the ranks and halved where
    the layer's block recomputes its forward (torchtitan's own rule) — what torchtitan's load-balancing pre-hook is
    about to read — to ``log``."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl

    step = optimizers.step

    def counted(*args, **kwargs):
        seen = []
        for block in model.layers.values():
            if getattr(getattr(block, "moe", None), "expert_bias_E", None) is None:
                continue
            counts = block.moe.tokens_per_expert_E.detach().clone()
            if getattr(block, "checkpoint_impl", None) is CheckpointImpl.NO_REENTRANT:
                counts = counts // 2
            if dist.is_initialized():
                dist.all_reduce(counts)
            seen.append([int(c) for c in counts.tolist()])
        log.append(seen)
        return step(*args, **kwargs)

    optimizers.step = counted


def _expert_biases(model) -> list[list[float]]:
    """Every MoE layer's routing bias (torchtitan's load balancing moves it before each optimizer step)."""
    return [layer.moe.expert_bias_E.tolist() for layer in model.layers.values()
            if getattr(getattr(layer, "moe", None), "expert_bias_E", None) is not None]


def _params(model) -> dict[str, np.ndarray]:
    """Every full parameter by its name in the stock model (FSDP2's shards gathered, AC's wrapper name dropped)."""
    from torch.distributed.tensor import DTensor

    return {n.replace("_checkpoint_wrapped_module.", ""): (p.full_tensor() if isinstance(p, DTensor) else p)
            .detach().double().numpy().copy() for n, p in model.named_parameters()}


def _load_params(model, path: str) -> None:
    """The stock model's initial parameters (``torch.save``d by name) into the trainer's sharded model."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    full = torch.load(path)
    with torch.no_grad():
        for n, p in model.named_parameters():
            src = full[n.replace("_checkpoint_wrapped_module.", "")].to(p.dtype)
            p.copy_(distribute_tensor(src, p.device_mesh, p.placements) if isinstance(p, DTensor) else src)


def _train(steps: int, dump: str, initial: str, interval: int = 0, damaged: bool = False, bf16: bool = False,
           compiled: bool = False, tokens_per_rank: int = TOKENS_PER_RANK, family: str = "qwen3") -> dict:
    """One FCPTitanTrainer run on this rank (inside the launch): its logged steps, batches and final parameters."""
    import torch.distributed as dist
    from fcp_exec.integrations.torchtitan_cpu import torchtitan_on_cpu

    torchtitan_on_cpu()
    _float64()
    trainer = _config(steps, dump, interval, damaged, bf16, compiled, tokens_per_rank, family).build()
    moe = family == "qwen3_moe"
    _load_params(trainer.model_parts[0], initial)
    expert_counts: list = []
    if moe:
        _counting(trainer.optimizers, trainer.model_parts[0], expert_counts)
    logged, groups, per_step = [], [], []
    log = trainer.metrics_processor.log

    def record(step, loss, max_loss, grad_norm, **kwargs):
        logged.append((int(step), float(loss), float(grad_norm)))
        return log(step, loss, max_loss, grad_norm, **kwargs)

    trainer.metrics_processor.log = record
    validated = []
    log_validation = trainer.metrics_processor.log_validation

    def record_validation(loss, step, **kwargs):
        validated.append((int(step), float(loss)))
        return log_validation(loss, step, **kwargs)

    trainer.metrics_processor.log_validation = record_validation
    fcp_metrics = []
    logger_log = trainer.metrics_processor.logger.log

    def record_metrics(metrics, step):
        if any(k.startswith("fcp/") for k in metrics):
            fcp_metrics.append((int(step), dict(metrics)))
        return logger_log(metrics, step)

    trainer.metrics_processor.logger.log = record_metrics
    step_fn = trainer.train_step

    def traced(it):
        step_fn(it)
        groups.extend(trainer.last_groups)
        per_step.append(list(trainer.last_groups))

    trainer.train_step = traced
    trainer.train()
    sampler = trainer.dataloader.sampler
    import json

    saved = json.loads(trainer.dataloader.state_dict()["fcp_sampler"])  # what torchtitan's checkpoint holds
    val = trainer.validator.loader.sampler
    from torch._dynamo.utils import counters

    out = {"graphs": int(counters["stats"]["unique_graphs"]), "logged": logged, "params": _params(trainer.model_parts[0]), "groups": groups, "validated": validated,
           "fcp_metrics": fcp_metrics, "per_step": per_step, "excluded_later": saved.get("excluded_later"),
           "batches": [[int(i) for i in sampler.global_batch_indices(s)] for s in range(steps)],
           "val_batches": [[int(i) for i in val.global_batch_indices(k)] for k in range(VAL_BATCHES)],
           "expert_bias": _expert_biases(trainer.model_parts[0]), "expert_counts": expert_counts}
    trainer.close()
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run (4 steps, checkpoints every 2) and a run that resumes from its step-2 checkpoint."""
    import shutil

    root = tmp_path_factory.mktemp("titan")
    initial = str(root / "initial.pt")
    torch.save({n: p.detach() for n, p in _stock_model().named_parameters()}, initial)
    full = launch(_train, 2, STEPS, str(root / "full"), initial, 2, timeout=600.0, pg_timeout=120.0,
                  preload=("torchtitan.trainer",))
    shutil.copytree(root / "full" / "checkpoint" / "step-2", root / "resumed" / "checkpoint" / "step-2")
    resumed = launch(_train, 2, STEPS, str(root / "resumed"), initial, 2, timeout=600.0, pg_timeout=120.0,
                     preload=("torchtitan.trainer",))
    damaged = launch(_train, 2, STEPS, str(root / "damaged"), initial, 0, True, timeout=600.0, pg_timeout=120.0,
                     preload=("torchtitan.trainer",))
    bf16 = launch(_train, 2, STEPS, str(root / "bf16"), initial, 0, False, True, timeout=600.0, pg_timeout=120.0,
                  preload=("torchtitan.trainer",))
    return {"full": full, "resumed": resumed, "damaged": damaged, "bf16": bf16, "initial": initial, "root": root}


def _reference(initial: str, batches: list[list[int]], val_batches: list[list[int]],
               skip: frozenset = frozenset(), family: str = "qwen3") -> tuple[list, dict, dict]:
    """The stock model over ``batches`` (without the samples ``skip``) in this process: per step (loss, gradient
    norm), the final parameters and the validation loss over ``val_batches`` after steps 1 and STEPS (the
    validator's freq). ``moe``: the MoE model, its expert biases moved by torchtitan's own optimizer pre-hook
    (``register_moe_load_balancing_hook``, which needs a process group: run it in a launched process); the
    parameters then carry the biases too, under ``expert_bias``."""
    import tempfile

    import torch.nn.functional as F

    from fcp_data import IndexedDataset, bundled_index

    _float64()
    cfg = _config(len(batches), tempfile.mkdtemp(), family=family)
    model, moe = _stock_model(family), family == "qwen3_moe"
    _load_params(model, initial)
    optimizers = cfg.optimizer.build(model_parts=[model])
    if moe:
        from torchtitan.components.optimizer.optimizer import register_moe_load_balancing_hook
        from torchtitan.distributed.parallel_dims import ParallelDims

        from fcp_exec.integrations.torchtitan_cpu import torchtitan_on_cpu

        torchtitan_on_cpu()  # its mesh on the CPU
        register_moe_load_balancing_hook(optimizers, [model], ParallelDims(
            dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1, spmd_backend="partial_dtensor"))
        expert_counts: list = []
        _counting(optimizers, model, expert_counts)
    schedulers = cfg.lr_scheduler.build(optimizers=optimizers, training_steps=len(batches))
    data = IndexedDataset(bundled_index("text"))

    def mean_loss(indices: list[int]) -> torch.Tensor:
        docs = [data[i]["input_ids"][:SEQ_LEN] for i in indices if i not in skip]
        num = sum(len(d) - 1 for d in docs)
        if family == "deepseek_v3":  # torchtitan's own MTPLoss (float32 logits), its token shift over each document
            loss = cfg.loss.build()
            return sum(loss(model(d[None]), torch.cat([d[1:], torch.tensor([-100])])[None],
                            positions=torch.arange(len(d))[None])[0] for d in docs) / num
        return sum(F.cross_entropy(model(d[None])[0, :-1].float(), d[1:], reduction="sum") for d in docs) / num

    out, validated = [], {}
    for step, batch in enumerate(batches, 1):
        optimizers.zero_grad()
        loss = mean_loss(batch)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.training.max_norm, foreach=True)
        out.append((float(loss.detach()), float(norm)))
        optimizers.step()
        schedulers.step()
        if step in (1, STEPS):  # in eval mode, as the validator runs it (an MoE counts its tokens in training only)
            model.eval()
            with torch.no_grad():
                validated[step] = float(mean_loss([i for b in val_batches for i in b]))
            model.train()
    params = _params(model)
    if moe:
        params["expert_bias"], params["expert_counts"] = _expert_biases(model), expert_counts
    return out, params, validated


def _check_against_reference(runs: dict, name: str, skip: frozenset = frozenset()) -> None:
    res = runs[name][0]
    assert res["batches"] == runs[name][1]["batches"], "the ranks planned different global batches"
    ref_steps, ref_params, ref_val = _reference(runs["initial"], res["batches"], res["val_batches"], skip)
    assert [s for s, _, _ in res["logged"]] == list(range(1, STEPS + 1)), res["logged"]
    for (step, loss, norm), (ref_loss, ref_norm) in zip(res["logged"], ref_steps):
        assert abs(loss - ref_loss) <= LOSS_TOL * abs(ref_loss), f"step {step}: loss {loss!r} vs {ref_loss!r}"
        assert abs(norm - ref_norm) <= NORM_TOL * abs(ref_norm), f"step {step}: grad norm {norm!r} vs {ref_norm!r}"
    assert set(res["params"]) == set(ref_params), sorted(set(res["params"]) ^ set(ref_params))[:4]
    scale = max(float(np.abs(v).max()) for v in ref_params.values())
    worst = max(float(np.abs(res["params"][k] - v).max()) for k, v in ref_params.items()) / scale
    assert worst <= PARAM_TOL, f"final parameters differ by {worst:.2e} of the largest"
    assert any(len(g) == 2 for r in runs[name] for g in r["groups"]), "no degree-2 ring ran"
    assert [s for s, _ in res["validated"]] == [1, STEPS], res["validated"]
    for step, loss in res["validated"]:
        assert abs(loss - ref_val[step]) <= LOSS_TOL * abs(ref_val[step]), f"validation at step {step}: {loss!r} vs " \
                                                                           f"{ref_val[step]!r}"


@pytest.mark.timeout(900)
def test_torchtitan_trainer_with_fcp_equals_the_stock_model(runs):
    _check_against_reference(runs, "full")


def test_failed_reads_train_as_without_those_samples(runs):
    """Samples that fail to read — everywhere, or on one rank of their degree-2 ring — are skipped on every rank of
    their group (torchtitan's label count then leaves them out): the run equals the stock model trained without them."""
    batches = [i for b in runs["damaged"][0]["batches"][:2] for i in b]
    damaged = set(DAMAGED_EVERYWHERE) | set(DAMAGED_ON_RANK)
    assert damaged <= set(batches), (sorted(damaged), batches)
    _check_against_reference(runs, "damaged", frozenset(damaged))
    for r in runs["damaged"]:  # left out of the later epochs on every rank, in the state torchtitan checkpoints
        assert r["excluded_later"] == [[1, sorted(damaged)]], r["excluded_later"]  # [[from epoch, samples]]
    assert not runs["full"][0]["excluded_later"], runs["full"][0]["excluded_later"]


def test_resumed_torchtitan_trainer_equals_the_uninterrupted_run(runs):
    full, resumed = runs["full"][0], runs["resumed"][0]
    assert [s for s, _, _ in resumed["logged"]] == [3, 4], resumed["logged"]
    assert resumed["logged"] == full["logged"][2:], (resumed["logged"], full["logged"][2:])
    assert resumed["validated"] == full["validated"][1:], (resumed["validated"], full["validated"])
    for k, v in full["params"].items():
        assert np.array_equal(resumed["params"][k], v), f"{k} differs after resuming"


def _loader(tmp_path, **fields):
    """The config's FCPTitanDataLoader built in this process (a world of one), with ``fields`` changed."""
    cfg = _config(2, str(tmp_path))
    return dataclasses.replace(cfg.dataloader, **fields).build(dp_world_size=1, dp_rank=0, seq_len=SEQ_LEN)


def test_misuse_is_one_clear_error(tmp_path):
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.validate import Validator
    from torchtitan.models.qwen3.config_registry import qwen3_debugmodel

    from fcp_exec.integrations.torchtitan_trainer import fcp_config

    with pytest.raises(TypeError, match="has no field global_batch;"):
        fcp_config(qwen3_debugmodel(), global_batch=4)
    with pytest.raises(TypeError, match="takes torchtitan's Trainer.Config, got dict"):
        fcp_config({})
    cfg = _config(2, str(tmp_path))
    wrong = {"parallelism.tensor_parallel_degree=2": dict(parallelism=dataclasses.replace(cfg.parallelism,
                                                                                          tensor_parallel_degree=2)),
             "\"partial_dtensor\" backend": dict(parallelism=dataclasses.replace(cfg.parallelism,
                                                                                 spmd_backend="full_dtensor")),
             "CUDA graphs cannot": dict(training=dataclasses.replace(cfg.training, disable_cuda_graphs=False)),
             "torchtitan's own validator": dict(validator=Validator.Config(enable=True)),
             "dataloader is Config, not FCPTitanDataLoader": dict(dataloader=BaseDataLoader.Config())}
    for match, change in wrong.items():
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(cfg, **change)
    from torchtitan.models.qwen3.config_registry import qwen3_moe_debug

    moe = qwen3_moe_debug()
    moe.compile = dataclasses.replace(moe.compile, enable=True, components=["model", "loss"])
    with pytest.raises(ValueError, match="MoE layer 0 balances its experts .* hooks that run eagerly only"):
        fcp_config(moe, dataset_path="unused")
    with pytest.raises(ValueError, match="on_overlong must be one of error, truncate, drop, got 'cut'"):
        _loader(tmp_path, on_overlong="cut")
    with pytest.raises(ValueError, match="set dataset_path"):
        _loader(tmp_path, dataset_path=None)
    with pytest.raises(ValueError, match="not an importable 'package.module:function'"):
        _loader(tmp_path, dataset="no_such_module:documents")
    with pytest.raises(ValueError, match="every rank is data-parallel"):
        dataclasses.replace(cfg.dataloader).build(dp_world_size=2, dp_rank=1, seq_len=SEQ_LEN)
    with pytest.raises(ValueError, match=f"longer than training.seq_len={SEQ_LEN}"):
        _loader(tmp_path, on_overlong="error", tokens_per_rank=160)  # FCP's capacity (160) passes them, RoPE not
    loader = _loader(tmp_path)
    with pytest.raises(RuntimeError, match="torchtitan's own Trainer does not run"):
        next(iter(loader))
    with pytest.raises(ValueError, match="saved by another dataloader"):
        loader.load_state_dict({"dp_rank_0": b""})


def test_gpt_oss_windows_and_mtp_depth_reach_the_run(tmp_path):
    """What FCPTitanTrainer does to a model spec before torchtitan builds it: gpt-oss's varlen configs (sliding windows
    ``(127, 0)`` on its even layers) become SDPA configs whose windows ``apply_fcp`` puts in the ring from the layer's
    ``sliding_window_size`` (128 keys; the odd layers causal); a varlen window its config does not name is refused.
    DeepSeek-V3's MTP config gives the loaders one look-ahead token per MTP module (the validator's loader reads in
    the training process), and a model with MTP modules but no ``MTPLoss`` is one error."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel, deepseek_v3_debugmodel_mtp
    from torchtitan.models.gpt_oss.config_registry import gpt_oss_debugmodel

    from fcp_exec.integrations import torchtitan_trainer as tt
    from fcp_exec.integrations.torchtitan import apply_fcp
    from fcp_exec.integrations.torchtitan_mtp import trainer_loss
    from fcp_exec.integrations.torchtitan_trainer import fcp_config

    spec = fcp_config(gpt_oss_debugmodel(), dataset_path=str(tmp_path)).model_spec
    fcp_spec = tt._fcp_model_spec(spec, None)
    inner = [layer.attention.inner_attention for layer in fcp_spec.model.layers]
    assert all(isinstance(c, ScaledDotProductAttention.Config) for c in inner), inner
    model = apply_fcp(fcp_spec.model.build())
    assert [layer.attention.inner_attention.window for layer in model.layers.values()] == [128, None, 128, None]
    compiled = gpt_oss_debugmodel()
    compiled.compile = dataclasses.replace(compiled.compile, enable=True, components=["model", "loss"])
    for layer in compiled.model_spec.model.layers:  # (its expert-bias balancing alone is refused under compile too)
        layer.moe.load_balance_coeff = None
    # its sinks and windows are arguments of the ring op: compiled blocks keep them (test_torchtitan.py's
    # test_gpt_oss_blocks_compile_fullgraph_with_sinks_and_windows); only the balancing's eager hooks are refused
    assert fcp_config(compiled, dataset_path=str(tmp_path)).compile.enable
    compiled.model_spec.model.layers[0].moe.load_balance_coeff = 1e-3
    with pytest.raises(ValueError, match="MoE layer 0 balances its experts"):
        fcp_config(compiled, dataset_path=str(tmp_path))
    spec.model.layers[0].attention.sliding_window_size = 64  # varlen's (127, 0) no longer matches its config
    with pytest.raises(ValueError, match=r"window_size=\(127, 0\)"):
        tt._fcp_model_spec(spec, None)
    mtp_cfg = fcp_config(deepseek_v3_debugmodel_mtp(), dataset_path=str(tmp_path))
    assert mtp_cfg.dataloader.future_tokens == mtp_cfg.validator.dataloader.future_tokens == 1
    # the validation data is read in the training process: nothing is forked in the middle of a run
    assert mtp_cfg.dataloader.num_workers == 2 and mtp_cfg.validator.dataloader.num_workers == 0
    assert fcp_config(deepseek_v3_debugmodel(), dataset_path=str(tmp_path)).dataloader.future_tokens == 0
    mtp = deepseek_v3_debugmodel_mtp()
    mtp.loss = deepseek_v3_debugmodel().loss  # the chunked cross-entropy: no list of predictions
    with pytest.raises(ValueError, match="not torchtitan's MTPLoss"):
        trainer_loss(mtp.loss.build(), apply_fcp(_stock_model("deepseek_v3")), 1)
    with pytest.raises(ValueError, match="dataloader.future_tokens is 0"):
        trainer_loss(deepseek_v3_debugmodel_mtp().loss.build(), apply_fcp(_stock_model("deepseek_v3")), 0)


def test_documents_past_seq_len_are_cut_or_left_out(tmp_path):
    """training.seq_len (the RoPE length) is below FCP's capacity here (2 × 96 would be 192 on two ranks; one rank:
    96, so use a world of one with 160 tokens per rank): 'truncate' plans and reads every document at ≤ seq_len
    tokens, 'drop' leaves the longer ones out; the loader goes from one epoch to the next; its state round-trips."""
    from fcp_data import IndexedDataset, bundled_index

    lengths = np.array([len(d["input_ids"]) for d in IndexedDataset(bundled_index("text"))])
    cut = _loader(tmp_path, tokens_per_rank=160, global_batch_size=32)
    assert int(cut.sampler.num_tokens.max()) == SEQ_LEN
    cut.trainer_bound = True
    seen = {}
    for mb in cut.loader:
        bounds = mb["cu_seqlens"].tolist()
        for i, n in zip(mb["sample_indices"], np.diff(bounds)):
            seen[int(i)] = int(n)
    assert len(seen) == len(lengths) and all(seen[i] == min(int(lengths[i]), SEQ_LEN) + (min(int(lengths[i]), SEQ_LEN)
                                                                                         % 2) for i in seen)
    epochs = []  # infinite: one epoch after another (32 documents per global batch: 10 per epoch; epoch 0 was read)
    for mb in cut:
        if int(mb["micro_batch"]) == 0:
            epochs.append((int(mb["epoch"]), int(mb["global_batch"])))
        if len(epochs) > 21:
            break
    assert epochs == [(e, g) for e in range(1, 4) for g in range(10)][:22], epochs
    dropped = _loader(tmp_path, tokens_per_rank=160, on_overlong="drop")
    assert sorted(dropped.sampler.excluded.tolist()) == np.flatnonzero(lengths > SEQ_LEN).tolist()
    state = cut.state_dict()
    cut.consumed({"epoch": 0, "global_batch": 0, "micro_batch": 0, "num_micro_batches": 1})
    moved = cut.state_dict()
    assert moved != state
    fresh = _loader(tmp_path, tokens_per_rank=160, global_batch_size=32)
    fresh.load_state_dict(moved)
    assert fresh.state_dict() == moved


def test_a_megatron_prefix_feeds_the_loader(tmp_path):
    """``dataset_path`` naming a Megatron ``PREFIX.bin/.idx`` pair (written here in its documented format: uint16
    tokens, one sequence per document): every document reaches the micro-batches with its tokens, cut to seq_len."""
    import struct

    lengths = [30, 150, 60, 200, 12, 90, 40, 110]
    tokens = np.random.default_rng(0).integers(0, 2048, sum(lengths)).astype(np.uint16)
    seq = np.asarray(lengths, dtype=np.int32)
    ptr = np.concatenate([[0], np.cumsum(seq.astype(np.int64) * 2)[:-1]]).astype(np.int64)
    bounds = np.arange(len(lengths) + 1, dtype=np.int64)
    (tmp_path / "corpus.idx").write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(seq), len(bounds))
                                          + seq.tobytes() + ptr.tobytes() + bounds.tobytes())
    (tmp_path / "corpus.bin").write_bytes(tokens.tobytes())
    loader = _loader(tmp_path, dataset_path=str(tmp_path / "corpus"), tokens_per_rank=160, global_batch_size=4)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    seen = {}
    for mb in loader.loader:
        bounds = mb["cu_seqlens"].tolist()
        for i, a, b in zip(mb["sample_indices"], bounds, bounds[1:]):
            n = min(lengths[int(i)], SEQ_LEN)
            assert mb["input_ids"][a:a + n].tolist() == tokens[starts[int(i)]:starts[int(i)] + n].tolist(), int(i)
            seen[int(i)] = n
    assert seen == {i: min(n, SEQ_LEN) for i, n in enumerate(lengths)}


def test_torchtitan_bf16_policy_stays_close_to_exact_training(runs):
    """torchtitan's usual precision (float32 weights, FSDP2's bf16 parameters and compute, float32 reductions) through
    its Trainer with FCP: each step's loss and gradient norm, and the validation losses, against exact (float64)
    training of the same weights on the same batches — within BF16_LOSS / BF16_NORM (relative) — and bf16 acted."""
    res = runs["bf16"][0]
    ref_steps, _, ref_val = _reference(runs["initial"], res["batches"], res["val_batches"])
    gaps = [abs(loss - ref) / ref for (_, loss, _), (ref, _) in zip(res["logged"], ref_steps)]
    norms = [abs(n - ref) / ref for (_, _, n), (_, ref) in zip(res["logged"], ref_steps)]
    vals = [abs(v - ref_val[s]) / ref_val[s] for s, v in res["validated"]]
    assert len(gaps) == STEPS and max(gaps) <= BF16_LOSS and max(vals) <= BF16_LOSS, (gaps, vals)
    assert max(norms) <= BF16_NORM, norms
    assert max(gaps) > 1e-6, "bf16 did not act: the losses equal float64's"
    assert res["params"].keys() == runs["bf16"][1]["params"].keys()
    assert all(np.array_equal(v, runs["bf16"][1]["params"][k]) for k, v in res["params"].items()), "ranks differ"


# measured: losses 1.7e-5 … 3.7e-4 from exact training, validation losses 1.1e-4 … 5.2e-4, gradient norms 2.5e-4 …
# 7.2e-3 (bf16 keeps 8 bits of mantissa; AdamW carries the step-1 differences on)
BF16_LOSS, BF16_NORM = 2e-3, 3e-2


def test_fcp_metrics_reach_torchtitans_logger(runs):
    """Every logged step sends fcp/* metrics to torchtitan's metric logger (TensorBoard / W&B): the plan's number of
    micro-batches (as many as the step ran), this rank's ring degrees, idle micro-batches, skipped samples (none in
    the clean run, some in the damaged one)."""
    for rank in (0, 1):
        res = runs["full"][rank]
        assert [step for step, _ in res["fcp_metrics"]] == list(range(1, STEPS + 1)), res["fcp_metrics"]
        for (step, m), groups in zip(res["fcp_metrics"], res["per_step"]):
            assert m["fcp/micro_batches"] == len(groups) >= 1, (step, m, groups)
            assert 1 <= m["fcp/max_ring_degree"] <= 2 and 0 <= m["fcp/idle_micro_batches"] < len(groups) + 1, m
            assert m["fcp/skipped_samples"] == 0, m
    assert max(m["fcp/max_ring_degree"] for _, m in runs["full"][0]["fcp_metrics"]) == 2
    assert sum(m["fcp/skipped_samples"] for r in runs["damaged"] for _, m in r["fcp_metrics"]) >= 3


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_torchtitan_trainer_equals_the_stock_model(tmp_path):
    """``--compile.enable`` (model and loss, torchtitan's fullgraph block compile with its selective activation
    checkpointing): inductor graphs ran (dynamic shapes across micro-batches) with the ring as one op in them, and the
    run meets the tolerances of the eager one against the stock model."""
    initial = str(tmp_path / "initial.pt")
    torch.save({n: p.detach() for n, p in _stock_model().named_parameters()}, initial)
    compiled = launch(_train, 2, STEPS, str(tmp_path / "compiled"), initial, 0, False, False, True, timeout=900.0,
                      pg_timeout=300.0, preload=("torchtitan.trainer",))
    assert all(r["graphs"] > 0 for r in compiled), [r["graphs"] for r in compiled]
    _check_against_reference({"compiled": compiled, "initial": initial}, "compiled")


def test_a_two_rank_checkpoint_resumes_on_one_rank(runs):
    """Elastic resume: the 2-rank run's step-2 checkpoint (torchtitan's DCP: FSDP2 shards, optimizer, schedule, FCP's
    sampler state) continued by 1 process with 2 × 96 → 192 tokens per rank, so that the documents are cut where they
    were (training.seq_len 128; FCP's capacity must not cut them shorter): steps 3-4 log and end as the 2-rank run,
    within the float32-logit tolerances (one rank sums in another order and runs no ring)."""
    import shutil

    root = runs["root"]
    shutil.copytree(root / "full" / "checkpoint" / "step-2", root / "elastic" / "checkpoint" / "step-2")
    (one,) = launch(_train, 1, STEPS, str(root / "elastic"), runs["initial"], 2, False, False, False,
                    2 * TOKENS_PER_RANK, timeout=600.0, pg_timeout=120.0, preload=("torchtitan.trainer",))
    full = runs["full"][0]
    assert [s for s, _, _ in one["logged"]] == [3, 4], one["logged"]
    for (step, loss, norm), (_, ref_loss, ref_norm) in zip(one["logged"], full["logged"][2:]):
        assert abs(loss - ref_loss) <= LOSS_TOL * abs(ref_loss), f"step {step}: loss {loss!r} vs {ref_loss!r}"
        assert abs(norm - ref_norm) <= NORM_TOL * abs(ref_norm), f"step {step}: grad norm {norm!r} vs {ref_norm!r}"
    scale = max(float(np.abs(v).max()) for v in full["params"].values())
    worst = max(float(np.abs(one["params"][k] - v).max()) for k, v in full["params"].items()) / scale
    assert worst <= PARAM_TOL, f"parameters after resuming on 1 rank differ by {worst:.2e} of the largest"


@pytest.mark.timeout(900)
def test_moe_expert_bias_balancing_trains_like_the_stock_model(tmp_path):
    """torchtitan's Qwen3 MoE debug model (8 experts, top 2, ``load_balance_coeff`` 1e-3: the routing bias moves
    ± 1e-3 per step toward balance, from the tokens per expert summed over the ranks) under ``Trainer.train()`` with
    FCP on 2 processes: the tokens per expert torchtitan's update reads before every step (summed over the ranks,
    halved where selective checkpointing counted twice) equal the stock model's trained in one process with
    torchtitan's own bias update — exactly at the first step, and later up to FLIPS tokens near a tie per layer, the
    routed totals exactly (FCP's pads and idle dummies counted, they differ from the first step on) —, the expert
    biases after 4 steps within what FLIPS flips can move (measured: equal), and the losses and parameters agree within the bf16 tolerances of its experts
    (torchtitan computes them in bfloat16, whose weight gradients sum in another order: MOE_TOL, MOE_PARAM_TOL)."""
    initial = str(tmp_path / "initial.pt")
    torch.save({n: p.detach() for n, p in _stock_model("qwen3_moe").named_parameters()}, initial)
    got = launch(_train, 2, STEPS, str(tmp_path / "moe"), initial, 0, False, False, False, TOKENS_PER_RANK, "qwen3_moe",
                 timeout=600.0, pg_timeout=120.0, preload=("torchtitan.trainer",))[0]
    ref_steps, ref_params, _ = launch(_reference, 1, initial, got["batches"], got["val_batches"], frozenset(), "qwen3_moe",
                                      timeout=600.0, pg_timeout=120.0, preload=("torchtitan.trainer",))[0]
    counts = ref_params.pop("expert_counts")
    assert len(got["expert_counts"]) == len(counts) == STEPS
    assert got["expert_counts"][0] == counts[0], f"step 1: tokens per expert {got['expert_counts'][0]} != {counts[0]}"
    for k, (mine, theirs) in enumerate(zip(got["expert_counts"], counts), 1):
        for layer, (a, b) in enumerate(zip(mine, theirs)):
            assert sum(a) == sum(b), f"step {k} layer {layer}: {sum(a)} routed tokens, stock {sum(b)}"
            assert sum(abs(x - y) for x, y in zip(a, b)) <= 2 * FLIPS, f"step {k} layer {layer}: {a} vs {b}"
    biases = ref_params.pop("expert_bias")
    worst = max(abs(x - y) for a, b in zip(got["expert_bias"], biases) for x, y in zip(a, b))
    assert worst <= 2 * FLIPS * COEFF, f"expert biases differ by {worst} from the stock model's"
    assert any(b != 0.0 for layer in got["expert_bias"] for b in layer), "no bias moved"
    for (step, loss, _), (ref_loss, _) in zip(got["logged"], ref_steps):
        assert abs(loss - ref_loss) <= MOE_TOL * abs(ref_loss), f"step {step}: loss {loss!r} vs {ref_loss!r}"
    scale = max(float(np.abs(v).max()) for v in ref_params.values())
    worst = max(float(np.abs(got["params"][k] - v).max()) for k, v in ref_params.items()) / scale
    assert worst <= MOE_PARAM_TOL, f"final parameters differ by {worst:.2e} of the largest"
    assert any(len(g) == 2 for g in got["groups"]), "no degree-2 ring ran"


@pytest.mark.timeout(900)
def test_deepseek_v3_with_multi_token_prediction_trains_like_the_stock_model(tmp_path):
    """torchtitan's ``deepseek_v3_debugmodel_mtp`` (multi-latent attention, YaRN RoPE, a dense and a MoE layer, one
    MTP module, ``MTPLoss`` with mtp_scale 0.3) under ``Trainer.train()`` with FCP on 2 processes — which torchtitan
    itself refuses with context parallelism ("MTP does not support context parallelism yet"): its MTP module reads each
    token's look-ahead token from ``FCPCollator(future_tokens=1)`` (``fcp_config`` sets it from the model) instead of
    shifting a shard. Against the stock model trained in one process with torchtitan's own ``MTPLoss`` and token
    shift over each whole document: the first step's loss within LOSS_TOL, every later one, the validation losses and
    the final parameters within the MoE tolerances (its experts compute in bfloat16: MOE_TOL, MOE_PARAM_TOL); a
    degree-2 ring ran. Measured: step 1 equal, later losses within 3.7e-7, validation 5.1e-7, parameters 1.5e-3 of
    the largest (expert weights); with the MTP module shifting its shard instead (the bug this guards against) step 1
    is 2.0e-5 off and step 2 8.0e-4."""
    initial = str(tmp_path / "initial.pt")
    torch.save({n: p.detach() for n, p in _stock_model("deepseek_v3").named_parameters()}, initial)
    got = launch(_train, 2, STEPS, str(tmp_path / "dsv3"), initial, 0, False, False, False, TOKENS_PER_RANK,
                 "deepseek_v3", timeout=600.0, pg_timeout=120.0, preload=("torchtitan.trainer",))[0]
    ref_steps, ref_params, ref_val = launch(_reference, 1, initial, got["batches"], got["val_batches"], frozenset(),
                                            "deepseek_v3", timeout=600.0, pg_timeout=120.0,
                                            preload=("torchtitan.trainer",))[0]
    assert len(got["logged"]) == len(ref_steps) == STEPS
    for (step, loss, _), (ref_loss, _) in zip(got["logged"], ref_steps):
        tol = LOSS_TOL if step == 1 else MOE_TOL  # the same weights at step 1: float32 rounding only
        assert abs(loss - ref_loss) <= tol * abs(ref_loss), f"step {step}: loss {loss!r} vs {ref_loss!r}"
    assert [s for s, _ in got["validated"]] == sorted(ref_val)
    for step, loss in got["validated"]:
        assert abs(loss - ref_val[step]) <= MOE_TOL * abs(ref_val[step]), f"validation after step {step}"
    assert any("mtp_layers.0" in k for k in ref_params), "the MTP module is not trained"
    scale = max(float(np.abs(v).max()) for v in ref_params.values())
    worst = max(float(np.abs(got["params"][k] - v).max()) for k, v in ref_params.items()) / scale
    assert worst <= MOE_PARAM_TOL, f"final parameters differ by {worst:.2e} of the largest"
    assert any(len(g) == 2 for g in got["groups"]), "no degree-2 ring ran"
