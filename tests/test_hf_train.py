"""Stock Hugging Face models trained with FCP on real gloo processes equal single-process stock training.

For each model family (tiny random configs of qwen3, llama, qwen2_vl, qwen2_5_vl, qwen3_vl from
``examples/configs``) and each world size (2 and 3 processes), ONE launch runs every reducer (allreduce, ddp,
fsdp2) with and without gradient checkpointing, 3 AdamW steps each, through the real pipeline: FCPSampler →
FCPCollator (Qwen-VL positions from the installed transformers' ``get_rope_index``) → ``apply_fcp`` ring
attention → :func:`fcp_exec.step.train_step`. The reference is the stock model (``sdpa`` attention, HF's own
positions from ``mm_token_type_ids`` and the grids, one document per forward, float64) stepping over the same
global batches (:func:`fcp_exec.integrations.hf_data.reference_step`).

Asserted, per step: the loss to 1e-12 relative, every gradient to 1e-12 relative to the largest reference
gradient entry, the loss denominator exactly; and that the plans mixed degree-2 groups, degree-1 groups and idle
ranks (Σd < nproc in some micro-batch). A failure means FCP training on that stack differs from the model the user
would train without it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from fcp_exec.integrations import hf  # noqa: E402
from fcp_exec.integrations.hf_data import reference_step, special_ids  # noqa: E402
from fcp_exec.launch import launch  # noqa: E402
from fcp_exec.train import TrainConfig, train_matrix  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"
FAMILIES = ("qwen3", "llama", "qwen2_vl", "qwen2_5_vl", "qwen3_vl")
REDUCERS = ("allreduce", "ddp", "fsdp2")
STEPS = 3
TOL = 1e-12
COMMON = dict(data="synthetic", dtype="float64", steps=STEPS, global_batch_size=3, num_synthetic=12, max_tokens=80,
              tokens_per_rank=40, lr=1e-2, prefetch=0, verbose=False, return_grads=True)


def _cfg(family: str, reducer: str, gc: bool, dtype: str = "float64") -> TrainConfig:
    return TrainConfig(model=f"hf:{CONFIGS / f'{family}-tiny.json'}", reducer=reducer, grad_checkpointing=gc,
                       **dict(COMMON, dtype=dtype))


@functools.lru_cache(maxsize=None)
def _reference(family: str, batches: tuple[tuple[int, ...], ...], dtype: str = "float64"):
    """Per step ``(loss, num_tokens, {name: grad})`` of the stock model over ``batches`` (global batches)."""
    config = hf.load_config(CONFIGS / f"{family}-tiny.json")
    data = load_train_data(f"hf:{family}", "synthetic", max_tokens=COMMON["max_tokens"], seed=0,
                           num_synthetic=COMMON["num_synthetic"], hf_config=config)
    model = hf.build_model(config, dtype=getattr(torch, dtype), seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=COMMON["lr"], weight_decay=0.01, foreach=False)
    ignore = ()
    if hasattr(config, "vision_config"):
        ids = special_ids(config)
        ignore = (ids["image"], ids["video"])
    out = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        loss, num = reference_step(model, [data.dataset[i] for i in batch], ignore_ids=ignore)
        grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
        out.append((loss, num, grads))
        opt.step()
    return out


def _check_run(family: str, nproc: int, cfg: TrainConfig, result: dict, tol: float = TOL,
               gtol: float = TOL) -> list[list[int]]:
    steps = result["steps"]
    assert len(steps) == STEPS
    batches = tuple(tuple(s["sample_indices"]) for s in steps)
    ref = _reference(family, batches, cfg.dtype)
    what = f"{family} nproc={nproc} reducer={cfg.reducer} gc={cfg.grad_checkpointing}"
    for s, (loss, num, grads) in zip(steps, ref):
        assert s["num_tokens"] == num, f"{what} step {s['step']}: denominator {s['num_tokens']} != reference {num}"
        assert abs(s["loss"] - loss) <= tol * abs(loss), f"{what} step {s['step']}: loss {s['loss']!r} vs {loss!r}"
        scale = max(float(np.abs(g).max()) for g in grads.values())
        missing = sorted(set(grads) - {n for n, g in s["grads"].items() if g is not None})
        assert not missing, f"{what}: no gradient for {missing[:3]}"
        worst = max(float(np.abs(s["grads"][n] - g).max()) for n, g in grads.items()) / scale
        assert worst <= gtol, f"{what} step {s['step']}: gradient differs by {worst:.2e} (relative to max |grad|)"
    assert len(set(result["checksums"])) == 1, f"{what}: parameters differ across ranks"
    return [d for s in steps for d in s["degrees"]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_hf_fcp_training_equals_single_process_stock_model(family, nproc):
    cfgs = [_cfg(family, r, gc) for r in REDUCERS for gc in (False, True)]
    per_rank = launch(train_matrix, nproc, cfgs, timeout=200.0, pg_timeout=60.0)
    results = per_rank[0]
    checksums = [[r[k]["param_checksum"] for r in per_rank] for k in range(len(cfgs))]
    plans = []
    for cfg, res, sums in zip(cfgs, results, checksums):
        res = dict(res, checksums=sums)
        plans += _check_run(family, nproc, cfg, res)
    assert any(2 in mb for mb in plans), f"no degree-2 group in {plans}"
    assert any(1 in mb for mb in plans), f"no degree-1 group in {plans}"
    assert any(sum(mb) < nproc for mb in plans), f"no micro-batch with an idle rank in {plans}"


@pytest.mark.timeout(240)
def test_hf_fcp_training_float32_reducers():
    """fp32 takes other collective paths (FSDP2 would reduce-scatter with PREMUL_SUM, which gloo lacks): the VL model
    on 2 processes with every reducer against the fp32 stock reference, loss to 1e-5 and gradients to 1e-4 (fp32
    summation order)."""
    cfgs = [_cfg("qwen2_vl", r, False, dtype="float32") for r in REDUCERS]
    per_rank = launch(train_matrix, 2, cfgs, timeout=200.0, pg_timeout=60.0)
    for k, cfg in enumerate(cfgs):
        res = dict(per_rank[0][k], checksums=[r[k]["param_checksum"] for r in per_rank])
        _check_run("qwen2_vl", 2, cfg, res, tol=1e-5, gtol=1e-4)
