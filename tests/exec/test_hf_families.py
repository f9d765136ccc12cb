"""More Hugging Face text model families trained with FCP on 2 gloo processes against single-process stock training.

Qwen2/2.5 (``qwen2``), Mistral (its 4,096-token sliding window, which every test document is shorter than), Phi-3,
OLMo 2, Granite (its attention, residual, embedding and logit multipliers), GLM-4, SmolLM3 (layers without rope),
Gemma, Gemma 3 (text; sliding-window layers), Cohere (parallel attention + MLP, interleaved rope, logit scale) and
Qwen3-MoE (4 experts, top-2; ``experts_implementation: "eager"`` in its config: the grouped-GEMM experts take no
float64), gpt-oss (MoE, attention sinks on every layer, a 128-token window on every other; its stock model has
no SDPA path and runs ``eager``) and DeepSeek-V3 (multi-latent attention: value heads narrower than query/key heads,
padded inside the ring; grouped top-k routing, a shared expert, a dense first layer), and the MoE families Mixtral,
Qwen2-MoE, GLM-4.5 (``glm4_moe``), OLMoE, and EXAONE 4 and Seed-OSS (``residual_dropout`` 0 in its config: dropout
is random, no reference could match it):
tiny random configs from ``examples/configs``, float64, 3 AdamW steps and one evaluation batch each, all in ONE
launch, through the real pipeline (FCPSampler → FCPCollator → ``apply_fcp`` ring attention → ``train_step``, the
allreduce reducer: DDP and FSDP2 do not depend on the model family and are ``test_hf_train.py``'s). Reference: the
stock model (``sdpa``, one document per forward) over the same global batches (``test_hf_train._reference``).

Asserted per family: step 0 — the same weights on both sides — loss to 1e-12 relative and every gradient to 1e-12
of the largest entry; every step's denominator exactly; plans that mix degree-2 groups, degree-1 groups and idle
ranks; parameters identical on both ranks. Later steps and the evaluation: to 1e-12 as well, except for the
families in ``ADAM_NOISE``, held to ADAM_LOSS / ADAM_GRAD: their step-0 gradients agree to 1e-16 of the largest
entry (measured 1.4e-17 … 9.7e-17), but AdamW divides each gradient by its running RMS + 1e-8, so entries whose
exact gradient is ~0 (these models have some) turn rounding noise into O(lr) differences in the update; measured
at step 2: losses 1e-12 … 5.8e-12 apart, gradients 4.3e-8 … 1.4e-7 of the largest entry.

A sliding window shorter than the documents (16 tokens: Mistral per call, Gemma 3 and gpt-oss on their sliding
layers, Qwen2 on every layer) trains like the stock model, whose own window mask is the reference; gpt-oss's sinks
are computed by the ring (``fcp_exec.kernels.base.add_sinks``; dropping them fails step 0: gradients 0.13 of the
largest entry apart), and so is Gemma 2's attention logit soft-capping (the masked path of
``fcp_exec.kernels.window``; its stock softmax runs in float32, hence ``FP32_SOFTMAX``).
"""

from __future__ import annotations

import functools
import json

import pytest
from _requires import transformers_models, without_cpu_fsdp2
import torch

transformers_models()

import test_hf_train as H  # noqa: E402 - the stock reference and the per-run checks (same folder)
from fcp_exec.launch import launch  # noqa: E402
from fcp_exec.train import TrainConfig, hf_preload, train_matrix  # noqa: E402

FAMILIES = ("qwen2", "mistral", "phi3", "olmo2", "granite", "glm4", "smollm3", "gemma", "gemma3_text", "cohere",
            "qwen3_moe", "gpt_oss", "deepseek_v3", "gemma2", "mixtral", "qwen2_moe", "glm4_moe", "exaone4", "seed_oss",
            "olmoe")
