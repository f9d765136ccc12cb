"""Cost-model presets read from Hugging Face configs (``fcp_data.hf_config``), against the real models.

References: for every example config (27 families: dense, MoE, multi-latent attention, sliding windows, vision
towers) the Hugging Face model built from it — its parameter count (the preset leaves norms and biases out: held to
1 %), the weights of its vision tower's and projector's linear and convolution layers (exactly), and the matmul
FLOPs of a forward pass counted by ``torch.utils.flop_counter`` at two lengths (``eager`` attention and experts, so
every matmul is an ATen call the counter sees): the per-token part equals ``2 × active_params`` and the per-token²
part equals the attention's ``2·H·(hd_qk + hd_v)`` per layer, both exactly. Full-size models: the published
parameter totals. The sliding-window term: the pairs a windowed layer really computes, counted by the mask rule.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._requires import transformers_models

transformers = transformers_models()

from fcp_data import hf_config  # noqa: E402
from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.hf_config import HF_PRESETS, hf_model_config  # noqa: E402
from fcp_data.presets import HARDWARE, ModelConfig, describe_presets, preset_cost_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "examples" / "configs").glob("*-tiny.json"))
VISION_PARTS = ("visual", "vision_tower", "vision_model", "multi_modal_projector")


def _model(path: Path):
    cfg = transformers.AutoConfig.from_pretrained(path)
    mllm = "vision_config" in cfg.to_dict()
    auto = transformers.AutoModelForImageTextToText if mllm else transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    return cfg, auto.from_config(cfg, attn_implementation="eager").eval()


def _flops(model, tokens: int) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(10, 1000, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    return counter.get_total_flops()


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name.removesuffix("-tiny.json") for p in CONFIGS])
def test_preset_counts_what_the_hugging_face_model_computes_and_holds(path):
    cfg, model = _model(path)
    m = hf_model_config(cfg)
    assert m == hf_model_config(f"{path}") == hf_model_config(json.loads(path.read_text()))  # object, file, dict
    vision = [mod for name, mod in model.named_modules() if name.split(".")[-1] in VISION_PARTS]
    held_vision = sum(p.numel() for mod in vision for p in mod.parameters())
    llm = sum(p.numel() for p in model.parameters()) - held_vision
    assert abs(m.stored_params / llm - 1) < 0.01, (m.stored_params, llm)  # norms and biases left out
    matmul_vision = sum(mod.weight.numel() for v in vision for mod in v.modules()
                        if isinstance(mod, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d)))
    assert m.vision_params == matmul_vision and (m.kind == "mllm") == bool(vision)
    a, b = 48, 96
    fa, fb = _flops(model, a), _flops(model, b)
    quad = (fb / b - fa / a) / (b - a)  # FLOPs = per_token·s + quad·s² (eager: every layer's full s×s matmuls)
    text = cfg.to_dict().get("text_config") or cfg.to_dict()
    v_dim = text.get("v_head_dim") or m.head_dim
    assert quad == pytest.approx(m.layers * 2 * m.heads * (m.head_dim + v_dim), rel=1e-9)
    assert fa / a - quad * a == pytest.approx(2 * m.active_params, rel=1e-9)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name.removesuffix("-tiny.json") for p in CONFIGS])
def test_the_rules_without_transformers_agree_with_its_config_classes(path, monkeypatch):
    """Where transformers is not installed a config.json is read as written: the window rules, head dims and tied
    embeddings the module assumes then must be the families' own defaults."""
    resolved = hf_model_config(path)
    monkeypatch.setattr(hf_config, "_resolved", lambda raw: raw)
    raw = json.loads(path.read_text())
    if path.name.startswith("exaone4"):  # its file leaves the window (4096, pattern "LLLG") at the class default
        raw.update(sliding_window=4096, sliding_window_pattern="LLLG")
    raw.setdefault("tie_word_embeddings", False)  # every example states it for its text config
    assert hf_model_config(raw) == resolved


def test_windows_and_mla_come_from_the_config():
    by_name = {p.name.removesuffix("-tiny.json"): hf_model_config(p) for p in CONFIGS}
    assert (by_name["gpt_oss"].window, by_name["gpt_oss"].window_layers) == (128, 1)  # sliding, full
    assert (by_name["gemma3_text"].window, by_name["gemma3_text"].window_layers) == (4096, 1)  # pattern 2
    assert by_name["mistral"].window_layers == by_name["mistral"].layers  # one window on every layer
    assert by_name["llama"].window == by_name["llama"].window_layers == 0
    mla = by_name["deepseek_v3"]  # ring runs H K/V heads of the q/k head dim (values padded): nope 8 + rope 4
    assert (mla.head_dim, mla.kv_heads) == (12, mla.heads)


