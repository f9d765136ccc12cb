"""Stage 2 of FCP: give each atomic group a degree so that the slowest group finishes first (DESIGN §5).

Input: the groups' aggregates ``S = Σ s`` and ``Q = Σ (1+η)s²``; the time table ``T[i, d−1]`` of group
``i`` on ``d`` ranks (§4, intra-node when ``d ≤ ranks_per_node`` — the placement's best case —
``inf`` where memory ``S ≤ d·E`` fails or the degree is not allowed). Two allocators, same optimum:

* :func:`allocate_dp` — the paper's Algorithm 1, ``DP[i][j] = min_d max(DP[i−1][j−d], T_i(d))`` with
  ``DP[0][j] = 0``, O(K·N²) (each row vectorised over ``(j, d)``).
* :func:`allocate_fast` — exact in O(K·N): with idle ranks allowed, ``T̃_i(d) = min_{d'≤d} T_i(d')`` is
  non-increasing, so the least ``d`` with ``T̃_i(d) ≤ τ`` is ``f_i(τ) = 1 + #{d : T̃_i(d) > τ}`` and a
  makespan ``τ`` is feasible iff ``Σ_i f_i(τ) = K + #{(i,d) : T̃_i(d) > τ} ≤ N``. The optimum is therefore
  the ``(N−K)``-th largest entry (0-based) of the whole table ``T̃`` — one ``np.partition``, no search.
  Each group then takes the fastest degree ``d ≤ f_i(τ*)`` (fewest ranks on ties); leftover ranks idle.
"""

from __future__ import annotations

import numpy as np

from fcp_data.cost import CostModel

__all__ = ["time_table", "allocate_fast", "allocate_dp", "pow2_mask"]


def pow2_mask(num_ranks: int) -> np.ndarray:
    """Boolean mask over degrees 1..N that keeps the powers of two."""
    d = np.arange(1, num_ranks + 1)
    return (d & (d - 1)) == 0


def time_table(S: np.ndarray, Q: np.ndarray, num_ranks: int, cost_model: CostModel,
               allowed: np.ndarray | None = None, B: np.ndarray | None = None,
               V: np.ndarray | None = None) -> np.ndarray:
    """``T[i, d−1]``: §4/§4.1 time of group ``i`` on ``d`` ranks, ``inf`` if memory fails or ``d`` not
    allowed; ``B``, ``V``: the groups' §4.1 aggregates ``Σ(1+η)s`` and ``Σv`` (None: 0)."""
    S = np.asarray(S, dtype=np.float64)[:, None]
    Q = np.asarray(Q, dtype=np.float64)[:, None]
    B = None if B is None else np.asarray(B, dtype=np.float64)[:, None]
    V = None if V is None else np.asarray(V, dtype=np.float64)[:, None]
    d = np.arange(1, num_ranks + 1, dtype=np.float64)[None, :]
    T = cost_model.time(S, Q, d, d <= cost_model.ranks_per_node, B=B, V=V)
    T = np.where(S <= d * cost_model.tokens_per_rank, T, np.inf)
    if allowed is not None:
        T = np.where(np.asarray(allowed, dtype=bool)[None, :], T, np.inf)
    return np.atleast_2d(T)


def _table(T: np.ndarray, num_ranks: int | None) -> tuple[np.ndarray, int, int]:
    """``(T as float64 K × N, K, N)``; the table's width must be ``num_ranks`` when that is given."""
    T = np.asarray(T, dtype=np.float64)
    K, N = T.shape
    if num_ranks is not None and num_ranks != N:
        raise ValueError(f"time table has {N} degree columns but num_ranks={num_ranks}")
    return T, K, N


def allocate_fast(T: np.ndarray, num_ranks: int | None = None) -> tuple[float, np.ndarray | None]:
    """Exact min-max degree allocation on the table ``T`` (K × N). Returns ``(makespan, degrees)``;
    ``(inf, None)`` when no allocation with ``Σ d ≤ N`` meets memory."""
    T, K, N = _table(T, num_ranks)
    if K == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    if K > N:
        return float("inf"), None
    Tt = np.minimum.accumulate(T, axis=1)
    flat = Tt.ravel()
    k = N - K  # the answer is the k-th largest entry (0-based)
    tau = float(-np.partition(-flat, k)[k])
    if not np.isfinite(tau):
        return float("inf"), None
    budget = 1 + (Tt > tau).sum(axis=1)  # f_i(τ*)
    cols = np.arange(N)[None, :]
    masked = np.where(cols < budget[:, None], T, np.inf)
    degrees = masked.argmin(axis=1) + 1  # fastest degree within budget, fewest ranks on ties
    return tau, degrees.astype(np.int64)


def allocate_dp(T: np.ndarray, num_ranks: int | None = None) -> tuple[float, np.ndarray | None]:
    """The paper's 2-D dynamic program (Algorithm 1) on the table ``T`` (K × N), O(K·N²)."""
    T, K, N = _table(T, num_ranks)
    if K == 0:
        return 0.0, np.zeros(0, dtype=np.int64)
    j = np.arange(N + 1)[:, None]
    d = np.arange(1, N + 1)[None, :]
    prev_idx = j - d
    valid = prev_idx >= 0
    prev_idx = np.where(valid, prev_idx, 0)
    dp = np.zeros(N + 1)  # DP[0][j] = 0: no group, any number of ranks
    choice = np.zeros((K, N + 1), dtype=np.int64)
    for i in range(K):
        cand = np.maximum(dp[prev_idx], T[i][None, :])
        cand = np.where(valid, cand, np.inf)
        best = cand.argmin(axis=1)
        dp = cand[np.arange(N + 1), best]
        choice[i] = best + 1
    value = float(dp[N])
    if not np.isfinite(value):
        return float("inf"), None
    degrees = np.zeros(K, dtype=np.int64)
    jj = N
    for i in range(K - 1, -1, -1):
        degrees[i] = choice[i, jj]
        jj -= degrees[i]
    return value, degrees
