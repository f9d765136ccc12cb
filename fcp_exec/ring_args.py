"""The argument contract of FCP's ring attention, shared by :func:`fcp_exec.ring_attention.ring_attention` and the
``torch.ops.fcp.ring_attention`` op (:mod:`fcp_exec.ring_op`): shape/dtype/device checks, the softmax scale and the
kernel, and how an enclosing ``torch.autocast`` is honoured."""

from __future__ import annotations

import contextlib
import struct
import zlib

import torch

from fcp_exec.kernels import AttentionKernel, default_kernel, get_kernel

__all__ = ["autocast_inputs", "autocast_off", "check_mask_options", "check_peers", "checked_args", "padded_values",
           "peer_header"]


def padded_values(k, v):
    """``(v, its head dim)`` with ``v`` zero-padded to ``k``'s head dim when it has fewer (multi-latent attention,
    DeepSeek-V3: query/key heads of 192, value heads of 128): the padded columns of the output are exactly 0 and are
    cut off after (``out[..., :dv]``), so attention and its gradients are unchanged; the ring then ships the padded
    values (K/V traffic ``2·d_qk`` instead of ``d_qk + d_v`` per head). ``(v, None)`` otherwise."""
    if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == 3 and v.dim() == 3 \
            and v.shape[:2] == k.shape[:2] and 0 < v.shape[2] < k.shape[2]:
        return torch.nn.functional.pad(v, (0, k.shape[2] - v.shape[2])), v.shape[2]
    return v, None


def autocast_inputs(q, k, v):
    """Inside ``torch.autocast`` attention runs in the autocast dtype, as torch's SDPA does there: the floating-point
    q, k, v other than float64 are cast to it (a Hugging Face layer under bf16 autocast hands over fp32 q/k — the
    rotary embedding promotes them — and a bf16 v). Outside autocast the tensors are taken as given."""
    if not isinstance(q, torch.Tensor) or not torch.is_autocast_enabled(q.device.type):
        return q, k, v
    dtype = torch.get_autocast_dtype(q.device.type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64
                 else t for t in (q, k, v))


def autocast_off(device: torch.device):
    """The ring's forward and backward run in the dtypes it chose (fp32 accumulators for half inputs), not in an
    enclosing autocast's: autocast is switched off for them (a ``backward()`` called inside autocast included)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def checked_args(q, k, v, causal, softmax_scale, kernel) -> tuple[float, AttentionKernel]:
    """:func:`ring_attention`'s argument checks; returns the softmax scale and the kernel to run."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a [T_local, H, D] tensor, got {getattr(t, 'shape', t)!r}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
                         "need q [T, H_q, D] and k, v [T, H_kv, D]")
    if q.shape[1] < 1 or k.shape[1] < 1:
        raise ValueError(f"q has {q.shape[1]} heads and k/v have {k.shape[1]}: need H_q >= 1 query heads and "
                         f"H_kv >= 1 key/value heads (q [T, H_q, D], k/v [T, H_kv, D]), got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"H_q={q.shape[1]} must be a multiple of H_kv={k.shape[1]}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"q, k, v must be floating point (fp16/bf16/fp32/fp64), got {q.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v devices differ: {q.device}, {k.device}, {v.device}")
    if q.shape[-1] < 1:
        raise ValueError(f"head dim must be >= 1, got q {tuple(q.shape)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    scale = q.shape[-1] ** -0.5
    if softmax_scale is not None:
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) or \
                not 0 < softmax_scale < float("inf"):
            raise ValueError(f"softmax_scale must be a finite number > 0 (default 1/sqrt(head dim)), got {softmax_scale!r}")
        scale = float(softmax_scale)
    if kernel is None:
        return scale, default_kernel(q.device, q.dtype)
    if isinstance(kernel, str):
        return scale, get_kernel(kernel)
    if not isinstance(kernel, AttentionKernel):
        raise ValueError(f"kernel must be an AttentionKernel or a kernel name, got {type(kernel).__name__} {kernel!r}")
    return scale, kernel


