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

Cost model v2 (DESIGN §4.1, ``version=2``). The group time gains ``gamma·(d−1)`` (d > 1) and ``alpha_blk·B``,
``B = k·(1+η)s``; both are linear, so the same regime search fits seven non-negative coefficients (columns
``Q/d, S/d, 1, X, [d>1], [d>1]·(d−1), B``). ``gamma`` needs two multi-rank degrees (with degrees 1 and 2
only, ``(d−1) = [d>1]`` and the ring-step latency is folded into ``beta2``); ``alpha_blk`` needs ``B`` not
proportional to ``S/d`` (several degrees). A coefficient the grid cannot separate is fixed at 0 and listed
in ``unidentified``. ``alpha_vis`` is not fitted here (text points have no visual tokens): the profiler
measures it on the vision tower alone and passes it in (:func:`fit_alpha_vis`). A v2 fit carries the v1 fit
of the same points (``FitResult.v1``), and :func:`format_fit` / :func:`fit_errors` compare the two: mean and
max relative error, and the mean on high-degree short-document points (degree = the largest measured, and
document length ≤ the median length of the grid), where v1, without per-step and per-block costs, errs most.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from fcp_data.cost import CostModel

__all__ = ["ProfilePoint", "FitResult", "fit_cost_model", "nnls_small", "format_fit", "plot_fit", "COEFFICIENTS",
           "COEFFICIENTS_V2", "fit_errors", "fit_alpha_vis", "timing_estimate", "degree_slopes", "alpha_blk_evidence"]

COEFFICIENTS = ("alpha1", "alpha2", "beta1", "alpha3", "beta2")
COEFFICIENTS_V2 = COEFFICIENTS + ("gamma", "alpha_blk")  # fitted on text points; alpha_vis is measured apart
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
    version: int = 1
    v1: "FitResult | None" = None  # a v2 fit: the v1 fit of the same points, for comparison

    @property
    def max_rel_error(self) -> float:
        return float(np.max(self.rel_errors)) if self.rel_errors else 0.0

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
    blk = np.array([p.num_docs * (1.0 + p.eta) * p.seq_len for p in points], dtype=np.float64)
    return q / d, s / d, np.ones_like(s), s * (d - 1) / d / v, multi, multi * (d - 1), blk


def _predict(theta: np.ndarray, feats) -> np.ndarray:
    a, s, one, x, multi, steps, blk = feats
    a1, a2, b1, a3, b2 = theta[:5]
    g, ab = (theta[5], theta[6]) if len(theta) > 5 else (0.0, 0.0)
    return a2 * s + b1 * one + b2 * multi + g * steps + ab * blk + np.maximum(a1 * a, a3 * x)


def _separable(u: np.ndarray, w: np.ndarray) -> bool:
    """True when column ``w`` is not (numerically) a multiple of column ``u``: the fit can tell them apart."""
    nu, nw = float(np.linalg.norm(u)), float(np.linalg.norm(w))
    if nw == 0:
        return False
    if nu == 0:
        return True
    return float(np.linalg.svd(np.stack([u / nu, w / nw], axis=1), compute_uv=False)[-1]) > 1e-6


def _regime_search(feats, t: np.ndarray, extra: tuple[bool, bool] | None) -> tuple[float, np.ndarray, bool]:
    """Best ``(objective, theta, any point X-bound)`` over the regime cuts (module docstring). ``extra`` (v2): whether the gamma and
    alpha_blk columns are used (an unusable column is all zeros, so its coefficient stays 0). The objective is
    the sum of squared relative residuals of the true ``max(A, X)`` prediction."""
    a, s, one, x, multi, steps, blk = feats
    w = 1.0 / t  # relative residuals
    multi_idx = np.flatnonzero(multi > 0)
    ratio = a[multi_idx] / x[multi_idx]
    best = None
    for cut in [np.inf] + sorted(set(ratio.tolist())):  # points with ratio < cut are X-bound
        x_bound = np.zeros(len(t), dtype=bool)
        x_bound[multi_idx] = ratio < cut
        cols = [a * ~x_bound, s, one, x * x_bound, multi]
        if extra is not None:
            cols += [steps if extra[0] else np.zeros_like(s), blk if extra[1] else np.zeros_like(s)]
        theta, _ = nnls_small(np.stack(cols, axis=1) * w[:, None], t * w)
        err = float(np.sum(((_predict(theta, feats) - t) * w) ** 2))
        if best is None or err < best[0] * (1 - 1e-12):
            best = (err, theta, bool(x_bound.any()))
    return best[0], best[1], best[2]


