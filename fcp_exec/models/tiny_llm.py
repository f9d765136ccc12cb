"""tiny-llm: a small Llama-style decoder whose attention runs through :func:`fcp_exec.ring_attention`.

Architecture (Llama 2/3 family, scaled down): token embedding → ``num_layers`` × [RMSNorm → GQA
self-attention with rotary embeddings → residual → RMSNorm → SwiGLU MLP → residual] → RMSNorm → LM head
(untied). It is meant for exactness tests, the demo and the profiler, so every op is deterministic and
works in float32 and float64.

The model takes one rank's share of a planned micro-batch exactly as :class:`fcp_data.FCPCollator`
produces it: local tokens in zigzag order, their *global* positions (RoPE is applied at those, so a
token's rotation does not depend on which rank holds it), the local ``cu_seqlens`` and the CP group's
global ``ranks``. Attention is causal within each packed document and the degree-``d`` ring exchange is
done by ``ring_attention``; every other op is token-wise, so the model never communicates otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["TinyLLMConfig", "TinyLLM", "RMSNorm", "apply_rope", "token_loss_sum"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyLLMConfig:
    """Sizes of tiny-llm. ``num_heads`` must be a multiple of ``num_kv_heads`` (GQA); ``head_dim`` even
    (rotary pairs). The default vocabulary matches the bundled ``tokenizers/tiny-bpe.json`` (2000 ids)."""

    vocab_size: int = 2000
    hidden: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    ffn: int = 128
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "num_layers", "num_heads", "num_kv_heads", "head_dim", "ffn"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TinyLLMConfig.{name} must be a positive int, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ValueError("rope_theta and norm_eps must be > 0")


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) · weight`` over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half convention) of ``x`` ``[T, H, D]`` at integer ``positions`` ``[T]``.

    Angles are computed in float64 and cast to ``x``'s dtype, so a token gets bit-identical rotations
    whichever rank holds it."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d))
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos = ang.cos().to(x.dtype)[:, None, :]
    sin = ang.sin().to(x.dtype)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


def _attention(q, k, v, cu_seqlens, ranks, causal: bool) -> torch.Tensor:
    from fcp_exec import ring_attention  # the executor; imported here so the model file loads alone

    return ring_attention(q, k, v, cu_seqlens, ranks=tuple(ranks), causal=causal)  # cu_seqlens: a RingBatch


class Attention(nn.Module):
    def __init__(self, cfg: TinyLLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x, positions, cu_seqlens, ranks) -> torch.Tensor:
        c = self.cfg
        t = x.shape[0]
        q = apply_rope(self.q_proj(x).view(t, c.num_heads, c.head_dim), positions, c.rope_theta)
        k = apply_rope(self.k_proj(x).view(t, c.num_kv_heads, c.head_dim), positions, c.rope_theta)
        v = self.v_proj(x).view(t, c.num_kv_heads, c.head_dim)
        o = _attention(q, k, v, cu_seqlens, ranks, causal=True)
        return self.o_proj(o.reshape(t, c.num_heads * c.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyLLMConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.ffn)

    def forward(self, x, positions, cu_seqlens, ranks) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), positions, cu_seqlens, ranks)
        return x + self.mlp(self.mlp_norm(x))


class TinyLLM(nn.Module):
    """Llama-style decoder over one rank's zigzag shard; see the module docstring.

    ``forward(input_ids, position_ids, cu_seqlens, ranks, inputs_embeds=None) -> logits [T, vocab]``:
    ``input_ids``/``position_ids`` ``[T]`` (local tokens, global positions), ``cu_seqlens`` local int32
    boundaries, ``ranks`` the CP group in ring order (``(rank,)`` for degree 1). ``inputs_embeds``
    ``[T, hidden]`` replaces the token embedding (the MLLM passes embeddings with visual rows filled in).
    """

    def __init__(self, cfg: TinyLLMConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or TinyLLMConfig()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Small normal init (std 0.02, output projections scaled by 1/sqrt(2·layers)); draws from the
        global torch RNG, so ``torch.manual_seed(s)`` before construction fixes every weight."""
        std = 0.02
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or ".attn_norm." in name or ".mlp_norm." in name:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down.weight")):
                nn.init.normal_(p, std=std / (2 * self.cfg.num_layers) ** 0.5)
            else:
                nn.init.normal_(p, std=std)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor,
                ranks: Sequence[int], inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.dim() != 1 or position_ids.shape != input_ids.shape:
            raise ValueError(f"input_ids and position_ids must be 1-D of equal length (one rank's packed "
                             f"tokens), got {tuple(input_ids.shape)} and {tuple(position_ids.shape)}")
        if not ranks:
            raise ValueError("ranks is empty: an idle rank has no tokens and must not call the model")
        from fcp_exec.ring_attention import RingBatch

        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        ring = RingBatch(cu_seqlens, tuple(ranks))  # host metadata once per forward, shared by every layer
        for layer in self.layers:
            x = layer(x, position_ids, ring, ranks)
        return self.lm_head(self.norm(x))


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Sum (not mean) of the cross-entropy of the label tokens; the training loop divides by the
    global batch's label-token count so that an all-reduce SUM over ranks gives the global mean."""
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
