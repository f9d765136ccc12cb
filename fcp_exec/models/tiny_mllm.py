"""tiny-mllm: tiny-llm plus a small vision encoder and projector (Qwen-VL layout), trained with FCP.

Vision side, per *frame* (one temporal patch of an image or video, ``h × w`` patches):
patch embedding (linear over the flattened ``C·temporal_patch·patch²`` pixels) + fixed 2-D sinusoidal
positions → one pre-norm transformer block with full (bidirectional) attention among the frame's
patches → RMSNorm → ``merge × merge`` neighbouring patches concatenated → 2-layer GELU projector to the
LLM width. Each merged row replaces one visual placeholder token of the text sequence.

Patch order is Qwen-VL's: inside a frame, patches are laid out by merged-token row, merged-token column,
then the ``merge × merge`` sub-patches, so every ``merge²`` consecutive patches form one visual token and
visual tokens are ordered t-major, then rows, then columns (what ``FCPCollator``'s ``visual_index`` and
the Qwen-VL 3-D rope rule assume).

How vision work is split inside a CP group. The collator gives every rank of a group the group's
``pixel_values``/``grid_thw`` and, for its own zigzag tokens, ``visual_pos`` (local positions of the
placeholder tokens) and ``visual_index`` (their rows in the group's visual embeddings).

* Degree 1: the rank encodes the frames holding its visual tokens (all of them) and scatters the rows.
* Degree > 1 (:meth:`VisionEncoder.group_rows`): CP rank ``r`` encodes the ``r``-th of ``degree``
  contiguous shares of the group's frames (balanced by patch count, whole frames), then a P2P exchange
  inside the logical group sends every row to the rank holding its token position, and in the backward
  pass sends each row's gradient back to the rank that encoded it (:mod:`fcp_exec.vision_exchange`).
  Every frame is encoded exactly once per group, and the encoder on the owning rank receives the sum of
  its rows' gradients, so the all-reduce SUM of gradients over ranks equals the single-process gradient.
  (Encoding, on each rank, just the frames its tokens fall in would need no communication, but zigzag
  chunks cut most frames of short videos: on the bundled samples that encodes 1.8× / 2.5× / 3.2× the
  frames at degree 2 / 3 / 4.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn import functional as F

from fcp_exec.models.tiny_llm import RMSNorm, TinyLLM, TinyLLMConfig
from fcp_exec.vision_exchange import exchange_rows, frame_table

__all__ = ["TinyMLLMConfig", "TinyMLLM", "VisionEncoder"]


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyMLLMConfig:
    """``llm``: the language model; ``patch_dim``: flattened pixels per patch (Qwen-VL: 3·2·14·14 = 1176);
    ``vision_hidden``/``vision_heads``/``vision_ffn``: the encoder block; ``merge_size``: patches merged per
    side into one visual token (Qwen-VL: 2)."""

    llm: TinyLLMConfig = field(default_factory=TinyLLMConfig)
    patch_dim: int = 3 * 2 * 14 * 14
    vision_hidden: int = 32
    vision_heads: int = 2
    vision_ffn: int = 64
    merge_size: int = 2
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if not isinstance(self.llm, TinyLLMConfig):
            raise ValueError(f"TinyMLLMConfig.llm must be a TinyLLMConfig, got {type(self.llm).__name__}")
        for name in ("patch_dim", "vision_hidden", "vision_heads", "vision_ffn", "merge_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TinyMLLMConfig.{name} must be a positive int, got {v!r}")
        if self.vision_hidden % self.vision_heads or (self.vision_hidden // self.vision_heads) % 2:
            raise ValueError("vision_hidden must split into vision_heads heads of even size")
        if self.vision_hidden % 4:
            raise ValueError("vision_hidden must be a multiple of 4 (2-D sinusoidal positions)")


def _sincos_2d(h: int, w: int, merge: int, dim: int, dtype, device) -> torch.Tensor:
    """Fixed 2-D sinusoidal positions ``[h·w, dim]`` in Qwen-VL patch order (half the dims for the row)."""
    bh, bw, mh, mw = torch.meshgrid(torch.arange(h // merge), torch.arange(w // merge), torch.arange(merge),
                                    torch.arange(merge), indexing="ij")
    row = (bh * merge + mh).reshape(-1).to(torch.float64)
    col = (bw * merge + mw).reshape(-1).to(torch.float64)
    quarter = dim // 4
    freq = 1.0 / (10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter))
    parts = []
    for coord in (row, col):
        a = coord[:, None] * freq[None, :]
        parts += [a.sin(), a.cos()]
    return torch.cat(parts, dim=1).to(dtype=dtype, device=device)


class VisionEncoder(nn.Module):
    """Patch embedding + one full-attention block per frame + patch merger/projector (module docstring)."""

    def __init__(self, cfg: TinyMLLMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.vision_hidden
        self.patch_embed = nn.Linear(cfg.patch_dim, d)
        self.norm1 = RMSNorm(d, cfg.norm_eps)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = RMSNorm(d, cfg.norm_eps)
        self.fc1 = nn.Linear(d, cfg.vision_ffn)
        self.fc2 = nn.Linear(cfg.vision_ffn, d)
        self.norm_out = RMSNorm(d, cfg.norm_eps)
        m2 = cfg.merge_size ** 2
        self.merge1 = nn.Linear(m2 * d, cfg.llm.hidden)
        self.merge2 = nn.Linear(cfg.llm.hidden, cfg.llm.hidden)

    def encode_frames(self, patches: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """``patches`` ``[F, h·w, patch_dim]`` (F frames of one size) → visual tokens ``[F, h·w/m², hidden]``."""
        c = self.cfg
        nf, n, _ = patches.shape
        x = self.patch_embed(patches) + _sincos_2d(h, w, c.merge_size, c.vision_hidden, patches.dtype, patches.device)
        hd = c.vision_hidden // c.vision_heads
        q, k, v = self.qkv(self.norm1(x)).view(nf, n, 3, c.vision_heads, hd).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        a = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(nf, n, c.vision_hidden)
        x = x + self.proj(a)
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        x = self.norm_out(x).reshape(nf, n // c.merge_size ** 2, c.merge_size ** 2 * c.vision_hidden)
        return self.merge2(F.gelu(self.merge1(x)))

    def _encode(self, pixel_values: torch.Tensor, table: torch.Tensor, frames: list[int]) -> torch.Tensor:
        """Rows of ``frames`` (in the given order, each frame's rows contiguous), batched by frame size."""
        if not frames:
            # an empty share still joins the autograd graph (peers may send gradients back through it)
            return pixel_values.new_zeros((0, self.cfg.llm.hidden)) + 0.0 * self.merge2.bias.sum()
        by_size: dict[tuple[int, int], list[int]] = {}
        for f in frames:
            by_size.setdefault((int(table[f, 3]), int(table[f, 4])), []).append(f)
        outs, where, offset = [], {}, 0
        for (h, w), fs in by_size.items():
            p0 = table[fs, 2]
            gather = (p0[:, None] + torch.arange(h * w)[None, :]).reshape(-1).to(pixel_values.device)
            emb = self.encode_frames(pixel_values.index_select(0, gather).reshape(len(fs), h * w, -1), h, w)
            per = emb.shape[1]
            for j, f in enumerate(fs):
                where[f] = offset + j * per
            outs.append(emb.reshape(-1, emb.shape[-1]))
            offset += len(fs) * per
        cat = torch.cat(outs, dim=0)
        sel = torch.cat([torch.arange(where[f], where[f] + int(table[f, 1])) for f in frames])
        return cat.index_select(0, sel.to(cat.device))

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, visual_index: torch.Tensor) -> torch.Tensor:
        """Embeddings ``[len(visual_index), hidden]`` of the requested rows, encoding (on this rank alone)
        only the whole frames that hold them. Returns the rows in ``visual_index`` order."""
        table = frame_table(grid_thw, self.cfg.merge_size)
        idx = visual_index.to(torch.long).cpu()
        if idx.numel() == 0:
            return pixel_values.new_zeros((0, self.cfg.llm.hidden))
        starts = table[:, 0].contiguous()
        total = int(table[-1, 0] + table[-1, 1]) if table.numel() else 0
        if int(idx.min()) < 0 or int(idx.max()) >= total:
            raise ValueError(f"visual_index out of range: the group's grid_thw gives {total} visual rows")
        frame_of = torch.searchsorted(starts, idx, right=True) - 1
        needed = torch.unique(frame_of).tolist()
        rows = self._encode(pixel_values, table, needed)
        first = {f: i for i, f in zip(torch.cumsum(table[needed, 1], 0).tolist(), needed)}
        base = torch.tensor([first[f] - int(table[f, 1]) for f in frame_of.tolist()], dtype=torch.long)
        return rows.index_select(0, (base + idx - starts[frame_of]).to(rows.device))

    def group_rows(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor, visual_index: torch.Tensor,
                   ranks, cp_rank: int) -> torch.Tensor:
        """Like :meth:`forward` for a CP group of degree > 1: this rank encodes its share of the group's
        frames and exchanges rows with its peers (:mod:`fcp_exec.vision_exchange`). Every rank of
        the group must call it."""
        table = frame_table(grid_thw, self.cfg.merge_size)
        return exchange_rows(lambda lo, hi: self._encode(pixel_values, table, list(range(lo, hi))), table,
                             visual_index, ranks, cp_rank, pixel_values.device)


