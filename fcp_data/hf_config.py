"""A cost-model preset for any Hugging Face model: its ``config.json`` read into a ``fcp_data.presets.ModelConfig``.

``CostModel.preset("hf:path/to/config.json", "h100")`` (or the folder holding it, a dict as in ``config.json``, or a
``transformers`` config object such as ``model.config``; ``fcp plan/compare/simulate --preset hf:PATH``) derives the
§4 / §4.1 coefficients of the model a user trains with the formulas of :mod:`fcp_data.presets`, from these facts of
its config (the text model's, ``text_config``/``llm_config`` for a vision-language model):

* **Matmul parameters per token** (``active_params``: ``alpha2``) and **held in memory** (``stored_params``):
  attention projections (grouped-query: ``h·H·hd + 2·h·G·hd + H·hd·h``; multi-latent attention, DeepSeek-V2/V3: the
  low-rank ``q_a/q_b``, ``kv_a/kv_b`` and ``o`` projections), a gated MLP (``3·h·F``) or a mixture of experts — the
  router (``h·E``), ``top-k`` routed experts of ``3·h·F_e`` per token (all ``E`` in memory) and any shared experts;
  the dense layers of a MoE (``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step``, ERNIE's
  ``moe_layer_start_index``/``_end_index``/``_interval``) keep the dense MLP; the LM head per token, the embedding in
  memory once more unless tied. Norms and biases are left out (< 0.1 % of a real model).
* **Attention**: ``H`` heads of ``hd``; with multi-latent attention fcp's ring runs ``H`` K/V heads of the query/key
  head dim (the values are zero-padded to it, :func:`fcp_exec.ring_args.padded_values`), so the preset charges that.
* **Sliding windows** (``layer_types``, else ``sliding_window`` with the family's rule): a windowed layer's attention
  is linear in the length (``window`` keys per query) and goes to ``alpha2``; only full layers stay in ``alpha1``.
* **Vision tower** (``vision_config``): its matmul parameters from depth, width and MLP width (gated for Qwen2.5-VL),
  patch embedding and merger — an estimate, within a few % of the real towers of the tested families — and
  ``patches_per_visual_token`` from ``spatial_merge_size``² (Qwen-VL) or ``1/downsample_ratio``² (InternVL).

With ``transformers`` installed a config (file or dict with a ``model_type``) is first resolved through
``AutoConfig`` (the family's defaults for keys the file leaves out, e.g. Gemma's window pattern); without it the file
is read as written, with the window rules of the families fcp tests (a key the file leaves at its class default,
such as EXAONE 4's window, is then unknown: install transformers). Checked in
``tests/exec/test_hf_presets.py`` against the parameter counts and the matmul FLOPs (``torch.utils.flop_counter``)
of the real Hugging Face models built from every example config, and against published totals of full-size models.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any, Mapping

from fcp_data.presets import ModelConfig

__all__ = ["hf_model_config", "load_hf_config", "moe_experts", "HF_PRESETS"]

# Named presets read from the public config.json of each model (the keys the derivation uses). Their totals and
# per-token matmul parameters match the published counts (tests/exec/test_hf_presets.py): gpt-oss-20b 20.9B / 3.6B
# active, gpt-oss-120b 116.8B / 5.1B, Qwen3-30B-A3B 30.5B / 3.3B, Qwen3-VL-30B-A3B 31.1B, Mixtral-8x7B 46.7B / 12.9B,
# Gemma-2-9B 9.2B.
# The MoE models need their weights sharded (shard_weights=True, FSDP2) to fit one rank with TP = 1.
HF_PRESETS: dict[str, dict[str, Any]] = {
    "gpt-oss-20b": dict(model_type="gpt_oss", num_hidden_layers=24, hidden_size=2880, intermediate_size=2880,
                        num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                        num_experts_per_tok=4, vocab_size=201088, sliding_window=128, tie_word_embeddings=False),
    "gpt-oss-120b": dict(model_type="gpt_oss", num_hidden_layers=36, hidden_size=2880, intermediate_size=2880,
                         num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=128,
                         num_experts_per_tok=4, vocab_size=201088, sliding_window=128, tie_word_embeddings=False),
    "Qwen3-30B-A3B": dict(model_type="qwen3_moe", num_hidden_layers=48, hidden_size=2048, intermediate_size=6144,
                          moe_intermediate_size=768, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False),
    # Qwen3-VL's video MLLM on the Qwen3-30B-A3B language model (its vision tower: SigLIP-2 size, deepstack at 8/16/24)
    "Qwen3-VL-30B-A3B": dict(model_type="qwen3_vl_moe", tie_word_embeddings=False, text_config=dict(
        model_type="qwen3_vl_moe_text", num_hidden_layers=48, hidden_size=2048, intermediate_size=6144,
        moe_intermediate_size=768, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, vocab_size=151936, tie_word_embeddings=False), vision_config=dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16, temporal_patch_size=2,
        spatial_merge_size=2, in_channels=3, out_hidden_size=2048, deepstack_visual_indexes=[8, 16, 24])),
    "Mixtral-8x7B": dict(model_type="mixtral", num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                         num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                         vocab_size=32000, sliding_window=None, tie_word_embeddings=False),
    "Gemma-2-9B": dict(model_type="gemma2", num_hidden_layers=42, hidden_size=3584, intermediate_size=14336,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=256000,
                       sliding_window=4096, tie_word_embeddings=True),
}

_MAX_CONFIG_BYTES = 1 << 22
_MAX_LAYERS, _MAX_INT = 100_000, 1 << 31  # per-layer loops stay short; a width beyond int32 is no model's
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
_TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k", "top_k")
_ALL_WINDOWED = ("mistral", "mixtral", "qwen2", "qwen2_moe", "starcoder2", "phi3")  # one window on every layer


def load_hf_config(source: Any) -> dict[str, Any]:
    """The config as a plain dict: ``source`` is a path (``config.json`` or its folder), a dict, or an object with
    ``to_dict()`` (a ``transformers`` config). A file goes through ``transformers.AutoConfig`` when it can."""
    if isinstance(source, Mapping):
        return _resolved(dict(source))
    if hasattr(source, "to_dict"):
        return dict(source.to_dict())
    if not isinstance(source, (str, Path)):
        raise ValueError(f"a Hugging Face config must be a path, a dict or a config object, got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read forever, /dev/zero fill the memory
            raise ValueError(f"{path} is not a regular file (a Hugging Face config.json)")
        if info.st_size > _MAX_CONFIG_BYTES:
            raise ValueError(f"{path}: {info.st_size} bytes is no config.json (limit {_MAX_CONFIG_BYTES})")
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read the Hugging Face config {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a JSON config: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a config.json holds one JSON object, got {type(raw).__name__}")
    return _resolved(raw)


def _resolved(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the family's defaults filled in by ``transformers`` (the raw dict when it is not installed or
    does not know the model type)."""
    try:
        from transformers import AutoConfig
    except Exception:  # noqa: BLE001 - optional: without transformers the file is taken as written
        return raw
    if not raw.get("model_type") or not _plain_sizes(raw):
        return raw
    fields = {k: v for k, v in raw.items() if k != "model_type"}
    try:
        return dict(AutoConfig.for_model(raw.get("model_type", ""), **fields).to_dict())
    except Exception:  # noqa: BLE001 - an unknown or newer model type: read as written
        return raw