def fit_cost_model(points, *, bandwidth_intra: float, bandwidth_inter: float | None = None,
                   ranks_per_node: int = 1, tokens_per_rank: int, alpha3_default: float = 0.0,
                   beta2_default: float = 0.0, version: int = 1, alpha_vis: float = 0.0) -> FitResult:
    """Least-squares fit (relative residuals, non-negative) of alpha1, alpha2, beta1, alpha3, beta2 (§4,
    ``version=1``) and, with ``version=2``, also gamma and alpha_blk (§4.1); ``alpha_vis`` (measured apart)
    is written into a v2 model as given. A v2 result holds the v1 fit of the same points in ``.v1``.

    v2 contains v1 (gamma = alpha_blk = 0 is a v2 model), so the v2 fit never scores worse than the v1 fit by
    the fit's objective (RMS relative error, :func:`fit_errors` ``"rms"``): should the v2 regime search end
    worse (the search is over regime cuts, not exhaustive over all non-negative coefficients), the v1
    coefficients are kept for v2.

    ``points`` are :class:`ProfilePoint`; the points must be measured inside one node (``bandwidth_intra``
    is the measured bandwidth). See the module docstring for the method."""
    if version not in (1, 2):
        raise ValueError(f"version must be 1 (DESIGN §4) or 2 (§4.1), got {version!r}")
    points = tuple(points)
    if len(points) < 3:
        raise ValueError(f"need at least 3 profile points to fit 5 coefficients sensibly, got {len(points)}")
    v = float(bandwidth_intra)
    if not v > 0:
        raise ValueError(f"bandwidth_intra must be > 0 bytes/s, got {bandwidth_intra}")
    if not (math.isfinite(alpha_vis) and alpha_vis >= 0):
        raise ValueError(f"alpha_vis must be a finite number >= 0 s per visual token, got {alpha_vis!r}")
    feats = _features(points, v)
    _, s, _, _, multi, steps, blk = feats
    t = np.array([p.time_s for p in points], dtype=np.float64)
    unidentified, extra = [], None
    if version == 2:
        extra = (_separable(multi, steps), _separable(s, blk))
        unidentified += [n for n, ok in zip(("gamma", "alpha_blk"), extra) if not ok]
    _, theta, any_x_bound = _regime_search(feats, t, extra)
    if not multi.any():
        unidentified += ["alpha3", "beta2"]
        theta[3], theta[4] = alpha3_default, beta2_default
    elif not any_x_bound:
        unidentified.append("alpha3")
        theta[3] = alpha3_default
    names = COEFFICIENTS_V2 if version == 2 else COEFFICIENTS
    coeffs = dict(zip(names, (float(c) for c in theta)))
    if version == 2:
        coeffs["alpha_vis"] = float(alpha_vis)
    cm = CostModel(bandwidth_intra=v, bandwidth_inter=float(bandwidth_inter or v),
                   ranks_per_node=int(ranks_per_node), tokens_per_rank=int(tokens_per_rank), **coeffs)
    pred = np.array([cm.group_time(p.lengths, [p.eta] * p.num_docs, p.degree) for p in points])
    base = None
    if version == 2:
        base = fit_cost_model(points, bandwidth_intra=bandwidth_intra, bandwidth_inter=bandwidth_inter,
                              ranks_per_node=ranks_per_node, tokens_per_rank=tokens_per_rank,
                              alpha3_default=alpha3_default, beta2_default=beta2_default, version=1)
        if _rms(np.array(base.predicted), t) < _rms(pred, t):  # v2 ⊇ v1: keep the better of the two
            cm = base.cost_model.replace(gamma=0.0, alpha_blk=0.0, alpha_vis=float(alpha_vis))
            pred = np.array(base.predicted)
            unidentified = [n for n in unidentified if n in ("gamma", "alpha_blk")] + list(base.unidentified)
    rel = np.abs(pred - t) / t
    return FitResult(cost_model=cm, points=points, predicted=tuple(float(p) for p in pred),
                     rel_errors=tuple(float(e) for e in rel), unidentified=tuple(unidentified), version=version,
                     v1=base)


