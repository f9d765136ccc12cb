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
_MLA = dict(multi_latent_attention=True, q_lora_rank=24, kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4,
            v_head_dim=6, num_query_groups=None)


class DenseCoreAttention(torch.nn.Module):
    """The stock model's core attention for multi-latent attention: megatron-core 0.16's local spec has none (its
    ``DotProductAttention`` takes no ``k_channels``/``v_channels``; only Transformer Engine's does), so the reference
    is dense causal softmax attention of one document ``[s, 1, heads, dim]`` in float64 at Megatron's softmax scale."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type="self", attention_dropout=None,
                 softmax_scale=None, **kwargs) -> None:
        super().__init__()
        self.config, self.scale = config, softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **kwargs):
        q, k, v = (x[:, 0].transpose(0, 1) for x in (query, key, value))  # [heads, s, dim]
        s = q.shape[1]
        scores = (q @ k.transpose(1, 2)) * self.scale
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        return (scores.softmax(-1) @ v).transpose(0, 1).reshape(s, 1, -1)

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
    "moe": ({"num_moe_experts": 4, "moe_router_topk": 2, "moe_aux_loss_coeff": 0.0, "moe_ffn_hidden_size": 16,
             "moe_token_dispatcher_type": "allgather"}, {"num_experts": 4, "moe_grouped_gemm": False}, {}),
    # DeepSeek-V3's attention: low-rank q and kv projections, a shared rope key, value heads narrower than q/k
    "mla": (dict(_MLA, rope_type="rope"), {"multi_latent_attention": True}, {}),
    "deepseek": (dict(_MLA, rope_type="rope", num_moe_experts=4, moe_router_topk=2, moe_aux_loss_coeff=0.0,
                      moe_ffn_hidden_size=16, moe_token_dispatcher_type="allgather", moe_shared_expert_intermediate_size=16,
                      moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                      moe_router_bias_update_rate=0.01, moe_router_dtype="fp64"),
                 {"multi_latent_attention": True, "num_experts": 4, "moe_grouped_gemm": False}, {}),
    # DeepSeek-V3's multi-token prediction: two MTP modules (each a transformer layer), the loss scaled by 0.3
    "mtp": ({"mtp_num_layers": 2, "mtp_loss_scaling_factor": 0.3}, {}, {}),
    "mla-yarn": (dict(_MLA, rope_type="yarn", rotary_scaling_factor=4.0, original_max_position_embeddings=16,
                      mscale=0.9, mscale_all_dim=0.8), {"multi_latent_attention": True}, {}),
}


def build_gpt(name: str, *, fcp: bool, max_len: int = 128, seed: int = 0):
    """The tiny fp64 ``GPTModel`` ``name`` (2 layers, hidden 32), with FCP's core attention or the stock
    ``DotProductAttention``; the same weights for the same ``seed`` either way."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import multi_latent_attention
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    # megatron-core 0.16 without Transformer Engine stands MagicMocks in for TE's classes yet sets HAVE_TE, and
    # MLASelfAttention then fails on isinstance(linear_proj, TELinear): there is no TE here
    multi_latent_attention.HAVE_TE = False
    from megatron.core.transformer.moe import moe_utils  # and its router GEMM would call TE's (NameError without it)

    moe_utils.te_general_gemm = None
    over, spec_opts, model_opts = MODELS[name]
    base = dict(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
                use_cpu_initialization=True, params_dtype=torch.float64, normalization="RMSNorm",
                gated_linear_unit=True, add_bias_linear=False, init_method_std=0.05, attention_dropout=0.0,
                hidden_dropout=0.0, calculate_per_token_loss=True, masked_softmax_fusion=False,
                bias_dropout_fusion=False, apply_rope_fusion=False, bias_activation_fusion=False)
    config = (MLATransformerConfig if over.get("multi_latent_attention") else TransformerConfig)(**{**base, **over})
    spec = get_gpt_layer_local_spec(**spec_opts)
    if fcp:
        from fcp_exec.integrations.megatron import fcp_layer_spec

        spec = fcp_layer_spec(spec)
    elif over.get("multi_latent_attention"):
        spec.submodules.self_attention.submodules.core_attention = DenseCoreAttention
    if config.mtp_num_layers:  # the MTP modules' layers from the same (FCP or stock) layer spec
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        model_opts = dict(model_opts, mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False))
    torch.manual_seed(seed)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=max_len,
                     **{"position_embedding_type": "rope", **model_opts})
    return model.double(), config  # Megatron's torch-norm fallback keeps its weights in float32
