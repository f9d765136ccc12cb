"""§4/§4.1 group times as compiled loops (optional, :mod:`fcp_data.jit`): :meth:`CostModel.time
<fcp_data.cost.CostModel.time>` on 1-D arrays and the dense K × N table of the planner's stage 2, for the planner's
small arrays (tens of groups), where numpy's per-call overhead is most of the time (~20 µs a call against ~2 µs).

Each function repeats :meth:`CostModel.time`'s float operations in the same order (``A = alpha1·Q/d``,
``C = (A + alpha2·S/d) [+ alpha_blk·B] [+ alpha_vis·V/d] + beta1``, ``X = alpha3·S·(d−1)/d/v``,
``M = (X + beta2) [+ gamma·(d−1)]``, ``T = (C + M) − min(A, X)``; ``X = M = 0`` on one rank), so compiled
without fastmath it gives bit-for-bit the same times (``tests/plan/test_cost_kernel.py`` compares both ways,
compiled and as plain Python). A term whose switch is off is not added at all, exactly as the numpy path skips it.
The formula is written out in each loop (and in :mod:`fcp_data.plan.tau_kernel`) on purpose: a compiled kernel can
only call a helper that numba compiled too, and compiling one at import would import numba in every process.
``coef`` is ``(alpha1, alpha2, alpha3, beta1, beta2, bandwidth_intra, bandwidth_inter, gamma, alpha_blk,
alpha_vis)``; ``use_blk`` / ``use_vis`` / ``use_gamma`` say whether the §4.1 terms are added."""

from __future__ import annotations

import numpy as np

from fcp_data import jit

__all__ = ["compiled_time", "compiled_table", "kernel_switches", "time_loop", "table_loop", "TIME_SIGNATURE", "TABLE_SIGNATURE"]

TIME_SIGNATURE = ("float64[:](float64[:], float64[:], float64[:], boolean[:], float64[:], float64[:], float64[:], "
                  "boolean, boolean, boolean)")
TABLE_SIGNATURE = ("float64[:, :](float64[:], float64[:], float64[:], float64[:], int64, float64, float64, "
                   "float64[:], boolean, boolean, boolean)")


def time_loop(S, Q, d, intra, B, V, coef, use_blk, use_vis, use_gamma):
    """Group times of 1-D ``S, Q, d, intra, B, V`` (all the same length; ``B``/``V`` ignored when their term is off)."""
    a1, a2, a3, b1, b2 = coef[0], coef[1], coef[2], coef[3], coef[4]
    v_in, v_out, g, blk, vis = coef[5], coef[6], coef[7], coef[8], coef[9]
    out = np.empty(S.size)
    for i in range(S.size):
        di = d[i]
        A = a1 * Q[i] / di
        C = A + a2 * S[i] / di
        if use_blk:
            C = C + blk * B[i]
        if use_vis:
            C = C + vis * V[i] / di
        C = C + b1
        X = 0.0
        M = 0.0
        if di > 1:
            X = a3 * S[i] * (di - 1.0) / di / (v_in if intra[i] else v_out)
            M = X + b2
            if use_gamma:
                M = M + g * (di - 1.0)
        out[i] = C + M - min(A, X)
    return out


