"""The headroom fill of :func:`~fcp_data.plan.tau._fill_headroom` as one kernel, compiled by numba when it is
installed (:mod:`fcp_data.jit`; run once a planner kernel has loaded numba, like the cost model's).

Each long group (its own sequence, on ``per[k] ≥ 2`` ranks) takes the longest prefix of the remaining light
sequences (lightest first) that keeps its time ``≤ τ`` and its memory: the numpy path's prefix sums are
``x0 + np.cumsum(x[prefix])`` (the cumulative sum from 0, then the group's own term added), here the same running
sum and the same addition; the time is :mod:`fcp_data.cost_kernel`'s formula. ``tests/plan/test_tau_kernel.py``
holds both paths to the same groupings.
"""

from __future__ import annotations

import numpy as np

__all__ = ["headroom_loop", "SIGNATURE"]

# per, base (4, m), light, terms (4, n), tau, tokens_per_rank, ranks_per_node, coef, use_blk, use_vis, use_gamma,
# take (out, m) -> nothing
SIGNATURE = ("void(int64[:], float64[:, :], int64[:], float64[:, :], float64, float64, float64, float64[:], boolean, "
             "boolean, boolean, int64[:])")


def headroom_loop(per, base, light, terms, tau, tokens_per_rank, ranks_per_node, coef, use_blk, use_vis, use_gamma,
                  take):
    """``take[k]``: how many of the light sequences (``light`` from ``taken`` on) long group ``k`` takes."""
    a1, a2, a3, b1, b2 = coef[0], coef[1], coef[2], coef[3], coef[4]
    v_in, v_out, g, blk, vis = coef[5], coef[6], coef[7], coef[8], coef[9]
    taken = 0
    for k in range(per.size):
        take[k] = 0
        d = per[k]
        if d < 2 or taken >= light.size:
            continue
        di = float(d)
        v = v_in if di <= ranks_per_node else v_out
        cap = float(d * tokens_per_rank)
        cs, cq, cb, cv = 0.0, 0.0, 0.0, 0.0
        j = 0
        while taken + j < light.size:
            i = light[taken + j]
            cs += terms[0, i]
            cq += terms[1, i]
            cb += terms[2, i]
            cv += terms[3, i]
            S = base[0, k] + cs
            Q = base[1, k] + cq
            A = a1 * Q / di
            C = A + a2 * S / di
            if use_blk:
                C = C + blk * (base[2, k] + cb)
            if use_vis:
                C = C + vis * (base[3, k] + cv) / di
            C = C + b1
            X = a3 * S * (di - 1.0) / di / v
            M = X + b2
            if use_gamma:
                M = M + g * (di - 1.0)
            if not (C + M - min(A, X) <= tau and S <= cap):
                break
            j += 1
        take[k] = j
        taken += j
