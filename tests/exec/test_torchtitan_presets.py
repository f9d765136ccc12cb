"""The cost model ``fcp_config`` derives from the torchtitan model being trained (``integrations.torchtitan.model_shape``):
its matmul parameters equal the weights of the model's linear layers exactly (torchtitan's Qwen3 and Llama 3
flavors, built on the meta device), its total parameters within 0.1 % (norms left out); of a MoE (Qwen3's debug MoE and
30B-A3B) the weights a token multiplies — attention, router, top-k of the experts, the LM head — and the weights held,
exactly."""

from __future__ import annotations

import importlib.util
import json

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None, reason="needs torchtitan")


@pytest.mark.parametrize("family, flavor", [("qwen3", "debugmodel"), ("llama3", "debugmodel"), ("qwen3", "0.6B"),
                                            ("llama3", "8B")])
def test_model_shape_counts_the_torchtitan_model_s_matmuls(family, flavor):
    import importlib

    import torch

    from fcp_data.presets import ModelConfig
    from fcp_exec.integrations.torchtitan import model_shape

    cfg = importlib.import_module(f"torchtitan.models.{family}").model_registry(flavor).model
    m = ModelConfig(**model_shape(cfg))
    with torch.device("meta"):
        model = cfg.build()
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    assert m.matmul_params == linear
    assert abs(m.total_params / sum(p.numel() for p in model.parameters()) - 1) < 1e-3


def test_fcp_config_plans_with_the_trained_model_unless_told_otherwise():
    from torchtitan.models.qwen3.config_registry import qwen3_debugmodel

    from fcp_data import CostModel
    from fcp_data.presets import ModelConfig
    from fcp_exec.integrations.torchtitan_data import _cost_model
    from fcp_exec.integrations.torchtitan import model_shape
    from fcp_exec.integrations.torchtitan_trainer import fcp_config

    base = qwen3_debugmodel()
    derived = fcp_config(base, dataset_path="x").dataloader
    assert derived.preset == "" and json.loads(derived.model_shape) == model_shape(base.model_spec.model)
    want = CostModel.preset(ModelConfig(**model_shape(base.model_spec.model)), "h100").replace(tokens_per_rank=512)
    assert _cost_model(derived, 512) == want
    named = fcp_config(base, dataset_path="x", preset="qwen3-8b").dataloader
    assert _cost_model(named, 512) == CostModel.preset("qwen3-8b", "h100").replace(tokens_per_rank=512)


@pytest.mark.parametrize("flavor", ["debugmodel_moe", "30B-A3B"])
def test_a_moe_shape_counts_the_weights_a_token_uses_and_the_weights_held(flavor):
    import torch
    from torchtitan.models.qwen3 import model_registry

    from fcp_data.presets import ModelConfig
    from fcp_exec.integrations.torchtitan import model_shape

    cfg = model_registry(flavor).model
    m = ModelConfig(**model_shape(cfg))
    with torch.device("meta"):
        model = cfg.build()
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    experts = sum(p.numel() for n, p in model.named_parameters() if "inner_experts" in n)
    router = cfg.layers[0].moe.router
    assert experts and m.matmul_params == linear + experts * router.top_k // router.num_experts
    assert m.total_params == linear + experts + model.tok_embeddings.weight.numel()
    if flavor == "30B-A3B":  # the published sizes: 30.5B parameters, 3.3B activated (with the input embedding)
        assert abs(m.total_params / 30.5e9 - 1) < 0.01
        assert abs((m.matmul_params + model.tok_embeddings.weight.numel()) / 3.3e9 - 1) < 0.02


@pytest.mark.parametrize("family, flavor, mtp", [("deepseek_v3", "debugmodel", 0), ("deepseek_v3", "debugmodel", 2),
                                                 ("deepseek_v3", "671B", 0), ("gpt_oss", "debugmodel", 0),
                                                 ("gpt_oss", "120b", 0)])
def test_mla_mtp_and_sliding_windows_are_in_the_shape(family, flavor, mtp):
    """DeepSeek-V3 (multi-latent attention, a dense first layer, shared experts; ``mtp`` MTP modules: one more block,
    eh_proj and LM head per token each) and gpt-oss (sliding windows on half its layers): the weights a token multiplies
    and the weights held, exactly against the model built on the meta device; the published sizes (DeepSeek-V3 671B
    with 37B activated; gpt-oss-120b 116.8B with 5.1B active, its windows 128 tokens on 18 of 36 layers)."""
    import importlib

    import torch

    from fcp_data.presets import ModelConfig
    from fcp_exec.integrations.torchtitan import model_shape

    registry = importlib.import_module(f"torchtitan.models.{family}").model_registry
    cfg = (registry(flavor, num_mtp_layers=mtp) if mtp else registry(flavor)).model
    shape = model_shape(cfg)
    m = ModelConfig(**shape)
    with torch.device("meta"):
        model = cfg.build()
    linear = sum(mod.weight.numel() for mod in model.modules() if isinstance(mod, torch.nn.Linear))
    experts = sum(p.numel() for n, p in model.named_parameters() if "inner_experts" in n and p.dim() == 3)
    router = next(layer.moe.router for layer in cfg.layers if getattr(layer, "moe", None) is not None)
    lm_head = model.lm_head.weight.numel()
    assert m.matmul_params == linear + experts * router.top_k // router.num_experts + mtp * lm_head
    assert m.total_params == linear + experts + model.tok_embeddings.weight.numel()
    assert m.layers == len(cfg.layers) + mtp
    if family == "deepseek_v3":
        assert (m.heads, m.kv_heads, m.head_dim) == (cfg.layers[0].attention.n_heads,) * 2 + (192,)
    if flavor == "671B":
        assert abs(m.total_params / 671e9 - 1) < 0.01
        assert abs((m.matmul_params + model.tok_embeddings.weight.numel()) / 37e9 - 1) < 0.02
    if flavor == "120b":
        assert abs(m.total_params / 116.8e9 - 1) < 0.01 and abs(m.matmul_params / 5.1e9 - 1) < 0.02
        assert (shape["window"], shape["window_layers"]) == (128, 18)


def test_dataset_path_takes_a_megatron_prefix_its_idx_or_its_bin(tmp_path):
    """``FCPTitanDataLoader(dataset_path=...)`` with a Megatron dataset's ``PREFIX.idx`` or ``PREFIX.bin`` (as users copy
    them from Megatron's own config) opens the same documents as ``PREFIX``; it said "not a length index, build one with
    fcp index". Reference: :class:`MegatronIndexedDocuments` of the prefix."""
    import struct

    import numpy as np

    from fcp_data.megatron_indexed import MegatronIndexedDocuments
    from fcp_exec.integrations.torchtitan_data import FCPTitanDataLoader, _open_dataset

    seq = np.array([4, 3], dtype=np.int32)
    (tmp_path / "c.idx").write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 2, 3) + seq.tobytes()
                                     + np.array([0, 8], dtype=np.int64).tobytes()
                                     + np.array([0, 1, 2], dtype=np.int64).tobytes())
    (tmp_path / "c.bin").write_bytes(np.arange(7, dtype=np.uint16).tobytes())
    want = MegatronIndexedDocuments(tmp_path / "c")
    for path in ("c", "c.idx", "c.bin"):
        config = FCPTitanDataLoader.Config(dataset_path=str(tmp_path / path))
        docs, lengths = _open_dataset(config)
        assert isinstance(docs, MegatronIndexedDocuments) and docs.path_prefix == want.path_prefix, path
        assert lengths.num_tokens.tolist() == [4, 3] and docs[1]["input_ids"].tolist() == [4, 5, 6]
