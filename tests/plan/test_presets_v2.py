"""Cost model v2 terms of the presets (issue 14, DESIGN §4.1): gamma, alpha_blk, alpha_vis derived from the
hardware and model specs (fcp_data/presets.py docstring), with the v1 coefficients left exactly as they were."""

from __future__ import annotations

import math

import pytest

from fcp_data.cost import COST_KEYS, COST_KEYS_V2, CostModel
from fcp_data.presets import HARDWARE, MODELS, describe_presets, preset_cost_model

# v1 coefficients before the v2 terms were added (commit 58a5eed), pinned exactly
V1_PINNED = {
    ("Qwen3-8B", "ascend-910c"): {
        "alpha1": 8.9638905775076e-09, "alpha2": 0.00032204669276595743, "alpha3": 589824.0, "beta1": 0.012960000000000001,
        "beta2": 0.02016, "bandwidth_intra": 137199999999.99998, "bandwidth_inter": 17500000000.0, "ranks_per_node": 16,
        "tokens_per_rank": 53248},
    ("Llama3.2-1B", "h100"): {
        "alpha1": 7.573133034811498e-10, "alpha2": 1.9991859510616786e-05, "alpha3": 131072.0, "beta1": 0.0038400000000000005,
        "beta2": 0.00672, "bandwidth_intra": 315000000000.0, "bandwidth_inter": 35000000000.0, "ranks_per_node": 8,
        "tokens_per_rank": 485376},
    ("InternVL3-8B", "h200"): {
        "alpha1": 2.3192719919110213e-09, "alpha2": 0.00011436017090394338, "alpha3": 229376.0, "beta1": 0.00672,
        "beta2": 0.01176, "bandwidth_intra": 315000000000.0, "bandwidth_inter": 35000000000.0, "ranks_per_node": 8,
        "tokens_per_rank": 289792},
    ("Qwen3-VL-4B", "a100"): {
        "alpha1": 1.0802637362637363e-08, "alpha2": 0.00020627035897435896, "alpha3": 589824.0, "beta1": 0.00864,
        "beta2": 0.01512, "bandwidth_intra": 210000000000.0, "bandwidth_inter": 17500000000.0, "ranks_per_node": 8,
        "tokens_per_rank": 190464},
}

PAIRS = [(m, h) for m in MODELS for h in HARDWARE]


def _v1(cm: CostModel) -> dict:
    d = cm.to_dict()
    return {k: d[k] for k in COST_KEYS}


@pytest.mark.parametrize(("model", "hw"), sorted(V1_PINNED))
def test_v1_coefficients_unchanged(model, hw):
    """v1 (``v2=False``) and v2 (the default) presets both carry exactly the pre-v2 coefficients; v1 adds no
    v2 term, the default adds all of them (a failure means a v1 coefficient drifted or the default flipped back)."""
    plain = preset_cost_model(model, hw, v2=False)
    assert plain.to_dict() == V1_PINNED[(model, hw)] and not plain.is_v2
    default = preset_cost_model(model, hw)
    assert default.is_v2 and default == preset_cost_model(model, hw, v2=True)
    assert default == CostModel.preset(model, hw)
    for kw in ({}, {"frozen_vision": True}, {"gamma_link": "inter"}):
        assert _v1(preset_cost_model(model, hw, v2=True, **kw)) == V1_PINNED[(model, hw)]


def test_every_preset_has_finite_nonnegative_v2_terms():
    for model, hw in PAIRS:
        for frozen in (False, True):
            for link in ("intra", "inter"):
                cm = preset_cost_model(model, hw, v2=True, frozen_vision=frozen, gamma_link=link)
                for k in COST_KEYS_V2:
                    v = getattr(cm, k)
                    assert math.isfinite(v) and v >= 0, (model, hw, k, v)
                assert cm.gamma > 0 and cm.alpha_blk > 0
                assert _v1(cm) == preset_cost_model(model, hw, v2=False).to_dict()


def test_alpha_vis_text_zero_vl_positive_frozen_third():
    for model, hw in PAIRS:
        trained = preset_cost_model(model, hw, v2=True)
        frozen = preset_cost_model(model, hw, v2=True, frozen_vision=True)
        if MODELS[model].kind == "llm":
            assert trained.alpha_vis == 0 and frozen.alpha_vis == 0
        else:
            assert 0 < frozen.alpha_vis < trained.alpha_vis
            assert frozen.alpha_vis / trained.alpha_vis == pytest.approx(1 / 3)
        assert frozen.gamma == trained.gamma and frozen.alpha_blk == trained.alpha_blk


