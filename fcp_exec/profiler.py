"""Fit the DESIGN §4 cost model to measured step times of the real executor (``fcp profile``).

Measurement (:func:`profile_worker`, on every rank of a real process group): for each point of a grid of
(sequence length ``s``, degree ``d``), ``world // d`` concurrent CP groups of degree ``d`` each run
forward + backward of the model (tiny-llm, or one transformer layer shaped like a preset model) on one
document of ``s`` tokens, zigzag-sharded, with ring attention; the point's time is the median over
repetitions of the slowest rank, and every repetition sweeps the whole grid (noise of a shared machine
spreads over all points instead of biasing a few). The bandwidth is measured by a P2P ping-pong between ranks 0 and 1.

Fit (:func:`fit_cost_model`). With ``S = s``, ``Q = (1+η)s²`` the §4 group time is::

    T = alpha2·S/d + beta1 + [d>1]·beta2 + max(A, X),   A = alpha1·Q/d,   X = alpha3·S·(d−1)/(d·v)

(``C + M − min(A, X)`` rewritten). It is linear in the five coefficients once we know, per point,
which of ``A`` and ``X`` is larger, and that regime is a threshold on ``(Q/d) / (S(d−1)/(d·v))``
(``A ≥ X ⟺ ratio ≥ alpha3/alpha1``). So the fit tries every threshold cut of the multi-rank points,
solves a non-negative least-squares problem for each (relative residuals, exact small-problem NNLS
over all supports), scores each candidate with the true ``max`` formula and keeps the best. On timings
generated from the formula this recovers the coefficients exactly. A coefficient the grid cannot
identify (``alpha3`` when no point is communication-bound, ``beta2``/``alpha3`` with one rank) keeps the
given default and is listed in ``FitResult.unidentified``.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from fcp_data.cost import CostModel

__all__ = ["ProfilePoint", "FitResult", "fit_cost_model", "nnls_small", "format_fit", "plot_fit", "run_profile",
           "profile_worker", "ping_bandwidth", "kv_bytes_per_token"]

_NAMES = ("alpha1", "alpha2", "beta1", "alpha3", "beta2")


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfilePoint:
    """One measurement: a group of ``degree`` ranks ran one document of ``seq_len`` tokens (mask factor
    ``eta``) in ``time_s`` seconds (forward + backward, slowest rank)."""

    seq_len: int
    degree: int
    time_s: float
    eta: float = 0.0

    def __post_init__(self) -> None:
        if self.seq_len < 1 or self.degree < 1:
            raise ValueError(f"seq_len and degree must be >= 1, got {self.seq_len}, {self.degree}")
        if not (math.isfinite(self.time_s) and self.time_s > 0):
            raise ValueError(f"time_s must be a positive finite number, got {self.time_s}")

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "degree": self.degree, "time_s": self.time_s, "eta": self.eta}


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
    s = np.array([p.seq_len for p in points], dtype=np.float64)
    d = np.array([p.degree for p in points], dtype=np.float64)
    q = np.array([(1.0 + p.eta) * p.seq_len ** 2 for p in points], dtype=np.float64)
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
    pred = np.array([cm.group_time([p.seq_len], [p.eta], p.degree) for p in points])
    rel = np.abs(pred - t) / t
    return FitResult(cost_model=cm, points=points, predicted=tuple(float(p) for p in pred),
                     rel_errors=tuple(float(e) for e in rel), unidentified=tuple(unidentified))


def format_fit(fit: FitResult) -> str:
    """A per-point table (measured vs predicted), the mean error and the coefficients."""
    lines = [f"{'seq_len':>8} {'degree':>6} {'measured ms':>12} {'predicted ms':>13} {'error':>7}"]
    for p, pr, e in zip(fit.points, fit.predicted, fit.rel_errors):
        lines.append(f"{p.seq_len:>8} {p.degree:>6} {p.time_s * 1e3:>12.2f} {pr * 1e3:>13.2f} {e * 100:>6.1f}%")
    lines.append(f"mean error: {fit.mean_rel_error * 100:.1f}% over {len(fit.points)} points (paper: < 8%)")
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
    for d in sorted({p.degree for p in fit.points}):
        pts = sorted((p.seq_len, p.time_s, pr) for p, pr in zip(fit.points, fit.predicted) if p.degree == d)
        s, m, pr = (np.array(c) for c in zip(*pts))
        line, = ax.plot(s, pr * 1e3, "-", label=f"fit, degree {d}")
        ax.plot(s, m * 1e3, "o", color=line.get_color(), label=f"measured, degree {d}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("forward + backward (ms)")
    ax.set_title(f"cost-model fit, mean error {fit.mean_rel_error * 100:.1f}%")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------- measurement
def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, elem_bytes: int) -> float:
    """Analytic ``alpha3`` of this executor: per layer K and V (``2·H_kv·head_dim`` values) travel the ring
    once in the forward and again in the backward, and dK/dV travel back: 3 transfers."""
    return float(3 * num_layers * 2 * num_kv_heads * head_dim * elem_bytes)


def ping_bandwidth(rank: int, nbytes: int = 1 << 22, iters: int = 8) -> float:
    """Per-direction P2P bandwidth (bytes/s) between ranks 0 and 1 by ping-pong (call on every rank;
    ranks other than 0 and 1 only wait at the barriers). Needs an initialised process group."""
    import torch
    import torch.distributed as dist

    from fcp_exec.launch import current_device

    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=current_device())
    dist.barrier()
    elapsed = 0.0
    if rank in (0, 1):
        other = 1 - rank
        for i in range(iters + 1):  # first round trip is a warm-up
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, other)
                dist.recv(buf, other)
            else:
                dist.recv(buf, other)
                dist.send(buf, other)
            if i:
                elapsed += time.perf_counter() - t0
    dist.barrier()
    if rank != 0:
        return 0.0
    return 2.0 * buf.numel() * 4 * iters / elapsed


def _profile_model(model: str, layer_like: str | None, dtype, seed: int):
    """The model to time and its analytic alpha3 (bytes/token) and activation bytes per token."""
    from fcp_exec.models import TinyLLM, TinyLLMConfig, build_model

    if layer_like:
        from fcp_data.presets import MODELS

        if layer_like not in MODELS:
            raise ValueError(f"unknown preset {layer_like!r}; choose one of {', '.join(MODELS)}")
        m = MODELS[layer_like]
        cfg = TinyLLMConfig(vocab_size=256, hidden=m.hidden, num_layers=1, num_heads=m.heads,
                            num_kv_heads=m.kv_heads, head_dim=m.head_dim, ffn=m.ffn)
        import torch

        torch.manual_seed(seed)
        net = TinyLLM(cfg).to(dtype)
    else:
        net = build_model(model, seed=seed, dtype=dtype)
        cfg = net.cfg if model == "tiny-llm" else net.cfg.llm
    elem = net.llm.embed.weight.element_size() if hasattr(net, "llm") else net.embed.weight.element_size()
    kv = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, elem)
    act = elem * (cfg.num_layers * (8 * cfg.hidden + 2 * (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
                                    + 4 * cfg.ffn) + 3 * cfg.vocab_size)
    return net, cfg, kv, act


def _device_memory(device) -> float:
    import os

    import torch

    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / max(local, 1)


def profile_worker(model: str = "tiny-llm", layer_like: str | None = None, seq_lens=(256, 512, 1024, 2048),
                   degrees=None, reps: int = 3, warmup: int = 1, dtype: str = "float32", seed: int = 0) -> dict:
    """Time forward + backward over the (seq_len, degree) grid on this rank (module docstring); every rank
    of the process group must call it. Returns (same on all ranks) ``{"points", "bandwidth",
    "alpha3_default", "bytes_per_token", "memory_bytes", "world"}``."""
    import statistics

    import torch
    import torch.distributed as dist

    from fcp_exec.launch import current_device, dist_info
    from fcp_exec.layout import zigzag_shard

    rank, world = dist_info()
    device = current_device()
    tdtype = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[dtype]
    net, cfg, kv, act = _profile_model(model, layer_like, tdtype, seed)
    net = net.to(device)
    is_mllm = model == "tiny-mllm" and not layer_like
    bandwidth = ping_bandwidth(rank) if world > 1 else 0.0
    if world > 1:
        bw = torch.tensor([bandwidth], dtype=torch.float64, device=device)
        dist.broadcast(bw, 0)
        bandwidth = float(bw[0])
    degrees = list(degrees or range(1, world + 1))
    if max(degrees) > world or min(degrees) < 1:
        raise ValueError(f"degrees {degrees} must lie in 1..{world} (the number of processes)")
    gen = torch.Generator().manual_seed(seed)
    lm = net.llm if is_mllm else net
    grid = []  # (seq_len, degree, group or None, local tensors)
    for d in degrees:
        groups = [tuple(range(i * d, (i + 1) * d)) for i in range(world // d)]
        mine = next((g for g in groups if rank in g), None)
        for s in seq_lens:
            s_pad = -(-int(s) // (2 * d)) * 2 * d
            ids = torch.randint(10, cfg.vocab_size, (s_pad,), generator=gen)
            labels = torch.randint(10, cfg.vocab_size, (s_pad,), generator=gen)
            cu = torch.tensor([0, s_pad], dtype=torch.int32)
            local = None
            if mine:
                cp = mine.index(rank)
                shards = [zigzag_shard(x, cu, d, cp)[0].to(device) for x in (ids, torch.arange(s_pad), labels)]
                local = (*shards, zigzag_shard(ids, cu, d, cp)[1].to(device))
            grid.append((s_pad, d, mine, local))
    # every repetition sweeps the whole grid, so slow phases of a shared machine hit all points alike
    times = [[] for _ in grid]
    for r in range(warmup + reps):
        for i, (s_pad, d, mine, local) in enumerate(grid):
            if world > 1:
                dist.barrier()
            t0 = time.perf_counter()
            if mine:
                ids_l, pos_l, lab_l, cu_l = local
                logits = lm(ids_l, pos_l, cu_l, mine)
                torch.nn.functional.cross_entropy(logits.float(), lab_l, reduction="sum").backward()
                net.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0 if mine else 0.0
            if world > 1:  # the group's (and micro-batch's) time is its slowest rank's
                t = torch.tensor([dt], dtype=torch.float64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                dt = float(t[0])
            if r >= warmup:
                times[i].append(dt)
    points = []
    for (s_pad, d, _, _), ts in zip(grid, times):
        med = statistics.median(ts)
        points.append({"seq_len": s_pad, "degree": d, "time_s": med, "eta": 0.0})
        if rank == 0:
            print(f"  measured seq_len {s_pad:>6} degree {d}: {med * 1e3:8.2f} ms (median of {len(ts)})", flush=True)
    return {"points": points, "bandwidth": bandwidth, "alpha3_default": kv, "bytes_per_token": act,
            "memory_bytes": _device_memory(device), "world": world,
            "layers": getattr(cfg, "num_layers", 1)}


def run_profile(nproc: int, *, model: str = "tiny-llm", layer_like: str | None = None,
                seq_lens=(256, 512, 1024, 2048), degrees=None, reps: int = 3, dtype: str = "float32",
                tokens_per_rank: int | None = None, backend: str | None = None) -> tuple[FitResult, dict]:
    """Measure on ``nproc`` processes (:func:`fcp_exec.launch.launch`) and fit. With ``layer_like`` the
    measured layer's coefficients are multiplied by the preset's layer count (the written model is for
    the whole backbone, LM head not included). ``tokens_per_rank`` defaults to half the device memory
    (per process) over the estimated activation bytes per token, rounded down to 64."""
    from fcp_exec.launch import launch

    raw = next(r for r in launch(profile_worker, nproc, model, layer_like, tuple(seq_lens), degrees, reps, 1,
                                 dtype, 0, backend=backend) if r is not None)
    points = [ProfilePoint(**p) for p in raw["points"]]
    layers = 1
    if layer_like:
        from fcp_data.presets import MODELS

        layers = MODELS[layer_like].layers
    if tokens_per_rank is None:
        tokens_per_rank = max(64, int(0.5 * raw["memory_bytes"] / (raw["bytes_per_token"] * layers)) // 64 * 64)
    bandwidth = raw["bandwidth"] or 1e10  # one process: no ring, the value is never used by a degree-1 plan
    fit = fit_cost_model(points, bandwidth_intra=bandwidth, ranks_per_node=max(1, raw["world"]),
                         tokens_per_rank=tokens_per_rank, alpha3_default=raw["alpha3_default"])
    raw["layers_scaled"] = layers
    if layers > 1:
        cm = fit.cost_model
        scaled = cm.replace(**{k: getattr(cm, k) * layers for k in _NAMES})
        pts = tuple(ProfilePoint(seq_len=p.seq_len, degree=p.degree, time_s=p.time_s * layers, eta=p.eta)
                    for p in fit.points)
        fit = FitResult(cost_model=scaled, points=pts, predicted=tuple(p * layers for p in fit.predicted),
                        rel_errors=fit.rel_errors, unidentified=fit.unidentified)
    return fit, raw
