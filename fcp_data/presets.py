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

**Any Hugging Face model** (``"hf:PATH"``, a config dict or ``model.config``; the named ``gpt-oss-20b``,
``gpt-oss-120b``, ``Qwen3-30B-A3B``, ``Mixtral-8x7B``, ``Gemma-2-9B``): :mod:`fcp_data.hf_config` reads the
architecture into the optional ``ModelConfig`` fields, and the formulas above change in three places:

* ``alpha2`` uses ``active_params`` (MoE: the router, ``top-k`` routed and the shared experts per token; multi-latent
  attention's low-rank projections) and memory ``stored_params`` (every expert; tied embeddings once).
* **Sliding windows**: of ``L`` layers, ``window_layers`` attend to the last ``w`` keys only. Their attention is
  ``4·H·hd·w`` FLOPs per token (``w`` keys per query), linear in the length and split over the ring like the
  linear layers, so it goes to ``alpha2`` (``train_factor · 2·H·hd · 2w · window_layers / (peak · attention_efficiency)``)
  and ``alpha1`` keeps the ``L − window_layers`` full layers (and so does ``alpha_blk = alpha1 · b0``). Exact for
  documents much longer than ``w``; a document shorter than the window is over-charged (its windowed layers do
  ``s²/2`` pairs, charged ``w·s``). A windowed layer does not ring: where every document of the group has zigzag
  chunks of at least ``w − 1`` tokens each rank swaps the last ``w − 1`` K/V rows of its chunks with its two
  neighbours (:mod:`fcp_exec.ring_halo`), a few rows per document in one round, so ``alpha3`` and ``gamma`` count
  the full layers only and ``beta2`` charges a windowed layer two hand-shakes. A document shorter than
  ``2·d·(w − 1)`` tokens in such a group goes round a ring of the short documents' rows only: that traffic (small
  documents, at most ``d − 1`` steps) is not charged.
* ``shard_weights=True`` (FSDP2 / ZeRO-3): weights, gradients and optimizer state sharded over ``dp_shards``
  (``16·P/dp_shards``) plus two layers' bf16 weights and gradients gathered (``2·4·P/L``): what MoE models need to
  fit one rank with TP = 1. A MoE layer's activation working set is taken as a dense layer's (``34·h``).

For MLLMs (InternVL, Qwen3-VL) the preset covers the LLM backbone, which sees every text and visual
token; the vision encoder runs per image/frame before the LLM, is data-parallel (not context-parallel)
and is only charged for its weights/optimizer memory (v1; cost model v2 below adds its compute). Example:
Qwen3-8B on ascend-910c gives about 54K tokens per rank, so a 128K sequence needs 3 ranks; ring traffic of
long sequences hides behind attention.

**Cost model v2 terms (DESIGN §4.1), the default**: ``preset_cost_model(model, hw)`` (and
``CostModel.preset(model, hw)``) adds ``gamma``, ``alpha_blk`` and ``alpha_vis`` to exactly the v1
coefficients above; ``v2=False`` gives the v1 model (the three terms at 0, every other value identical), e.g.
for a v1-vs-v2 comparison. Because ``alpha_blk`` depends on the per-sequence term ``B = Σ(1+η)·s``,
``CostModel.time`` on a v2 preset needs ``B=`` (``group_time`` computes it). Options, valid only with
``v2=True``: ``frozen_vision=True`` (a frozen vision tower: forward only) and ``gamma_link="inter"``
(ring-step latency of an inter-node ring). All numbers below are *assumptions* from published orders of
magnitude, meant to be replaced by ``fcp profile`` fits:

