"""Synthetic workload generators for the evaluation (docs/EVALUATION.md): text and video length models.

These are SYNTHETIC stand-ins for datasets we do not ship. Each model names the published statistics it
is fitted to and which of its parameters are assumptions; the evaluation report repeats that table.

Text (token length of one document, GPT-2-style BPE):

* A log-normal is fitted from two statistics, the median ``m`` and the mean ``μ``:
  ``σ = sqrt(2·ln(μ/m))``. Check on real data: :func:`fit_lognormal` applied to the Wikipedia file of
  ``../shared/workloads`` (FlexSP's published lengths: p50 347, mean 1013.65) gives ``σ = 1.464`` and
  predicts p90 2,266 / p99 10,463 / p99.9 32,021 against the file's 2,112 / 10,919 / 37,353 — the
  two-parameter shape holds to within ~15 % up to p99.9 (the evaluation prints this comparison).
* ``commoncrawl``: mean = The Pile's Pile-CC mean document size, 4.33 KiB (Gao et al. 2020,
  arXiv 2101.00027, Table 1) at an ASSUMED 4.0 bytes per token (English prose) → 1,108 tokens;
  σ = 1.464, ASSUMED equal to the Wikipedia fit (no published quantile of Pile-CC lengths was found).
* ``github``: mean = The Pile's GitHub mean document size, 5.25 KiB (same table) at an ASSUMED
  3.0 bytes per token (indentation-heavy code tokenises worse than prose) → 1,792 tokens;
  σ = 1.8, ASSUMED (a heavier tail than prose: generated and data files).

Video (one clip → clip statistics → tokens through a model family's token spec, :mod:`fcp_data.specs`):

* ``msr-vtt``: 10,000 clips, 41.2 h in total → mean 14.83 s, every clip 10–30 s (Xu et al., CVPR
  2016); 320×240 at 30 fps as distributed (ASSUMED uniform); captions ~9 words → ~12 tokens (ASSUMED).
* ``internvid``: 234 M clips from 7.1 M videos, 760.3 K hours → mean 11.70 s (Wang et al., ICLR 2024);
  clip range 2–120 s and σ = 0.8 of the log-duration ASSUMED; 1280×720 at 30 fps ASSUMED (the corpus
  was collected at 720p); captions ~25 tokens ASSUMED.
* ``openvid``: 1.02 M clips of which 433 K are 1080p (OpenVidHD-0.4M; Nan et al., ICLR 2025) → 42.5 %
  1920×1080, the rest 1280×720 (ASSUMED); duration mean 8 s, range 2–60 s, σ = 0.6 ASSUMED; long
  "expressive" captions, ~130 tokens ASSUMED.

Durations are log-normal truncated to the clip range, with ``μ`` solved so the truncated mean equals
the stated mean (:func:`truncated_lognormal_mean`). A sample's token length is the spec's visual
layout (:func:`fcp_data.specs.plan_visual` + :func:`fcp_data.specs.count_segments`) plus the caption
and the EOS token, exactly what ``fcp index`` counts for a real clip with the same header.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from fcp_data import workloads

__all__ = ["LogNormalLengths", "VideoWorkloadModel", "TEXT_WORKLOADS", "VIDEO_WORKLOADS", "MLLM_SPECS",
           "fit_lognormal", "truncated_lognormal_mean", "apply_cap", "video_token_lengths"]

_N = NormalDist()


def fit_lognormal(lengths) -> tuple[float, float]:
    """``(median, σ)`` of the log-normal with the same median and mean as ``lengths``."""
    a = np.asarray(lengths, dtype=np.float64)
    if a.size < 2 or np.any(a <= 0):
        raise ValueError("fit_lognormal needs at least two positive lengths")
    med, mean = float(np.median(a)), float(a.mean())
    if mean <= med:
        raise ValueError(f"mean {mean:.1f} <= median {med:.1f}: not right-skewed, a log-normal does not fit")
    return med, math.sqrt(2.0 * math.log(mean / med))


def apply_cap(lengths: np.ndarray, cap: int | None, on_overlong: str = "truncate") -> np.ndarray:
    """Cap lengths at ``cap`` tokens (None: unchanged) with :func:`fcp_data.workloads.apply_cap` — the one cap —
    in its ``truncate`` or ``drop`` mode; only the lengths are returned."""
    if cap is None:
        return np.asarray(lengths, dtype=np.int64)
    if on_overlong not in ("truncate", "drop"):
        raise ValueError(f"on_overlong must be 'truncate' or 'drop', got {on_overlong!r}")
    return workloads.apply_cap(lengths, cap, on_overlong)[0]


@dataclass(frozen=True, kw_only=True, slots=True)
class LogNormalLengths:
    """A log-normal document-length model. ``median`` tokens, ``sigma`` of ln(length), ``min_tokens``
    floor (lengths are rounded up to at least this), ``source``: the published statistics and assumptions."""

    name: str
    median: float
    sigma: float
    min_tokens: int = 1
    source: str = ""

    def __post_init__(self) -> None:
        if not self.median > 0:
            raise ValueError(f"{self.name}: median must be > 0 tokens, got {self.median}")
        if not self.sigma > 0:
            raise ValueError(f"{self.name}: sigma must be > 0, got {self.sigma}")
        if self.min_tokens < 1:
            raise ValueError(f"{self.name}: min_tokens must be >= 1, got {self.min_tokens}")

    @classmethod
    def from_mean(cls, *, name: str, mean: float, sigma: float, **kw: Any) -> "LogNormalLengths":
        """The model with the given mean and σ (``median = mean / exp(σ²/2)``)."""
        return cls(name=name, median=mean / math.exp(sigma * sigma / 2.0), sigma=sigma, **kw)

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2.0)

    def quantile(self, q: float) -> float:
        if not 0.0 < q < 1.0:
            raise ValueError(f"quantile q must be in (0, 1), got {q}")
        return self.median * math.exp(self.sigma * _N.inv_cdf(q))

    def sample(self, n: int, *, seed: int, cap: int | None = None, on_overlong: str = "truncate") -> np.ndarray:
        """``n`` int64 token lengths (fewer with ``on_overlong='drop'``); deterministic in ``seed``."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        rng = np.random.default_rng(seed)
        x = np.exp(math.log(self.median) + self.sigma * rng.standard_normal(n))
        out = np.maximum(np.rint(x), self.min_tokens).astype(np.int64)
        return apply_cap(out, cap, on_overlong)


