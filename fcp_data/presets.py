"""Cost-model presets: §4 coefficients derived from a model config and a hardware spec.

A *rank* is one accelerator die that runs one CP rank (on Ascend 910C: one of the chip's two dies, as
the FCP paper counts 64 NPUs on 4 nodes of 16). The derivation, per token of a sequence of length ``s``
and for the LLM backbone with ``L`` layers, hidden ``h``, ``H`` query heads, ``G`` KV heads of size
``hd``, FFN width ``F`` and vocabulary ``V``:

* **Attention** (``alpha1``, s/token²). ``QKᵀ`` and ``PV`` each cost ``2·s²·H·hd`` FLOPs per layer for a
  full mask; a causal mask does half, so the forward pass is ``2·s²·H·hd`` per layer (η=0) and
  ``4·s²·H·hd`` for full attention (η=1, the ``(1+η)`` of §4). Training multiplies the forward by
  ``train_factor`` = 3 (forward + backward at twice the forward) + 1 with full activation recomputation
  (the default, see memory below) = 4. ``alpha1 = 4·L·2·H·hd / (peak · attention_efficiency)``.
* **Linear layers and the rest** (``alpha2``, s/token). ``2·P`` FLOPs per token forward, with
  ``P = L·(h·H·hd + 2·h·G·hd + H·hd·h + 3·h·F) + h·V`` (Q, K, V, O projections, SwiGLU MLP, LM head;
  norms, rotary and the embedding lookup are negligible). ``alpha2 = 4·2·P / (peak · linear_efficiency)``.
* **Ring KV traffic** (``alpha3``, bytes/token). Each layer ships K and V, ``2·G·hd`` values of 2 bytes
  (bf16) per token; the ring moves them once in the forward, once more in the recomputed forward, and
  in the backward K/V travel again while dK/dV travel back to their owner: 4 transfers.
  ``alpha3 = 4·L·2·G·hd·2``. Bandwidths are the per-direction point-to-point bandwidth of one rank
  (HCCS / NVLink inside a node, the NIC across nodes) times ``comm_efficiency``.
* **Fixed costs**: ``beta1`` = kernel launches, ~``3·L`` kernels of ``launch_s`` per layer and pass
  (``4·3·L·launch_s``); ``beta2`` = ring hand-shakes, ``RING_STEPS`` = 7 P2P rounds (a degree-8 ring)
  of ``latency_s`` per layer and pass (``4·L·7·latency_s``). §4 keeps ``beta2`` independent of ``d``.
* **Memory** (``tokens_per_rank``). Weights and gradients in bf16 stay replicated (``2·P_all + 2·P_all``
  bytes, ``P_all`` with the embedding and, for an MLLM, the vision encoder), fp32 master weights and the
  two Adam moments are sharded over the data-parallel world (``12·P_all / dp_shards``, ZeRO-1 /
  Megatron distributed optimizer, TP = PP = 1 as in the FCP paper's CP-only setting). With full
  activation recomputation a token keeps its layer inputs (``2·h`` bytes per layer) plus the working set
  of the layer being recomputed (~``34·h`` bytes, Korthikanti et al. with flash attention) and the loss is
  computed in vocabulary chunks. ``tokens_per_rank = usable_memory / bytes_per_token`` rounded down to a
  multiple of 1024, where ``usable_memory = memory · memory_fraction − static bytes``.

For MLLMs (InternVL, Qwen3-VL) the preset covers the LLM backbone, which sees every text and visual
token; the vision encoder runs per image/frame before the LLM, is data-parallel (not context-parallel)
and is only charged for its weights/optimizer memory. Example: Qwen3-8B on ascend-910c gives about 54K
tokens per rank, so a 128K sequence needs 3 ranks; ring traffic of long sequences hides behind attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fcp_data.cost import CostModel

__all__ = ["ModelConfig", "HardwareSpec", "MODELS", "HARDWARE", "preset_cost_model", "describe_presets", "model_heads"]


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """Public config of an LLM backbone (``vision_params``: parameters of the vision encoder, 0 for an LLM)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    vision_params: float = 0.0
    kind: str = "llm"

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @property
    def layer_params(self) -> int:
        h, a = self.hidden, self.heads * self.head_dim
        return h * a + 2 * h * self.kv_heads * self.head_dim + a * h + 3 * h * self.ffn

    @property
    def matmul_params(self) -> int:
        """Parameters touched by a matmul per token: all layers plus the LM head."""
        return self.layers * self.layer_params + self.hidden * self.vocab

    @property
    def total_params(self) -> float:
        """Everything held in memory: layers, input embedding, LM head, vision encoder."""
        return self.layers * self.layer_params + 2 * self.hidden * self.vocab + self.vision_params


