"""The transformers models fcp runs: which model types it was tested with, building one from a local config, and the
attention features ring attention does not implement (refused per call, never silently dropped)."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

from fcp_exec.compat import require_hf_models
from fcp_exec.names import SUPPORTED_MODEL_TYPES

__all__ = ["SUPPORTED_MODEL_TYPES", "VL_MODEL_TYPES", "QWEN3_VL_MODEL_TYPES", "TILE_VL_MODEL_TYPES",
           "FRAME_VL_MODEL_TYPES", "MLLM_MODEL_TYPES", "UNUSED_PARAMETER_MODEL_TYPES", "leaves_parameters_unused",
           "attention_limits", "other_token_mixing", "build_model", "load_config", "ring_call", "tile_geometry"]

VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")  # Qwen-VL: 3-D rope positions, patches + grids
QWEN3_VL_MODEL_TYPES = ("qwen3_vl", "qwen3_vl_moe")  # deepstack features, one placeholder run per frame group
TILE_VL_MODEL_TYPES = ("internvl",)  # fixed-size image tiles (video frames: one tile each), 1-D positions
FRAME_VL_MODEL_TYPES = ("llava_onevision",)  # videos as square frames pooled by the model, 1-D positions
MLLM_MODEL_TYPES = VL_MODEL_TYPES + TILE_VL_MODEL_TYPES + FRAME_VL_MODEL_TYPES
# models whose forward leaves parameters without a gradient (LLaVA-OneVision reads its SigLIP tower's last hidden
# state, before the tower's post_layernorm): DDP must be built with find_unused_parameters=True
UNUSED_PARAMETER_MODEL_TYPES = ("llava_onevision",)


def leaves_parameters_unused(model: Any) -> bool:
    """Whether ``model`` (a transformers model, or anything else: False) is of a type in
    :data:`UNUSED_PARAMETER_MODEL_TYPES`, i.e. DDP needs ``find_unused_parameters=True`` for it."""
    return getattr(getattr(model, "config", None), "model_type", None) in UNUSED_PARAMETER_MODEL_TYPES


_ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# modules that mix tokens outside attention: state-space / linear-attention / convolution mixers of hybrid models
_MIXER_NAMES = re.compile(r"Mamba|DeltaNet|LinearAttention|LightningAttention|Rwkv|RWKV|Retention|ShortConv")


def other_token_mixing(model: nn.Module) -> str | None:
    """Why ``model``'s language model mixes tokens other than through the attention calls ring attention computes —
    or None. Ring attention sees the whole document only inside those calls; anything else would see this rank's
    zigzag shard (and, packed, its neighbour documents) and train silently wrong, so :func:`apply_fcp` refuses it:
    layer types other than full and sliding-window attention (Qwen3-Next's and Jamba's linear attention, Llama 4's
    chunked attention, Falcon-H1's hybrid layers), bidirectional attention, and recurrent or convolutional token
    mixers in the decoder (Mamba, gated DeltaNet, LFM2's short convolutions: an ``nn.Conv1d`` or such a class)."""
    cfg = getattr(model.config, "text_config", None) or model.config
    kinds = sorted({str(t) for t in (getattr(cfg, "layer_types", None) or ())} - set(_ATTENTION_LAYER_TYPES))
    if kinds:
        return f"its layer types {kinds} (FCP computes full and sliding-window attention layers)"
    if getattr(cfg, "use_bidirectional_attention", False):
        return "bidirectional attention (use_bidirectional_attention=True; FCP computes causal attention)"
    try:
        decoder = model.get_decoder()
    except Exception:  # noqa: BLE001 - a model without a separable decoder: scan all of it
        decoder = model
    for name, m in decoder.named_modules():
        if name and (isinstance(m, nn.Conv1d) or _MIXER_NAMES.search(type(m).__name__)):
            return f"its module {name} ({type(m).__name__}) mixes tokens outside attention"
    return None


def _refusals(dropout: float, kwargs: dict) -> None:
    if dropout:
        raise ValueError(f"fcp_ring attention does not implement attention dropout (got {dropout}); set the config's "
                         "attention_dropout to 0")
    # transformers 5 hands the layer's cache to the layer, not to attention; the attention call gets ``use_cache``
    if kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None or kwargs.get("use_cache"):
        raise ValueError("fcp_ring attention is for training: call the model with use_cache=False")


def attention_limits(module: nn.Module, dropout: float, kwargs: dict, ring: Any) -> int | None:
    """The sliding window ring attention must apply in this call, or None; one ``ValueError`` for what a layer asks
    of its attention that ring attention does not compute: attention dropout, a KV cache (attention sinks, gpt-oss's
    ``s_aux``, and logit soft-capping, Gemma 2's ``softcap``, it computes: :func:`ring_call` passes them on). The
    window comes from the call (Mistral, Phi-3 pass the config's) or the layer (Qwen2/3, Gemma 2/3). A window at
    least as long as every document of the micro-batch is plain causal attention (no token has more predecessors than
    the window): None then, so the fused kernels run (the check uses each document's padded length in the ring,
    ``ring.cu`` × degree, which can only over-estimate); a shorter one is returned and computed exactly
    (:mod:`fcp_exec.kernels.window`)."""
    _refusals(dropout, kwargs)
    window = _window_of(module, kwargs)
    return ring.acting_window(window) if window else None


def ring_call(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Any, kernel: Any,
              scaling: float | None, dropout: float, kwargs: dict) -> torch.Tensor:
    """Ring attention for one transformers attention call (``[T, H, D]`` q, k, v of this rank's shard). Under
    ``torch.compile`` it runs as the op ``torch.ops.fcp.ring_attention`` (:mod:`fcp_exec.ring_op`: one graph node
    reading the micro-batch's registered handle, so a new micro-batch does not recompile; a sliding window and
    attention sinks are its arguments), except with logit soft-capping or a non-default kernel: eagerly then, outside
    any graph (:func:`_ring_eager`).
    Attention sinks (``s_aux``: a ``[H_q]`` logit per head, gpt-oss) join every query's softmax
    (:func:`fcp_exec.kernels.base.add_sinks`); logit soft-capping (``softcap``, Gemma 2) runs on the masked path."""
    if k.shape[0] != q.shape[0]:  # a KV cache handed to the model (use_cache=False too) put earlier tokens' keys first
        raise ValueError(f"fcp_ring attention is for training: call the model with use_cache=False and no "
                         f"past_key_values (its KV cache gave {k.shape[0]} keys for {q.shape[0]} queries)")
    if torch.compiler.is_compiling() and kernel is None and not kwargs.get("softcap"):
        from fcp_exec.ring_op import ring_attention_op

        _refusals(dropout, kwargs)  # the ring's lengths are not read here: the op decides whether a window acts
        window = _window_of(module, kwargs)
        return ring_attention_op(q, k, v, ring, causal=bool(getattr(module, "is_causal", True)), softmax_scale=scaling,
                                 window=int(window) if window else None, sinks=kwargs.get("s_aux"))
    return _ring_eager(module, q, k, v, ring, kernel, scaling, dropout, kwargs)


@torch.compiler.disable
def _ring_eager(module: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Any, kernel: Any,
                scaling: float | None, dropout: float, kwargs: dict) -> torch.Tensor:
    """:func:`fcp_exec.ring_attention.ring_attention` with the layer's window, sinks and soft-capping: under
    ``torch.compile`` a graph break (logit soft-capping and non-default kernels are not the op's)."""
    from fcp_exec.ring_attention import ring_attention

    window = attention_limits(module, dropout, kwargs, ring)
    return ring_attention(q, k, v, ring, causal=bool(getattr(module, "is_causal", True)), softmax_scale=scaling,
                          kernel=kernel, window=window, sinks=kwargs.get("s_aux"),
                          softcap=kwargs.get("softcap") or None)


def _window_of(module: nn.Module, kwargs: dict) -> Any:
    return kwargs.get("sliding_window") or getattr(module, "sliding_window", None)


def load_config(path) -> Any:
    """A transformers config from a local ``config.json`` (or its folder); no download. ``ValueError`` with the
    reason for anything else."""
    import json
    from pathlib import Path

    from transformers import AutoConfig

    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"no model config at {str(path)!r}: pass a local config.json (random weights, no download)")
    try:
        raw = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p}: not a JSON model config ({e})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ValueError(f"{p}: a transformers config.json needs a 'model_type' (one of {', '.join(SUPPORTED_MODEL_TYPES)})")
    raw = dict(raw)
    raw.pop("architectures", None)
    _check_pad_token(raw, p)
    try:
        cfg = AutoConfig.for_model(raw.pop("model_type"), **raw)
    except Exception as e:  # noqa: BLE001 -- also huggingface_hub's StrictDataclassError (a field of the wrong type)
        raise ValueError(f"{p}: transformers cannot build this config: {' '.join(str(e).split())}") from None
    for sub in (getattr(cfg, "text_config", None) or cfg, getattr(cfg, "vision_config", None)):
        for name in _SIZE_FIELDS:  # transformers 5.3 stored them unchecked (a str reached torch.empty)
            v = getattr(sub, name, None) if sub is not None else None
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"{p}: transformers cannot build this config: {name} must be an int, got {v!r}")
    _check_pad_token(cfg, p)
    return cfg


