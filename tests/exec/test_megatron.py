"""Megatron-core GPT models trained with FCP on 3 real gloo processes equal the stock model trained in one process.

The whole Megatron training stack runs: ``GPTModel`` (local layer spec) built with
:func:`fcp_exec.integrations.megatron.fcp_layer_spec` + ``apply_fcp``, Megatron's ``DistributedDataParallel``, its
``get_forward_backward_func()`` schedule with :func:`~fcp_exec.integrations.megatron.forward_step` over FCPSampler →
FCPDataset → FCPCollator micro-batches (``next_global_batch``), ``finalize_model_grads`` with the per-token loss, and
Megatron's own optimizer (Adam). The reference is the same stock model (Megatron's ``DotProductAttention``, its own
causal / sliding-window mask, positions ``0..n-1``) in one process, one document per micro-batch, over the same
global batches, with the same DDP, schedule, finalize and optimizer. Megatron-core runs on the CPU through
``tests/exec/_megatron_cpu.py`` (it redirects Megatron's hard-coded CUDA device placement; the computation is
Megatron's).

Models (float64, 2 layers): Llama-style (RoPE, GQA, RMSNorm, SwiGLU), Qwen3-style (+ QK layer norm), a sliding
window on every other layer (``window_size=(6, 0)``, ``window_attn_skip_freq=2``), Llama with full activation
recomputation (the ring attention runs again inside the backward), GPT-2-style (learned absolute positions,
LayerNorm, biases), attention sinks as gpt-oss has them (``softmax_type="learnable"``, a learned logit per head,
with the sliding window on every other layer) and ``softmax_type="off-by-one"`` (a zero logit), multi-latent attention
as DeepSeek-V3 has it (``MLATransformerConfig``: low-rank q and kv projections, a shared rope key of 4 dims, value heads
of 6 against query/key heads of 12; RoPE, and YaRN with its mscale — megatron-core 0.16's local spec has no core
attention for it, only Transformer Engine's, so its reference is ``_megatron_cpu.DenseCoreAttention``, dense causal
float64 softmax attention per document; the rest of the layer is Megatron's), a mixture of experts (4 experts, top-2,
the all-gather dispatcher, no auxiliary loss) and DeepSeek-V3's combination (multi-latent attention, a sigmoid router
with the auxiliary-loss-free expert bias, a shared expert: the routers count real tokens only, pads and idle dummies
masked by ``padding_mask``, so the bias updates equal the one-process run's) and DeepSeek-V3's multi-token prediction
(``mtp_num_layers=2``, ``mtp_loss_scaling_factor=0.3``: each MTP module a transformer layer with FCP's core attention;
the tokens and labels ahead from ``FCPCollator(future_tokens=2)`` where Megatron rolls them along the sequence, the
reference rolling each whole document itself, its loss mask handed to the model; rolling this rank's shard instead
misses step 0's gradient norm by 8.4e-4 relative); Llama fed the
DataLoader's iterator itself with a fixed 2 micro-batches per step (Megatron-LM's
``pretrain()``), ``forward_step`` preparing each batch; and Llama on a dataset whose sample 9 fails to read on every
rank and sample 6 on one rank of its CP group only (agreed in the group: label-free on all of its ranks), against the
stock model trained on the samples that were read; and Qwen3 on the samples' own labels (SFT: each document's first
third, its prompt, masked; ``FCPCollator(sample_labels=True)``) against the stock model with that loss mask; and
Llama with Megatron's DDP overlapping its bucketed gradient all-reduces with the last micro-batch's backward (while
that backward's ring attention exchanges blocks). Megatron's distributed optimizer and its mixed-precision optimizer
assert CUDA tensor types, so they are not run here. Asserted per step: the global loss and token count, Megatron's gradient norm; after
the steps, every parameter; and that the plans mixed groups of degree 1, 2 and 3 with idle ranks, and 1 or 2
micro-batches per global batch.
Tolerances: Megatron's cross-entropy computes in float32 (it casts the float64 logits), so losses and gradients
carry float32 rounding, and the loss reports are float32 sums taken in another order: losses to 1e-6 relative
(measured ≤ 1e-7); gradient norms to 1e-9 relative and parameters to 1e-10 absolute (measured: equal norms,
parameters within 8e-13; they are O(0.1) and moved 0.04 by the steps), DeepSeek's to 1e-8 (``PARAM_TOL``). A wrong
position, mask or group moves them by 1e-3 or more.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from fcp_data import CostModel
from fcp_exec.launch import launch

# megatron-core is imported only in the launched processes (not in the pytest worker)
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core"),
              pytest.mark.timeout(900)]  # hang guards: the module's runs (its first test's setup) took 153 s of 300

NAMES = ("llama", "qwen3", "window", "recompute", "gpt2", "sinks", "off-by-one", "mla", "mla-yarn", "moe", "deepseek",
         "mtp")
RAW = "-loader"  # the same model fed the DataLoader's iterator directly (Megatron-LM's pretrain() with its own loop)
SKIP = "-damaged"  # sample 9 fails to read on every rank, sample 6 (71 tokens: a group of 2+) on rank 1 only
SFT = "-sft"  # the samples' own labels, the first third of each document (its prompt) masked
OVERLAP = "-overlap"  # Megatron's DDP overlapping its gradient reduction with the last micro-batch's backward
RUNS = NAMES + ("llama" + RAW, "llama" + SKIP, "qwen3" + SFT, "llama" + OVERLAP)
RAW_MICRO_BATCHES = 2
# Megatron's sigmoid router scores in float32 (``sigmoid(logits.float())``): a last-bit difference of an fp64 logit
# between the two runs' matmuls (other token sets) can round a gate to the next float32 (6e-8 relative); measured
# after the steps: 4.4e-9 on one expert's weights (1.3e-9 with Adam's eps at 1e-4), every other parameter < 1e-12
PARAM_TOL = {"deepseek": 1e-8}
LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58, 27, 44, 6, 61]
NPROC = 3
GBS = 4
STEPS = 4
LR = 1e-2


def _docs() -> list[torch.Tensor]:
    from _megatron_cpu import VOCAB

    g = torch.Generator().manual_seed(0)
    return [torch.randint(1, VOCAB, (n,), generator=g) for n in LENGTHS]


def _optimizer(model):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    # clip_grad=0: Megatron's clipping asserts CUDA tensors (the gradient norm is still computed and returned)
    cfg = OptimizerConfig(optimizer="adam", lr=LR, weight_decay=0.01, clip_grad=0.0, bf16=False, fp16=False,
                          params_dtype=torch.float64, use_distributed_optimizer=False)
    return get_megatron_optimizer(cfg, [model])


def _wrap(model, config, overlap: bool = False):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    ddp = DistributedDataParallelConfig(overlap_grad_reduce=overlap)
    model = DistributedDataParallel(config, ddp, model)
    config.no_sync_func, config.finalize_model_grads_func = model.no_sync, finalize_model_grads
    return model


def _params(model) -> dict[str, torch.Tensor]:
    return {k.removeprefix("module."): v.detach().clone() for k, v in model.named_parameters()}


def _train_fcp() -> dict:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import _megatron_cpu as mc
    from fcp_data import FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.integrations.megatron import apply_fcp, forward_step, global_loss, next_global_batch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    mc.init_megatron()
    rank, world = dist.get_rank(), dist.get_world_size()
    data = [{"input_ids": d} for d in _docs()]
    out = {}
    for name in RUNS:
        raw = name.endswith(RAW)
        model, config = mc.build_gpt(_model(name), fcp=True)
        model = _wrap(apply_fcp(model), config, name.endswith(OVERLAP))
        opt = _optimizer(model)
        cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=48)
        sampler = FCPSampler([len(d) for d in _docs()], num_ranks=world, rank=rank, global_batch_size=GBS, seed=0,
                             cost_model=cost, micro_batches=RAW_MICRO_BATCHES if raw else "auto")
        sft = name.endswith(SFT)
        items = [dict(d, labels=_prompt_masked(d["input_ids"])) for d in data] if sft else data
        dataset = FCPDataset(_Damaged(items, rank) if name.endswith(SKIP) else items)
        collate = FCPCollator(pad_token_id=0, sample_labels=sft, future_tokens=config.mtp_num_layers or 0)
        batches = iter(DataLoader(dataset, batch_sampler=sampler, collate_fn=collate))
        schedule = get_forward_backward_func()
        run = {"loss": [], "norm": [], "indices": [], "degrees": [], "skipped": []}
        for _ in range(STEPS):
            seen: list[dict] = []
            if raw:  # Megatron-LM's pretrain(): the loader's own iterator, a fixed number of micro-batches
                feed, num_mb = _recording(batches, seen), RAW_MICRO_BATCHES
            else:
                seen = next_global_batch(batches, model)
                feed, num_mb = iter(seen), len(seen)
            model.zero_grad_buffer()
            opt.zero_grad()
            reports = schedule(forward_step_func=forward_step, data_iterator=feed, model=[model],
                               num_microbatches=num_mb, seq_length=128, micro_batch_size=1)
            _, norm, _ = opt.step()
            run["loss"].append(global_loss(reports))
            run["norm"].append(float(norm))
            run["indices"].append(sorted(i for b in seen for i in b.get("sample_indices", ())))
            run["skipped"].append(sorted(r["index"] for b in seen for r in b.get("skipped_samples", ())))
            run["degrees"].append([0 if b.get("idle") or not b["ranks"] else len(b["ranks"]) for b in seen])
        run["params"] = _params(model) if rank == 0 else None
        out[name] = run
    return out


def _model(run: str) -> str:
    return run.removesuffix(RAW).removesuffix(SKIP).removesuffix(SFT).removesuffix(OVERLAP)


def _prompt_masked(doc: torch.Tensor) -> torch.Tensor:
    """Labels as a dataset carries them (aligned with the tokens, not shifted): the first third masked."""
    return torch.where(torch.arange(len(doc)) < len(doc) // 3, torch.full_like(doc, -100), doc)


class _Damaged:
    """The documents, with sample 9 unreadable everywhere and sample 6 unreadable on rank 1 (a flaky mount)."""

    def __init__(self, data: list, rank: int) -> None:
        self.data, self.rank = data, rank

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        if i == 9 or (i == 6 and self.rank == 1):
            raise OSError(f"sample {i}: damaged")
        return self.data[i]


def _recording(batches, seen: list):
    for batch in batches:
        seen.append(batch)
        yield batch


def _reference_step(data_iterator, model):
    from fcp_exec.integrations.megatron import loss_func

    doc, sft = next(data_iterator)
    n = len(doc)
    own = _prompt_masked(doc) if sft else doc
    targets = torch.cat([own[1:], own.new_full((1,), -100)])  # token t predicts t + 1; the last predicts nothing
    mask = targets != -100
    out = model(doc[None], torch.arange(n)[None], None, labels=targets.clamp(min=0)[None], loss_mask=mask[None])
    return out, lambda t: loss_func(mask, t)


def _train_reference(batches: dict) -> dict:
    import _megatron_cpu as mc
    from fcp_exec.integrations.megatron import global_loss
    from megatron.core.pipeline_parallel import get_forward_backward_func

    mc.init_megatron()
    docs = _docs()
    out = {}
    for name in RUNS:
        model, config = mc.build_gpt(_model(name), fcp=False)
        model = _wrap(model, config)
        opt = _optimizer(model)
        schedule = get_forward_backward_func()
        run = {"loss": [], "norm": [], "initial": _params(model)}
        for batch in batches[name]:
            model.zero_grad_buffer()
            opt.zero_grad()
            feed = iter([(docs[i], name.endswith(SFT)) for i in batch])
            reports = schedule(forward_step_func=_reference_step, data_iterator=feed,
                               model=[model], num_microbatches=len(batch), seq_length=128, micro_batch_size=1)
            _, norm, _ = opt.step()
            run["loss"].append(global_loss(reports))
            run["norm"].append(float(norm))
        run["params"] = _params(model)
        out[name] = run
    return out


@pytest.fixture(scope="module")
def runs():
    fcp = launch(_train_fcp, NPROC, timeout=600.0, pg_timeout=120.0)
    batches, skipped = {}, {}
    for name in RUNS:
        per_rank = [r[name]["indices"] for r in fcp]
        skipped[name] = [set().union(*step) for step in zip(*(r[name]["skipped"] for r in fcp))]
        # a CP group's sample is on each of its ranks; the reference trains on the samples that were read
        batches[name] = [sorted(set().union(*step) - gone) for step, gone in zip(zip(*per_rank), skipped[name])]
    ref = launch(_train_reference, 1, batches, timeout=600.0)[0]
    return fcp, ref, batches, skipped


@pytest.mark.parametrize("name", RUNS)
def test_megatron_fcp_training_equals_the_stock_model_in_one_process(runs, name):
    fcp, ref, batches, skipped = runs
    r0, want = fcp[0][name], ref[name]
    gone = set().union(*skipped[name])
    assert gone == ({6, 9} if name.endswith(SKIP) else set()), gone  # the partial failure was agreed in its group
    assert all(len(b) + len(s) == GBS for b, s in zip(batches[name], skipped[name]))
    assert len({i for b in batches[name] for i in b} | gone) == GBS * STEPS
    for step in range(STEPS):
        (l0, n0), (lr, nr) = r0["loss"][step], want["loss"][step]
        assert all(r[name]["loss"][step] == (l0, n0) for r in fcp), "every rank reports the same global loss"
        assert n0 == nr and math.isclose(l0, lr, rel_tol=1e-6), (step, l0, n0, lr, nr)
        assert math.isclose(r0["norm"][step], want["norm"][step], rel_tol=1e-9), (step, r0["norm"][step],
                                                                                 want["norm"][step])
    got, exp = r0["params"], want["params"]
    assert got.keys() == exp.keys()
    worst = max(float((got[k] - exp[k]).abs().max()) for k in exp)
    moved = max(float((exp[k] - v).abs().max()) for k, v in want["initial"].items())
    assert worst <= PARAM_TOL.get(name, 1e-10) < moved, (worst, moved)
    degrees = {d for r in fcp for step in r[name]["degrees"] for d in step}
    assert {0, 2} <= degrees and (1 in degrees or 3 in degrees), degrees  # idle ranks, groups of degree 1-3
    counts = {len(step) for step in r0["degrees"]}
    assert counts == {RAW_MICRO_BATCHES} if name.endswith(RAW) else len(counts) > 1, counts


def _error(fn) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test compares the type and the message
        return type(e).__name__, str(e)
    return "no error", ""


def _misuse() -> dict:
    import _megatron_cpu as mc
    from fcp_exec.integrations.megatron import apply_fcp, batch_inputs, fcp_layer_spec, forward_step

    mc.init_megatron()
    batch = {"input_ids": torch.arange(4), "labels": torch.arange(4), "position_ids": torch.arange(4),
             "cu_seqlens": torch.tensor([0, 4], dtype=torch.int32), "ranks": (0,)}

    def stock_spec():
        apply_fcp(mc.build_gpt("llama", fcp=False)[0])

    def per_micro_batch_loss():
        model, config = mc.build_gpt("llama", fcp=True)
        config.calculate_per_token_loss = False
        apply_fcp(model)

    def tensor_parallel():
        model, config = mc.build_gpt("llama", fcp=True)
        config.tensor_model_parallel_size = 2
        apply_fcp(model)

    def expert_tensor_parallel():  # Megatron allows ETP != TP; FCP runs every rank as data-parallel
        model, config = mc.build_gpt("llama", fcp=True)
        config.expert_tensor_parallel_size = 2
        apply_fcp(model)

    def dropout():
        mc.MODELS["dropout"] = ({"attention_dropout": 0.1}, {}, {})
        mc.build_gpt("dropout", fcp=True)

    def window_ahead():
        mc.MODELS["ahead"] = ({"window_size": (4, 2)}, {}, {})
        mc.build_gpt("ahead", fcp=True)

    def count_mismatch():  # Megatron-LM's calculator says 3 micro-batches per global batch, the plan 2
        from megatron.core import num_microbatches_calculator as calc

        calc.init_num_microbatches_calculator(0, None, 3, 1, 1)
        try:
            model = apply_fcp(mc.build_gpt("llama", fcp=True)[0])
            forward_step(iter([dict(batch, micro_batch=0, num_micro_batches=2, plan_digest=0)]), model)
        finally:
            calc.destroy_num_microbatches_calculator()

    def mla_rope_fusion():  # Megatron's fused MLA rope numbers tokens by its own CP layout
        model, config = mc.build_gpt("mla", fcp=True)
        config.apply_rope_fusion = True
        apply_fcp(model)

    def plain_forward():
        model = apply_fcp(mc.build_gpt("llama", fcp=True)[0])
        model(torch.arange(4)[None], torch.arange(4)[None], None)

    def mtp_without_lookahead():  # a collator without future_tokens for a model with mtp_num_layers=2
        model = apply_fcp(mc.build_gpt("mtp", fcp=True)[0])
        batch_inputs(dict(batch, future_ids=torch.zeros(1, 4, dtype=torch.long)), model)

    return {"stock spec": _error(stock_spec), "per micro-batch loss": _error(per_micro_batch_loss),
            "tensor parallel": _error(tensor_parallel), "dropout": _error(dropout),
            "expert tensor parallel": _error(expert_tensor_parallel),
            "window ahead": _error(window_ahead), "plain forward": _error(plain_forward),
            "mla rope fusion": _error(mla_rope_fusion), "mtp without look-ahead": _error(mtp_without_lookahead),
            "micro-batch count": _error(count_mismatch),
            "not applied": _error(lambda: batch_inputs(batch, mc.build_gpt("llama", fcp=True)[0])),
            "not a spec": _error(lambda: fcp_layer_spec(object()))}


MISUSE = {"stock spec": ("ValueError", "fcp_layer_spec"),
          "per micro-batch loss": ("ValueError", "calculate_per_token_loss=True"),
          "tensor parallel": ("ValueError", "tensor_model_parallel_size=2 must be 1"),
          "expert tensor parallel": ("ValueError", "expert_tensor_parallel_size=2 must be 1"),
          "dropout": ("ValueError", "attention_dropout=0.1"),
          "window ahead": ("ValueError", "window_size=(left, 0)"),
          "plain forward": ("ValueError", "batch_inputs(batch, model)"),
          "mla rope fusion": ("ValueError", "set apply_rope_fusion=False"),
          "mtp without look-ahead": ("ValueError", "FCPCollator(future_tokens=2)"),
          "micro-batch count": ("ValueError", "FCPSampler(micro_batches=3)"),
          "not applied": ("ValueError", "apply_fcp(model) before batch_inputs"),
          "not a spec": ("TypeError", "not a Megatron transformer layer spec")}


@pytest.fixture(scope="module")
def misuse():
    return launch(_misuse, 1, timeout=300.0)[0]


@pytest.mark.parametrize("case", MISUSE)
def test_misuse_is_one_clear_error(misuse, case):
    kind, phrase = MISUSE[case]
    got_kind, msg = misuse[case]
    assert got_kind == kind and phrase in msg, (case, got_kind, msg)