def _plain_sizes(cfg: Any, depth: int = 0) -> bool:
    """Whether every number in ``cfg`` (nested) is of a size a model has: a config class builds per-layer lists from
    ``num_hidden_layers`` when constructed, so an absurd value must not reach it (it is refused later, in one line)."""
    if depth > 4:
        return False
    if isinstance(cfg, Mapping):
        layers = cfg.get("num_hidden_layers", 1)
        if isinstance(layers, int) and not isinstance(layers, bool) and not 0 <= layers <= _MAX_LAYERS:
            return False
        return all(_plain_sizes(v, depth + 1) for v in cfg.values())
    if isinstance(cfg, (list, tuple)):
        return len(cfg) <= _MAX_LAYERS and all(_plain_sizes(v, depth + 1) for v in cfg)
    return not isinstance(cfg, (int, float)) or isinstance(cfg, bool) or abs(cfg) <= _MAX_INT * _MAX_INT


def hf_model_config(source: Any) -> ModelConfig:
    """:class:`ModelConfig` of a Hugging Face model config (module docstring); ``ValueError`` naming the missing
    or invalid key when the config is not a decoder LLM's (one line, whatever the file holds)."""
    cfg = load_hf_config(source)
    text = cfg.get("text_config") or cfg.get("llm_config") or cfg
    if not isinstance(text, Mapping):
        raise ValueError("the config's text_config is not an object")
    kind = str(cfg.get("model_type") or text.get("model_type") or "?")[:60]
    try:
        return _derive(cfg, text, kind)
    except (TypeError, ValueError, OverflowError, ZeroDivisionError, KeyError, AttributeError, IndexError) as e:
        if isinstance(e, ValueError) and str(e).startswith(("the ", "ModelConfig")):
            raise
        raise ValueError(f"the {kind} config is not one fcp can derive a preset from: {type(e).__name__}: "
                         f"{str(e)[:200]}") from None