def _check_pad_token(cfg, where) -> None:
    """A ``pad_token_id`` outside the vocabulary fails inside ``nn.Embedding`` (an AssertionError on every rank):
    refused here, with the fix. ``cfg``: the config, or its raw JSON dict (checked before transformers warns)."""
    def get(obj, name):
        return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)

    for sub in (cfg, get(cfg, "text_config")):
        pad, vocab = get(sub, "pad_token_id"), get(sub, "vocab_size")
        if isinstance(pad, int) and not isinstance(pad, bool) and isinstance(vocab, int) and not -vocab <= pad < vocab:
            raise ValueError(f"{where}: pad_token_id {pad} is outside the vocabulary (vocab_size {vocab}); set it to "
                             f"a token id below {vocab}, or leave it out")


_SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "depth", "num_heads")


def stock_attention(auto, cfg) -> str:
    """The attention a stock model is built with: ``"sdpa"``, or ``"eager"`` for a model class without an SDPA
    path (gpt-oss: SDPA has no attention sinks) and for a config that soft-caps attention logits (Gemma 2:
    transformers 5.18 offers SDPA for it, which drops the cap)."""
    if getattr(getattr(cfg, "text_config", None) or cfg, "attn_logit_softcapping", None):
        return "eager"
    try:
        cls = auto._model_mapping[type(cfg)]
    except (KeyError, AttributeError):
        return "sdpa"
    return "sdpa" if getattr(cls, "_supports_sdpa", True) else "eager"