def _rms(pred: np.ndarray, t: np.ndarray) -> float:
    """Root mean square relative residual: the fit's objective (up to the monotone sqrt and 1/n)."""
    return float(np.sqrt(np.mean(((pred - t) / t) ** 2)))


def fit_alpha_vis(samples) -> float:
    """``alpha_vis`` (s per visual token) from vision-tower timings ``[(visual_tokens, seconds), ...]``:
    the non-negative slope of ``seconds = c + alpha_vis · visual_tokens`` (relative residuals); the
    intercept ``c`` (launch overheads) is dropped, as §4.1 has no fixed vision cost. 0 with no samples."""
    samples = [(float(n), float(sec)) for n, sec in samples]
    if len({n for n, _ in samples}) < 2:
        return 0.0
    n = np.array([p[0] for p in samples])
    sec = np.array([p[1] for p in samples])
    wgt = 1.0 / sec
    theta, _ = nnls_small(np.stack([np.ones_like(n), n], axis=1) * wgt[:, None], sec * wgt)
    return float(theta[1])


def timing_estimate(reps) -> tuple[float, float, float]:
    """``(estimate, median, spread)`` of one point's repeated timings: the minimum (contention on a shared machine
    only ever adds time, so the fastest repetition is the least disturbed one: the standard benchmark estimator),
    the median, and the spread ``median / min − 1`` (how much contention the repetitions saw)."""
    ts = [float(x) for x in reps]
    if not ts or not all(math.isfinite(x) and x > 0 for x in ts):
        raise ValueError(f"timings must be a non-empty list of positive finite seconds, got {reps!r}")
    lo, med = min(ts), float(np.median(ts))
    return lo, med, med / lo - 1.0


def degree_slopes(points) -> dict[int, float]:
    """Model-free check of alpha_blk: per degree with ≥ 4 causal points, the unconstrained least-squares fit
    (relative residuals) of ``T = a·Q + c·S + b`` on that degree's points alone; returns ``{degree: c}``, the
    group's cost per token at that degree. §4.1 says ``c_d = alpha2/d + alpha_blk`` (attention-bound points; KV
    traffic would add ``alpha3·(d−1)/(d·v)``), §4 says ``c_d = alpha2/d``. Caveat: ``a`` and ``c`` trade off
    (Q and S move together on single documents), and a per-document cost paid at every ring step (k·d kernel
    calls per rank on the CPU executor) also lands in ``c_d`` through the packed points; read it as a hint."""
    out = {}
    for d in sorted({p.degree for p in points}):
        pts = [p for p in points if p.degree == d and p.eta == 0]
        if len(pts) < 4:
            continue
        t = np.array([p.time_s for p in pts])
        cols = np.array([[p.num_docs * p.seq_len ** 2, p.num_docs * p.seq_len, 1.0] for p in pts]) / t[:, None]
        if np.linalg.matrix_rank(cols) < 3:
            continue
        out[d] = float(np.linalg.lstsq(cols, np.ones_like(t), rcond=None)[0][1])
    return out