# Published totals / parameters per token (the model cards; OpenAI's active counts leave the input embedding out,
# Qwen's and Mistral's count it: taken out here)
PUBLISHED = {"gpt-oss-20b": (20.91e9, 3.61e9), "gpt-oss-120b": (116.83e9, 5.13e9),
             "Qwen3-30B-A3B": (30.5e9, 3.3e9 - 151936 * 2048), "Qwen3-VL-30B-A3B": (31.1e9, 3.3e9 - 151936 * 2048),
             "Mixtral-8x7B": (46.7e9, 12.9e9 - 32000 * 4096), "Gemma-2-9B": (9.24e9, None)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_presets_match_the_published_parameter_counts(name):
    m = hf_model_config(HF_PRESETS[name])
    total, active = PUBLISHED[name]
    assert abs(m.total_params / total - 1) < 0.005
    if active is not None:
        assert abs(m.matmul_params / active - 1) < 0.02  # the published active counts are rounded to 2 digits


def test_deepseek_v3_config_gives_its_published_size_and_needs_more_than_one_rank_can_hold():
    cfg = dict(model_type="deepseek_v3", num_hidden_layers=61, hidden_size=7168, intermediate_size=18432,
               moe_intermediate_size=2048, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
               n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3, q_lora_rank=1536,
               kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280,
               tie_word_embeddings=False)
    m = hf_model_config(cfg)
    assert abs(m.total_params / 671e9 - 1) < 0.005 and abs(m.matmul_params / 37e9 - 1) < 0.02
    with pytest.raises(ValueError, match="does not fit on h200.*shard the weights"):
        preset_cost_model(cfg, "h200", shard_weights=True)


def _exact_window_pairs(s: int, w: int) -> int:
    """(query, key) pairs of a causal sliding window of w keys (itself included), by the mask rule i − w < j ≤ i."""
    i = np.arange(s)
    return int(np.minimum(i + 1, w).sum())


def test_windowed_layers_are_charged_the_pairs_they_compute():
    base = ModelConfig(layers=8, hidden=1024, heads=16, kv_heads=4, head_dim=64, ffn=4096, vocab=32000)
    w = 512
    half = ModelConfig(**{**{f: getattr(base, f) for f in base.__slots__}, "window": w, "window_layers": 4})
    full, win = preset_cost_model(base, "h100", v2=False), preset_cost_model(half, "h100", v2=False)
    per_layer = full.alpha1 / 8  # s/token² of one full causal layer: s² ≈ 2 × its pairs
    assert win.alpha1 == pytest.approx(4 * per_layer, rel=1e-12)
    # a windowed layer swaps K/V tails with its neighbours (fcp_exec.ring_halo): the ring's traffic is the full
    # layers', and a windowed layer pays two hand-shakes instead of the ring's steps
    assert win.alpha3 == pytest.approx(full.alpha3 / 2, rel=1e-12)
    hw = HARDWARE["h100"]
    assert win.beta2 == pytest.approx(4.0 * (4 * 7 + 4 * 2) * hw.latency_s, rel=1e-12)
    for s in (4 * w, 16 * w, 64 * w):
        charged = win.alpha2 * s - full.alpha2 * s  # four windowed layers
        exact = 4 * per_layer * 2 * _exact_window_pairs(s, w)
        assert abs(charged / exact - 1) <= w / (2 * s - w) + 1e-12  # the ramp of the first w queries
    text_only = preset_cost_model(base, "h100", v2=False)
    assert win.tokens_per_rank == text_only.tokens_per_rank  # windows change time, not memory


def test_moe_presets_need_sharded_weights_and_say_so():
    with pytest.raises(ValueError, match=r"gpt-oss-20b does not fit on h100.*shard_weights=True"):
        CostModel.preset("gpt-oss-20b", "h100")
    sharded = CostModel.preset("gpt-oss-20b", "h100", shard_weights=True)
    m, hw = hf_model_config(HF_PRESETS["gpt-oss-20b"]), HARDWARE["h100"]
    static = 16 * m.total_params / 64 + 8 * m.total_params / m.layers
    per_token = 2 * m.hidden * m.layers + 34 * m.hidden
    assert sharded.tokens_per_rank == int((hw.memory * hw.memory_fraction - static) / per_token) // 1024 * 1024
    rows = [r for r in describe_presets() if r["model"] == "gpt-oss-20b"]
    assert {r["hardware"]: r["weights"] for r in rows} == {"ascend-910c": "sharded", "h100": "sharded",
                                                             "h200": "replicated", "a100": "sharded"}


def test_named_presets_are_unchanged_by_the_new_fields():
    """The paper's presets keep their coefficients: the dense formulas with every new field at its default."""
    m = ModelConfig(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936)
    assert preset_cost_model("Qwen3-8B", "ascend-910c") == preset_cost_model(m, "ascend-910c")
    assert m.matmul_params == 36 * m.layer_params + 4096 * 151936


@pytest.mark.parametrize("bad, match", [
    ({"hidden_size": 64}, "no 'num_hidden_layers'"),  # no model_type: nothing fills the family's defaults
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 8,
      "num_key_value_heads": 3}, "no multiple of num_key_value_heads"),
    ({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100, "intermediate_size": 8,
      "num_experts": 4}, "4 experts but no top-k"),
    ({"num_hidden_layers": "2", "hidden_size": 64}, r"num_hidden_layers must be an integer in 1\.\.100000"),
    ({"num_hidden_layers": 10 ** 12, "hidden_size": 64}, "must be an integer in 1..100000"),  # no 1e12-layer loop
])
def test_configs_that_are_no_decoder_llm_are_one_clear_error(bad, match):
    with pytest.raises(ValueError, match=match):
        hf_model_config(bad)