def build_model(config, *, dtype=torch.float32, seed: int = 0) -> nn.Module:
    """A randomly initialised transformers model (``sdpa`` attention, ``eager`` where the model has no SDPA path:
    :func:`stock_attention`; call :func:`apply_fcp` for FCP) from a config or a config path, with weights drawn
    from ``torch.manual_seed(seed)`` — identical on every rank."""
    require_hf_models()
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = load_config(config) if not hasattr(config, "model_type") else config
    torch.manual_seed(int(seed))
    auto = AutoModelForImageTextToText if cfg.model_type in MLLM_MODEL_TYPES else AutoModelForCausalLM
    try:
        return auto.from_config(cfg, attn_implementation=stock_attention(auto, cfg), dtype=dtype)
    except (RuntimeError, ValueError, TypeError, ZeroDivisionError, AssertionError) as e:  # e.g. a negative
        # hidden_size, 0 kv heads, a padding index outside the embedding
        raise ValueError(f"cannot build a {cfg.model_type} model from this config: {str(e).splitlines()[0]}") from None


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
INIT_NAMES = ("auto", "pretrained", "random")


def tile_geometry(config) -> tuple[int, int]:
    """InternVL's tiles: ``(side, merge)`` — vision patches per tile side (``image_size / patch_size``) and patches
    merged per side by the pixel shuffle (``1 / downsample_ratio``); a tile is the grid row ``(1, side, side)`` and
    holds ``(side / merge)²`` visual tokens."""
    v = config.vision_config
    return int(v.image_size[0]) // int(v.patch_size[0]), round(1 / float(config.downsample_ratio))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def has_weights(path) -> bool:
    """Whether ``path`` is a folder holding a transformers checkpoint's weights (:data:`WEIGHT_FILES`)."""
    from pathlib import Path

    p = Path(path)
    return p.is_dir() and any((p / f).is_file() for f in WEIGHT_FILES)


def load_model(path, *, config=None, dtype=torch.float32, seed: int = 0, init: str = "auto") -> nn.Module:
    """The model of a local ``path`` (a ``config.json`` or a checkpoint folder): its weights, read with
    ``from_pretrained`` (local files only, :func:`stock_attention`, in ``dtype``), when ``init`` is
    ``"pretrained"`` — or ``"auto"`` and the folder holds weights (:data:`WEIGHT_FILES`); else randomly initialised
    from ``seed`` (:func:`build_model`). A checkpoint that lacks a tensor the model has, or holds one of another
    shape, is one ``ValueError`` naming it (transformers would initialise it randomly and only log a warning)."""
    if init not in INIT_NAMES:
        raise ValueError(f"init must be one of {', '.join(INIT_NAMES)}, got {init!r}")
    require_hf_models()
    cfg = config if config is not None else load_config(path)
    if init == "random" or (init == "auto" and not has_weights(path)):
        return build_model(cfg, dtype=dtype, seed=seed)
    if not has_weights(path):
        raise ValueError(f"init='pretrained' needs a checkpoint folder with {' or '.join(WEIGHT_FILES[::2])}; "
                         f"{str(path)!r} has none (init='random' trains from random weights)")
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from transformers.utils import logging as hf_logging

    auto = AutoModelForImageTextToText if cfg.model_type in MLLM_MODEL_TYPES else AutoModelForCausalLM
    quiet = _rank() != 0 and hf_logging.is_progress_bar_enabled()  # one "Loading weights" bar per job, not per rank
    if quiet:
        hf_logging.disable_progress_bar()
    try:
        model, info = auto.from_pretrained(str(path), config=cfg, attn_implementation=stock_attention(auto, cfg),
                                           dtype=dtype, local_files_only=True, output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - safetensors/torch/transformers errors of a damaged checkpoint
        first = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"{path}: cannot load the checkpoint's weights ({type(e).__name__}: {first})") from None
    finally:
        if quiet:
            hf_logging.enable_progress_bar()
    bad = [f"missing {k}" for k in info.get("missing_keys", ())]
    bad += [f"{m[0] if isinstance(m, tuple) else m} of another shape" for m in info.get("mismatched_keys", ())]
    if bad:
        raise ValueError(f"{path}: the checkpoint does not fit this {cfg.model_type} config ({len(bad)} tensor(s): "
                         f"{', '.join(bad[:3])}{', …' if len(bad) > 3 else ''})")
    return model


def enable_gradient_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing of a transformers model (the 5.x name, else the older one)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
