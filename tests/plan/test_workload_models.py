"""Synthetic workload models (benchmarks/paper/workload_models.py) hit the statistics they claim, deterministically.

Each test compares a generator against the published (or stated) statistic it is fitted to, with a
tolerance derived from the sampling error; a failure means the generator no longer produces the
workload the evaluation report describes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "paper"))  # evaluation-only code
from workload_models import (  # noqa: E402
    MLLM_SPECS, TEXT_WORKLOADS, VIDEO_WORKLOADS, LogNormalLengths, apply_cap, fit_lognormal,
    truncated_lognormal_mean, video_token_lengths,
)


@pytest.mark.parametrize("name,mean_tokens", [("commoncrawl", 4.33 * 1024 / 4.0), ("github", 5.25 * 1024 / 3.0)])
def test_text_models_hit_published_mean_and_stated_median(name, mean_tokens):
    """Sample mean within 6 % of The Pile's mean document size converted to tokens (the log-normal's CV is
    ≤ 5, so 4e5 draws give a standard error ≤ 0.8 %; 6 % is > 5 SE), median within 2 %, p99 within 5 %.
    A failure means the model no longer matches its documented fit."""
    m = TEXT_WORKLOADS[name]
    assert m.mean == pytest.approx(mean_tokens, rel=1e-9)
    x = m.sample(400_000, seed=1)
    assert x.mean() == pytest.approx(mean_tokens, rel=0.06)
    assert np.median(x) == pytest.approx(m.median, rel=0.02)
    assert np.quantile(x, 0.99) == pytest.approx(m.quantile(0.99), rel=0.05)
    assert x.min() >= m.min_tokens


def test_text_sampling_is_deterministic_in_seed():
    """Same seed → identical lengths; another seed → different lengths (the report's seeds reproduce it)."""
    m = TEXT_WORKLOADS["github"]
    a, b, c = m.sample(5000, seed=7), m.sample(5000, seed=7), m.sample(5000, seed=8)
    assert a.dtype == np.int64 and np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_fit_lognormal_recovers_parameters():
    """fit_lognormal on 3e5 draws of a known log-normal returns its median within 1 % and σ within 2 %."""
    ref = LogNormalLengths(name="ref", median=500.0, sigma=1.3)
    med, sigma = fit_lognormal(ref.sample(300_000, seed=3))
    assert med == pytest.approx(500.0, rel=0.01)
    assert sigma == pytest.approx(1.3, rel=0.02)
    with pytest.raises(ValueError, match="right-skewed"):
        fit_lognormal([5, 5, 5, 1])


def test_apply_cap_truncates_or_drops():
    """truncate clips to the cap and keeps the count; drop removes exactly the overlong entries."""
    x = np.array([10, 200, 50, 300])
    assert apply_cap(x, 100, "truncate").tolist() == [10, 100, 50, 100]
    assert apply_cap(x, 100, "drop").tolist() == [10, 50]
    assert apply_cap(x, None).tolist() == x.tolist()
    with pytest.raises(ValueError, match="truncate"):
        apply_cap(x, 100, "clip")


def test_truncated_lognormal_mean_matches_quadrature():
    """Closed form vs a trapezoid integral of the truncated density (rel 1e-4)."""
    mu, s, lo, hi = 2.3, 0.7, 2.0, 60.0
    t = np.linspace(math.log(lo), math.log(hi), 200_001)
    dens = np.exp(-0.5 * ((t - mu) / s) ** 2)
    ref = np.trapezoid(np.exp(t) * dens, t) / np.trapezoid(dens, t)
    assert truncated_lognormal_mean(mu, s, lo, hi) == pytest.approx(ref, rel=1e-4)


@pytest.mark.parametrize("name,mean_s", [("msr-vtt", 14.832), ("internvid", 11.697), ("openvid", 8.0)])
def test_video_durations_hit_published_mean_and_range(name, mean_s):
    """Clip durations: mean within 2 % of the published mean (MSR-VTT 41.2 h / 10K clips, InternVid
    760.3K h / 234M clips, OpenVid stated), all inside [min_s, max_s]; same seed → same clips."""
    m = VIDEO_WORKLOADS[name]
    c = m.sample_clips(40_000, seed=5)
    assert c["duration"].mean() == pytest.approx(mean_s, rel=0.02)
    assert c["duration"].min() >= m.min_s and c["duration"].max() <= m.max_s
    again = m.sample_clips(100, seed=5)
    assert np.array_equal(m.sample_clips(100, seed=5)["duration"], again["duration"])
    assert not np.array_equal(m.sample_clips(100, seed=6)["duration"], again["duration"])


def test_openvid_resolution_share():
    """42.5 % of OpenVid clips are 1080p (433K of 1.02M, OpenVidHD-0.4M), within 1.5 points on 40K clips."""
    c = VIDEO_WORKLOADS["openvid"].sample_clips(40_000, seed=2)
    assert (c["height"] == 1080).mean() == pytest.approx(433 / 1019, abs=0.015)


def test_video_token_lengths_equal_the_spec_formula():
    """Each token length equals plan_visual + count_segments of the same clip + caption + EOS: the
    generator adds nothing of its own to the specs' formulas (reference: a direct per-clip spec call)."""
    from fcp_data.specs import count_segments, load_spec, plan_visual

    model = VIDEO_WORKLOADS["internvid"]
    for spec_name in sorted(set(MLLM_SPECS.values())):
        spec = load_spec(spec_name)
        got = video_token_lengths(model, spec, 40, seed=11)
        clips = model.sample_clips(40, seed=11)
        eos = 1 if spec.text.get("append_eos") else 0
        for i in range(40):
            vp = plan_visual(spec, "video", height=int(clips["height"][i]), width=int(clips["width"][i]),
                             num_frames=int(clips["num_frames"][i]), fps=model.fps)
            assert got[i] == count_segments(spec, vp.segments) + int(clips["caption_tokens"][i]) + eos


def test_qwen3_vl_tokens_grow_with_duration_internvl_fixed_frames():
    """Qwen3-VL samples 2 frames/s, so longer clips give more tokens (rank correlation > 0.95); the bundled
    InternVL3 spec plans 32 frames for every clip (spread < 2 %), the duration-dependent variant does not."""
    model = VIDEO_WORKLOADS["internvid"]
    d = model.sample_clips(300, seed=4)["duration"]
    q = video_token_lengths(model, "qwen3-vl", 300, seed=4)
    rho = np.corrcoef(np.argsort(np.argsort(d)), np.argsort(np.argsort(q)))[0, 1]
    assert rho > 0.95
    fixed = video_token_lengths(model, "internvl3", 300, seed=4)
    assert fixed.max() / fixed.min() < 1.02
    var = video_token_lengths(model, "internvl3", 300, seed=4, internvl_frames=(1.0, 8, 64))
    assert var.max() / var.min() > 3
    with pytest.raises(ValueError, match="internvl"):
        video_token_lengths(model, "qwen3-vl", 3, seed=0, internvl_frames=(1.0, 8, 64))


def test_models_validate_inputs():
    """Bad parameters are a ValueError that names the problem."""
    with pytest.raises(ValueError, match="sigma"):
        LogNormalLengths(name="x", median=10, sigma=0)
    with pytest.raises(ValueError, match="inside the range"):
        type(VIDEO_WORKLOADS["openvid"])(name="x", mean_s=100.0, sigma=0.5, min_s=1.0, max_s=10.0,
                                         resolutions=((10, 10, 1.0),))
