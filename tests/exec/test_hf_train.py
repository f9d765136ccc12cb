"""Stock Hugging Face models trained with FCP on real gloo processes equal single-process stock training.

For each model family (tiny random configs of qwen3, llama, qwen2_vl, qwen2_5_vl, qwen3_vl from
``examples/configs``; internvl and llava_onevision with 56-px tiles / frames from ``tests/exec``) and each world size (2 and 3 processes), every reducer (allreduce, ddp, fsdp2) with and
without gradient checkpointing (FSDP1 on two families), 3 AdamW steps each (ONE launch per world size runs every family and
configuration), through the real pipeline: FCPSampler → FCPCollator (Qwen-VL positions from the installed
transformers' ``get_rope_index``) → ``apply_fcp`` ring
attention → :func:`fcp_exec.step.train_step`. The reference is the stock model (``sdpa`` attention, HF's own
positions from ``mm_token_type_ids`` and the grids, one document per forward, float64) stepping over the same
global batches (:func:`fcp_exec.integrations.hf_data.reference_step`).

After training, one more global batch (a second sampler, seed + 1) is evaluated with ``eval_step`` (forward only,
no update): its loss to 1e-12 and its denominator exactly against the stock model with the trained weights.

Asserted, per step: the loss to 1e-12 relative, every gradient to 1e-12 relative to the largest reference
gradient entry, the loss denominator exactly; and that the plans mixed degree-2 groups, degree-1 groups and idle
ranks (Σd < nproc in some micro-batch). On 2 processes, fp32 (Qwen2-VL) and bf16 parameters (Qwen3) with every
reducer are held to their precision's bounds (their tests). Three more runs per world size train on the samples' own SFT labels
(``sample_labels``, prompts masked) against the stock model on the same labels. A failure means FCP training on that stack differs from the model the user
would train without it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from _requires import CPU_FSDP2, cpu_fsdp2, transformers_models, without_cpu_fsdp2
import torch

transformers = transformers_models()

from fcp_exec.integrations import hf  # noqa: E402
from fcp_exec.integrations.hf_data import reference_loss, reference_step, special_ids  # noqa: E402
from fcp_exec.launch import launch  # noqa: E402
from fcp_exec.train import TrainConfig, hf_preload, train_matrix  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
FAMILIES = ("qwen3", "llama", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "internvl", "llava_onevision")
# InternVL's example config takes real 448-px tiles (256 tokens each); the matrix's runs use the same tiny model
# with 56-px tiles (4 tokens each), so its documents fit the matrix's 80-token cap like the Qwen-VL ones
_CONFIG_FILES = {f: Path(__file__).resolve().parent / f"{f}-tiny.json" for f in ("internvl", "llava_onevision")}


def _config_file(family: str) -> Path:
    return _CONFIG_FILES.get(family, CONFIGS / f"{family}-tiny.json")
REDUCERS = ("allreduce", "ddp") + ("fsdp2",) * CPU_FSDP2  # FSDP2 runs on the CPU from torch 2.7
STEPS = 3
TOL = 1e-12
COMMON = dict(data="synthetic", dtype="float64", steps=STEPS, global_batch_size=3, num_synthetic=12, max_tokens=80,
              tokens_per_rank=40, lr=1e-2, prefetch=0, verbose=False, return_grads=True, eval_steps=1)


def _cfg(family: str, reducer: str, gc: bool, dtype: str = "float64", sft: bool = False, amp: str = "none",
         scale: float | None = None, clip: bool = False, mp: str = "none") -> TrainConfig:
    scaler = dict(initial_loss_scale=scale, loss_scale_window=AMP_WINDOW) if amp == "float16" else {}
    return TrainConfig(model=f"hf:{_config_file(family)}", reducer=reducer, grad_checkpointing=gc,
                       sample_labels=sft, amp=amp, fsdp_mixed_precision=mp, **scaler, **(CLIP if clip else {}),
                       **dict(COMMON, dtype=dtype, **_SIZES.get(family, {})))


# LLaVA-OneVision's documents are longer (an AnyRes image of 36-52 tokens beside a video): 96 tokens keep them all,
# and 48 per rank plans degree-2 groups, degree-1 groups and an idle rank on 2 and 3 processes
_SIZES = {"llava_onevision": dict(max_tokens=96, tokens_per_rank=48)}


@functools.lru_cache(maxsize=None)
def _reference(family: str, batches: tuple[tuple[int, ...], ...], dtype: str = "float64", init: str | None = None,
               sft: bool = False, data: str = "synthetic", max_tokens: int = COMMON["max_tokens"],
               evals: tuple[tuple[int, ...], ...] = (), clip: float = 0.0, lrs: tuple[float, ...] = ()):
    """Per step ``(loss, num_tokens, {name: grad}, failed)`` of the stock model over ``batches`` (global batches), in
    ``dtype``; ``init`` initialises the weights in another dtype first (the fp32 model's weights, in fp64); ``sft``:
    the samples carry labels with a masked prompt, which the stock model's loss honours; ``data``: an index instead
    of the synthetic documents. A sample whose read raises here is left out of its batch (``failed``: those).
    ``evals``: more global batches whose ``(loss, num_tokens, None, failed)`` follow, with the trained weights
    and no update (FCP's ``eval_step``). ``clip``: the gradients are scaled by ``min(1, clip / (‖g‖ + 1e-6))`` before
    each step (torch's ``clip_grad_norm_`` rule, written out); ``lrs``: step k's learning rate (default ``lr``)."""
    config = hf.load_config(family if family.endswith(".json") else _config_file(family))  # or a path
    data = load_train_data(f"hf:{family}", data, max_tokens=max_tokens, seed=0,
                           num_synthetic=COMMON["num_synthetic"], hf_config=config, prompt_mask=sft)
    model = hf.build_model(config, dtype=getattr(torch, init or dtype), seed=0).to(getattr(torch, dtype))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=COMMON["lr"], weight_decay=0.01, foreach=False)
    ignore = ()
    if hasattr(config, "vision_config"):
        ids = special_ids(config)
        ignore = tuple(ids[k] for k in ("image", "video") if k in ids)
    out = []
    for k, batch in enumerate(batches + evals):
        opt.zero_grad(set_to_none=True)
        samples, failed = [], []
        for i in batch:
            try:
                sample = data.dataset[i]
            except Exception:  # noqa: BLE001 - a damaged sample (test_hf_training_skips_unreadable_samples)
                failed.append(i)
                continue
            if len(sample["input_ids"]) != data.lengths[i]:  # read fine, but not the sample the index counted
                failed.append(i)
                continue
            samples.append(sample)
        loss, num = reference_step(model, samples, ignore_ids=ignore)
        if k >= len(batches):  # evaluation: the loss only, no step
            out.append((loss, num, None, failed))
            continue
        grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
        out.append((loss, num, grads, failed))
        if clip:
            norm = float(np.sqrt(sum(float((g ** 2).sum()) for g in grads.values())))
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(min(1.0, clip / (norm + 1e-6)))
        for group in opt.param_groups:
            group["lr"] = lrs[k] if lrs else COMMON["lr"]
        opt.step()
    return out


def _gap(grads: dict, ref: dict) -> float:
    """Largest entry-wise gradient difference, relative to the largest reference gradient entry."""
    scale = max(float(np.abs(g).max()) for g in ref.values())
    return max(float(np.abs(grads[n] - g).max()) for n, g in ref.items()) / scale


def _check_run(family: str, nproc: int, cfg: TrainConfig, result: dict, tol: float = TOL,
               gtol: float = TOL) -> list[list[int]]:
    steps = result["steps"]
    assert len(steps) == STEPS
    batches = tuple(tuple(s["sample_indices"]) for s in steps)
    evals = tuple(tuple(e["sample_indices"]) for e in result["eval"])
    optim = dict(clip=cfg.max_grad_norm, lrs=CLIP_LRS) if cfg.max_grad_norm else {}
    ref = _reference(family, batches, cfg.dtype, sft=cfg.sample_labels, data=cfg.data, max_tokens=cfg.max_tokens,
                     evals=evals, **optim)
    what = f"{family} nproc={nproc} reducer={cfg.reducer} gc={cfg.grad_checkpointing} sft={cfg.sample_labels}"
    assert len(evals) == cfg.eval_steps
    for e, (loss, num, _, failed) in zip(result["eval"], ref[len(steps):]):  # eval_step: forward only, trained weights
        assert sorted(r["index"] for r in e["skipped_samples"]) == sorted(failed), f"{what} eval"
        assert e["num_tokens"] == num, f"{what} eval: denominator {e['num_tokens']} != reference {num}"
        assert abs(e["loss"] - loss) <= tol * abs(loss), f"{what} eval: loss {e['loss']!r} vs {loss!r}"
    for s, (loss, num, grads, failed) in zip(steps, ref):
        skipped = sorted(rec["index"] for rec in s["skipped_samples"])
        assert skipped == sorted(failed), f"{what} step {s['step']}: skipped {skipped}, unreadable {failed}"
        assert s["num_tokens"] == num, f"{what} step {s['step']}: denominator {s['num_tokens']} != reference {num}"
        assert abs(s["loss"] - loss) <= tol * abs(loss), f"{what} step {s['step']}: loss {s['loss']!r} vs {loss!r}"
        missing = sorted(set(grads) - {n for n, g in s["grads"].items() if g is not None})
        assert not missing, f"{what}: no gradient for {missing[:3]}"
        worst = _gap(s["grads"], grads)
        assert worst <= gtol, f"{what} step {s['step']}: gradient differs by {worst:.2e} (relative to max |grad|)"
        norm = float(np.sqrt(sum(float((g ** 2).sum()) for g in grads.values())))  # before clipping, every parameter
        assert abs(s["grad_norm"] - norm) <= gtol * norm, f"{what} step {s['step']}: grad_norm {s['grad_norm']} vs {norm}"
    assert len(set(result["checksums"])) == 1, f"{what}: parameters differ across ranks"
    return [d for s in steps for d in s["degrees"]]


FP32_REDUCERS = [("qwen2_vl", r) for r in REDUCERS]  # fp32 takes other collective paths: run on 2 processes
# the samples' own labels
SFT_RUNS = without_cpu_fsdp2([("qwen3", "fsdp2"), ("llama", "allreduce"), ("qwen2_5_vl", "ddp")])
# --amp: fp32 parameters, autocast; float16 with the loss scaler. Whether a step overflows near the edge depends on
# how its tokens are split (a weight's fp16 gradient sums the tokens of one document in the stock model, of one
# rank's share in FCP), so the scales are far from it: 2**12 never overflows here (gradients at 2**14 peak ~1e3),
# 2**40 always does (every step skipped, on every rank, in both).
AMP_RUNS = without_cpu_fsdp2([("qwen3", "allreduce", "float16", 2.0 ** 12), ("qwen3", "fsdp2", "float16", 2.0 ** 40),
                              ("qwen2_5_vl", "ddp", "float16", 2.0 ** 12), ("qwen2_5_vl", "fsdp2", "bfloat16", None)])
AMP_WINDOW = 1000
# FSDP1 (FullyShardedDataParallel per decoder layer, ``--reducer fsdp1``) on 2 and 3 processes: (family, gradient
# checkpointing, clipping + schedule); and on 2, fp16 autocast through its ShardedGradScaler
FSDP1_RUNS = (("qwen3", False, True), ("qwen2_5_vl", True, False))
AMP_RUNS += [("qwen3", "fsdp1", "float16", 2.0 ** 12)]


# --max-grad-norm and a learning-rate schedule (warm-up 1, linear to lr/10): clipped below every step's norm (the test
# asserts the norm is above it), the reference scales its gradients by the rule written out and steps at CLIP_LRS
CLIP_RUNS = without_cpu_fsdp2([("qwen3", "fsdp2"), ("llama", "allreduce"), ("qwen2_5_vl", "ddp")])
CLIP = dict(max_grad_norm=0.05, warmup_steps=1, lr_schedule="linear", min_lr=COMMON["lr"] / 10)
CLIP_LRS = (COMMON["lr"] / 2, COMMON["lr"], COMMON["lr"] / 10)  # lr·1/2 (warm-up), lr, min_lr at the last step


# samples that pass `fcp index` but fail to read (a video's frame data zeroed, jsonl lines edited after indexing)
SKIP_RUNS = without_cpu_fsdp2([("qwen3", "fsdp2"), ("qwen2_5_vl", "ddp")]) + [("llama", "fsdp1")]
# FCP learns how many labels were skipped only after the step's backward, so its gradients are those of Σ CE / D (the
# planned denominator) times D / (D − S); the reference divides by D − S at once. Equal in exact arithmetic, but the
# stock Qwen RMSNorm computes in float32 even in a float64 model, so the two scalings round apart at float32's level:
# measured 5e-8 … 1.4e-7 of the largest gradient entry over the 3 steps (the AdamW steps carry it into the losses of
# steps 1-2: 3e-11 … 3e-9). A missing rescale is off by D / (D − S) (2.3x here), a lost or extra sample by O(1).
SKIP_GTOL, SKIP_TOL = 1e-5, 1e-7


@functools.lru_cache(maxsize=None)
def _damaged(family: str) -> tuple[str, list[str], int, int]:
    """``(index dir, damaged keys, max_tokens, tokens_per_rank)`` for a SKIP_RUNS family (built once)."""
    import atexit
    import shutil
    import tempfile

    from _damaged_data import damaged_video_index, edited_text_index

    root = Path(tempfile.mkdtemp(prefix="fcp-damaged-"))
    atexit.register(shutil.rmtree, root, True)
    if family in ("qwen3", "llama"):
        path, lines = edited_text_index(root, edit=(2, 7), rewrite=(11,))  # 11: valid JSON, another token count
        return str(path), [f"doc-{k:05d}" for k in lines], 80, 40
    path, keys = damaged_video_index(root, "qwen2.5-vl")
    return str(path), keys, 400, 200  # the 300-token videos need a degree-2 group; longer ones are left out


def _skip_cfg(family: str, reducer: str) -> TrainConfig:
    path, _, max_tokens, tokens_per_rank = _damaged(family)
    return TrainConfig(model=f"hf:{CONFIGS / f'{family}-tiny.json'}", reducer=reducer,
                       **dict(COMMON, data=path, num_synthetic=None, max_tokens=max_tokens, tokens_per_rank=tokens_per_rank))


def _matrix_cfgs(nproc: int) -> list[TrainConfig]:
    cfgs = [_cfg(f, r, gc) for f in FAMILIES for r in REDUCERS for gc in (False, True)]
    cfgs += [_cfg(f, r, False, sft=True) for f, r in SFT_RUNS]
    cfgs += [_cfg(f, "fsdp1", gc, clip=clip) for f, gc, clip in FSDP1_RUNS]
    if nproc == 2:
        cfgs += [_cfg(f, r, False, dtype="float32") for f, r in FP32_REDUCERS]
        cfgs += [_cfg("qwen3", r, False, dtype="bfloat16") for r in REDUCERS]
        cfgs += [_skip_cfg(f, r) for f, r in SKIP_RUNS]
        cfgs += [_cfg(f, r, False, dtype="float32", amp=a, scale=sc) for f, r, a, sc in AMP_RUNS]
        cfgs += [_cfg(f, r, False, clip=True) for f, r in CLIP_RUNS]
        cfgs += [_cfg(f, "fsdp2", False, dtype="float32", mp="bfloat16") for f in MP_FAMILIES if CPU_FSDP2]
    return cfgs


@functools.lru_cache(maxsize=None)
def _matrix(nproc: int):
    """ONE launch of ``nproc`` processes runs every configuration of every family (process start-up and the torch /
    transformers imports are paid once per world size, not per family). Returns ``(configs, per-config result with
    every rank's checksum)``, or the exception the launch raised (cached too: one failed launch, not ten)."""
    cfgs = _matrix_cfgs(nproc)
    try:
        per_rank = launch(train_matrix, nproc, cfgs, timeout=900.0, pg_timeout=120.0, preload=hf_preload(cfgs))
    except Exception as exc:  # noqa: BLE001 - re-raised by every test that needs this launch
        return cfgs, exc
    results = [dict(per_rank[0][k], checksums=[r[k]["param_checksum"] for r in per_rank]) for k in range(len(cfgs))]
    return cfgs, results


def _runs(nproc: int, family: str, dtype: str = "float64", sft: bool = False, amp: str = "none", clip: bool = False,
          mp: str = "none", reducers: tuple[str, ...] = REDUCERS):
    cfgs, results = _matrix(nproc)
    if isinstance(results, Exception):
        raise results
    return [(c, r) for c, r in zip(cfgs, results)
            if c.model == f"hf:{_config_file(family)}" and c.dtype == dtype and c.sample_labels == sft and
            c.data == COMMON["data"] and c.amp == amp and bool(c.max_grad_norm) == clip and c.fsdp_mixed_precision == mp
            and c.reducer in reducers]


@pytest.mark.timeout(1000)
@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize("family", FAMILIES)
def test_hf_fcp_training_equals_single_process_stock_model(family, nproc):
    runs = _runs(nproc, family)
    assert len(runs) == len(REDUCERS) * 2
    plans = []
    for cfg, res in runs:
        plans += _check_run(family, nproc, cfg, res)
    assert any(2 in mb for mb in plans), f"no degree-2 group in {plans}"
    assert any(1 in mb for mb in plans), f"no degree-1 group in {plans}"
    assert any(sum(mb) < nproc for mb in plans), f"no micro-batch with an idle rank in {plans}"


@pytest.mark.timeout(1000)
@pytest.mark.parametrize("nproc", [2, 3])
def test_hf_fsdp1_training_equals_single_process_stock_model(nproc):
    """``--reducer fsdp1`` (FSDP1, Accelerate's and many own loops' FSDP: FullyShardedDataParallel around each decoder
    layer, its average turned into a SUM by a comm hook, no_sync before the last micro-batch): Qwen3 with
    ``max_grad_norm`` and a schedule (the norm of flat-parameter shards, one all-reduce of their squares) and
    Qwen2.5-VL with gradient checkpointing, on 2 and 3 processes (3: padded flat shards), equal the stock model to
    1e-12 like every other reducer (loss, every full gradient, the norm, the denominator; parameters equal on every
    rank). A mean instead of the SUM is off by N, a norm over one rank's shard by O(1)."""
    for family, gc, clip in FSDP1_RUNS:
        [(cfg, res)] = _runs(nproc, family, clip=clip, reducers=("fsdp1",))
        assert cfg.grad_checkpointing == gc
        _check_run(family, nproc, cfg, res)
        if clip:
            assert [s["lr"] for s in res["steps"]] == list(CLIP_LRS), family
            assert all(s["grad_norm"] > cfg.max_grad_norm for s in res["steps"]), [s["grad_norm"] for s in res["steps"]]


@pytest.mark.timeout(1000)
@pytest.mark.parametrize("nproc", [2, 3])
def test_hf_sft_labels_training_equals_single_process_stock_model(nproc):
    """``sample_labels=True`` (SFT: every sample's labels mask a random prompt, images included): the loss over the
    samples' own labels, divided by their count over the global batch (counted by train_step across micro-batches
    and ranks), equals the stock model's on the same masked labels — loss and gradients to 1e-12, the denominator
    exactly — and the masks did mask (the denominator is below the causal-LM one of the same batches)."""
    for family, reducer in SFT_RUNS:
        [(cfg, res)] = _runs(nproc, family, sft=True)
        assert cfg.reducer == reducer
        _check_run(family, nproc, cfg, res)
        batches = tuple(tuple(s["sample_indices"]) for s in res["steps"])
        plain = [num for _, num, _, _ in _reference(family, batches)]
        assert all(s["num_tokens"] < n for s, n in zip(res["steps"], plain)), (family, plain)


@pytest.mark.timeout(1000)
def test_hf_clipping_and_lr_schedule_equal_the_stock_model_with_the_same_rules():
    """``max_grad_norm`` + warm-up + linear decay on 2 processes (FSDP2: the norm of sharded gradients; all-reduce;
    DDP on the VL model): every step's loss and gradients to 1e-12 against the stock model clipped by torch's rule
    written out and stepped at the hand-computed learning rates, the reported norm (before clipping) to 1e-12, the
    reported learning rates exactly; and clipping did act (each step's norm above ``max_grad_norm``: the losses of
    steps 1-2 depend on it)."""
    for family, reducer in CLIP_RUNS:
        [(cfg, res)] = _runs(2, family, clip=True)
        assert cfg.reducer == reducer
        _check_run(family, 2, cfg, res)
        assert [s["lr"] for s in res["steps"]] == list(CLIP_LRS), family
        assert all(s["grad_norm"] > cfg.max_grad_norm for s in res["steps"]), [s["grad_norm"] for s in res["steps"]]


@pytest.mark.timeout(1000)
def test_hf_fcp_training_float32_reducers():
    """fp32 takes other collective paths (FSDP2 would reduce-scatter with PREMUL_SUM, which gloo lacks): the VL model
    on 2 processes with every reducer: step 0 against the fp32 stock model (loss 1e-5, gradients 1e-4), every step
    against fp64 training of the same weights within 10x the fp32 stock model's own drift (:func:`_check_fp32_run`)."""
    runs = _runs(2, "qwen2_vl", "float32")
    assert [c.reducer for c, _ in runs] == list(REDUCERS)
    for cfg, res in runs:
        _check_fp32_run("qwen2_vl", cfg, res)


@pytest.mark.timeout(1000)
def test_hf_fcp_training_bfloat16_parameters():
    """``--dtype bfloat16`` (bf16 weights and activations, as Megatron/MindSpeed-style runs keep them; bf16 collectives
    on gloo) on Qwen3 with every reducer: each step's loss and gradients no further from fp64 training of the same
    bf16-initialised weights than BF16_DRIFT times the stock bf16 model's own distance plus a floor (loss 1e-3,
    gradients 1e-2 of the largest entry). Measured: FCP's gradients 7.3e-3 from fp64 at step 0 (the stock's 7.3e-3),
    0.2 / 0.12 at steps 1 / 2 (the stock's 0.22 / 0.12: bf16 weights take AdamW's small updates coarsely); FCP's loss
    is closer than the stock's (3e-6 … 5e-5 against 5e-5 … 3e-3: fcp_loss takes the cross-entropy of float32 logits).
    A lost rank or a missing 1/N is off by O(1) of the largest gradient."""
    runs = _runs(2, "qwen3", "bfloat16")
    assert [c.reducer for c, _ in runs] == list(REDUCERS)
    for cfg, res in runs:
        steps = res["steps"]
        batches = tuple(tuple(s["sample_indices"]) for s in steps)
        stock, truth = _reference("qwen3", batches, "bfloat16"), _reference("qwen3", batches, "float64", init="bfloat16")
        for s, (l16, num, g16, _), (l64, _, g64, _) in zip(steps, stock, truth):
            what = f"qwen3 bf16 reducer={cfg.reducer} step {s['step']}"
            assert s["num_tokens"] == num, what
            lgap, ldrift = abs(s["loss"] - l64) / abs(l64), abs(l16 - l64) / abs(l64)
            assert lgap <= BF16_DRIFT * ldrift + 1e-3, f"{what}: loss {lgap:.2e} from fp64, stock bf16 {ldrift:.2e}"
            gap, drift = _gap(s["grads"], g64), _gap(g16, g64)
            assert gap <= BF16_DRIFT * drift + 1e-2, f"{what}: gradients {gap:.2e} from fp64, stock bf16 {drift:.2e}"
        assert len(set(res["checksums"])) == 1, f"{cfg.reducer}: parameters differ across ranks"


BF16_DRIFT = 3.0
MP_FAMILIES = ("qwen3", "qwen2_5_vl")  # --fsdp-mixed-precision bfloat16 (FSDP2's MixedPrecisionPolicy)


@functools.lru_cache(maxsize=None)
def _mp_reference(family: str, batches: tuple[tuple[int, ...], ...]):
    """What FSDP2's MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32) does, written out on one process:
    float32 master weights; each step the stock model's forward and backward run on a bfloat16 copy of them, its
    gradients are cast to float32 and AdamW steps the master weights. Per step ``(loss, num_tokens, grads, [])``."""
    import copy

    config = hf.load_config(CONFIGS / f"{family}-tiny.json")
    data = load_train_data(f"hf:{family}", "synthetic", max_tokens=COMMON["max_tokens"], seed=0,
                           num_synthetic=COMMON["num_synthetic"], hf_config=config)
    master = hf.build_model(config, dtype=torch.float32, seed=0)
    opt = torch.optim.AdamW(master.parameters(), lr=COMMON["lr"], weight_decay=0.01, foreach=False)
    ignore = (special_ids(config)["image"], special_ids(config)["video"]) if hasattr(config, "vision_config") else ()
    out = []
    for batch in batches:
        work = copy.deepcopy(master).to(torch.bfloat16)
        work.train()
        loss, num = reference_step(work, [data.dataset[i] for i in batch], ignore_ids=ignore)
        for pm, pw in zip(master.parameters(), work.parameters()):
            pm.grad = None if pw.grad is None else pw.grad.float()
        out.append((loss, num, {n: p.grad.double().numpy().copy() for n, p in master.named_parameters()
                                if p.grad is not None}, []))
        opt.step()
    return out


@pytest.mark.timeout(1000)
def test_fsdp2_mixed_precision_is_as_close_to_exact_training_as_the_stock_models_bf16_compute():
    """``--reducer fsdp2 --fsdp-mixed-precision bfloat16`` (bf16 forward/backward over float32 sharded parameters,
    float32 reduce-scatter) on 2 processes, Qwen3 and Qwen2.5-VL with images and videos: every step's loss and
    gradients no further from fp64 training of the same fp32 weights than BF16_DRIFT times the stock model's under
    the same policy written out (:func:`_mp_reference`) plus a floor (loss 1e-3, gradients 1e-2 of the largest entry);
    the denominator exactly; the policy acted (losses not fp64's); the parameters equal on every rank. Measured: FCP's
    gradients 4.9e-3 … 0.19 of the largest entry from fp64 (the stock's 6.3e-3 … 0.20: at most 1.9x it, after AdamW's
    sign-like first update bf16 rounding compounds as in the bf16 test), its losses 1e-5 … 9e-5 from fp64 (the stock's
    4e-5 … 5e-3: fcp_loss takes the cross-entropy in float32). Mutation: the policy not passed to fully_shard fails
    ("did not act")."""
    cpu_fsdp2()
    for family in MP_FAMILIES:
        [(cfg, res)] = _runs(2, family, "float32", mp="bfloat16")
        steps = res["steps"]
        batches = tuple(tuple(s["sample_indices"]) for s in steps)
        stock, truth = _mp_reference(family, batches), _reference(family, batches, "float64", init="float32")
        acted = 0.0
        for s, (l16, num, g16, _), (l64, _, g64, _) in zip(steps, stock, truth):
            what = f"{family} fsdp2 mixed precision step {s['step']}"
            assert s["num_tokens"] == num, what
            lgap, ldrift = abs(s["loss"] - l64) / abs(l64), abs(l16 - l64) / abs(l64)
            acted = max(acted, lgap)
            assert lgap <= BF16_DRIFT * ldrift + 1e-3, f"{what}: loss {lgap:.2e} from fp64, stock {ldrift:.2e}"
            gap, drift = _gap(s["grads"], g64), _gap(g16, g64)
            assert gap <= BF16_DRIFT * drift + 1e-2, f"{what}: gradients {gap:.2e} from fp64, stock {drift:.2e}"
        assert acted > 1e-6, f"{family}: the policy did not act (losses equal fp64's)"
        assert len(set(res["checksums"])) == 1, f"{family}: parameters differ across ranks"
FP32_STEP0 = 1e-4  # step 0: gradients of the same weights, fp32 summation order only
FP32_DRIFT = 10.0  # later steps: this many times the stock fp32 model's own drift from fp64, plus FP32_STEP0


def _check_fp32_run(family: str, cfg: TrainConfig, result: dict) -> None:
    """An fp32 FCP run against the truth: the same fp32-initialised weights trained in fp64 on the same batches.

    After an AdamW step fp32 rounding is no longer small: the first update is about ``lr * sign(grad)``, so an entry
    whose gradient is within rounding of zero moves by up to ``2 lr`` depending on summation order, and the next
    gradients differ by much more than fp32's epsilon (CI measured 1.3e-4 between two correct fp32 runs at step 2).
    So step 0 is held to FP32_STEP0 against the fp32 stock model, and every step to FP32_DRIFT times the stock fp32
    model's own distance from fp64 (plus FP32_STEP0): FCP in fp32 is no further from exact training than the stock
    model in fp32 is, within a factor. A wrong reduction (a lost rank, a missing 1/N, an unreduced shard) is off by
    O(1) of the largest gradient and fails either bound."""
    steps = result["steps"]
    assert len(steps) == STEPS
    batches = tuple(tuple(s["sample_indices"]) for s in steps)
    ref32 = _reference(family, batches, "float32")
    truth = _reference(family, batches, "float64", init="float32")
    what = f"{family} fp32 nproc=2 reducer={cfg.reducer}"
    for s, (loss32, num, g32, _), (loss64, _, g64, _) in zip(steps, ref32, truth):
        assert s["num_tokens"] == num, f"{what} step {s['step']}: denominator {s['num_tokens']} != reference {num}"
        missing = sorted(set(g32) - {n for n, g in s["grads"].items() if g is not None})
        assert not missing, f"{what}: no gradient for {missing[:3]}"
        if s["step"] == 0:
            assert abs(s["loss"] - loss32) <= 1e-5 * abs(loss32), f"{what} step 0: loss {s['loss']!r} vs {loss32!r}"
            gap = _gap(s["grads"], g32)
            assert gap <= FP32_STEP0, f"{what} step 0: gradient differs by {gap:.2e} from the fp32 stock model"
        drift, gap = _gap(g32, g64), _gap(s["grads"], g64)
        bound = FP32_DRIFT * drift + FP32_STEP0
        assert gap <= bound, (f"{what} step {s['step']}: gradient {gap:.2e} from fp64 training, the fp32 stock model "
                              f"{drift:.2e} (bound {bound:.2e})")
        ldrift, lgap = abs(loss32 - loss64), abs(s["loss"] - loss64)
        assert lgap <= FP32_DRIFT * ldrift + 1e-5 * abs(loss64), \
            f"{what} step {s['step']}: loss {lgap:.2e} from fp64 training, the fp32 stock model {ldrift:.2e}"
    assert len(set(result["checksums"])) == 1, f"{what}: parameters differ across ranks"


@pytest.mark.timeout(1000)
def test_hf_training_skips_unreadable_samples_like_training_on_the_rest():
    """Samples that ``fcp index`` accepted but that fail when read — videos whose header is intact but whose frame
    data is zeroed (Qwen2.5-VL, DDP), jsonl lines edited after indexing, into garbage or into valid JSON whose
    token count is no longer the index's (Qwen3 with FSDP2, Llama with FSDP1) — are skipped, not the end of
    the run: every step equals the stock model trained on the rest of its global batch (the first loss to 1e-12,
    later losses and every gradient within SKIP_TOL / SKIP_GTOL, whose origin is stated above; the denominator
    exactly: the skipped samples' labels taken out; a sample is skipped where the reference's
    own read of it raises, and nowhere else), and the records name the damaged samples by their keys."""
    cfgs, results = _matrix(2)
    if isinstance(results, Exception):
        raise results
    for family, reducer in SKIP_RUNS:
        path, damaged, _, _ = _damaged(family)
        [(cfg, res)] = [(c, r) for c, r in zip(cfgs, results) if c.data == path]
        assert cfg.reducer == reducer
        _check_run(family, 2, cfg, res, tol=SKIP_TOL, gtol=SKIP_GTOL)
        batches = tuple(tuple(s["sample_indices"]) for s in res["steps"])
        loss0 = _reference(family, batches, data=cfg.data, max_tokens=cfg.max_tokens)[0][0]
        assert abs(res["steps"][0]["loss"] - loss0) <= TOL * abs(loss0), (family, res["steps"][0]["loss"], loss0)
        keys = [rec["key"] for s in res["steps"] for rec in s["skipped_samples"]]
        assert keys and set(keys) <= set(damaged), (family, keys, damaged)
        reasons = {rec["key"]: rec["reason"] for s in res["steps"] for rec in s["skipped_samples"]}
        assert set(reasons.values()) <= {"VideoDecodeError", "JSONDecodeError", "StaleSampleError"}, reasons
        if family != "qwen2_5_vl":  # the line rewritten as valid JSON of another length: read fine, caught by its length
            assert reasons.get("doc-00011") == "StaleSampleError", reasons


@functools.lru_cache(maxsize=None)
def _amp_reference(family: str, batches: tuple[tuple[int, ...], ...], amp: str, scale: float | None) -> list[dict]:
    """The stock model (float32 parameters) over ``batches`` with its forward under ``torch.autocast(amp)`` and, for
    float16, a ``torch.amp.GradScaler`` of initial ``scale`` and the runs' window: per step the loss, label tokens, the
    unscaled gradients, the scale before the step and whether the scaler skipped it."""
    config = hf.load_config(CONFIGS / f"{family}-tiny.json")
    data = load_train_data(f"hf:{family}", "synthetic", max_tokens=COMMON["max_tokens"], seed=0,
                           num_synthetic=COMMON["num_synthetic"], hf_config=config)
    model = hf.build_model(config, dtype=torch.float32, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=COMMON["lr"], weight_decay=0.01, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=AMP_WINDOW) if amp == "float16" else None
    ignore = (special_ids(config)["image"], special_ids(config)["video"]) if hasattr(config, "vision_config") else ()
    out = []
    for batch in batches:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=getattr(torch, amp)):
            loss, num = reference_loss(model, [data.dataset[i] for i in batch], ignore_ids=ignore)
        (loss if scaler is None else scaler.scale(loss)).backward()
        before = None if scaler is None else float(scaler.get_scale())
        if scaler is not None:
            scaler.unscale_(opt)
        grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        out.append({"loss": float(loss.detach()), "num": num, "grads": grads, "scale": before,
                    "skipped": scaler is not None and float(scaler.get_scale()) < before})
    return out


AMP_DRIFT, AMP_FLOOR = 20.0, {"loss": 1e-4, "grads": 1e-2}  # relative (gradients: of the largest entry)


@pytest.mark.timeout(1000)
def test_fcp_train_amp_scales_and_skips_like_the_stock_model_under_autocast():
    """``fcp train --amp float16`` (fp32 parameters, fp16 autocast, the loss scaler; Qwen3 with the all-reduce reducer,
    Qwen2.5-VL with images and videos under DDP) and ``--amp bfloat16`` (Qwen2.5-VL, FSDP2) on 2 processes. Reference:
    the stock model in one process over the same global batches under the same autocast and a scaler of the same
    initial scale (:func:`_amp_reference`), and fp64 training of the same fp32-initialised weights (the truth).
    Asserted per step: the denominator exactly; the scale before the step equal to the stock run's and no step
    skipped; the loss and the unscaled gradients no further from the truth than AMP_DRIFT times the stock autocast
    run's plus AMP_FLOOR; the autocast acted (the losses are not fp64's); every rank's parameters equal. Measured:
    FCP's losses 4e-7 … 3e-5 from fp64 (at most 6x the stock's), its gradients 4e-4 … 7e-2 of the largest entry (at
    most 7.4x the stock's: after an AdamW step, whose first update is about lr * sign(grad), low-precision rounding
    compounds, as in the bf16 test); a gradient summed twice or not at all is off by O(1). And ``--amp float16`` with an
    initial scale of 2**40 (Qwen3, FSDP2) overflows at every step: every step skipped on every rank, as in the stock
    run, the scale halved each time, the parameters never moved (the checksum of a run of 0 steps)."""
    for family, reducer, amp, scale in AMP_RUNS:
        [(cfg, res)] = _runs(2, family, "float32", amp=amp, reducers=(reducer,))
        steps = res["steps"]
        batches = tuple(tuple(s["sample_indices"]) for s in steps)
        stock, truth = _amp_reference(family, batches, amp, scale), _reference(family, batches, "float64", init="float32")
        what = f"{family} {reducer} --amp {amp} scale {scale}"
        assert [s.get("loss_scale") for s in steps] == [r["scale"] for r in stock], (what, steps, stock)
        assert [s.get("skipped_step", False) for s in steps] == [r["skipped"] for r in stock], what
        assert len(set(res["checksums"])) == 1, f"{what}: parameters differ across ranks"
        if scale is not None and scale >= 2.0 ** 40:  # every step overflows
            assert all(r["skipped"] for r in stock) and [s["loss_scale"] for s in steps] == \
                [scale / 2 ** k for k in range(STEPS)], what
            assert res["param_checksum"] == _untrained_checksum(family), f"{what}: a skipped step moved the parameters"
            continue
        acted = 0.0
        for k, (s, r, (l64, num, g64, _)) in enumerate(zip(steps, stock, truth)):
            assert s["num_tokens"] == num == r["num"], f"{what} step {k}: denominator"
            assert not r["skipped"], f"{what} step {k}: the stock run overflowed at a scale chosen not to"
            lgap, ldrift = abs(s["loss"] - l64) / abs(l64), abs(r["loss"] - l64) / abs(l64)
            gap, drift = _gap(s["grads"], g64), _gap(r["grads"], g64)
            acted = max(acted, lgap)
            assert lgap <= AMP_DRIFT * ldrift + AMP_FLOOR["loss"], f"{what} step {k}: loss {lgap:.2e} / {ldrift:.2e}"
            assert gap <= AMP_DRIFT * drift + AMP_FLOOR["grads"], f"{what} step {k}: grads {gap:.2e} / {drift:.2e}"
        assert acted > 1e-8, f"{what}: the autocast did not act (losses equal fp64's)"


def _untrained_checksum(family: str) -> float:
    """fcp train's parameter checksum of the float32 model before any step (a run of 0 steps cannot be asked for:
    the same weights, built the same way)."""
    cfg = _cfg(family, "allreduce", False, dtype="float32")
    model = hf.build_model(hf.load_config(cfg.model[3:]), dtype=torch.float32, seed=cfg.seed)
    with torch.no_grad():
        return float(sum(p.double().sum().item() * (i + 1) for i, p in enumerate(model.parameters())))


def test_amp_float16_visual_rows_do_not_overflow_where_the_stock_model_does_not():
    """Regression: the vision rows join the graph through a zero-weighted anchor added to the embeddings, whose
    gradient is the sum of every embedding gradient; computed in fp16 it overflowed under the loss scaler long
    before any real gradient (inf * 0 = NaN), and the step was skipped for nothing (Qwen2.5-VL at a scale of 2**16,
    one process, the whole global batch packed: step 2 skipped). Now the anchor is float32: over 4 steps at 2**16 —
    where the stock model under the same autocast and scaler overflows nowhere, and these batches' gradients overflow
    only from 2**18 on — no step is skipped, as in the stock run."""
    import dataclasses

    from fcp_exec.train import train

    scale = 2.0 ** 16
    cfg = dataclasses.replace(_cfg("qwen2_5_vl", "allreduce", False, dtype="float32", amp="float16", scale=scale),
                              tokens_per_rank=400, steps=4, return_grads=True)
    steps = train(cfg)["steps"]
    stock = _amp_reference("qwen2_5_vl", tuple(tuple(s["sample_indices"]) for s in steps), "float16", scale)
    assert [r["skipped"] for r in stock] == [False] * 4, "the stock run overflowed: the scale is not below the edge"
    assert [s["skipped_step"] for s in steps] == [False] * 4, [s["loss_scale"] for s in steps]