* **Ring step** (``gamma``, s per step, paid ``d−1`` times). Each extra ring step costs, per layer and
  pass, one P2P hand-shake (send/recv of the next K/V block) plus the launch of one more attention-block
  kernel: ``gamma = train_factor · L · (latency + launch_s)`` (the backward counts twice, as it does in
  ``beta1``/``beta2``: K/V travel forward and dK/dV travel back). ``latency`` is ``latency_s`` for an
  intra-node ring and ``latency_inter_s`` across nodes. Assumed small-message P2P latencies with the
  collective library's overhead (nccl-tests ``sendrecv_perf`` reports roughly 5–15 µs on NVLink and
  10–30 µs over InfiniBand/RoCE; HCCL on HCCS/RoCE is taken somewhat slower): GPUs 15 µs NVLink /
  30 µs IB, Ascend 910C 20 µs HCCS / 40 µs RoCE; kernel launch 20 µs on GPUs, 30 µs on Ascend (the v1
  ``launch_s``). :class:`~fcp_data.cost.CostModel` has one ``gamma``: the preset uses the **intra-node**
  value (a group of ``d ≤ ranks_per_node`` is placed on one node; across nodes the ring is already slowed
  by ``bandwidth_inter``); ``gamma_link="inter"`` gives the inter-node value for clusters whose rings span
  nodes. Qwen3-8B on H100: ``4·36·(15+20) µs = 5.04 ms`` per step intra, ``7.2 ms`` inter.
* **Attention block overhead** (``alpha_blk``, s/token). A flash-attention kernel over a block of ``b`` keys
  reaches the fraction ``b/(b + b0)`` of its large-block throughput (the tile prologue/epilogue, the
  online-softmax rescale and the O/LSE write are a per-row cost worth ``b0`` keys). A rank of a degree-``d``
  group runs ``d`` blocks of ``s/d`` keys for its ``s/d`` rows, so its attention time is
  ``alpha1·(1+η)·(s/d)·(s + d·b0) = A + alpha1·b0·(1+η)·s``: ``alpha_blk = alpha1 · b0``, independent of
  ``d`` as §4.1 has it. ``b0`` (``attention_half_block``, tokens: the block size at half efficiency) is
  an assumption read off published kernel curves: FlashAttention-2 on A100 (Dao 2023, head dim 128) runs
  at ~60 % of its long-sequence throughput at 512 tokens and ~75 % at 1K, so ``b0 ≈ 384``; Hopper's
  FlashAttention-3 needs larger tiles to saturate (~50 % at 512), ``b0 = 512`` on H100/H200, and the same
  512 is assumed for Ascend's FlashAttentionScore (no published curve). Qwen3-8B on H100:
  ``alpha_blk = 3.41e-9 · 512 = 1.74 µs/token`` (vs ``alpha2 = 122 µs/token``: 1.4 % at ``d = 1``,
  comparable to ``alpha2·s/d`` at ``d ≈ 70``).
* **Vision tower** (``alpha_vis``, s per visual token; 0 for text models). A visual token of the LLM is
  ``patches_per_visual_token`` ViT patches: InternVL (InternViT-300M, 14-px patches, pixel-unshuffle 0.5)
  and Qwen3-VL (16-px patches, 2×2 spatial merge) both merge 4 patches into one token. The ViT's matmul
  FLOPs are ``2·P_vis`` per patch forward, so ``alpha_vis = k · P_vis · patches / (peak ·
  linear_efficiency)`` with ``k = 6`` for a trained tower (forward + backward, no recomputation: its
  activations are per image and short-lived) and ``k = 2`` for a frozen one (forward only), a ratio of
  exactly 1/3. The ViT's own self-attention (+~15 % for a 1024-patch tile) and the MLP projector (~1 %)
  are neglected; ``P_vis`` is the ``vision_params`` used for memory (frozen or not, the memory keeps the
  v1 conservative charge). InternVL3-8B on H200, trained: ``6·0.3e9·4 / (989e12·0.5) = 14.6 µs`` per
  visual token; frozen ``4.85 µs``.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

from fcp_data.cost import COST_KEYS_V2, CostModel
from fcp_data.strict import did_you_mean