def alpha_blk_evidence(points) -> tuple[float, float] | None:
    """``(alpha2, alpha_blk)`` from ``c_d = alpha2/d + alpha_blk`` over :func:`degree_slopes` (least squares,
    exact with two degrees; not clipped, so a negative alpha_blk means none is seen); None with < 2 degrees."""
    c = degree_slopes(points)
    if len(c) < 2:
        return None
    d = np.array(sorted(c), dtype=np.float64)
    sol = np.linalg.lstsq(np.stack([1.0 / d, np.ones_like(d)], axis=1), np.array([c[k] for k in sorted(c)]),
                          rcond=None)[0]
    return float(sol[0]), float(sol[1])


def _high_degree_short(points) -> list[int]:
    """Indices of the high-degree short-document points: degree = the largest measured (> 1) and document
    length ≤ the median document length of the points."""
    top = max(p.degree for p in points)
    if top < 2:
        return []
    med = float(np.median([p.seq_len for p in points]))
    return [i for i, p in enumerate(points) if p.degree == top and p.seq_len <= med]


def fit_errors(fit: FitResult) -> dict:
    """Errors of a fit on its points: ``{"mean", "max", "rms", "high_degree_short", "n_points",
    "n_high_degree_short"}`` (relative, as fractions; ``rms`` is the fit's own objective; ``high_degree_short``
    None when there are no such points; see module docstring)."""
    idx = _high_degree_short(fit.points)
    rms = float(np.sqrt(np.mean(np.square(fit.rel_errors)))) if fit.rel_errors else 0.0
    return {"mean": fit.mean_rel_error, "max": fit.max_rel_error, "rms": rms,
            "high_degree_short": float(np.mean([fit.rel_errors[i] for i in idx])) if idx else None,
            "n_points": len(fit.points), "n_high_degree_short": len(idx)}


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
    names = COEFFICIENTS_V2 + ("alpha_vis",) if fit.version == 2 else _NAMES
    lines.append(f"fitted (v{fit.version}): " + ", ".join(f"{k}={getattr(cm, k):.4g}" for k in names)
                 + f", bandwidth={cm.bandwidth_intra:.4g} B/s, tokens_per_rank={cm.tokens_per_rank}")
    if fit.unidentified:
        lines.append("not identifiable from this grid (v1 terms: kept the analytic default; gamma/alpha_blk: 0): "
                     + ", ".join(fit.unidentified))
    if fit.v1 is not None:
        e1, e2 = fit_errors(fit.v1), fit_errors(fit)

        def pct(x):
            return "-" if x is None else f"{x * 100:.1f}%"

        top = max(p.degree for p in fit.points)
        lines.append(f"v1 (§4) vs v2 (§4.1) on the same {e2['n_points']} points:")
        lines.append(f"  {'':<34} {'v1':>7} {'v2':>7}")
        lines.append(f"  {'mean error':<34} {pct(e1['mean']):>7} {pct(e2['mean']):>7}")
        lines.append(f"  {'max error':<34} {pct(e1['max']):>7} {pct(e2['max']):>7}")
        lines.append(f"  {'RMS error (the fit objective)':<34} {pct(e1['rms']):>7} {pct(e2['rms']):>7}")
        label = f"degree {top}, short docs ({e2['n_high_degree_short']} pts)"
        lines.append(f"  {label:<34} {pct(e1['high_degree_short']):>7} {pct(e2['high_degree_short']):>7}")
    slopes, ev = degree_slopes(fit.points), alpha_blk_evidence(fit.points)
    if ev is not None:
        lines.append("per-degree cost per token c_d (T = a·Q + c·S + b on each degree alone): "
                     + ", ".join(f"d={d}: {c:.3g}" for d, c in slopes.items())
                     + f" s; c_d = alpha2/d + alpha_blk gives alpha_blk = {ev[1]:.3g} s/token (alpha2 {ev[0]:.3g})")
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
