"""``benchmarks/paper/video_workloads.py``: real ActivityNet Captions / YouCook2 rows → (s, v, η) per sample.

The reference for every token count is a direct :func:`fcp_data.specs.plan_visual` + ``count_segments`` call on
the row's header plus the caption/prompt/EOS arithmetic written out by hand; a failure means the loader's
memoisation, row handling or cap bookkeeping changed a count. Exact equality (integers), no tolerance.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import importlib.util
import inspect
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from fcp_data.specs import count_segments, load_spec, plan_visual

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("video_workloads", REPO / "benchmarks" / "paper" / "video_workloads.py")
vw = importlib.util.module_from_spec(_spec)
sys.modules["video_workloads"] = vw
_spec.loader.exec_module(vw)

VIDEO_DIR = vw.default_video_dir()
pytestmark = pytest.mark.skipif(not (VIDEO_DIR / "activitynet_captions.csv").is_file(),
                                reason=f"real video metadata not found under {VIDEO_DIR} (set FCP_WORKLOAD_DIR)")


@functools.cache
def _csv_rows(dataset: str) -> list[dict[str, str]]:
    """The dataset's CSV rows, read once per session (the tests only read them)."""
    with open(VIDEO_DIR / vw.DATASETS[dataset], newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


_LOADED: dict[str, object] = {}


def _load(*args, **kwargs):
    """``vw.load_video_workload`` with its arguments (defaults filled in), loaded once per session: several tests read
    the same workload (e.g. ActivityNet train through Qwen2.5-VL, mixed) and none modifies it. Calls that must load
    afresh (test_deterministic_across_calls_and_memo, the error cases) call ``vw.load_video_workload`` directly."""
    bound = inspect.signature(vw.load_video_workload).bind(*args, **kwargs)
    bound.apply_defaults()
    key = repr(sorted(bound.arguments.items()))
    if key not in _LOADED:
        _LOADED[key] = vw.load_video_workload(*args, **kwargs)
    return _LOADED[key]


@pytest.mark.parametrize("dataset,split,splits", [
    ("activitynet", "train", ("train",)), ("activitynet", "val", ("val_1", "val_2")), ("activitynet", "val_2", ("val_2",)),
    ("youcook2", "train", ("train",)), ("youcook2", "test", ("test",)), ("youcook2", "all", ("train", "val", "test")),
])
def test_one_sample_per_csv_row_of_the_split(dataset, split, splits):
    rows = [r for r in _csv_rows(dataset) if r["split"] in splits]
    wl = _load(dataset, "qwen2.5-vl", split=split)
    assert len(wl) == len(rows) == wl.describe()["count"]
    assert sorted(wl.video_ids.tolist()) == sorted(r["video_id"] for r in rows)
    assert np.all(wl.eta == 0.0) and wl.tokens.dtype == np.int64 and np.all(wl.visual_tokens < wl.tokens)


def test_published_split_sizes():
    """The dataset READMEs' counts: ActivityNet train 10,009 / val_1 4,917 / val_2 4,885; YouCook2 1,333/457/210."""
    assert [len(_load("activitynet", "internvl3", split=s)) for s in ("train", "val_1", "val_2")] == \
        [10009, 4917, 4885]
    assert [len(_load("youcook2", "internvl3", split=s)) for s in ("train", "val", "test")] == [1333, 457, 210]


def _by_hand(spec_name, row, width, height, internvl_frames=None, tokens_per_word=1.3, prompt=40):
    spec = load_spec(spec_name)
    if row.get("fps") and row.get("frames"):
        frames, fps = int(row["frames"]), float(row["fps"])
    else:
        fps = 30.0
        frames = max(1, round(float(row["duration_s"]) * 30.0))
    if internvl_frames:
        f, lo, hi = internvl_frames
        n = int(min(max(round(float(row["duration_s"]) * f), lo), hi))
        spec = load_spec(spec_name)
        from dataclasses import replace
        spec = replace(spec, vision=dict(spec.vision, video=dict(spec.vision["video"], num_frames=n)))
    vp = plan_visual(spec, "video", height=height, width=width, num_frames=frames, fps=fps)
    caption = math.ceil(float(row["caption_words_total"] or 0) * tokens_per_word - 1e-9)
    return count_segments(spec, vp.segments) + caption + prompt + 1, vp.num_visual_tokens


@pytest.mark.parametrize("dataset,spec,ivf", [
    ("activitynet", "qwen2.5-vl", None), ("youcook2", "qwen3-vl", None), ("youcook2", "internvl3", None),
    ("youcook2", "internvl3", (1.0, 8, 64)), ("activitynet", "qwen2-vl", None),
])
def test_tokens_equal_a_direct_plan_visual_call(dataset, spec, ivf):
    """A handful of rows, including ActivityNet rows without fps/frames (30 fps default) and the shortest video."""
    split = "train"
    rows = [r for r in _csv_rows(dataset) if r["split"] == split]
    pick = [0, 1, 2, len(rows) - 1, int(np.argmin([float(r["duration_s"]) for r in rows])),
            int(np.argmax([float(r["duration_s"]) for r in rows]))]
    if dataset == "activitynet":
        pick += [i for i, r in enumerate(rows) if not r["fps"]][:2]
    wl = _load(dataset, spec, split=split, mix="mixed", internvl_frames=ivf)
    for i in pick:
        assert wl.video_ids[i] == rows[i]["video_id"]
        s, v = _by_hand(spec, rows[i], int(wl.width[i]), int(wl.height[i]), ivf)
        assert (int(wl.tokens[i]), int(wl.visual_tokens[i])) == (s, v), rows[i]


def test_resolution_is_the_documented_hash_of_seed_and_id():
    ids = ["v_QOlSCBRmfWY", "v_ehGHCYKzyZ8", "v_GLd3aX16zBg"]
    w, h = vw.resolution_of(ids, "mixed", seed=7)
    for vid, wi, hi in zip(ids, w, h):
        u = int.from_bytes(hashlib.blake2b(f"7:{vid}".encode(), digest_size=8).digest(), "little") / 2.0 ** 64
        assert (wi, hi) == [(640, 360), (854, 480), (1280, 720)][min(int(u * 3), 2)]


def test_deterministic_across_calls_and_memo():
    a = vw.load_video_workload("youcook2", "qwen3-vl", split="val", mix="mixed", seed=3)
    vw._LAYOUT_MEMO.clear()
    vw._TEXT_MEMO.clear()
    b = vw.load_video_workload("youcook2", "qwen3-vl", split="val", mix="mixed", seed=3)
    for f in ("tokens", "visual_tokens", "eta", "width", "height"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.describe() == b.describe()
    # a video keeps its resolution in every split that holds it (val_1 and val_2 share 4,885 videos)
    v1 = vw.load_video_workload("activitynet", "qwen2.5-vl", split="val_1")
    v2 = vw.load_video_workload("activitynet", "qwen2.5-vl", split="val_2")
    res1 = dict(zip(v1.video_ids, zip(v1.width, v1.height)))
    shared = [(vid, wi, hi) for vid, wi, hi in zip(v2.video_ids, v2.width, v2.height) if vid in res1]
    assert len(shared) == 4885 and all(res1[vid] == (wi, hi) for vid, wi, hi in shared)


def test_mixes_differ():
    low = _load("activitynet", "qwen2.5-vl", mix="low")
    mixed = _load("activitynet", "qwen2.5-vl", mix="mixed")
    high = _load("activitynet", "qwen2.5-vl", mix="high")
    other_seed = _load("activitynet", "qwen2.5-vl", mix="mixed", seed=1)
    assert set(zip(low.width, low.height)) == {(640, 360)} and set(zip(high.width, high.height)) == {(1280, 720)}
    shares = [np.mean(mixed.width == w) for w in (640, 854, 1280)]
    assert all(abs(s - 1 / 3) < 0.03 for s in shares), shares  # 10k hash draws: binomial sd 0.005
    assert low.tokens.mean() < mixed.tokens.mean() < high.tokens.mean()
    # more pixels give more tokens, except where the frame count hits max_frames 768 (>= 384 s at 2 fps): there the
    # total_pixels budget floors 720p to 12x23 merged patches per group while 360p keeps its 13x23 (a property
    # of the Qwen2.5-VL rule, documented in docs/VIDEO_WORKLOADS.md)
    long = low.num_frames / low.fps >= 384
    assert np.all(low.tokens[~long] <= high.tokens[~long]) and np.any(low.tokens[long] > high.tokens[long])
    assert not np.array_equal(mixed.width, other_seed.width)
    # the visual budget: no Qwen2.5-VL video exceeds total_pixels / 28² = 115,200 visual tokens
    assert high.visual_tokens.max() <= 115_200 and high.num_over_128k == 0
    # custom mixes are accepted and validated
    custom = _load("youcook2", "qwen2.5-vl", mix=((1920, 1080, 1.0),))
    assert custom.mix == "custom" and set(custom.width) == {1920}
    with pytest.raises(ValueError, match="unknown resolution mix"):
        vw.load_video_workload("youcook2", "qwen2.5-vl", mix="ultra")


def test_internvl3_ignores_resolution_and_is_near_constant():
    a = _load("youcook2", "internvl3", mix="low")
    b = _load("youcook2", "internvl3", mix="high")
    assert np.array_equal(a.tokens, b.tokens) and set(a.visual_tokens) == {32 * 256}


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_cap(policy):
    cap = 50_000
    full = _load("activitynet", "qwen2.5-vl", mix="mixed")
    wl = _load("activitynet", "qwen2.5-vl", mix="mixed", cap=cap, on_overlong=policy)
    over = full.tokens > cap
    assert wl.num_over_cap == int(over.sum()) > 1000 and wl.describe()["num_over_cap"] == wl.num_over_cap
    assert wl.tokens.max() <= cap and np.array_equal(wl.uncapped_tokens, full.tokens)
    if policy == "truncate":
        assert len(wl) == len(full) and np.array_equal(wl.tokens, np.minimum(full.tokens, cap))
        # layout <|vision_start|> + V pads + <|vision_end|>: the first `cap` tokens hold min(V, cap - 1) pads
        assert np.array_equal(wl.visual_tokens, np.minimum(full.visual_tokens, cap - 1))
    else:
        assert len(wl) == int((~over).sum()) and np.array_equal(wl.video_ids, full.video_ids[~over])
        assert np.array_equal(wl.tokens, full.tokens[~over])
    assert _load("activitynet", "qwen2.5-vl", cap=131_072).num_over_cap == 0
    with pytest.raises(ValueError, match="on_overlong"):
        vw.load_video_workload("youcook2", "qwen2.5-vl", cap=cap, on_overlong="clip")


def test_truncated_qwen3_visual_tokens_count_the_prefix():
    """Qwen3-VL interleaves timestamps: the kept visual tokens are the placeholders among the first `cap` tokens."""
    cap = 20_000
    wl = _load("youcook2", "qwen3-vl", split="val", cap=cap)
    spec = load_spec("qwen3-vl")
    i = int(np.flatnonzero(wl.uncapped_tokens > cap)[0])
    vp = plan_visual(spec, "video", height=int(wl.height[i]), width=int(wl.width[i]), num_frames=int(wl.num_frames[i]),
                     fps=float(wl.fps[i]))
    ids = [t for seg in vp.segments for t in (["txt"] * len(spec.encode(seg[1])) if seg[0] == "text" else [seg[1]] * seg[2])]
    assert wl.tokens[i] == cap and wl.visual_tokens[i] == sum(t == "<|video_pad|>" for t in ids[:cap])


def test_describe_reports_stats_and_assumptions():
    d = _load("activitynet", "qwen2.5-vl", mix="mixed").describe()
    for k in ("count", "mean", "p50", "p90", "p99", "max", "mean_visual_share", "num_over_128k", "assumptions"):
        assert k in d
    assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"] and 0.9 < d["mean_visual_share"] < 1.0
    text = " ".join(d["assumptions"])
    for needle in ("resolution mix 'mixed'", "1.3", "40 prompt", "30 fps", "cap: none"):
        assert needle in text, needle
    # the sanity figure: ActivityNet train through Qwen2.5-VL at 360p-720p, mean ~56K, max ~115K
    assert 50_000 < d["mean"] < 62_000 and 110_000 < d["max"] < 116_000


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown dataset"):
        vw.load_video_workload("kinetics", "qwen2.5-vl")
    with pytest.raises(ValueError, match="no split"):
        vw.load_video_workload("youcook2", "qwen2.5-vl", split="val_1")
    with pytest.raises(ValueError, match="text-only"):
        vw.load_video_workload("youcook2", "text")
    with pytest.raises(ValueError, match="internvl_frames"):
        _load("youcook2", "qwen2.5-vl", internvl_frames=(1.0, 8, 64))
