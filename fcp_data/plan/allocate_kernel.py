"""Stage 2's dense allocation (:func:`~fcp_data.plan.allocate.allocate_fast` on a K × N table) as one kernel,
compiled by numba when it is installed (:mod:`fcp_data.jit`).

The same steps as the numpy path: the running minimum of each row (``np.minimum.accumulate``), ``τ*`` = the
``(N − K)``-th largest entry of it (``np.partition``, an order statistic: the same value however it is found), each
row's budget ``1 + #{T̃ > τ*}`` and the fastest degree within it, fewest ranks on ties (``argmin``'s first index;
index 0 when the whole budget is ``inf``). ``tests/plan/test_allocate_kernel.py`` holds both to the same answers.
"""

from __future__ import annotations

import numpy as np

__all__ = ["allocate_loop", "SIGNATURE"]

# T (K x N, the allowed mask applied), degrees (out) -> tau (inf: no allocation; degrees then undefined)
SIGNATURE = "float64(float64[:, :], int64[:])"


def allocate_loop(T, degrees):
    """``τ*`` of the table ``T`` (``K ≤ N`` rows), the degree of each row written to ``degrees``."""
    K, N = T.shape
    run = np.empty((K, N))
    for i in range(K):
        low = T[i, 0]
        run[i, 0] = low
        for j in range(1, N):
            if T[i, j] < low:
                low = T[i, j]
            run[i, j] = low
    neg = -run.ravel()
    tau = -np.partition(neg, N - K)[N - K]
    if not np.isfinite(tau):
        return np.inf
    for i in range(K):
        budget = 1
        for j in range(N):
            if run[i, j] > tau:
                budget += 1
        best, arg = np.inf, 0
        for j in range(min(budget, N)):
            if T[i, j] < best:
                best, arg = T[i, j], j
        degrees[i] = arg + 1
    return tau