@dataclass(frozen=True, kw_only=True, slots=True)
class HardwareSpec:
    """One rank (device or die): bf16 peak FLOP/s, memory bytes, per-direction P2P bandwidths (bytes/s)."""

    peak_flops: float
    memory: float
    bandwidth_intra: float
    bandwidth_inter: float
    ranks_per_node: int
    attention_efficiency: float = 0.35
    linear_efficiency: float = 0.5
    comm_efficiency: float = 0.7
    launch_s: float = 20e-6
    latency_s: float = 15e-6
    memory_fraction: float = 0.9


# Public configs (Hugging Face config.json of each model). InternVL's LLMs: InternVL3-2B = Qwen2.5-1.5B,
# InternVL3-8B = Qwen2.5-7B, InternVL2.5-4B = Qwen2.5-3B, each with InternViT-300M (~0.3B). Qwen3-VL's
# LLMs follow Qwen3-1.7B/4B/8B with vision towers of ~0.4B (2B/4B) and ~0.6B (8B).
MODELS: dict[str, ModelConfig] = {
    "Qwen3-1.7B": ModelConfig(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151936),
    "Qwen3-4B": ModelConfig(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, ffn=9728, vocab=151936),
    "Qwen3-8B": ModelConfig(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936),
    "Llama3.2-1B": ModelConfig(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256),
    "Llama3.2-3B": ModelConfig(layers=28, hidden=3072, heads=24, kv_heads=8, head_dim=128, ffn=8192, vocab=128256),
    "Llama3-8B": ModelConfig(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336, vocab=128256),
    "InternVL3-2B": ModelConfig(layers=28, hidden=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960, vocab=151674,
                                vision_params=0.3e9, kind="mllm"),
    "InternVL3-8B": ModelConfig(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=151674,
                                vision_params=0.3e9, kind="mllm"),
    "InternVL2.5-4B": ModelConfig(layers=36, hidden=2048, heads=16, kv_heads=2, head_dim=128, ffn=11008, vocab=151674,
                                  vision_params=0.3e9, kind="mllm"),
    "Qwen3-VL-2B": ModelConfig(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151936,
                               vision_params=0.4e9, kind="mllm"),
    "Qwen3-VL-4B": ModelConfig(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, ffn=9728, vocab=151936,
                               vision_params=0.4e9, kind="mllm"),
    "Qwen3-VL-8B": ModelConfig(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
                               vision_params=0.6e9, kind="mllm"),
}

# Ascend 910C: a rank is one die (~376 TFLOP/s bf16, 64 GB HBM), 16 dies per node, HCCS ~196 GB/s per
# direction, 200 Gb/s RoCE per die across nodes. H100/H200 SXM: 989 TFLOP/s dense bf16, NVLink 4
# 450 GB/s per direction, 400 Gb/s InfiniBand per GPU. A100 SXM: 312 TFLOP/s, NVLink 3 300 GB/s, 200 Gb/s.
HARDWARE: dict[str, HardwareSpec] = {
    "ascend-910c": HardwareSpec(peak_flops=376e12, memory=64e9, bandwidth_intra=196e9, bandwidth_inter=25e9,
                                ranks_per_node=16, launch_s=30e-6, latency_s=20e-6),
    "h100": HardwareSpec(peak_flops=989e12, memory=80e9, bandwidth_intra=450e9, bandwidth_inter=50e9, ranks_per_node=8),
    "h200": HardwareSpec(peak_flops=989e12, memory=141e9, bandwidth_intra=450e9, bandwidth_inter=50e9, ranks_per_node=8),
    "a100": HardwareSpec(peak_flops=312e12, memory=80e9, bandwidth_intra=300e9, bandwidth_inter=25e9, ranks_per_node=8),
}