ADAM_NOISE = ("gemma", "gemma3_text", "cohere")
# gpt-oss's sinks are a parameter of their own (each rank's share of their gradient reduced like any weight's): DDP
# and FSDP2, with activation checkpointing (the ring and its sinks run again inside the backward)
SINK_REDUCERS = without_cpu_fsdp2([("gpt_oss", "ddp"), ("gpt_oss", "fsdp2")])
ADAM_LOSS, ADAM_GRAD = 1e-9, 1e-5
# DeepSeek-V3's router scores in float32 (its own ``F.linear(hidden.float(), weight.float())``), so its weight's
# gradient carries float32 rounding of sums taken in another order: step 0 within this of the largest entry
# (measured 2.7e-10; the loss equal), later steps within ADAM_LOSS / ADAM_GRAD (measured 7.8e-11 / 7.0e-8)
FP32_ROUTER = {"deepseek_v3": 1e-8, "glm4_moe": 1e-8}  # GLM-4.5's router too (measured 8.2e-11)
# Gemma 2's stock (eager) attention takes its softmax in float32 — the reference itself carries float32 rounding:
# (loss, gradient) at step 0 within the first pair (measured 3e-10 / 2e-7; a cap of 0.05 left out moves them to
# 1.2e-6 / 2.4e-3: the windowed variant's cap, WINDOWED), later steps and the evaluation after AdamW within the
# second (measured 9e-10 / 1.3e-6 at step 2, the evaluation's loss 2.8e-7)
FP32_SOFTMAX = {"gemma2": ((1e-8, 1e-5), (1e-6, 1e-4))}


def _step0_tols(family: str) -> tuple[float, float]:
    return FP32_SOFTMAX[family][0] if family in FP32_SOFTMAX else (1e-12, FP32_ROUTER.get(family, 1e-12))


def _later_tols(family: str) -> tuple[float, float]:
    if family in FP32_SOFTMAX:
        return FP32_SOFTMAX[family][1]
    return (ADAM_LOSS, ADAM_GRAD) if family in ADAM_NOISE or family in FP32_ROUTER else (H.TOL, H.TOL)


WINDOW = 16  # tokens: the synthetic documents run to 80, so most are longer
WINDOWED = {"mistral": {"sliding_window": WINDOW}, "gemma3_text": {"sliding_window": WINDOW},
            "gpt_oss": {"sliding_window": WINDOW},
            # Gemma 2: its 4,096-token window and its cap of 50 change nothing on these tiny scores; here both bite
            "gemma2": {"sliding_window": WINDOW, "attn_logit_softcapping": 0.05},
            "qwen2": {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 0}}


@functools.lru_cache(maxsize=None)
def _windowed_configs() -> dict[str, str]:
    """``{family: config path}``: the family's tiny config with a 16-token sliding window (written once)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="fcp-windowed-")
    out = {}
    for family, changes in WINDOWED.items():
        raw = json.loads((H.CONFIGS / f"{family}-tiny.json").read_text())
        raw.update(changes)
        path = f"{folder}/{family}-window.json"
        with open(path, "w") as f:
            json.dump(raw, f)
        out[family] = path
    return out


def _windowed_cfg(family: str) -> TrainConfig:
    return TrainConfig(model=f"hf:{_windowed_configs()[family]}", reducer="allreduce", grad_checkpointing=False,
                       **H.COMMON)


@functools.lru_cache(maxsize=None)
def _matrix():
    cfgs = [H._cfg(f, "allreduce", False) for f in FAMILIES] + [_windowed_cfg(f) for f in WINDOWED]
    cfgs += [H._cfg(f, reducer, True) for f, reducer in SINK_REDUCERS]
    try:
        per_rank = launch(train_matrix, 2, cfgs, timeout=900.0, pg_timeout=120.0, preload=hf_preload(cfgs))
    except Exception as exc:  # noqa: BLE001 - re-raised by every test that needs this launch
        return cfgs, exc
    return cfgs, [dict(per_rank[0][k], checksums=[r[k]["param_checksum"] for r in per_rank]) for k in range(len(cfgs))]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_like_the_stock_model(family):
    cfgs, results = _matrix()
    if isinstance(results, Exception):
        raise results
    [(cfg, res)] = [(c, r) for c, r in zip(cfgs, results)
                    if c.model.endswith(f"/{family}-tiny.json") and c.reducer == "allreduce"]
    steps = res["steps"]
    batches = tuple(tuple(s["sample_indices"]) for s in steps)
    ref = H._reference(family, batches)
    loss0, _, grads0, _ = ref[0]
    ltol, gtol = _step0_tols(family)
    assert abs(steps[0]["loss"] - loss0) <= ltol * abs(loss0), (family, steps[0]["loss"], loss0)
    assert H._gap(steps[0]["grads"], grads0) <= gtol, (family, H._gap(steps[0]["grads"], grads0))
    ltol, gtol = _later_tols(family)
    degrees = H._check_run(family, 2, cfg, res, tol=ltol, gtol=gtol)
    assert any(2 in mb for mb in degrees) and any(1 in mb for mb in degrees), degrees
    assert any(sum(mb) < 2 for mb in degrees), f"no micro-batch with an idle rank in {degrees}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family, reducer", SINK_REDUCERS)
def test_attention_sinks_train_like_the_stock_model_with_ddp_and_fsdp2(family, reducer):
    """gpt-oss with DDP and FSDP2 (its sinks then an FSDP2-sharded parameter, unsharded for the forward) and activation
    checkpointing: every step and the evaluation equal the stock model's to 1e-12, parameters equal on both ranks."""
    cfgs, results = _matrix()
    if isinstance(results, Exception):
        raise results
    [(cfg, res)] = [(c, r) for c, r in zip(cfgs, results)
                    if c.model.endswith(f"/{family}-tiny.json") and c.reducer == reducer]
    assert cfg.grad_checkpointing
    degrees = H._check_run(family, 2, cfg, res)
    assert any(2 in mb for mb in degrees), degrees