TEXT_WORKLOADS: dict[str, LogNormalLengths] = {
    "commoncrawl": LogNormalLengths.from_mean(
        name="commoncrawl", mean=4.33 * 1024 / 4.0, sigma=1.464, min_tokens=16,
        source="mean: Pile-CC mean document 4.33 KiB (The Pile, Gao et al. 2020, Table 1) at 4.0 bytes/token "
               "(assumed); sigma: assumed = log-normal fit of the Wikipedia file (1.464)"),
    "github": LogNormalLengths.from_mean(
        name="github", mean=5.25 * 1024 / 3.0, sigma=1.8, min_tokens=16,
        source="mean: Pile GitHub mean document 5.25 KiB (The Pile, Table 1) at 3.0 bytes/token (assumed); "
               "sigma 1.8 assumed (heavier tail than prose)"),
}


def truncated_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Mean of ``exp(N(mu, sigma²))`` conditioned on ``lo <= X <= hi``."""
    a, b = (math.log(lo) - mu) / sigma, (math.log(hi) - mu) / sigma
    mass = _N.cdf(b) - _N.cdf(a)
    if mass <= 0:
        raise ValueError(f"the range [{lo}, {hi}] has no mass under mu={mu}, sigma={sigma}")
    return math.exp(mu + sigma * sigma / 2.0) * (_N.cdf(b - sigma) - _N.cdf(a - sigma)) / mass


def _solve_mu(mean: float, sigma: float, lo: float, hi: float) -> float:
    if not lo < mean < hi:
        raise ValueError(f"the target mean {mean} must lie strictly inside the range [{lo}, {hi}]")
    a, b = math.log(lo) - 6 * sigma, math.log(hi) + 6 * sigma
    for _ in range(200):  # truncated mean is increasing in mu: bisection
        mid = 0.5 * (a + b)
        if truncated_lognormal_mean(mid, sigma, lo, hi) < mean:
            a = mid
        else:
            b = mid
    return 0.5 * (a + b)


@dataclass(frozen=True, kw_only=True, slots=True)
class VideoWorkloadModel:
    """A clip-statistics model: truncated log-normal duration (seconds) with the stated ``mean_s`` over
    [``min_s``, ``max_s``] and log-sd ``sigma``; ``resolutions``: ((width, height, share), ...);
    ``fps``; caption tokens log-normal around ``caption_tokens`` (σ 0.4); ``source``: where each comes from."""

    name: str
    mean_s: float
    sigma: float
    min_s: float
    max_s: float
    resolutions: tuple[tuple[int, int, float], ...]
    fps: float = 30.0
    caption_tokens: float = 12.0
    source: str = ""
    mu: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not 0 < self.min_s < self.max_s:
            raise ValueError(f"{self.name}: need 0 < min_s < max_s, got [{self.min_s}, {self.max_s}]")
        if not self.sigma > 0 or not self.fps > 0 or not self.caption_tokens > 0:
            raise ValueError(f"{self.name}: sigma, fps and caption_tokens must be > 0")
        shares = [r[2] for r in self.resolutions]
        if not self.resolutions or min(shares) <= 0 or abs(sum(shares) - 1.0) > 1e-9:
            raise ValueError(f"{self.name}: resolution shares must be > 0 and sum to 1, got {shares}")
        object.__setattr__(self, "mu", _solve_mu(self.mean_s, self.sigma, self.min_s, self.max_s))

    def sample_clips(self, n: int, *, seed: int) -> dict[str, np.ndarray]:
        """``n`` clips: ``duration`` (s), ``width``, ``height``, ``num_frames`` (source frames), ``fps``,
        ``caption_tokens``; deterministic in ``seed``. Truncation by inverse-CDF sampling (exact)."""
        rng = np.random.default_rng(seed)
        a = _N.cdf((math.log(self.min_s) - self.mu) / self.sigma)
        b = _N.cdf((math.log(self.max_s) - self.mu) / self.sigma)
        u = a + (b - a) * rng.random(n)
        z = np.array([_N.inv_cdf(float(min(max(x, 1e-300), 1 - 1e-16))) for x in u])
        dur = np.clip(np.exp(self.mu + self.sigma * z), self.min_s, self.max_s)
        which = rng.choice(len(self.resolutions), size=n, p=[r[2] for r in self.resolutions])
        w = np.array([self.resolutions[i][0] for i in which], dtype=np.int64)
        h = np.array([self.resolutions[i][1] for i in which], dtype=np.int64)
        cap = np.maximum(1, np.rint(self.caption_tokens * np.exp(0.4 * rng.standard_normal(n) - 0.08))).astype(np.int64)
        frames = np.maximum(1, np.rint(dur * self.fps)).astype(np.int64)
        return {"duration": dur, "width": w, "height": h, "num_frames": frames,
                "fps": np.full(n, self.fps), "caption_tokens": cap}


VIDEO_WORKLOADS: dict[str, VideoWorkloadModel] = {
    "msr-vtt": VideoWorkloadModel(
        name="msr-vtt", mean_s=41.2 * 3600 / 10_000, sigma=0.35, min_s=10.0, max_s=30.0,
        resolutions=((320, 240, 1.0),), fps=30.0, caption_tokens=12.0,
        source="10K clips, 41.2 h, 10-30 s each (Xu et al. CVPR 2016); 320x240@30fps, sigma 0.35, captions assumed"),
    "internvid": VideoWorkloadModel(
        name="internvid", mean_s=760.3e3 * 3600 / 234e6, sigma=0.8, min_s=2.0, max_s=120.0,
        resolutions=((1280, 720, 1.0),), fps=30.0, caption_tokens=25.0,
        source="234M clips, 760.3K h -> mean 11.70 s (Wang et al. ICLR 2024); range, sigma, 720p@30fps, captions assumed"),
    "openvid": VideoWorkloadModel(
        name="openvid", mean_s=8.0, sigma=0.6, min_s=2.0, max_s=60.0,
        resolutions=((1920, 1080, 433 / 1019), (1280, 720, 1 - 433 / 1019)), fps=30.0, caption_tokens=130.0,
        source="433K of 1.02M clips 1080p (Nan et al. ICLR 2025); duration mean/range/sigma, other res., captions assumed"),
}

# Which token spec (tokenizers/*.json) each MLLM preset's processor follows.
MLLM_SPECS: dict[str, str] = {
    "InternVL3-2B": "internvl3", "InternVL3-8B": "internvl3", "InternVL2.5-4B": "internvl3",
    "Qwen3-VL-2B": "qwen3-vl", "Qwen3-VL-4B": "qwen3-vl", "Qwen3-VL-8B": "qwen3-vl",
}


def video_token_lengths(model: VideoWorkloadModel, spec, n: int, *, seed: int,
                        internvl_frames: tuple[float, int, int] | None = None) -> np.ndarray:
    """Token length of ``n`` clips of ``model`` under a token spec (a :class:`fcp_data.specs.Spec` or its
    name): visual layout + caption + EOS, the count ``fcp index`` gives a real clip with this header.

    ``internvl_frames=(fps, lo, hi)``: for an ``internvl`` spec, sample ``clamp(round(duration·fps), lo, hi)``
    frames per clip instead of the spec's fixed ``num_frames`` (a duration-dependent variant; the
    bundled spec plans every clip at its upper bound of 32 frames, which makes all clips equally long)."""
    from dataclasses import replace

    from fcp_data.specs import count_segments, load_spec, plan_visual

    if isinstance(spec, str):
        spec = load_spec(spec)
    if internvl_frames is not None and spec.family != "internvl":
        raise ValueError(f"internvl_frames applies to an internvl spec, not {spec.family!r}")
    clips = model.sample_clips(n, seed=seed)
    eos = 1 if spec.text.get("append_eos") else 0
    cache: dict[tuple[int, int, int, int], int] = {}
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        segs = 0
        if internvl_frames is not None:
            f, lo, hi = internvl_frames
            segs = int(min(max(round(float(clips["duration"][i]) * f), lo), hi))
        key = (int(clips["width"][i]), int(clips["height"][i]), int(clips["num_frames"][i]), segs)
        if key not in cache:
            sp = spec
            if segs:
                vision = dict(spec.vision, video=dict(spec.vision["video"], num_frames=segs))
                sp = replace(spec, vision=vision)
            vp = plan_visual(sp, "video", height=key[1], width=key[0], num_frames=key[2], fps=model.fps)
            cache[key] = count_segments(sp, vp.segments)
        out[i] = cache[key] + int(clips["caption_tokens"][i]) + eos
    return out