__all__ = ["ModelConfig", "HardwareSpec", "MODELS", "HARDWARE", "preset_cost_model", "resolve_model", "describe_presets",
           "model_heads"]


def _is_bool(v: Any) -> bool:
    return type(v).__name__ in ("bool", "bool_")  # Python's and numpy's


def _whole(name: str, v: Any, low: int) -> int:
    """``v`` as an int ``>= low`` (numpy ints too); a bool, float, str or None is one ``ValueError`` naming ``name``."""
    if _is_bool(v) or not hasattr(v, "__index__") or getattr(v, "ndim", 0) != 0 or operator.index(v) < low:
        raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
    return operator.index(v)


def _check_flags(**flags: Any) -> None:
    """Each flag of :func:`preset_cost_model` a real bool (``bool("no")`` is True: no guessing)."""
    for name, v in flags.items():
        if not _is_bool(v):
            raise ValueError(f"{name} must be True or False, got {v!r}")


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
    patches_per_visual_token: int = 0  # ViT patches merged into one LLM visual token (0: no vision tower)
    kind: str = "llm"
    # Models read from a Hugging Face config (fcp_data.hf_config) set these; 0 keeps the dense formulas below.
    active_params: float = 0.0  # matmul parameters per token, LM head included (MoE: routed experts × top-k)
    stored_params: float = 0.0  # LLM parameters held in memory (MoE: every expert; tied embeddings once)
    window: int = 0  # sliding-window size of the windowed layers (keys a query sees, itself included)
    window_layers: int = 0  # how many of the layers attend in a sliding window (the others attend fully)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "patches_per_visual_token",
                     "window", "window_layers"):
            low = 1 if name in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab") else 0
            object.__setattr__(self, name, _whole(f"ModelConfig.{name}", getattr(self, name), low))
        for name in ("vision_params", "active_params", "stored_params"):
            v = getattr(self, name)
            if _is_bool(v) or not hasattr(v, "__float__") or not 0 <= float(v) < math.inf:
                raise ValueError(f"ModelConfig.{name} must be a finite number >= 0 (parameters), got {v!r}")
            object.__setattr__(self, name, float(v))
        if not isinstance(self.kind, str):
            raise ValueError(f"ModelConfig.kind must be a str ('llm' or 'mllm'), got {self.kind!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if min(self.active_params, self.stored_params, self.window, self.window_layers) < 0:
            raise ValueError("ModelConfig active_params, stored_params, window and window_layers must be >= 0")
        if self.window_layers > self.layers or bool(self.window) != bool(self.window_layers):
            raise ValueError(f"ModelConfig: window_layers ({self.window_layers}) must be 1..layers ({self.layers}) "
                             f"exactly when window ({self.window}) is set")

    @property
    def layer_params(self) -> int:
        h, a = self.hidden, self.heads * self.head_dim
        return h * a + 2 * h * self.kv_heads * self.head_dim + a * h + 3 * h * self.ffn

    @property
    def matmul_params(self) -> float:
        """Parameters touched by a matmul per token: all layers plus the LM head."""
        return self.active_params or self.layers * self.layer_params + self.hidden * self.vocab

    @property
    def total_params(self) -> float:
        """Everything held in memory: layers, input embedding, LM head, vision encoder."""
        return (self.stored_params or self.layers * self.layer_params + 2 * self.hidden * self.vocab) + self.vision_params


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
    latency_inter_s: float = 30e-6  # v2: P2P hand-shake across nodes (latency_s: inside a node)
    attention_half_block: int = 512  # v2: keys per block at which a flash-attention kernel runs at half efficiency


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
                                vision_params=0.3e9, patches_per_visual_token=4, kind="mllm"),
    "InternVL3-8B": ModelConfig(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, ffn=18944, vocab=151674,
                                vision_params=0.3e9, patches_per_visual_token=4, kind="mllm"),
    "InternVL2.5-4B": ModelConfig(layers=36, hidden=2048, heads=16, kv_heads=2, head_dim=128, ffn=11008, vocab=151674,
                                  vision_params=0.3e9, patches_per_visual_token=4, kind="mllm"),
    "Qwen3-VL-2B": ModelConfig(layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151936,
                               vision_params=0.4e9, patches_per_visual_token=4, kind="mllm"),
    "Qwen3-VL-4B": ModelConfig(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, ffn=9728, vocab=151936,
                               vision_params=0.4e9, patches_per_visual_token=4, kind="mllm"),
    "Qwen3-VL-8B": ModelConfig(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936,
                               vision_params=0.6e9, patches_per_visual_token=4, kind="mllm"),
}