def test_sliding_windows_of_the_configs_are_really_there():
    """The windows the launch runs with (so the equal results above include a layer with a window): Mistral's comes
    with every call from its config, Gemma 3's sits on its sliding layers; gpt-oss alternates windowed and full layers,
    each with its sinks, and its stock model is built with eager attention (it has no SDPA path)."""
    from fcp_exec.integrations.hf import build_model

    assert json.loads((H.CONFIGS / "mistral-tiny.json").read_text())["sliding_window"] == 4096
    model = build_model(H.CONFIGS / "gemma3_text-tiny.json", dtype=torch.float64)
    windows = {getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers}
    assert 4096 in windows, windows
    model = build_model(H.CONFIGS / "gpt_oss-tiny.json", dtype=torch.float64)
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == [128, None]
    assert all(layer.self_attn.sinks.abs().sum() > 0 for layer in model.model.layers)
    assert model.config._attn_implementation == "eager"


def _config_with(tmp_path, family: str, **changes) -> str:
    raw = json.loads((H.CONFIGS / f"{family}-tiny.json").read_text())
    raw.update(changes)
    path = tmp_path / f"{family}.json"
    path.write_text(json.dumps(raw))
    return f"hf:{path}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", sorted(WINDOWED))
def test_a_sliding_window_shorter_than_the_documents_trains_like_the_stock_model(family):
    """A 16-token sliding window over documents of up to 80 tokens — Mistral's passed per call, Gemma 3's on its
    sliding layers (and gpt-oss's with its sinks, Gemma 2's with a cap of 0.05), Qwen2's on every layer
    (``use_sliding_window``) — trains like the stock model, whose own sliding-window mask is the reference: the same
    checks as above (step 0 to 1e-12, Gemma 2 to FP32_SOFTMAX; Gemma 3 later steps within ADAM_LOSS / ADAM_GRAD).
    Ignoring the window (full causal attention) fails at step 0."""
    cfgs, results = _matrix()
    if isinstance(results, Exception):
        raise results
    path = _windowed_configs()[family]
    [(cfg, res)] = [(c, r) for c, r in zip(cfgs, results) if c.model == f"hf:{path}"]
    steps = res["steps"]
    loss0, _, grads0, _ = H._reference(path, tuple(tuple(s["sample_indices"]) for s in steps))[0]
    ltol, gtol = _step0_tols(family)
    assert abs(steps[0]["loss"] - loss0) <= ltol * abs(loss0), (family, steps[0]["loss"], loss0)
    assert H._gap(steps[0]["grads"], grads0) <= gtol, (family, H._gap(steps[0]["grads"], grads0))
    ltol, gtol = _later_tols(family)
    H._check_run(path, 2, cfg, res, tol=ltol, gtol=gtol)


