"""The normative cost model of DESIGN.md §4.

Every solver, baseline, the ILP and the benchmarks call these formulas, so plans made by different
solvers are comparable. A CP group holds sequences with token lengths ``s_k`` and mask factors ``η_k``
(0 causal, 1 full attention) and runs on ``d`` ranks with zigzag ring attention::

    v = bandwidth_intra if all ranks of the group are on one node else bandwidth_inter
    A = alpha1 · Σ (1+η_k)·s_k² / d                  attention compute per rank
    C = A + alpha2 · Σ s_k / d + beta1                all compute per rank
    X = 0 if d == 1 else alpha3 · Σ s_k · (d−1)/d / v ring KV traffic per rank
    M = 0 if d == 1 else X + beta2                    all communication
    T = C + M − min(A, X)                             group time (attention overlaps KV traffic)
    memory: Σ s_k ≤ d · tokens_per_rank

Cost model v2 (§4.1) adds three optional terms, 0 by default (then every formula above is unchanged
bit-for-bit): ``gamma`` s per ring step (``M += gamma·(d−1)`` when ``d > 1``), ``alpha_blk`` s/token
(``C += alpha_blk·Σ (1+η_k)·s_k``, any ``d``) and ``alpha_vis`` s per visual token (``C += alpha_vis·Σ v_k / d``,
``v_k`` the visual tokens of sequence ``k``, 0 for text).

Solvers work on aggregates of a group: ``S = Σ s_k``, ``Q = Σ (1+η_k)·s_k²`` and, for v2, ``B = Σ (1+η_k)·s_k``
and ``V = Σ v_k``; :meth:`CostModel.time` takes those (vectorised over numpy arrays) so that a planner never
re-sums the lengths. To add a cost term: a field here (validated in ``__post_init__``, optional in
:data:`COST_KEYS_V2`), its aggregate in :func:`sequence_terms`, and a line in :meth:`CostModel.time` and in
:meth:`CostModel.time_fixed` (``tests/plan/test_cost_fixed.py`` holds the two to the same floats).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from fcp_data.cost_kernel import compiled_time
from fcp_data.strict import strict_keys

__all__ = ["CostModel", "COST_KEYS", "COST_KEYS_V2", "group_aggregates", "sequence_terms", "MAX_RANKS", "MAX_SEQUENCE_TOKENS", "MAX_TOKENS_PER_RANK",
           "MAX_GROUP_SECONDS"]

# Sanity limits of the planning core. MAX_RANKS bounds the ranks one plan covers: stage 2 works on a
# (groups × ranks) time table, so 4096 ranks × 4096 groups is 16.8M entries (134 MB per float64 array);
# a plan for more ranks is not a CP plan anyone runs (TP/PP/DP split a larger cluster first).
MAX_RANKS = 4096
MAX_SEQUENCE_TOKENS = (1 << 31) - 1  # one sequence; a batch of them still sums far below int64
MAX_TOKENS_PER_RANK = 1 << 40
MAX_RANKS_PER_NODE = 1 << 20
# no CP group that memory allows may take longer than this (about 31,700 years): a coefficient that makes
# it so is in the wrong unit, and larger values overflow once makespans are summed
MAX_GROUP_SECONDS = 1e12
_MAX_COST_FILE_BYTES = 1 << 20
_UNITS = {"alpha1": "s/token²", "alpha2": "s/token", "alpha3": "bytes/token", "beta1": "s", "beta2": "s",
          "bandwidth_intra": "bytes/s", "bandwidth_inter": "bytes/s", "ranks_per_node": "ranks",
          "tokens_per_rank": "tokens", "gamma": "s per ring step", "alpha_blk": "s/token",
          "alpha_vis": "s per visual token"}

COST_KEYS = (
    "alpha1",
    "alpha2",
    "alpha3",
    "beta1",
    "beta2",
    "bandwidth_intra",
    "bandwidth_inter",
    "ranks_per_node",
    "tokens_per_rank",
)
# §4.1: optional keys (absent = 0); to_dict emits them only when non-zero, so a v1 model round-trips as v1
COST_KEYS_V2 = ("gamma", "alpha_blk", "alpha_vis")


def sequence_terms(lengths, etas=None, visual=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-sequence float64 terms ``(s, q, b, v)``: ``q = (1+η)·s²``, ``b = (1+η)·s``, ``v`` the visual
    tokens (zeros when ``visual`` is None). Summed over a group they give ``S, Q, B, V`` of :meth:`CostModel.time`."""
    s = np.asarray(lengths, dtype=np.float64)
    e = np.zeros_like(s) if etas is None else np.asarray(etas, dtype=np.float64)
    v = np.zeros_like(s) if visual is None else np.asarray(visual, dtype=np.float64)
    if e.shape != s.shape or v.shape != s.shape:
        raise ValueError(f"etas/visual have shapes {e.shape}/{v.shape} but lengths has {s.shape}; give one per sequence")
    b = (1.0 + e) * s
    return s, b * s, b, v


