"""The move loop of :func:`fcp_data.plan.refine.refine_moves` as one kernel, compiled by numba when it is
installed (:mod:`fcp_data.jit`).

It makes exactly the moves of the numpy path (``refine._best_move``): each group time is
:meth:`CostModel.time_fixed`'s operations in the same order on the same operands, the best move is the first
minimum of ``max(T_slowest', T_target')`` in (member, target) order, as ``argmin`` over the numpy path's matrix
(its de-duplication of equal members only drops rows that cannot come first), and ties, memory and the stopping
rule are the same. ``tests/plan/test_refine_kernel.py`` holds the two paths to the same plans bit for bit.
Plain Python too (slow): the tests run it so even without numba.
"""

from __future__ import annotations

import numpy as np

__all__ = ["refine_loop", "SIGNATURE"]

# label, X (4, K), T, cols (5, K), cap, terms (4, n), coefficients, use B, use V, max moves, moved -> moves made
SIGNATURE = ("int64(int64[:], float64[:, :], float64[:], float64[:, :], float64[:], float64[:, :], float64[:], "
             "boolean, boolean, int64, int64[:])")


def refine_loop(label, X, T, cols, cap, terms, coef, use_b, use_v, max_moves, moved):
    """Up to ``max_moves`` best moves out of the slowest group (``label``, the ``X`` rows S, Q, B, V and ``T`` updated
    in place), the moved sequences in ``moved``; returns how many. ``cols``: ``fixed_columns`` of the groups;
    ``coef``: alpha1, alpha2, alpha_blk, alpha_vis, beta1, alpha3; ``use_b``/``use_v``: the B and V terms apply."""
    alpha1, alpha2, alpha_blk, alpha_vis, beta1, alpha3 = coef[0], coef[1], coef[2], coef[3], coef[4], coef[5]
    n, K = label.size, T.size
    members = np.empty(n, dtype=np.int64)
    count = 0
    for _ in range(max_moves):
        b = 0
        for j in range(1, K):  # the first slowest group, as argmax
            if T[j] > T[b]:
                b = j
        m = 0
        for k in range(n):
            if label[k] == b:
                members[m] = k
                m += 1
        best, bi, bg, btb, btg = np.inf, 0, 0, 0.0, 0.0
        for i in range(m):
            k = members[i]
            tb = 0.0  # an emptied group leaves its ranks idle
            for g in range(-1 if m > 1 else 0, K):  # -1: the slowest group without k; then each target with k
                c, sgn = (b, -1.0) if g < 0 else (g, 1.0)  # x + (-1.0·y) is x − y exactly
                S = X[0, c] + sgn * terms[0, k]
                if g == b or (g >= 0 and S > cap[c]):
                    t = np.inf  # not a target, or memory fails
                else:  # CostModel.time_fixed, operation for operation
                    d, dm1, v, b2, gd = cols[0, c], cols[1, c], cols[2, c], cols[3, c], cols[4, c]
                    A = alpha1 * (X[1, c] + sgn * terms[1, k]) / d
                    C = alpha2 * S / d
                    C = C + A
                    if use_b:
                        C = C + alpha_blk * (X[2, c] + sgn * terms[2, k])
                    if use_v:
                        C = C + alpha_vis * (X[3, c] + sgn * terms[3, k]) / d
                    C = C + beta1
                    R = alpha3 * S * dm1 / d / v
                    M = R + b2
                    C = C + (M + gd)
                    t = C - min(A, R)
                if g < 0:
                    tb = t
                elif (tb if tb > t else t) < best:
                    best, bi, bg, btb, btg = (tb if tb > t else t), i, g, tb, t
        if m == 0 or not best < T[b] * (1 - 1e-12):
            break
        k = members[bi]
        label[k] = bg
        for r in range(4):
            X[r, b] -= terms[r, k]
            X[r, bg] += terms[r, k]
        T[b], T[bg], moved[count] = btb, btg, k
        count += 1
    return count