def table_loop(S, Q, B, V, num_ranks, tokens_per_rank, ranks_per_node, coef, use_blk, use_vis, use_gamma):
    """The K × N table ``T[i, d − 1]`` of groups ``S, Q, B, V`` on ``d = 1 … num_ranks`` ranks, intra-node when
    ``d ≤ ranks_per_node``, ``inf`` where memory fails (``S > d·tokens_per_rank``): :meth:`TimeTable.dense
    <fcp_data.plan.allocate.TimeTable.dense>` without a mask."""
    a1, a2, a3, b1, b2 = coef[0], coef[1], coef[2], coef[3], coef[4]
    v_in, v_out, g, blk, vis = coef[5], coef[6], coef[7], coef[8], coef[9]
    out = np.empty((S.size, num_ranks))
    for i in range(S.size):
        for j in range(num_ranks):
            di = j + 1.0
            if not S[i] <= di * tokens_per_rank:
                out[i, j] = np.inf
                continue
            A = a1 * Q[i] / di
            C = A + a2 * S[i] / di
            if use_blk:
                C = C + blk * B[i]
            if use_vis:
                C = C + vis * V[i] / di
            C = C + b1
            X = 0.0
            M = 0.0
            if di > 1:
                X = a3 * S[i] * (di - 1.0) / di / (v_in if di <= ranks_per_node else v_out)
                M = X + b2
                if use_gamma:
                    M = M + g * (di - 1.0)
            out[i, j] = C + M - min(A, X)
    return out


time_kernel = jit.kernel(time_loop, TIME_SIGNATURE)
table_kernel = jit.kernel(table_loop, TABLE_SIGNATURE)


def kernel_switches(cost_model, B, V) -> tuple[np.ndarray, bool, bool, bool] | None:
    """``(coef, use_blk, use_vis, use_gamma)`` of :meth:`CostModel.time`'s branches, the trailing arguments of every
    kernel that evaluates the formula, or None when the numpy path must run (it raises the error for
    ``alpha_blk > 0`` without ``B``)."""
    cm = cost_model
    if cm.alpha_blk and B is None:
        return None
    coef = np.array((cm.alpha1, cm.alpha2, cm.alpha3, cm.beta1, cm.beta2, cm.bandwidth_intra, cm.bandwidth_inter,
                     cm.gamma, cm.alpha_blk, cm.alpha_vis), dtype=np.float64)
    return coef, bool(cm.alpha_blk), bool(cm.alpha_vis and V is not None), bool(cm.gamma)


def _vector(x, n: int) -> np.ndarray | None:
    """``x`` as a float64 vector of length ``n`` (the conversion numpy's path makes; a Python int or float is
    broadcast), or None if it is neither."""
    if type(x) in (int, float):
        return np.full(n, float(x))
    if type(x) is not np.ndarray or x.shape != (n,):
        return None
    return x.astype(np.float64, copy=False)


def compiled_time(cost_model, S, Q, d, intra, B, V) -> np.ndarray | None:
    """:meth:`CostModel.time` by :func:`time_loop` when a kernel is in use in this process (:func:`jit.active`) and
    ``S, Q`` (and ``d``, ``B``, ``V`` when given, ``intra`` unless a scalar, ``d`` unless a Python number) are 1-D arrays
    of one length; else None."""
    if not jit.active() or type(S) is not np.ndarray or S.ndim != 1:
        return None
    n = S.shape[0]
    S, Q, d = _vector(S, n), _vector(Q, n), _vector(d, n)
    sw = kernel_switches(cost_model, B, V)
    if S is None or Q is None or d is None or sw is None or (kern := time_kernel()) is None:
        return None
    Bv = S if B is None else _vector(B, n)
    Vv = S if V is None else _vector(V, n)
    flags = np.asarray(intra, dtype=bool)
    if flags.shape != (n,):
        flags = np.full(n, bool(flags)) if flags.ndim == 0 else None
    if Bv is None or Vv is None or flags is None:
        return None
    return kern(S, Q, d, flags, Bv, Vv, *sw)


def compiled_table(cost_model, S: np.ndarray, Q: np.ndarray, B, V, num_ranks: int) -> np.ndarray | None:
    """The dense stage-2 table by :func:`table_loop` (1-D float64 ``S, Q``, ``B``/``V`` None or alike) when a
    kernel is in use in this process, else None."""
    if not jit.active():
        return None
    sw = kernel_switches(cost_model, B, V)
    if sw is None or (kern := table_kernel()) is None:
        return None
    return kern(S, Q, S if B is None else B, S if V is None else V, int(num_ranks), float(cost_model.tokens_per_rank),
                float(cost_model.ranks_per_node), *sw)