def group_aggregates(lengths: Iterable[float], etas: Iterable[float] | None = None) -> tuple[float, float]:
    """``(S, Q) = (Σ s, Σ (1+η)·s²)`` of one group's sequences."""
    s = np.asarray(list(lengths) if not isinstance(lengths, np.ndarray) else lengths, dtype=np.float64)
    if etas is None:
        e = np.zeros_like(s)
    else:
        e = np.asarray(list(etas) if not isinstance(etas, np.ndarray) else etas, dtype=np.float64)
        if e.shape != s.shape:
            raise ValueError(f"etas has {e.size} entries but lengths has {s.size}; give one η per sequence")
    return float(s.sum()), float(((1.0 + e) * s * s).sum())


class _DuplicateKey(ValueError):
    """A JSON object holding one key twice (:func:`_no_duplicate_keys`)."""


def _no_duplicate_keys(pairs: list) -> dict:
    """A JSON object whose keys are all different: ``{"alpha1": 1, "alpha1": 2}`` silently kept the last value."""
    seen = dict(pairs)
    if len(seen) != len(pairs):
        dup = next(k for k in seen if sum(1 for kk, _ in pairs if kk == k) > 1)
        raise _DuplicateKey(f"key {dup!r} appears twice")
    return seen


@dataclass(frozen=True, kw_only=True, slots=True)
class CostModel:
    """Coefficients of the §4 cost model.

    Fields (units): ``alpha1`` s/token² (attention), ``alpha2`` s/token (linear layers and the rest),
    ``alpha3`` bytes/token (KV bytes sent per token, forward + backward), ``beta1``/``beta2`` s (fixed
    compute / communication overheads), ``bandwidth_intra``/``bandwidth_inter`` bytes/s,
    ``ranks_per_node`` (node of a rank = rank // ranks_per_node), ``tokens_per_rank`` (activation budget
    E: the most tokens one rank holds). v2 (§4.1, default 0): ``gamma`` s per ring step (paid ``d−1`` times
    when ``d > 1``), ``alpha_blk`` s/token (per-rank attention overhead ``alpha_blk·Σ(1+η)s`` that does not
    shrink with ``d``), ``alpha_vis`` s per visual token (vision encoder, ``alpha_vis·Σv/d``).
    """

    alpha1: float
    alpha2: float
    alpha3: float
    beta1: float
    beta2: float
    bandwidth_intra: float
    bandwidth_inter: float
    ranks_per_node: int
    tokens_per_rank: int
    gamma: float = 0.0
    alpha_blk: float = 0.0
    alpha_vis: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise ValueError(f"CostModel.{f.name} must be a number ({_UNITS[f.name]}), got {type(v).__name__} {v!r:.60}")
            try:
                finite = math.isfinite(float(v))
            except OverflowError:  # an int beyond float range
                finite = False
            if not finite:
                raise ValueError(f"CostModel.{f.name} must be a finite number ({_UNITS[f.name]}), got {v!r:.60}")
        for name in ("alpha1", "alpha2", "alpha3", "beta1", "beta2") + COST_KEYS_V2:
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0 {_UNITS[name]}, got {getattr(self, name)!r}")
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("bandwidth_intra", "bandwidth_inter"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CostModel.{name} must be > 0 bytes/s, got {getattr(self, name)!r}")
            object.__setattr__(self, name, float(getattr(self, name)))
        for name, top in (("ranks_per_node", MAX_RANKS_PER_NODE), ("tokens_per_rank", MAX_TOKENS_PER_RANK)):
            v = getattr(self, name)
            if int(v) != v or v < 1:
                raise ValueError(f"CostModel.{name} must be a positive integer, got {v!r}")
            if v > top:
                raise ValueError(f"CostModel.{name}={v!r} is beyond any real system (at most {top}); check the value")
            object.__setattr__(self, name, int(v))
        self._check_range()

    def _check_range(self) -> None:
        """No memory-feasible group may take an infinite or absurd time: the slowest one a plan can hold is
        one full-attention sequence filling ``d·tokens_per_rank`` on ``d`` ranks (A grows with ``d``), on
        one node or across nodes. A coefficient in the wrong unit (alpha1=1e308) fails here, at load,
        instead of as an overflow or a misleading "does not fit" deep inside a solver."""
        d = np.array([1.0, float(min(self.ranks_per_node, MAX_RANKS)), float(MAX_RANKS)])
        S = d * self.tokens_per_rank
        with np.errstate(over="ignore", invalid="ignore"):
            T = np.stack([self.time(S, 2.0 * S * S, d, intra, B=2.0 * S, V=S) for intra in (True, False)])
            T = np.where(np.isnan(T), np.inf, T)
            if float(T.max()) <= MAX_GROUP_SECONDS:
                return
            intra, j = np.unravel_index(int(np.argmax(T)), T.shape)
            dj, Sj = float(d[j]), float(S[j])
            v = self.bandwidth_intra if intra == 0 else self.bandwidth_inter
            terms = {"alpha1 (attention)": self.alpha1 * 2.0 * Sj * Sj / dj, "alpha2 (linear layers)": self.alpha2 * Sj / dj,
                     "alpha3 / bandwidth (ring traffic)": self.alpha3 * Sj * (dj - 1.0) / dj / v,
                     "beta1": self.beta1, "beta2": self.beta2, "gamma (ring steps)": self.gamma * (dj - 1.0),
                     "alpha_blk (attention blocks)": self.alpha_blk * 2.0 * Sj, "alpha_vis (vision)": self.alpha_vis * Sj / dj}
        culprit = max(terms, key=lambda k: terms[k] if not math.isnan(terms[k]) else math.inf)
        raise ValueError(
            f"cost model out of range: {int(dj)} rank(s) × tokens_per_rank={self.tokens_per_rank} would take "
            f"{float(T.max()):.3g} s (limit {MAX_GROUP_SECONDS:g} s), mostly from {culprit}; check the units: alpha1 "
            f"s/token², alpha2 s/token, alpha3 bytes/token, bandwidths bytes/s (alpha1={self.alpha1!r}, "
            f"alpha2={self.alpha2!r}, alpha3={self.alpha3!r}, bandwidth_intra={self.bandwidth_intra!r}, "
            f"bandwidth_inter={self.bandwidth_inter!r}, gamma={self.gamma!r}, alpha_blk={self.alpha_blk!r}, "
            f"alpha_vis={self.alpha_vis!r})")

    # ------------------------------------------------------------------ formulas
    @property
    def is_v2(self) -> bool:
        """True when a §4.1 term is non-zero (then group times need ``B`` and ``V``)."""
        return bool(self.gamma or self.alpha_blk or self.alpha_vis)

    def time(self, S, Q, d, intra=True, B=None, V=None):
        """Group time ``T`` from the aggregates ``S = Σ s``, ``Q = Σ (1+η)s²`` on ``d`` ranks, and for the
        §4.1 terms ``B = Σ (1+η)s`` (needed when ``alpha_blk > 0``) and ``V = Σ v`` (visual tokens; None = 0).

        Vectorised: any argument may be a numpy array (broadcast). ``intra`` says whether all the
        group's ranks are on one node. Returns a float for scalar input, else an array. A zero v2
        coefficient adds nothing, so with all three at 0 the result is bit-for-bit the §4 time.
        """
        if (out := compiled_time(self, S, Q, d, intra, B, V)) is not None:
            return out  # the same floats (fcp_data/cost_kernel.py), once the planner has loaded its kernels
        S = np.asarray(S, dtype=np.float64)
        Q = np.asarray(Q, dtype=np.float64)
        d_arr = np.asarray(d, dtype=np.float64)
        v = np.where(np.asarray(intra, dtype=bool), self.bandwidth_intra, self.bandwidth_inter)
        A = self.alpha1 * Q / d_arr
        C = A + self.alpha2 * S / d_arr
        if self.alpha_blk:
            if B is None:
                raise TypeError("CostModel.time needs B = Σ(1+η)s when alpha_blk > 0 (see sequence_terms)")
            C = C + self.alpha_blk * np.asarray(B, dtype=np.float64)
        if self.alpha_vis and V is not None:
            C = C + self.alpha_vis * np.asarray(V, dtype=np.float64) / d_arr
        C = C + self.beta1
        multi = d_arr > 1
        X = np.where(multi, self.alpha3 * S * (d_arr - 1.0) / d_arr / v, 0.0)
        if self.gamma:
            M = np.where(multi, X + self.beta2 + self.gamma * (d_arr - 1.0), 0.0)
        else:
            M = np.where(multi, X + self.beta2, 0.0)
        T = C + M - np.minimum(A, X)
        return float(T) if T.ndim == 0 else T

    def fixed_columns(self, d, intra) -> np.ndarray:
        """Per-group constants of :meth:`time_fixed` for groups of degrees ``d`` (1-D) and node flags ``intra``: a
        ``(5, K)`` array of rows ``d``, ``d − 1``, the bandwidth, ``beta2`` (0 where ``d == 1``) and ``gamma·(d − 1)``."""
        d = np.asarray(d, dtype=np.float64)
        out = np.empty((5,) + d.shape)  # filled row by row: the values np.stack of the five rows gives, fewer copies
        out[0] = d
        np.subtract(d, 1.0, out=out[1])
        np.copyto(out[2], self.bandwidth_inter)
        np.copyto(out[2], self.bandwidth_intra, where=np.asarray(intra, dtype=bool))
        np.copyto(out[3], 0.0)
        np.copyto(out[3], self.beta2, where=d > 1)
        np.multiply(self.gamma, out[1], out=out[4])
        return out

    def time_fixed(self, S, Q, B, V, cols: np.ndarray) -> np.ndarray:
        """:meth:`time` for many aggregates on groups whose degrees and placement are fixed (``cols`` from
        :meth:`fixed_columns`, broadcast along the last axis): bit-for-bit the same floats (the same operations in the
        same order; for ``d = 1`` the ring terms are exact zeros), in about half the numpy calls; for refinement,
        which times thousands of moves per plan. ``B`` is needed when ``alpha_blk > 0``; ``V`` None means no visual
        tokens (as in :meth:`time`)."""
        d, dm1, v, b2, gd = cols
        A = self.alpha1 * Q / d
        C = self.alpha2 * S
        C /= d
        C += A
        if self.alpha_blk:
            C += self.alpha_blk * B
        if self.alpha_vis and V is not None:
            w = self.alpha_vis * V
            w /= d
            C += w
        C += self.beta1
        X = self.alpha3 * S
        X *= dm1
        X /= d
        X /= v
        M = X + b2
        M += gd
        C += M
        C -= np.minimum(A, X, out=M)
        return C

    def is_intra_node(self, ranks: Sequence[int]) -> bool:
        """True when every rank of the group lies on one node (node = rank // ranks_per_node)."""
        ranks = list(ranks)
        if not ranks:
            raise ValueError("a CP group needs at least one rank")
        node = ranks[0] // self.ranks_per_node
        return all(r // self.ranks_per_node == node for r in ranks)

    def group_time(self, lengths: Iterable[float], etas: Iterable[float] | None = None, ranks: Sequence[int] | int = 1,
                   visual: Iterable[float] | None = None) -> float:
        """§4/§4.1 time of one group. ``ranks`` is the group's global ranks (placement decides intra/inter
        node) or an int degree, which is taken as the best placement (one node if it fits); ``visual``:
        visual tokens per sequence (None: text)."""
        def arr(x):
            return None if x is None else np.asarray(x if isinstance(x, np.ndarray) else list(x), dtype=np.float64)

        s, q, b, v = sequence_terms(arr(lengths), arr(etas), arr(visual))
        S, Q = float(s.sum()), float(q.sum())
        if isinstance(ranks, (int, np.integer)):
            d = int(ranks)
            if d < 1:
                raise ValueError(f"a CP group's degree must be >= 1, got {d}")
            intra = d <= self.ranks_per_node
        else:
            d = len(ranks)
            intra = self.is_intra_node(ranks)
        return self.time(S, Q, d, intra, B=float(b.sum()), V=float(v.sum()))

    def work(self, lengths, etas=None, visual=None) -> np.ndarray:
        """Per-sequence compute on one rank, ``alpha1·(1+η)s² + alpha2·s`` (+ ``alpha_blk·(1+η)s + alpha_vis·v``
        under §4.1): what LPT balances and what the micro-batch bound of ``auto`` sums."""
        s = np.asarray(lengths, dtype=np.float64)
        e = np.zeros_like(s) if etas is None else np.asarray(etas, dtype=np.float64)
        w = self.alpha1 * (1.0 + e) * s * s + self.alpha2 * s  # this order: plans depend on these exact floats
        if self.alpha_blk:
            w = w + self.alpha_blk * (1.0 + e) * s
        if self.alpha_vis and visual is not None:
            w = w + self.alpha_vis * np.asarray(visual, dtype=np.float64)
        return w

    def linearized(self, lengths, etas, visual, num_ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The group time as linear functions of the sequences on each degree ``d = 1..num_ranks`` (the exact
        form the ILP uses): ``T = c_d + max(Σ_k a[k, d], Σ_k x[k, d])`` for a group on one node, with
        ``c_d = beta1 + (beta2 + gamma·(d−1))·[d>1]``, ``a = (alpha1·q + alpha2·s)/d + e``, ``x = alpha3·s·(d−1)/(d·v_d)
        + alpha2·s/d + e`` and ``e = alpha_blk·b + alpha_vis·v/d`` (``T = C + M − min(A, X)`` rewritten;
        ``v_d`` the intra-node bandwidth up to ``ranks_per_node``, else inter-node). Returns ``(c, a, x)``."""
        s, q, b, vis = sequence_terms(lengths, etas, visual)
        d = np.arange(1, int(num_ranks) + 1, dtype=np.float64)
        bw = np.where(d <= self.ranks_per_node, self.bandwidth_intra, self.bandwidth_inter)
        c = self.beta1 + np.where(d > 1, self.beta2 + self.gamma * (d - 1), 0.0)
        extra = self.alpha_blk * b[:, None] + self.alpha_vis * vis[:, None] / d[None, :]
        a = (self.alpha1 * q[:, None] + self.alpha2 * s[:, None]) / d[None, :] + extra
        x = self.alpha3 * s[:, None] * ((d - 1) / d / bw)[None, :] + self.alpha2 * s[:, None] / d[None, :] + extra
        return c, a, x

    def min_degree(self, total_tokens: float) -> int:
        """Smallest degree whose memory holds ``total_tokens``."""
        return max(1, math.ceil(total_tokens / self.tokens_per_rank))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        """The §4 keys, then each §4.1 key that is non-zero (a v1 model stays a v1 JSON)."""
        d = asdict(self)
        for k in COST_KEYS_V2:
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CostModel":
        """Strict: the §4 keys, optionally the §4.1 keys (absent = 0); a missing or unknown key is a
        ``ValueError`` naming it."""
        return cls(**strict_keys(d, COST_KEYS, COST_KEYS_V2, what="cost model"))

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        """Read a cost JSON (the §4 keys); every problem is a one-line ``ValueError`` naming the file."""
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise ValueError(f"CostModel.load needs the path of a cost JSON, got {path!r}")
        p = Path(path)
        try:
            size = p.stat().st_size
            if p.exists() and not p.is_dir() and not p.is_file():
                raise ValueError(f"cost model file {p} is not a regular file (a device, pipe or socket); pass a JSON file")
            if size > _MAX_COST_FILE_BYTES:
                raise ValueError(f"cost model file {p} has {size} bytes; a cost JSON is a few hundred bytes "
                                 f"(at most {_MAX_COST_FILE_BYTES}) — is this the right file?")
            data = json.loads(p.read_text(encoding="utf-8-sig"), object_pairs_hook=_no_duplicate_keys)  # a BOM: Windows
        except FileNotFoundError:
            raise ValueError(f"cost model file not found: {p}") from None
        except IsADirectoryError:
            raise ValueError(f"cost model file {p} is a directory; pass the JSON file inside it") from None
        except OSError as e:
            raise ValueError(f"cost model file {p} cannot be read: {e.strerror or e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError, _DuplicateKey) as e:
            raise ValueError(f"cost model file {p} is not valid JSON: {e}") from None
        except RecursionError:
            raise ValueError(f"cost model file {p} is nested too deeply to be a cost model; it must be one flat "
                             f"JSON object with the keys {', '.join(COST_KEYS)}") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"cost model file {p}: {e}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def preset(cls, model: str, hardware: str, **overrides: Any) -> "CostModel":
        """Coefficients derived from a model config and a hardware spec (see :mod:`fcp_data.presets`)."""
        from fcp_data.presets import preset_cost_model

        return preset_cost_model(model, hardware, **overrides)

    def replace(self, **changes: Any) -> "CostModel":
        d = self.to_dict()
        d.update(changes)
        return CostModel.from_dict(d)