def check_mask_options(q, causal: bool, window, sinks, softcap) -> None:
    """:func:`ring_attention`'s ``window`` (an int >= 1), ``softcap`` (a finite number > 0) — both causal only — and
    ``sinks`` (a floating ``[H_q]`` tensor on ``q``'s device): one ``ValueError`` for anything else."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1 or not causal):
        raise ValueError(f"window must be an int >= 1 with causal=True (a sliding window), got {window!r}"
                         f"{'' if causal else ' with causal=False'}")
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not 0 < softcap < float("inf") or not causal):
        raise ValueError(f"softcap must be a finite number > 0 with causal=True (logit soft-capping), got "
                         f"{softcap!r}{'' if causal else ' with causal=False'}")
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (q.shape[1],)
                              or not sinks.is_floating_point() or sinks.device != q.device):
        raise ValueError(f"sinks must be a floating [H_q={q.shape[1]}] tensor on {q.device}, got "
                         f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else type(sinks).__name__}")


_HEADER_MAGIC = 0x46435032  # "FCP2": the peer runs this check (same header layout: 14 integers)
_HEADER_TAG = 8  # K/V use tags 0-1, dK/dV 2-3
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# a window this long (more tokens than any shard holds) is the plain causal mask: longer ones are sent as this one
# (the header holds ``causal + 2·window`` in an int64), so a window up to any Python int agrees with itself
WINDOW_CAP = 1 << 40


def _crc(values) -> int:
    return zlib.crc32(struct.pack(f"<{len(values)}q", *values))


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def peer_header(q, k, cu: list[int], causal: bool, scale: float, ranks, window: int | None = None,
                sinks: torch.Tensor | None = None, softcap: float | None = None) -> list[int]:
    """The 14 integers every rank of a CP group swaps with its ring neighbours before the first block travels: local
    tokens, heads, head dim, dtype, mask (causal, sliding window), softmax scale, degree, checksums of ``ranks`` and of
    the local ``cu_seqlens``, the soft-capping value (0: none) and attention sinks (0: none, else 1 + a checksum of
    their values: one small device-to-host copy)."""
    code = _DTYPES.index(q.dtype) + 1 if q.dtype in _DTYPES else 99
    values = [] if sinks is None else sinks.detach().double().tolist()  # (no numpy view: FSDP2 frees the storage)
    sunk = 0 if sinks is None else 1 + zlib.crc32(struct.pack(f"<{len(values)}d", *values))
    return [_HEADER_MAGIC, q.shape[0], q.shape[1], k.shape[1], q.shape[2], code,
            int(causal) + 2 * min(window or 0, WINDOW_CAP), _bits(scale), len(ranks), _crc(list(ranks)), len(cu) - 1,
            _crc(cu), 0 if softcap is None else _bits(float(softcap)), sunk]


def _describe(h: list[int]) -> str:
    dtype = str(_DTYPES[h[5] - 1]).replace("torch.", "") if 1 <= h[5] <= len(_DTYPES) else f"dtype#{h[5]}"
    scale = struct.unpack("<d", struct.pack("<q", h[7]))[0]
    mask = ("causal" if h[6] & 1 else "full") + (f" sliding-window {h[6] >> 1}" if h[6] >> 1 else "")
    cap = f"softcap {struct.unpack('<d', struct.pack('<q', h[12]))[0]:.6g}" if h[12] else "no softcap"
    sinks = f"sinks (crc {h[13] - 1:08x})" if h[13] else "no sinks"
    return (f"q [{h[1]}, {h[2]}, {h[4]}] k/v [{h[1]}, {h[3]}, {h[4]}] {dtype}, {mask} mask, "
            f"scale {scale:.6g}, {cap}, {sinks}, degree {h[8]}, {h[10]} local documents (cu_seqlens crc {h[11]:08x})")


_FIELDS = ((1, "local tokens"), (2, "query heads"), (3, "key/value heads"), (4, "head dim"), (5, "dtype"),
           (6, "mask"), (7, "softmax scale"), (8, "degree"), (9, "ranks (ring order)"), (10, "documents"),
           (11, "local cu_seqlens"), (12, "softcap"), (13, "sinks"))


def check_peers(comm, mine: list[int], device) -> None:
    """Swap :func:`peer_header` s with both ring neighbours of ``comm`` (a :class:`fcp_exec.comm.RingComm`) and raise
    ``ValueError`` on any difference."""
    got = comm.exchange_with_neighbours(torch.tensor(mine, dtype=torch.int64, device=device),
                                        tag=_HEADER_TAG, what="the shape header")
    for peer, t in got.items():
        theirs = t.tolist()
        if theirs == mine:
            continue
        if theirs[0] != _HEADER_MAGIC:
            raise ValueError(f"ring attention: rank {comm.rank} (cp_rank {comm.cp_rank} of CP group {comm.ranks}) got "
                             f"no shape header from peer rank {peer}; do all ranks run the same fcp version?")
        diff = [name for i, name in _FIELDS if theirs[i] != mine[i]]
        raise ValueError(
            f"ring attention: rank {comm.rank} (cp_rank {comm.cp_rank} of CP group {list(comm.ranks)}) and peer rank "
            f"{peer} differ in {', '.join(diff)}: rank {comm.rank} has {_describe(mine)}; rank {peer} has "
            f"{_describe(theirs)}. Every rank of a CP group must call ring_attention with the same ranks, dtype, mask "
            "(window, softcap, sinks) and local shapes and cu_seqlens (zigzag_shard of the same padded documents)")