class TinyMLLM(nn.Module):
    """tiny-llm + :class:`VisionEncoder`; the encoder's rows replace the visual placeholder embeddings.

    ``forward(input_ids, position_ids, cu_seqlens, ranks, *, visual_pos=None, visual_index=None,
    pixel_values=None, grid_thw=None) -> logits``. ``visual_pos``/``visual_index`` are the collator's
    local positions of visual tokens and their rows in the group's visual embeddings."""

    def __init__(self, cfg: TinyMLLMConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or TinyMLLMConfig()
        self.llm = TinyLLM(cfg.llm)
        self.vision = VisionEncoder(cfg)
        for name, p in self.vision.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "norm" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, std=0.02)

    def forward(self, input_ids, position_ids, cu_seqlens, ranks, *, visual_pos=None, visual_index=None,
                pixel_values=None, grid_thw=None) -> torch.Tensor:
        x = self.llm.embed(input_ids)
        has_frames = pixel_values is not None and grid_thw is not None and grid_thw.numel() > 0
        has_tokens = visual_pos is not None and visual_pos.numel() > 0
        if has_tokens and not has_frames:
            raise ValueError("the batch has visual tokens but no pixel_values/grid_thw")
        if has_frames and (len(ranks) > 1 or has_tokens):
            if visual_pos is None or visual_index is None or visual_index.shape != visual_pos.shape:
                raise ValueError("visual_index must give one visual-embedding row per entry of visual_pos")
            pv = pixel_values.to(device=x.device, dtype=x.dtype)
            if pv.dim() != 2 or pv.shape[1] != self.cfg.patch_dim:
                raise ValueError(f"pixel_values must be [num_patches, {self.cfg.patch_dim}], got {tuple(pv.shape)}")
            if len(ranks) > 1:
                import torch.distributed as dist

                vis = self.vision.group_rows(pv, grid_thw, visual_index, tuple(ranks), list(ranks).index(dist.get_rank()))
            else:
                vis = self.vision(pv, grid_thw, visual_index)
            x = x.index_copy(0, visual_pos.to(x.device), vis)
        return self.llm(input_ids, position_ids, cu_seqlens, ranks, inputs_embeds=x)
