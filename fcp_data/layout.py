"""Zigzag layout of packed documents over a CP group (pure, per-rank helpers).

Every document of a packed micro-batch is cut into ``2·degree`` equal chunks; CP rank ``r`` keeps
chunks ``r`` and ``2·degree−1−r`` of every document, in document order. With a causal mask this
gives every rank the same amount of attention work. The helpers take ``(degree, cp_rank)`` as
plain ints, so they are tested for every rank in one process, and the collator uses them to shard
``input_ids``, ``labels`` and ``positions`` exactly like the attention inputs.

Local layout of one document of length ``L = 2·degree·c`` on CP rank ``r``: positions ``[0, c)``
hold global chunk ``r`` and positions ``[c, 2c)`` hold global chunk ``2·degree−1−r``; the local
``cu_seqlens`` is therefore ``cu_seqlens // degree``.
"""
from __future__ import annotations

import operator
from typing import Sequence

import numpy as np
import torch

__all__ = [
    "check_cu_seqlens",
    "local_positions",
    "zigzag_chunk_ids",
    "zigzag_index",
    "zigzag_shard",
    "zigzag_unshard",
]


def _as_long_list(cu_seqlens) -> list[int]:
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1:
            raise ValueError(f"cu_seqlens must be 1-D, got shape {tuple(cu_seqlens.shape)}")
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens must hold integers, got dtype {cu_seqlens.dtype}")
        if cu_seqlens.is_meta:
            raise ValueError("cu_seqlens must hold real integers: it is a tensor on the meta device, which has no data "
                             "(pass the collator's CPU cu_seqlens)")
        return [int(v) for v in cu_seqlens.tolist()]
    what = "cu_seqlens must be a 1-D sequence of integer token offsets"
    if isinstance(cu_seqlens, (str, bytes)):
        raise ValueError(f"{what}, got {cu_seqlens!r}")
    try:
        items = list(cu_seqlens)
    except TypeError:
        raise ValueError(f"{what}, got {cu_seqlens!r}") from None
    out = []
    for i, v in enumerate(items):
        # ints and integer numpy scalars; a whole float (8.0) is tolerated, 8.5 is not (int() truncated it)
        iv = _as_int(v)
        if iv is None and isinstance(v, (float, np.floating)) and float(v).is_integer():
            iv = int(v)
        if iv is None:
            raise ValueError(f"{what}; entry {i} is {v!r}")
        out.append(iv)
    return out


def check_cu_seqlens(cu_seqlens, *, num_tokens: int | None = None, multiple: int = 1,
                     local_degree: int | None = None) -> list[int]:
    """Validate document boundaries and return them as a list of ints.

    ``cu_seqlens`` must start at 0 and never decrease; when ``num_tokens`` is given it must end
    there; every document length must be a multiple of ``multiple``. ``local_degree``: ``cu_seqlens`` are one rank's
    local bounds in a CP group of that degree (``zigzag_shard``'s second output), named so in the error.
    """
    cu = _as_long_list(cu_seqlens)
    if len(cu) < 1 or cu[0] != 0:
        raise ValueError(f"cu_seqlens must start with 0 (cumulative document ends), got {cu[:4]}...")
    for i in range(len(cu) - 1):
        length = cu[i + 1] - cu[i]
        if length < 0:
            raise ValueError(
                f"cu_seqlens decreases at document {i} ({cu[i]} -> {cu[i + 1]}); "
                "it must be the running sum of document lengths")
        if length % multiple:
            if local_degree is not None:
                raise ValueError(_odd_local(i, cu, length, multiple, local_degree))
            raise ValueError(
                f"document {i} (tokens {cu[i]}..{cu[i + 1]}) has length {length}, not divisible by "
                f"2*degree={multiple}; pad every document to a multiple of {multiple} "
                f"(here to {length + (-length) % multiple}) before sharding")
    if num_tokens is not None and cu[-1] != num_tokens:
        raise ValueError(
            f"cu_seqlens ends at {cu[-1]} but the tensor has {num_tokens} tokens; "
            "they must describe the same packed sequence")
    return cu


def _odd_local(i: int, cu: list[int], length: int, multiple: int, degree: int) -> str:
    return (f"local document {i} (tokens {cu[i]}..{cu[i + 1]}) has length {length}, not divisible by {multiple}: at "
            f"degree {degree} every rank holds 2 zigzag chunks of each document (whose padded global length is a "
            f"multiple of 2*degree={2 * degree}), so every local document length must be even; pass the local "
            "cu_seqlens that fcp_data.layout.zigzag_shard returns for the padded documents")


def _as_int(v) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)  # int, numpy/torch integer scalars
    except TypeError:
        return None