# Ascend 910C: a rank is one die (~376 TFLOP/s bf16, 64 GB HBM), 16 dies per node, HCCS ~196 GB/s per
# direction, 200 Gb/s RoCE per die across nodes. H100/H200 SXM: 989 TFLOP/s dense bf16, NVLink 4
# 450 GB/s per direction, 400 Gb/s InfiniBand per GPU. A100 SXM: 312 TFLOP/s, NVLink 3 300 GB/s, 200 Gb/s.
HARDWARE: dict[str, HardwareSpec] = {
    "ascend-910c": HardwareSpec(peak_flops=376e12, memory=64e9, bandwidth_intra=196e9, bandwidth_inter=25e9,
                                ranks_per_node=16, launch_s=30e-6, latency_s=20e-6, latency_inter_s=40e-6),
    "h100": HardwareSpec(peak_flops=989e12, memory=80e9, bandwidth_intra=450e9, bandwidth_inter=50e9, ranks_per_node=8),
    "h200": HardwareSpec(peak_flops=989e12, memory=141e9, bandwidth_intra=450e9, bandwidth_inter=50e9, ranks_per_node=8),
    "a100": HardwareSpec(peak_flops=312e12, memory=80e9, bandwidth_intra=300e9, bandwidth_inter=25e9, ranks_per_node=8,
                         attention_half_block=384),
}

RING_STEPS = 7  # typical P2P rounds per layer and pass charged to beta2
_ACTIVATION_WORKSET = 34  # bytes per token per hidden unit of the layer being recomputed (bf16, flash attention)


def _lookup(table: dict, key: str, what: str, more: tuple[str, ...] = ()):
    valid = ", ".join((*table, *more))
    if not isinstance(key, str):
        raise ValueError(f"{what} must be a name (str), got {type(key).__name__} {key!r}; valid: {valid}")
    if key in table:
        return table[key]
    folded = {k.lower(): k for k in table}
    if key.lower() in folded:
        return table[folded[key.lower()]]
    raise ValueError(f"unknown {what} {key!r}{did_you_mean(key, (*table, *more))}; valid: {valid}")


def resolve_model(model: Any) -> tuple[str, ModelConfig]:
    """``(label, ModelConfig)`` of a preset name, a ``ModelConfig``, or a Hugging Face config: ``"hf:PATH"`` (a
    ``config.json`` or the folder holding it), a dict as in ``config.json``, or a ``transformers`` config object
    (``model.config``), read by :func:`fcp_data.hf_config.hf_model_config`."""
    if isinstance(model, ModelConfig):
        return "custom", model
    if not isinstance(model, (str, dict)) and not hasattr(model, "to_dict"):
        raise ValueError(f"model preset must be a name (str) or a Hugging Face config (hf:PATH, a dict, model.config), "
                         f"got {type(model).__name__} {model!r:.60}")
    from fcp_data.hf_config import HF_PRESETS, hf_model_config

    if isinstance(model, str) and not model[:3].lower() == "hf:":
        if model.lower() in {k.lower() for k in HF_PRESETS}:
            return model, hf_model_config(_lookup(HF_PRESETS, model, "model preset"))
        return model, _lookup(MODELS, model, "model preset", more=(*HF_PRESETS, "hf:PATH"))

    if isinstance(model, str):
        return f"hf:{model[3:]}", hf_model_config(model[3:])
    kind = model.get("model_type") if isinstance(model, dict) else getattr(model, "model_type", None)
    return str(kind or "hf-config"), hf_model_config(model)