def test_gamma_intra_below_inter_and_preset_uses_intra():
    """CostModel has a single gamma: the preset's default is the intra-node ring step."""
    for model, hw in PAIRS:
        intra = preset_cost_model(model, hw, v2=True)
        inter = preset_cost_model(model, hw, v2=True, gamma_link="inter")
        assert intra.gamma == preset_cost_model(model, hw, v2=True, gamma_link="intra").gamma
        assert intra.gamma < inter.gamma


def test_hand_recomputation():
    """InternVL3-8B on H200 (trained ViT): 6 · 0.3e9 params · 4 patches / (989e12 · 0.5) FLOP/s; Qwen3-8B on H100:
    gamma = 4 passes · 36 layers · (15 + 20) µs, alpha_blk = alpha1 · 512."""
    cm = preset_cost_model("InternVL3-8B", "h200", v2=True)
    assert cm.alpha_vis == pytest.approx(6 * 0.3e9 * 4 / (989e12 * 0.5), rel=1e-12)  # 14.56 µs per visual token
    assert preset_cost_model("InternVL3-8B", "h200", v2=True, frozen_vision=True).alpha_vis == pytest.approx(
        2 * 0.3e9 * 4 / (989e12 * 0.5), rel=1e-12)
    q = preset_cost_model("Qwen3-8B", "h100", v2=True)
    assert q.gamma == pytest.approx(4 * 36 * (15e-6 + 20e-6), rel=1e-12)
    assert preset_cost_model("Qwen3-8B", "h100", v2=True, gamma_link="inter").gamma == pytest.approx(4 * 36 * 50e-6)
    assert q.alpha_blk == pytest.approx(q.alpha1 * 512, rel=1e-12)
    assert preset_cost_model("Qwen3-8B", "a100", v2=True).alpha_blk == pytest.approx(
        preset_cost_model("Qwen3-8B", "a100", v2=False).alpha1 * 384, rel=1e-12)
    # without recomputation the fixed costs scale with 3 passes, like beta1/beta2
    assert preset_cost_model("Qwen3-8B", "h100", v2=True, recompute=False).gamma == pytest.approx(3 * 36 * 35e-6)


def test_v2_terms_change_group_time_as_derived():
    """A 32K causal sequence with 8K visual tokens on 4 ranks: v2 time = v1 time + the three terms."""
    v1 = preset_cost_model("Qwen3-VL-8B", "h100", v2=False)
    v2 = preset_cost_model("Qwen3-VL-8B", "h100", v2=True)
    s, vis, d = 32768, 8192, 4
    t1 = v1.group_time([s], ranks=d, visual=[vis])
    t2 = v2.group_time([s], ranks=d, visual=[vis])
    assert t2 == pytest.approx(t1 + v2.gamma * (d - 1) + v2.alpha_blk * s + v2.alpha_vis * vis / d, rel=1e-12)
    # round trip through JSON keeps the v2 keys
    assert CostModel.from_dict(v2.to_dict()) == v2


def test_v2_options_and_overrides():
    with pytest.raises(ValueError, match="v2=True"):
        preset_cost_model("Qwen3-8B", "h100", v2=False, frozen_vision=True)
    with pytest.raises(ValueError, match="v2=True"):
        preset_cost_model("Qwen3-8B", "h100", v2=False, gamma_link="inter")
    with pytest.raises(ValueError, match="gamma_link"):
        preset_cost_model("Qwen3-8B", "h100", v2=True, gamma_link="nvlink")
    cm = CostModel.preset("qwen3-vl-2b", "H200", v2=True, frozen_vision=True, gamma=1e-3)
    assert cm.gamma == 1e-3 and cm.alpha_vis > 0
    assert preset_cost_model("Qwen3-8B", "h100", v2=False, alpha_blk=2e-6).alpha_blk == 2e-6  # v2 keys: overrides
    # the listing (`fcp presets`) shows the default, v2: every row carries gamma and alpha_blk > 0
    rows = describe_presets()
    assert all(r["gamma"] > 0 and r["alpha_blk"] > 0 for r in rows)
    assert all(r.get("alpha_vis", 0.0) > 0 for r in rows if r["kind"] == "mllm")