RING_STEPS = 7  # typical P2P rounds per layer and pass charged to beta2
_ACTIVATION_WORKSET = 34  # bytes per token per hidden unit of the layer being recomputed (bf16, flash attention)


def _lookup(table: dict, key: str, what: str):
    if key in table:
        return table[key]
    folded = {k.lower(): k for k in table}
    if key.lower() in folded:
        return table[folded[key.lower()]]
    raise ValueError(f"unknown {what} {key!r}; valid: {', '.join(table)}")


def preset_cost_model(model: str, hardware: str, *, dp_shards: int = 64, recompute: bool = True,
                      **overrides: Any) -> CostModel:
    """§4 coefficients of ``model`` on ``hardware`` (see the module docstring for the derivation).

    ``dp_shards``: ranks the optimizer state is sharded over; ``recompute``: full activation
    recomputation (else activations of every layer are kept: ``34·h`` bytes per layer and token, and
    the training factor is 3). ``overrides``: any §4 key replaces the derived value.
    """
    m: ModelConfig = _lookup(MODELS, model, "model preset")
    hw: HardwareSpec = _lookup(HARDWARE, hardware, "hardware preset")
    if dp_shards < 1:
        raise ValueError(f"dp_shards must be >= 1, got {dp_shards}")
    train_factor = 4.0 if recompute else 3.0
    attn_flops = 2.0 * m.heads * m.head_dim * m.layers  # causal forward FLOPs per token² (η=0)
    alpha1 = train_factor * attn_flops / (hw.peak_flops * hw.attention_efficiency)
    alpha2 = train_factor * 2.0 * m.matmul_params / (hw.peak_flops * hw.linear_efficiency)
    kv_bytes = 2.0 * m.layers * m.kv_heads * m.head_dim * 2.0  # K and V, bf16, all layers
    alpha3 = (4.0 if recompute else 3.0) * kv_bytes
    beta1 = 3 * m.layers * hw.launch_s * train_factor
    beta2 = train_factor * m.layers * RING_STEPS * hw.latency_s
    static = 4.0 * m.total_params + 12.0 * m.total_params / dp_shards
    if recompute:
        per_token = 2.0 * m.hidden * m.layers + _ACTIVATION_WORKSET * m.hidden
    else:
        per_token = _ACTIVATION_WORKSET * m.hidden * m.layers
    usable = hw.memory * hw.memory_fraction - static
    if usable <= per_token * 1024:
        raise ValueError(f"{model} does not fit on {hardware} with TP=1 (static {static / 1e9:.1f} GB of "
                         f"{hw.memory / 1e9:.0f} GB); raise dp_shards or pick a larger device")
    tokens_per_rank = int(usable / per_token) // 1024 * 1024
    values = dict(
        alpha1=alpha1, alpha2=alpha2, alpha3=alpha3, beta1=beta1, beta2=beta2,
        bandwidth_intra=hw.bandwidth_intra * hw.comm_efficiency,
        bandwidth_inter=hw.bandwidth_inter * hw.comm_efficiency,
        ranks_per_node=hw.ranks_per_node, tokens_per_rank=tokens_per_rank,
    )
    unknown = sorted(set(overrides) - set(values))
    if unknown:
        raise ValueError(f"unknown cost-model override(s) {', '.join(unknown)}; valid: {', '.join(values)}")
    values.update(overrides)
    return CostModel(**values)


def describe_presets() -> list[dict[str, Any]]:
    """One row per (model, hardware): the derived §4 keys plus heads/kv_heads (for Ulysses) — `fcp presets`."""
    rows = []
    for name, m in MODELS.items():
        for hw in HARDWARE:
            try:
                cm = preset_cost_model(name, hw)
            except ValueError:
                continue
            rows.append({"model": name, "hardware": hw, "kind": m.kind, "heads": m.heads,
                         "kv_heads": m.kv_heads, "params_b": round(m.total_params / 1e9, 2), **cm.to_dict()})
    return rows


def model_heads(model: str) -> tuple[int, int]:
    """(query heads, KV heads) of a model preset — what the Ulysses baseline needs."""
    m = _lookup(MODELS, model, "model preset")
    return m.heads, m.kv_heads

