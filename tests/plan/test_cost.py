"""The §4 cost model and the presets derived from model configs and hardware specs.

Formula tests recompute T by hand from DESIGN §4; a failure means every solver is optimising the wrong
objective. Preset tests check the derivation (FLOP and byte counts) and its stated consequences.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fcp_data.cost import COST_KEYS, CostModel
from fcp_data.presets import HARDWARE, MODELS, describe_presets, model_heads, preset_cost_model

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)


def _by_hand(lengths, etas, d, intra):
    v = CM.bandwidth_intra if intra else CM.bandwidth_inter
    A = CM.alpha1 * sum((1 + e) * s * s for s, e in zip(lengths, etas)) / d
    C = A + CM.alpha2 * sum(lengths) / d + CM.beta1
    X = 0.0 if d == 1 else CM.alpha3 * sum(lengths) * (d - 1) / d / v
    M = 0.0 if d == 1 else X + CM.beta2
    return C + M - min(A, X)


@pytest.mark.parametrize("lengths,etas,ranks", [
    ([1000], [0], [0]),
    ([5000, 300], [0, 1], [0, 1, 2]),
    ([20000], [1], [2, 3, 4, 5]),          # crosses nodes 0 and 1: inter-node bandwidth
    ([100, 100, 100], [0, 0, 0], [4, 5, 6, 7]),
])
def test_group_time_matches_design_formula(lengths, etas, ranks):
    """group_time on real ranks == §4 by hand (rel. 1e-12)."""
    intra = len({r // CM.ranks_per_node for r in ranks}) == 1
    assert CM.group_time(lengths, etas, ranks) == pytest.approx(_by_hand(lengths, etas, len(ranks), intra), rel=1e-12)


def test_time_is_vectorised_and_overlap_is_max():
    """T = max(A, X) + alpha2·S/d + beta1 + beta2·[d>1]: the identity the ILP relies on."""
    S = np.array([1e3, 5e4, 2e5])
    Q = S * S
    for d in (1, 2, 3, 8):
        T = CM.time(S, Q, d, intra=False)
        A = CM.alpha1 * Q / d
        X = 0 if d == 1 else CM.alpha3 * S * (d - 1) / d / CM.bandwidth_inter
        np.testing.assert_allclose(T, np.maximum(A, X) + CM.alpha2 * S / d + CM.beta1 + (CM.beta2 if d > 1 else 0), rtol=1e-12)


def test_from_dict_is_strict():
    d = CM.to_dict()
    assert tuple(d) == COST_KEYS and CostModel.from_dict(json.loads(json.dumps(d))) == CM
    with pytest.raises(ValueError, match="unknown extra"):
        CostModel.from_dict({**d, "extra": 1})
    bad = dict(d)
    bad.pop("alpha3")
    with pytest.raises(ValueError, match="missing alpha3"):
        CostModel.from_dict(bad)
    with pytest.raises(ValueError, match="bandwidth_intra"):
        CostModel.from_dict({**d, "bandwidth_intra": 0})


def test_every_preset_is_valid_and_listed():
    """Every Table 7/8 model on every hardware gives a valid CostModel with replicated weights; the named Hugging
    Face presets too (the MoE ones with their weights sharded, gpt-oss-120b on a 910C die with 7,168 tokens)."""
    from fcp_data.hf_config import HF_PRESETS

    rows = describe_presets()
    assert len(rows) == (len(MODELS) + len(HF_PRESETS)) * len(HARDWARE)
    for r in rows:
        cm = CostModel.from_dict({k: r[k] for k in COST_KEYS})
        table = r["model"] in MODELS
        assert cm.tokens_per_rank % 1024 == 0 and cm.tokens_per_rank >= (8192 if table else 4096)
        assert cm.bandwidth_intra > cm.bandwidth_inter and (r["weights"] == "replicated" or not table)


def test_preset_derivation_qwen3_8b_910c():
    """FLOP/byte derivation: alpha1 = 4·L·2·H·hd/(peak·eff), alpha3 = 4·L·2·G·hd·2; a 128K sequence
    needs several ranks and its ring traffic hides behind attention (A > X even across nodes)."""
    m, hw = MODELS["Qwen3-8B"], HARDWARE["ascend-910c"]
    cm = preset_cost_model("Qwen3-8B", "ascend-910c")
    assert cm.alpha1 == pytest.approx(4 * m.layers * 2 * m.heads * m.head_dim / (hw.peak_flops * hw.attention_efficiency))
    assert cm.alpha3 == pytest.approx(4 * m.layers * 2 * m.kv_heads * m.head_dim * 2)
    assert 7.5e9 < m.total_params < 8.5e9  # Qwen3-8B: 8.2B parameters
    assert 3 <= cm.min_degree(131072) <= 8
    s, d = 131072, 4
    A = cm.alpha1 * s * s / d
    X = cm.alpha3 * s * (d - 1) / d / cm.bandwidth_inter
    assert A > X
    # order of magnitude: 128K tokens of an 8B model, fwd+bwd+recompute = 4·(2·P·s + 2·L·H·hd·s²) FLOPs at ~40 % of peak
    flops = 4 * 2 * m.matmul_params * s + 4 * 2 * m.layers * m.heads * m.head_dim * s * s
    # (v2 preset, the default: B = s adds alpha_blk·s = alpha1·512·s, 0.4 % of the attention term at 128K)
    assert cm.time(s, s * s, 1, True, B=s) == pytest.approx(flops / (hw.peak_flops * 0.4), rel=0.35)


def test_presets_scale_sensibly():
    """Bigger models hold fewer tokens per rank; bigger memory holds more; faster chips are faster."""
    e = {m: preset_cost_model(m, "h100").tokens_per_rank for m in ("Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B")}
    assert e["Qwen3-1.7B"] > e["Qwen3-4B"] > e["Qwen3-8B"]
    assert preset_cost_model("Llama3-8B", "h200").tokens_per_rank > preset_cost_model("Llama3-8B", "h100").tokens_per_rank
    assert preset_cost_model("Llama3-8B", "h100").alpha2 < preset_cost_model("Llama3-8B", "a100").alpha2
    assert model_heads("Llama3-8B") == (32, 8)


def test_preset_errors_and_overrides():
    with pytest.raises(ValueError, match="valid: .*Qwen3-8B"):
        CostModel.preset("GPT-5", "h100")
    with pytest.raises(ValueError, match="valid: ascend-910c"):
        CostModel.preset("Qwen3-8B", "tpu")
    cm = CostModel.preset("qwen3-8b", "H100", tokens_per_rank=4096)
    assert cm.tokens_per_rank == 4096 and math.isclose(cm.alpha1, preset_cost_model("Qwen3-8B", "h100").alpha1)
    with pytest.raises(ValueError, match="unknown cost-model override"):
        preset_cost_model("Qwen3-8B", "h100", alpha9=1)
