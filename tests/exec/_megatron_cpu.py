"""Test harness for ``test_megatron.py``: Megatron-core on the CPU (:func:`fcp_exec.integrations.megatron_cpu.
megatron_on_cpu` — it redirects Megatron's hard-coded CUDA device placement; the computation is Megatron's) and the
tiny models the tests train."""

from __future__ import annotations

import torch

from fcp_exec.integrations.megatron_cpu import megatron_on_cpu


def init_megatron() -> None:
    """Megatron's parallel state on the launched process group: every rank data-parallel (TP = PP = CP = 1)."""
    megatron_on_cpu()
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


VOCAB = 64

# name -> (TransformerConfig overrides, layer-spec options, GPTModel options)
MODELS = {
    "llama": ({}, {}, {}),  # RoPE, GQA (4 heads, 2 groups), RMSNorm, SwiGLU
    "qwen3": ({}, {"qk_layernorm": True}, {}),
    "window": ({"window_size": (6, 0), "window_attn_skip_freq": 2}, {}, {}),  # layer 1 local (7 tokens), layer 2 global
    "recompute": ({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}, {}, {}),
    # gpt-oss's attention: a learned sink per head on every layer, a window on every other
    "sinks": ({"softmax_type": "learnable", "window_size": (6, 0), "window_attn_skip_freq": 2}, {}, {}),
    "off-by-one": ({"softmax_type": "off-by-one"}, {}, {}),  # a fixed zero logit per head in every softmax
    "gpt2": ({"normalization": "LayerNorm", "gated_linear_unit": False, "add_bias_linear": True}, {},
             {"position_embedding_type": "learned_absolute"}),
}


def build_gpt(name: str, *, fcp: bool, max_len: int = 128, seed: int = 0):
    """The tiny fp64 ``GPTModel`` ``name`` (2 layers, hidden 32), with FCP's core attention or the stock
    ``DotProductAttention``; the same weights for the same ``seed`` either way."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    over, spec_opts, model_opts = MODELS[name]
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
                use_cpu_initialization=True, params_dtype=torch.float64, normalization="RMSNorm",
                gated_linear_unit=True, add_bias_linear=False, init_method_std=0.05, attention_dropout=0.0,
                hidden_dropout=0.0, calculate_per_token_loss=True, masked_softmax_fusion=False,
                bias_dropout_fusion=False, apply_rope_fusion=False, bias_activation_fusion=False)
    config = TransformerConfig(**{**base, **over})
    spec = get_gpt_layer_local_spec(**spec_opts)
    if fcp:
        from fcp_exec.integrations.megatron import fcp_layer_spec

        spec = fcp_layer_spec(spec)
    torch.manual_seed(seed)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=max_len,
                     **{"position_embedding_type": "rope", **model_opts})
    return model.double(), config  # Megatron's torch-norm fallback keeps its weights in float32
