"""Fit the DESIGN §4 cost model to measured group times (the fitting half of ``fcp profile``).

A :class:`ProfilePoint` is one measured CP group: ``num_docs`` documents of ``seq_len`` tokens each
(mask factor ``eta``) on ``degree`` ranks. With ``S = k·s``, ``Q = k·(1+η)s²`` (``k = num_docs``) the
§4 group time is::

    T = alpha2·S/d + beta1 + [d>1]·beta2 + max(A, X),   A = alpha1·Q/d,   X = alpha3·S·(d−1)/(d·v)

(``C + M − min(A, X)`` rewritten). It is linear in the five coefficients once we know, per point,
which of ``A`` and ``X`` is larger, and that regime is a threshold on ``(Q/d) / (S(d−1)/(d·v))``
(``A ≥ X ⟺ ratio ≥ alpha3/alpha1``). So the fit tries every threshold cut of the multi-rank points,
solves a non-negative least-squares problem for each (relative residuals, exact small-problem NNLS
over all supports), scores each candidate with the true ``max`` formula and keeps the best. On timings
generated from the formula this recovers the coefficients exactly. A coefficient the grid cannot
identify (``alpha3`` when no point is communication-bound, ``beta2``/``alpha3`` with one rank) keeps the
given default and is listed in ``FitResult.unidentified``.

Packed groups. §4 depends on a group only through ``S`` and ``Q``: it has no per-document term, while a
real executor pays per document (a kernel call per document and ring step, padding to ``2·d``). Fitting
on single documents only leaves that cost out entirely (the tiny model on CPU: a degree-2 group packing
25 short documents measured 0.69 s against 0.42 s predicted). A grid that also holds packed points
(``k`` documents per group, as training packs them) makes the least-squares fit fold the per-document
cost into ``alpha2``/``beta1`` as well as the §4 form allows; :func:`format_fit` reports the mean error on
single-document and packed points separately, so the remaining gap is visible.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from fcp_data.cost import CostModel

__all__ = ["ProfilePoint", "FitResult", "fit_cost_model", "nnls_small", "format_fit", "plot_fit", "COEFFICIENTS"]

COEFFICIENTS = ("alpha1", "alpha2", "beta1", "alpha3", "beta2")
_NAMES = COEFFICIENTS


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfilePoint:
    """One measurement: a group of ``degree`` ranks ran ``num_docs`` packed documents of ``seq_len`` tokens
    each (mask factor ``eta``) in ``time_s`` seconds (forward + backward, slowest rank)."""

    seq_len: int
    degree: int
    time_s: float
    eta: float = 0.0
    num_docs: int = 1

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.degree < 1 or self.num_docs < 1:
            raise ValueError(f"seq_len, degree and num_docs must be >= 1, got {self.seq_len}, {self.degree}, "
                             f"{self.num_docs}")
        if not (math.isfinite(self.time_s) and self.time_s > 0):
            raise ValueError(f"time_s must be a positive finite number, got {self.time_s}")

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "degree": self.degree, "time_s": self.time_s, "eta": self.eta,
                "num_docs": self.num_docs}

    @property
    def lengths(self) -> list[int]:
        return [self.seq_len] * self.num_docs


@dataclass(frozen=True, kw_only=True, slots=True)
class FitResult:
    """The fitted cost model, its prediction for every point, relative errors and the mean error."""

    cost_model: CostModel
    points: tuple[ProfilePoint, ...]
    predicted: tuple[float, ...]
    rel_errors: tuple[float, ...]
    unidentified: tuple[str, ...] = field(default=())

    @property
    def mean_rel_error(self) -> float:
        return float(np.mean(self.rel_errors)) if self.rel_errors else 0.0

    def mean_rel_error_of(self, packed: bool) -> float | None:
        """Mean error over the packed (``num_docs > 1``) or the single-document points; None if none."""
        errs = [e for p, e in zip(self.points, self.rel_errors) if (p.num_docs > 1) == packed]
        return float(np.mean(errs)) if errs else None


def nnls_small(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Exact non-negative least squares ``min ||a x − b||, x ≥ 0`` for a few columns (≤ 8): the optimum
    is the unconstrained solution on some support, so every support is tried. Columns are scaled to unit
    norm first (coefficients span many orders of magnitude). Returns ``(x, residual_norm)``."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n = a.shape[1]
    if n > 8:
        raise ValueError(f"nnls_small enumerates supports; {n} columns is too many (max 8)")
    norms = np.linalg.norm(a, axis=0)
    live = [j for j in range(n) if norms[j] > 0]
    an = a[:, live] / norms[live]
    best_x, best_r = np.zeros(n), float(np.linalg.norm(b))
    for k in range(1, len(live) + 1):
        for sup in itertools.combinations(range(len(live)), k):
            sol, *_ = np.linalg.lstsq(an[:, sup], b, rcond=None)
            if np.any(sol < -1e-12 * max(1.0, float(np.abs(sol).max()))):
                continue
            sol = np.maximum(sol, 0.0)
            r = float(np.linalg.norm(an[:, sup] @ sol - b))
            if r < best_r * (1 - 1e-12):
                best_r = r
                best_x = np.zeros(n)
                for j, s in zip(sup, sol):
                    best_x[live[j]] = s / norms[live[j]]
    return best_x, best_r


def _features(points, v: float):
    s = np.array([p.num_docs * p.seq_len for p in points], dtype=np.float64)
    d = np.array([p.degree for p in points], dtype=np.float64)
    q = np.array([p.num_docs * (1.0 + p.eta) * p.seq_len ** 2 for p in points], dtype=np.float64)
    multi = (d > 1).astype(np.float64)
    return q / d, s / d, np.ones_like(s), s * (d - 1) / d / v, multi


def _predict(theta: np.ndarray, feats) -> np.ndarray:
    a, s, one, x, multi = feats
    a1, a2, b1, a3, b2 = theta
    return a2 * s + b1 * one + b2 * multi + np.maximum(a1 * a, a3 * x)


def fit_cost_model(points, *, bandwidth_intra: float, bandwidth_inter: float | None = None,
                   ranks_per_node: int = 1, tokens_per_rank: int, alpha3_default: float = 0.0,
                   beta2_default: float = 0.0) -> FitResult:
    """Least-squares fit (relative residuals, non-negative) of alpha1, alpha2, beta1, alpha3, beta2.

    ``points`` are :class:`ProfilePoint`; the points must be measured inside one node (``bandwidth_intra``
    is the measured bandwidth). See the module docstring for the method."""
    points = tuple(points)
    if len(points) < 3:
        raise ValueError(f"need at least 3 profile points to fit 5 coefficients sensibly, got {len(points)}")
    v = float(bandwidth_intra)
    if not v > 0:
        raise ValueError(f"bandwidth_intra must be > 0 bytes/s, got {bandwidth_intra}")
    feats = _features(points, v)
    a, s, one, x, multi = feats
    t = np.array([p.time_s for p in points], dtype=np.float64)
    w = 1.0 / t  # relative residuals
    multi_idx = np.flatnonzero(multi > 0)
    ratio = a[multi_idx] / x[multi_idx]
    cuts = [np.inf] + sorted(set(ratio.tolist()))  # points with ratio < cut are X-bound
    best = None
    for cut in cuts:
        x_bound = np.zeros(len(points), dtype=bool)
        x_bound[multi_idx] = ratio < cut
        cols = np.stack([a * ~x_bound, s, one, x * x_bound, multi], axis=1)
        theta, _ = nnls_small(cols * w[:, None], t * w)
        err = float(np.sum(((_predict(theta, feats) - t) * w) ** 2))
        if best is None or err < best[0] * (1 - 1e-12):
            best = (err, theta, x_bound)
    _, theta, x_bound = best
    unidentified = []
    if not multi_idx.size:
        unidentified += ["alpha3", "beta2"]
        theta[3], theta[4] = alpha3_default, beta2_default
    elif not x_bound.any():
        unidentified.append("alpha3")
        theta[3] = alpha3_default
    coeffs = dict(zip(_NAMES, (float(c) for c in theta)))
    cm = CostModel(bandwidth_intra=v, bandwidth_inter=float(bandwidth_inter or v),
                   ranks_per_node=int(ranks_per_node), tokens_per_rank=int(tokens_per_rank), **coeffs)
    pred = np.array([cm.group_time(p.lengths, [p.eta] * p.num_docs, p.degree) for p in points])
    rel = np.abs(pred - t) / t
    return FitResult(cost_model=cm, points=points, predicted=tuple(float(p) for p in pred),
                     rel_errors=tuple(float(e) for e in rel), unidentified=tuple(unidentified))


def format_fit(fit: FitResult) -> str:
    """A per-point table (measured vs predicted), the mean error and the coefficients."""
    lines = [f"{'docs':>4} {'seq_len':>8} {'degree':>6} {'measured ms':>12} {'predicted ms':>13} {'error':>7}"]
    for p, pr, e in zip(fit.points, fit.predicted, fit.rel_errors):
        lines.append(f"{p.num_docs:>4} {p.seq_len:>8} {p.degree:>6} {p.time_s * 1e3:>12.2f} {pr * 1e3:>13.2f} "
                     f"{e * 100:>6.1f}%")
    lines.append(f"mean error: {fit.mean_rel_error * 100:.1f}% over {len(fit.points)} points (paper: < 8%)")
    single, packed = fit.mean_rel_error_of(False), fit.mean_rel_error_of(True)
    if single is not None and packed is not None:
        n_packed = sum(p.num_docs > 1 for p in fit.points)
        lines.append(f"  single-document points: {single * 100:.1f}% ({len(fit.points) - n_packed}); packed points "
                     f"(several documents per group): {packed * 100:.1f}% ({n_packed})")
    cm = fit.cost_model
    lines.append("fitted: " + ", ".join(f"{k}={getattr(cm, k):.4g}" for k in _NAMES)
                 + f", bandwidth={cm.bandwidth_intra:.4g} B/s, tokens_per_rank={cm.tokens_per_rank}")
    if fit.unidentified:
        lines.append("not identifiable from this grid (kept the analytic default): " + ", ".join(fit.unidentified))
    return "\n".join(lines)


def plot_fit(fit: FitResult, path) -> None:
    """Measured (markers) vs fitted (lines) time against sequence length, one colour per degree."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for d, k in sorted({(p.degree, p.num_docs) for p in fit.points}):
        pts = sorted((p.seq_len * k, p.time_s, pr) for p, pr in zip(fit.points, fit.predicted)
                     if (p.degree, p.num_docs) == (d, k))
        s, m, pr = (np.array(c) for c in zip(*pts))
        what = f"degree {d}" + (f", {k} docs" if k > 1 else "")
        line, = ax.plot(s, pr * 1e3, "-", label=f"fit, {what}")
        ax.plot(s, m * 1e3, "o", color=line.get_color(), label=f"measured, {what}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the group")
    ax.set_ylabel("forward + backward (ms)")
    ax.set_title(f"cost-model fit, mean error {fit.mean_rel_error * 100:.1f}%")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
