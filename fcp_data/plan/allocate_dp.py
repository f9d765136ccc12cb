"""The paper's stage-2 allocator (Algorithm 1), the reference :func:`~fcp_data.plan.allocate.allocate_fast` is
tested against and the allocator of the ``fcp-dp`` solver."""

from __future__ import annotations

import numpy as np

from fcp_data.plan.allocate import _table

__all__ = ["allocate_dp"]


def allocate_dp(T, num_ranks: int | None = None, allowed: np.ndarray | None = None
                ) -> tuple[float, np.ndarray | None]:
    """The paper's 2-D dynamic program (Algorithm 1) on the table ``T`` (K × N; a :class:`TimeTable` is
    made dense), only the degrees in ``allowed`` (None: all); O(K·N²)."""
    T, K, N = _table(T, num_ranks, allowed)
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