def _check_degree(degree: int, cp_rank: int | None = None) -> tuple[int, int | None]:
    d = _as_int(degree)
    if d is None or d < 1:
        raise ValueError(f"degree must be an int >= 1, got {degree!r}")
    if cp_rank is None:
        return d, None
    r = _as_int(cp_rank)
    if r is None or not 0 <= r < d:
        raise ValueError(f"cp_rank must be an int in [0, {d}), got {cp_rank!r}")
    return d, r


def zigzag_index(cu_seqlens, degree: int, cp_rank: int) -> torch.Tensor:
    """Global token indices that ``cp_rank`` keeps, in local order (a ``LongTensor``).

    ``x[zigzag_index(cu, degree, r)]`` is the local shard of ``x`` on CP rank ``r``.
    """
    degree, cp_rank = _check_degree(degree, cp_rank)
    cu = check_cu_seqlens(cu_seqlens, multiple=2 * degree)
    parts: list[torch.Tensor] = []
    for start, end in zip(cu[:-1], cu[1:]):
        chunk = (end - start) // (2 * degree)
        if chunk == 0:
            continue
        first = start + cp_rank * chunk
        second = start + (2 * degree - 1 - cp_rank) * chunk
        parts.append(torch.arange(first, first + chunk, dtype=torch.long))
        parts.append(torch.arange(second, second + chunk, dtype=torch.long))
    if not parts:
        return torch.zeros(0, dtype=torch.long)
    return torch.cat(parts)


def zigzag_chunk_ids(degree: int, cp_rank: int) -> tuple[int, int]:
    """The two global chunk ids (out of ``2·degree``) that ``cp_rank`` holds, in local order."""
    degree, cp_rank = _check_degree(degree, cp_rank)
    return cp_rank, 2 * degree - 1 - cp_rank


def _local_cu(cu_seqlens, cu: list[int], degree: int) -> torch.Tensor:
    if isinstance(cu_seqlens, torch.Tensor):
        return torch.div(cu_seqlens, degree, rounding_mode="floor")
    return torch.tensor([c // degree for c in cu], dtype=torch.int32)


def zigzag_shard(x: torch.Tensor, cu_seqlens, degree: int, cp_rank: int):
    """Shard ``x`` (``[T, ...]``) for ``cp_rank`` of a CP group of size ``degree``.

    Returns ``(x_local, cu_seqlens_local)`` with ``x_local`` of shape ``[T // degree, ...]`` holding
    chunks ``cp_rank`` and ``2·degree−1−cp_rank`` of every document in document order, and
    ``cu_seqlens_local = cu_seqlens // degree`` (same dtype when ``cu_seqlens`` is a tensor, int32
    otherwise). Raises ``ValueError`` naming the first document whose length is not divisible by
    ``2·degree``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor of shape [T, ...]")
    degree, cp_rank = _check_degree(degree, cp_rank)
    cu = check_cu_seqlens(cu_seqlens, num_tokens=x.shape[0], multiple=2 * degree)
    if degree == 1:
        return x, _local_cu(cu_seqlens, cu, 1)
    idx = zigzag_index(cu, degree, cp_rank).to(x.device)
    return x.index_select(0, idx), _local_cu(cu_seqlens, cu, degree)


def zigzag_unshard(shards: Sequence[torch.Tensor], cu_seqlens, degree: int) -> torch.Tensor:
    """Inverse of :func:`zigzag_shard`: ``shards[r]`` is CP rank ``r``'s local tensor."""
    degree, _ = _check_degree(degree)
    if len(shards) != degree:
        raise ValueError(f"expected {degree} shards (one per CP rank), got {len(shards)}")
    cu = check_cu_seqlens(cu_seqlens, multiple=2 * degree)
    local_tokens = cu[-1] // degree
    first = shards[0]
    for r, shard in enumerate(shards):
        if shard.shape[0] != local_tokens or shard.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"shard {r} has shape {tuple(shard.shape)}, expected "
                f"({local_tokens}, {', '.join(map(str, first.shape[1:]))}) from cu_seqlens")
        if shard.dtype != first.dtype:
            raise ValueError(f"shard {r} has dtype {shard.dtype}, shard 0 has {first.dtype}")
    out = first.new_empty((cu[-1],) + tuple(first.shape[1:]))
    for r, shard in enumerate(shards):
        out.index_copy_(0, zigzag_index(cu, degree, r).to(out.device), shard)
    return out


def local_positions(gpos: torch.Tensor, rows: torch.Tensor, idx: torch.Tensor | None,
                    total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed (global) positions ``gpos`` that this rank holds, as local positions after the zigzag take ``idx``
    (``zigzag_index``; None: degree 1, nothing moves) of ``total`` packed tokens, with their ``rows``."""
    if idx is None:
        return gpos, rows
    inv = torch.full((total,), -1, dtype=torch.long)
    inv[idx] = torch.arange(idx.numel(), dtype=torch.long)
    local = inv[gpos]
    keep = local >= 0
    return local[keep], rows[keep]