def test_an_moe_router_loss_fcp_does_not_compute_is_refused_not_dropped():
    """JetMoE with ``output_router_logits=True`` adds its router's load-balancing loss to its own loss; fcp computes
    that loss over the global batch for the families of ``test_hf_router_loss.py``, not this one (its attention is a
    mixture of experts too), so apply_fcp refuses the model instead of training without the term."""
    import transformers

    from fcp_exec.integrations.hf import apply_fcp

    cfg = transformers.AutoConfig.for_model("jetmoe", vocab_size=2000, hidden_size=32, num_hidden_layers=1,
                                            num_key_value_heads=2, kv_channels=8, num_local_experts=4,
                                            num_experts_per_tok=2, output_router_logits=True)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(ValueError, match=r"JetMoeForCausalLM adds its MoE router's load-balancing loss "
                                         r"\(output_router_logits=True\), which fcp computes over the global batch for "
                                         r"mixtral, .* only; set it to False"):
        apply_fcp(model)


def test_softcapping_and_sinks_are_not_refused_but_dropout_is():
    """Soft-capping (Gemma 2) and sinks (gpt-oss) reach the ring; attention dropout is refused with one error."""
    from fcp_exec.integrations.hf_models import attention_limits

    assert attention_limits(torch.nn.Module(), 0.0, {"softcap": 50.0, "s_aux": torch.zeros(2)}, None) is None
    with pytest.raises(ValueError, match=r"does not implement attention dropout \(got 0.1\)"):
        attention_limits(torch.nn.Module(), 0.1, {}, None)


_SMALL = dict(vocab_size=2000, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8)
MIXING = [  # (model type, config changes, what the one-line refusal names)
    ("qwen3_next", {}, r"layer types \['linear_attention'\]"),  # gated DeltaNet layers
    ("jamba", {}, r"layer types \['linear_attention'\]"),  # Mamba layers
    ("falcon_h1", {}, r"layer types \['hybrid'\]"),  # Mamba2 beside attention in every layer
    ("lfm2", {"layer_types": ["conv", "full_attention"]}, r"layer types \['conv'\]"),  # short convolutions
    ("llama4_text", {}, r"layer types \['chunked_attention'\]"),  # attention within 8,192-token chunks
    ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional attention"),
    ("rwkv", {"num_attention_heads": None, "num_key_value_heads": None, "head_dim": None, "intermediate_size": None},
     r"its module \S+ \(Rwkv\w+\) mixes tokens outside attention"),  # no layer types: found by its modules
]


@pytest.mark.parametrize("model_type, changes, reason", MIXING, ids=[m[0] for m in MIXING])
def test_models_that_mix_tokens_outside_attention_are_refused(model_type, changes, reason):
    """Ring attention sees a document spread over a CP group only inside its attention calls: a model that mixes
    tokens anywhere else (linear attention, state-space or convolution layers, chunked or bidirectional attention)
    would train silently wrong (each rank's layer seeing its zigzag shard), so apply_fcp refuses it with one line
    naming what it found — before, these were accepted with a "not tested" warning."""
    from transformers import AutoConfig

    from fcp_exec.integrations.hf import apply_fcp, build_model

    kw = {k: v for k, v in {**_SMALL, **changes}.items() if v is not None}
    model = build_model(AutoConfig.for_model(model_type, **kw), dtype=torch.float32)
    with pytest.raises(ValueError, match=rf"cannot train with FCP: .*{reason}"):
        apply_fcp(model)


def test_no_tested_family_is_taken_for_one_that_mixes_tokens_elsewhere():
    """The check's patterns (layer types, class names such as Mamba or ShortConv, ``nn.Conv1d``) flag none of the
    model types fcp trains (every example config, vision models included)."""
    from fcp_exec.integrations.hf import build_model
    from fcp_exec.integrations.hf_models import other_token_mixing

    configs = sorted(H.CONFIGS.glob("*-tiny.json"))
    assert len(configs) >= 25
    flagged = {p.name: other_token_mixing(build_model(p, dtype=torch.float32)) for p in configs}
    assert not {k: v for k, v in flagged.items() if v}, flagged