HOSTILE = (None, 0, -3, 1.5, 10 ** 40, "x", "7", [], [3], {}, {"a": 1}, True, float("nan"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from([p.name for p in CONFIGS] + sorted(HF_PRESETS)), data=st.data())
def test_hostile_values_in_any_key_give_a_preset_or_one_value_error(name, data):
    """Any key of a real config (text, vision or top level) set to a hostile value: a ModelConfig or one ValueError
    — never another exception or a hang (the first line of a CLI error)."""
    base = json.loads((ROOT / "examples" / "configs" / name).read_text()) if name.endswith(".json") \
        else dict(HF_PRESETS[name])
    cfg = json.loads(json.dumps(base))
    for _ in range(data.draw(st.integers(1, 3))):
        where = cfg
        for sub in ("text_config", "vision_config"):
            if isinstance(cfg.get(sub), dict) and data.draw(st.booleans()):
                where = cfg[sub]
                break
        keys = sorted(where) + ["layer_types", "sliding_window_pattern", "num_experts", "mlp_only_layers"]
        where[data.draw(st.sampled_from(keys))] = data.draw(st.sampled_from(HOSTILE))
    try:
        m = hf_model_config(cfg)
    except ValueError as e:
        assert "\n" not in str(e) and len(str(e)) < 600
    else:
        assert isinstance(m, ModelConfig) and m.active_params > 0 and m.stored_params > 0 and m.vision_params >= 0


def test_unreadable_configs_are_one_clear_error(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    for source, match in ((tmp_path / "bad.json", "is not a JSON config"), (tmp_path / "list.json", "one JSON object"),
                          (tmp_path, "cannot read the Hugging Face config"), (7, "a path, a dict or a config")):
        with pytest.raises(ValueError, match=match):
            hf_model_config(source)


def _fcp(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fcp_cli.main", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_cli_plans_with_a_hugging_face_config_and_lists_its_preset(tmp_path):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in (120_000, 60_000, 30_000, 8_000, 4_000, 2_000)))
    config = ROOT / "examples" / "configs" / "gpt_oss-tiny.json"
    out = _fcp("presets", "--model", f"hf:{config}", "--hardware", "h100", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)
    assert row["alpha2"] == pytest.approx(preset_cost_model(f"hf:{config}", "h100").alpha2)
    plan = _fcp("plan", "--lengths", str(lengths), "--ranks", "16", "--preset", "gpt-oss-20b", "--hardware", "h100",
                "--shard-weights", "--json")
    assert plan.returncode == 0, plan.stderr
    assert sum(len(g["seq_ids"]) for mb in json.loads(plan.stdout)["micro_batches"] for g in mb["groups"]) == 6
    refused = _fcp("plan", "--lengths", str(lengths), "--ranks", "16", "--preset", "gpt-oss-20b", "--hardware", "h100")
    assert refused.returncode == 2 and "shard_weights" in refused.stderr and "Traceback" not in refused.stderr
    missing = _fcp("presets", "--model", f"hf:{tmp_path / 'nothing'}")
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