def _derive(cfg: Mapping, text: Mapping, kind: str) -> ModelConfig:
    layers, hidden, heads = (_int(text, k, kind) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    vocab = _int(text, "vocab_size", kind)
    attn, head_dim, kv_heads = _attention(text, hidden, heads, kind)
    dense_ffn = int(text.get("intermediate_size") or 0)
    active = stored = 0.0
    for i in range(layers):
        mlp_active, mlp_stored = _mlp(text, i, hidden, dense_ffn, kind)
        active, stored = active + attn + mlp_active, stored + attn + mlp_stored
    tied = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    window, window_layers = _windows(text, layers, kind)
    vision, patches = _vision(cfg, hidden)
    if vision < 0 or patches < 0:
        raise ValueError(f"the {kind} config's vision_config gives a negative size ({vision:.3g} parameters)")
    return ModelConfig(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                       ffn=max(dense_ffn, 1), vocab=vocab, vision_params=float(vision), patches_per_visual_token=patches,
                       kind="mllm" if vision else "llm", active_params=active + hidden * vocab,
                       stored_params=stored + hidden * vocab * (1 if tied else 2), window=window,
                       window_layers=window_layers)


def _int(cfg: Mapping, key: str, kind: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"the {kind} config has no {key!r}: not a decoder language model fcp can derive a preset for")
    top = _MAX_LAYERS if key == "num_hidden_layers" else _MAX_INT
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise ValueError(f"the {kind} config's {key} must be an integer in 1..{top}, got {value!r:.60}")
    return value


def _attention(text: Mapping, h: int, heads: int, kind: str) -> tuple[float, int, int]:
    """(matmul parameters of one layer's attention, head dim fcp's ring runs, K/V heads it ships)."""
    if text.get("kv_lora_rank"):  # multi-latent attention: K/V decompressed per head, values padded to qk
        nope, rope = _int(text, "qk_nope_head_dim", kind), _int(text, "qk_rope_head_dim", kind)
        v, kv_rank, qk = _int(text, "v_head_dim", kind), _int(text, "kv_lora_rank", kind), nope + rope
        q_rank = text.get("q_lora_rank")
        q = h * q_rank + q_rank * heads * qk if q_rank else h * heads * qk
        kv = h * (kv_rank + rope) + kv_rank * heads * (nope + v)
        return float(q + kv + heads * v * h), qk, heads
    head_dim = int(text.get("head_dim") or h // heads)
    kv_heads = _int(text, "num_key_value_heads", kind, heads)
    if heads % kv_heads:
        raise ValueError(f"the {kind} config's num_attention_heads ({heads}) is no multiple of num_key_value_heads "
                         f"({kv_heads})")
    return float(2 * h * heads * head_dim + 2 * h * kv_heads * head_dim), head_dim, kv_heads


def moe_experts(text: Mapping) -> tuple[int, int]:
    """``(experts, top-k)`` of a (text) model config dict, from the first key of each family's naming that is set
    (Mixtral's ``num_local_experts``, DeepSeek's ``n_routed_experts``, ERNIE's ``moe_num_experts`` / ``moe_k``, ...);
    0 where none is."""
    experts = next((int(text[k]) for k in _EXPERT_KEYS if text.get(k)), 0)
    return experts, next((int(text[k]) for k in _TOP_K_KEYS if text.get(k)), 0)


def _mlp(text: Mapping, layer: int, h: int, dense_ffn: int, kind: str) -> tuple[float, float]:
    """(matmul parameters per token, parameters held) of layer ``layer``'s MLP or mixture of experts."""
    experts, top_k = moe_experts(text)
    if not experts or not _is_moe_layer(text, layer):
        if not dense_ffn:
            raise ValueError(f"the {kind} config has no 'intermediate_size'")
        return 3.0 * h * dense_ffn, 3.0 * h * dense_ffn
    if not 1 <= top_k <= experts:
        raise ValueError(f"the {kind} config has {experts} experts but no top-k in 1..{experts} "
                         f"({'/'.join(_TOP_K_KEYS)})")
    expert_ffn = int(text.get("moe_intermediate_size") or dense_ffn)
    gated_shared = int(text.get("shared_expert_intermediate_size") or 0)  # Qwen2-MoE: behind a 1-wide sigmoid gate
    shared = gated_shared + int(text.get("n_shared_experts") or text.get("moe_num_shared_experts") or 0) * expert_ffn
    router, one = h * experts + (h if gated_shared else 0), 3.0 * h * expert_ffn
    return router + top_k * one + 3.0 * h * shared, router + experts * one + 3.0 * h * shared


def _is_moe_layer(text: Mapping, layer: int) -> bool:
    if layer < int(text.get("first_k_dense_replace") or 0) or layer in (text.get("mlp_only_layers") or ()):
        return False
    if "moe_layer_start_index" in text:  # ERNIE-4.5: start <= layer <= end (-1: the last), every interval-th
        end = text.get("moe_layer_end_index")
        end = 1 << 30 if end is None or int(end) < 0 else int(end)
        return (int(text["moe_layer_start_index"] or 0) <= layer <= end
                and (layer + 1) % int(text.get("moe_layer_interval") or 1) == 0)
    step = int(text.get("decoder_sparse_step") or text.get("moe_layer_freq") or 1)
    return (layer + 1) % step == 0


def _windows(text: Mapping, layers: int, kind: str) -> tuple[int, int]:
    """(window, how many layers use it)."""
    window = int(text.get("sliding_window") or 0)
    types = text.get("layer_types")
    if isinstance(types, (list, tuple)) and len(types) == layers:
        count = sum(t == "sliding_attention" for t in types)
    elif not window:
        count = 0
    elif isinstance(text.get("sliding_window_pattern"), str):  # EXAONE 4: "LLLG", L = local, repeated
        pattern = text["sliding_window_pattern"]
        count = sum(pattern[i % len(pattern)] == "L" for i in range(layers))
    elif text.get("sliding_window_pattern"):  # Gemma 3: every pattern-th layer is global
        count = sum((i + 1) % int(text["sliding_window_pattern"]) != 0 for i in range(layers))
    elif kind in ("gemma2", "cohere2", "gpt_oss"):  # every other layer, the first windowed
        count = (layers + 1) // 2
    elif text.get("use_sliding_window") is False:
        count = 0
    elif kind in _ALL_WINDOWED:
        count = layers - int(text.get("max_window_layers") or 0) if "max_window_layers" in text else layers
    else:
        count = layers
    return (window, count) if window and count else (0, 0)


def _vision(cfg: Mapping, llm_hidden: int) -> tuple[float, int]:
    """(matmul parameters of the vision tower and projector, ViT patches per LLM visual token); (0, 0) for text."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, Mapping):
        return 0.0, 0
    # Qwen2-VL names the ViT width embed_dim (its hidden_size is the merger's output) and sizes the MLP by mlp_ratio
    vh = int(vc.get("embed_dim") or vc.get("hidden_size") or 0)
    depth = int(vc.get("depth") or vc.get("num_hidden_layers") or 0)
    if vh < 1 or depth < 1:
        return 0.0, 0
    ratio_ffn = int(vh * float(vc["mlp_ratio"])) if vc.get("mlp_ratio") and vc.get("embed_dim") else 0
    ffn = ratio_ffn or int(vc.get("intermediate_size") or 4 * vh)
    gated = str(cfg.get("model_type", "")) == "qwen2_5_vl"
    per_layer = 4 * vh * vh + (3 if gated else 2) * vh * ffn
    patch = _side(vc.get("patch_size") or 14)
    frames = int(vc.get("temporal_patch_size") or 1)
    embed = int(vc.get("in_channels") or vc.get("num_channels") or 3) * patch * patch * frames * vh
    merge = int(vc.get("spatial_merge_size") or 0)
    if merge:  # Qwen-VL: merge² patches -> an MLP of width vh·merge² -> the LLM's hidden size (+ DeepStack mergers)
        wide = vh * merge * merge
        out = int(vc.get("out_hidden_size") or (vc.get("embed_dim") and vc.get("hidden_size")) or llm_hidden)
        merger = (wide * wide + wide * out) * (1 + len(vc.get("deepstack_visual_indexes") or ()))
        return float(depth * per_layer + embed + merger), merge * merge
    ratio = float(cfg.get("downsample_ratio") or 1.0)  # InternVL: pixel shuffle, then a 2-layer projector
    unshuffle = max(int(round(1 / ratio)) ** 2, 1)
    projector = vh * unshuffle * llm_hidden + llm_hidden * llm_hidden
    return float(depth * per_layer + embed + projector), unshuffle


def _side(patch: Any) -> int:
    return int(patch[0] if isinstance(patch, (list, tuple)) else patch)