def preset_cost_model(model: Any, hardware: str, *, dp_shards: int = 64, recompute: bool = True,
                      v2: bool = True, frozen_vision: bool = False, gamma_link: str = "intra",
                      shard_weights: bool = False, **overrides: Any) -> CostModel:
    """§4 coefficients of ``model`` on ``hardware`` (see the module docstring for the derivation).

    ``model``: a preset name (``MODELS``), a ``ModelConfig`` or a Hugging Face config (:func:`resolve_model`).
    ``dp_shards``: ranks the optimizer state is sharded over; ``recompute``: full activation
    recomputation (else activations of every layer are kept: ``34·h`` bytes per layer and token, and
    the training factor is 3). ``shard_weights``: weights and gradients are sharded over ``dp_shards`` too
    (FSDP2 / ZeRO-3; two layers' weights and gradients gathered at a time): what MoE models need. ``v2`` (default
    True): also derive the §4.1 terms ``gamma``, ``alpha_blk``, ``alpha_vis`` (the v1 values are the same either
    way; ``v2=False`` leaves them at 0); with it, ``frozen_vision`` charges the vision tower forward only and
    ``gamma_link`` ("intra" or "inter") picks the ring-step latency. ``overrides``: any §4 or §4.1 key replaces
    the derived value.
    """
    label, m = resolve_model(model)
    hw: HardwareSpec = _lookup(HARDWARE, hardware, "hardware preset")
    dp_shards = _whole("dp_shards", dp_shards, 1)
    _check_flags(recompute=recompute, v2=v2, frozen_vision=frozen_vision, shard_weights=shard_weights)
    if gamma_link not in ("intra", "inter"):
        raise ValueError(f"gamma_link must be 'intra' or 'inter', got {gamma_link!r}")
    if not v2 and (frozen_vision or gamma_link != "intra"):
        raise ValueError("frozen_vision / gamma_link set the cost-model v2 terms; they need v2=True (the default)")
    train_factor = 4.0 if recompute else 3.0
    attn_rate = hw.peak_flops * hw.attention_efficiency
    pair_flops = 2.0 * m.heads * m.head_dim  # causal forward FLOPs per token² of one layer (η=0)
    alpha1 = train_factor * pair_flops * (m.layers - m.window_layers) / attn_rate
    # a windowed layer: each query sees `window` keys, 4·H·hd·window FLOPs per token, linear in s (split over d)
    alpha_window = train_factor * pair_flops * 2.0 * m.window * m.window_layers / attn_rate
    alpha2 = train_factor * 2.0 * m.matmul_params / (hw.peak_flops * hw.linear_efficiency) + alpha_window
    full_layers = m.layers - m.window_layers  # windowed layers swap K/V tails with 2 neighbours, no ring (halo)
    kv_bytes = 2.0 * full_layers * m.kv_heads * m.head_dim * 2.0  # K and V, bf16, the ring's layers
    alpha3 = (4.0 if recompute else 3.0) * kv_bytes
    beta1 = 3 * m.layers * hw.launch_s * train_factor
    beta2 = train_factor * (full_layers * RING_STEPS + m.window_layers * 2) * hw.latency_s
    static = _static_bytes(m, dp_shards, shard_weights)
    if recompute:
        per_token = 2.0 * m.hidden * m.layers + _ACTIVATION_WORKSET * m.hidden
    else:
        per_token = _ACTIVATION_WORKSET * m.hidden * m.layers
    usable = hw.memory * hw.memory_fraction - static
    if usable <= per_token * 1024:
        raise ValueError(f"{label} does not fit on {hardware} with TP=1 (static {static / 1e9:.1f} GB of "
                         f"{hw.memory / 1e9:.0f} GB); raise dp_shards, shard the weights (shard_weights=True, "
                         "FSDP2) or pick a larger device")
    tokens_per_rank = int(usable / per_token) // 1024 * 1024
    values = dict(
        alpha1=alpha1, alpha2=alpha2, alpha3=alpha3, beta1=beta1, beta2=beta2,
        bandwidth_intra=hw.bandwidth_intra * hw.comm_efficiency,
        bandwidth_inter=hw.bandwidth_inter * hw.comm_efficiency,
        ranks_per_node=hw.ranks_per_node, tokens_per_rank=tokens_per_rank,
        gamma=0.0, alpha_blk=0.0, alpha_vis=0.0,
    )
    if v2:
        values.update(_v2_terms(m, hw, alpha1, train_factor, frozen_vision=frozen_vision, gamma_link=gamma_link))
    unknown = sorted(set(overrides) - set(values))
    if unknown:
        raise ValueError(f"unknown cost-model override(s) {', '.join(unknown)}; valid: {', '.join(values)}")
    values.update(overrides)
    return CostModel(**values)


def _static_bytes(m: ModelConfig, dp_shards: int, shard_weights: bool) -> float:
    """Weights + gradients (bf16) and fp32 master weights + Adam moments (sharded over ``dp_shards``); with
    ``shard_weights`` all of it is sharded and two layers' weights and gradients are gathered at a time."""
    if not shard_weights:
        return 4.0 * m.total_params + 12.0 * m.total_params / dp_shards
    layer = (m.total_params - m.vision_params) / m.layers
    return 16.0 * m.total_params / dp_shards + 2 * 4.0 * layer


def _v2_terms(m: ModelConfig, hw: HardwareSpec, alpha1: float, train_factor: float, *, frozen_vision: bool,
              gamma_link: str) -> dict[str, float]:
    """§4.1 terms (module docstring, "Cost model v2 terms")."""
    latency = hw.latency_s if gamma_link == "intra" else hw.latency_inter_s
    gamma = train_factor * (m.layers - m.window_layers) * (latency + hw.launch_s)  # windowed layers: one round
    alpha_blk = alpha1 * hw.attention_half_block
    vis_factor = 2.0 if frozen_vision else 6.0
    alpha_vis = vis_factor * m.vision_params * m.patches_per_visual_token / (hw.peak_flops * hw.linear_efficiency)
    return dict(gamma=gamma, alpha_blk=alpha_blk, alpha_vis=alpha_vis)


def describe_presets(models: tuple[Any, ...] | None = None) -> list[dict[str, Any]]:
    """One row per (model, hardware) that fits: the derived §4 keys plus heads/kv_heads (for Ulysses), the model's
    parameters (total and per token, billions) and whether its weights had to be sharded — `fcp presets`.
    ``models``: names or Hugging Face configs (default every named preset)."""
    from fcp_data.hf_config import HF_PRESETS

    rows = []
    for model in (models if models is not None else (*MODELS, *HF_PRESETS)):
        label, m = resolve_model(model)
        for hw in HARDWARE:
            for sharded in (False, True):
                try:
                    cm = preset_cost_model(m, hw, shard_weights=sharded)
                except ValueError:
                    continue
                rows.append({"model": label if label != "custom" else str(model), "hardware": hw, "kind": m.kind,
                             "heads": m.heads, "kv_heads": m.kv_heads, "params_b": round(m.total_params / 1e9, 2),
                             "active_b": round(m.matmul_params / 1e9, 2),
                             "weights": "sharded" if sharded else "replicated", **cm.to_dict(),
                             **{k: getattr(cm, k) for k in COST_KEYS_V2}})  # the v2 keys at 0 too
                break
    return rows


def model_heads(model: Any) -> tuple[int, int]:
    """(query heads, KV heads) of a model preset or Hugging Face config — what the Ulysses baseline needs."""
    m = resolve_model(model)[1]
    return m.heads, m.kv_heads

