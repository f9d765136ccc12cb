"""Token formulas of the bundled specs against the public processors.

References: transformers processors built offline with their default configuration where that is possible
(Qwen2-VL image processor — PIL backend, InternVL/GOT-OCR2 tiling, Qwen3-VL timestamp helper), and worked
examples computed by hand below where it is not (qwen-vl-utils' video path imports torchvision, which is not
installed; its formulas are re-derived step by step in the comments of each example).
A failure means the index would plan with a token count that the model's processor would not produce.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fcp_data.specs import (count_segments, internvl_frame_indices, internvl_grid, list_specs, llava_frame_indices,
                            load_spec, plan_visual, qwen_num_frames, segments_to_ids, smart_resize, torch_linspace_round)

SIZES = [(48, 64), (90, 160), (112, 112), (136, 240), (180, 320), (360, 640), (300, 90), (250, 1000), (517, 33),
         (1080, 1920), (2160, 3840), (28, 28), (10, 2000), (777, 333), (4000, 3000), (56, 56), (1, 150)]


def test_bundled_specs_load_and_know_their_tokens():
    """Every bundled spec loads, and every special token it names exists in its tokenizer."""
    names = list_specs()
    assert {"qwen2-vl", "qwen2.5-vl", "qwen3-vl", "internvl3", "llava-video", "text"} <= set(names)
    for n in names:
        s = load_spec(n)
        for tok in s.vision.get("tokens", {}).values():
            s.token_id(tok)
        assert len(set(s.placeholder_ids)) == len(s.placeholder_ids)


def test_unknown_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown spec"):
        load_spec("no-such-model")


@pytest.mark.parametrize("spec_name,patch", [("qwen2-vl", 14), ("qwen3-vl", 16)])
def test_qwen_image_grid_matches_transformers(spec_name, patch):
    """Image patch grid (and so tokens = h·w/4) equals transformers' Qwen2-VL image processor (PIL backend)."""
    tr = pytest.importorskip("transformers")
    proc = tr.Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                       min_pixels=load_spec(spec_name).vision["image"]["min_pixels"],
                                       max_pixels=load_spec(spec_name).vision["image"]["max_pixels"])
    spec = load_spec(spec_name)
    for h, w in SIZES:
        if max(h, w) / min(h, w) > 200:
            continue
        plan = plan_visual(spec, "image", height=h, width=w)
        ref = proc.get_number_of_image_patches(h, w, {})
        assert plan.grid_thw[1] * plan.grid_thw[2] == ref, (h, w)
        assert plan.num_visual_tokens == ref // 4
    # and the full preprocessing path on real pixels for a few sizes
    from PIL import Image

    for h, w in [(48, 64), (360, 640), (517, 33)]:
        out = proc(images=Image.new("RGB", (w, h)), return_tensors="np")
        assert tuple(out["image_grid_thw"][0]) == plan_visual(spec, "image", height=h, width=w).grid_thw


def test_qwen_patchify_layout_matches_transformers():
    """Our Qwen-VL patch layout [t·h·w, C·tp·p·p] equals transformers' for an image already at grid size."""
    tr = pytest.importorskip("transformers")
    from fcp_data.video import _normalize, qwen_patchify

    spec = load_spec("qwen2-vl")
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (56, 84, 3), dtype=np.uint8)
    proc = tr.Qwen2VLImageProcessorPil(do_resize=False)
    ref = proc(images=img, return_tensors="np")["pixel_values"]
    x = torch.from_numpy(img.astype(np.float32)).permute(2, 0, 1)[None].expand(2, -1, -1, -1)
    ours, grid = qwen_patchify(_normalize(x, spec.vision["image_mean"], spec.vision["image_std"]), 14, 2, 2)
    assert grid == (1, 4, 6)
    np.testing.assert_allclose(ours.numpy(), ref, rtol=0, atol=1e-5)


def test_torch_linspace_round_is_exact():
    """qwen-vl-utils picks frames with torch.linspace(...).round() in float32; our numpy copy must agree bit for bit."""
    for total in list(range(2, 200)) + [1000, 1799, 2999, 9001]:
        for k in sorted({2, 4, 6, total // 2 * 2, min(total, 768) // 2 * 2, 30, 64}):
            if 2 <= k <= total:
                ref = torch.linspace(0, total - 1, k).round().long().numpy()
                np.testing.assert_array_equal(torch_linspace_round(0, total - 1, k), ref, err_msg=f"{total=} {k=}")


def test_qwen2_video_worked_examples():
    """Hand-computed qwen-vl-utils 0.0.14 examples (factor 28, 2 fps, min 4 frames, budget 128000·784·0.9)."""
    spec = load_spec("qwen2-vl")
    # 16 s at 8 fps = 128 frames -> 128/8*2 = 32 frames; per-frame max = max(min(768·784, 90316800/32·2), 100352·1.05)
    # = 602112. 48x64 rounds to 56x56 = 3136 < 100352 -> beta = sqrt(100352/3072) = 5.7155 -> ceil(9.80)=10,
    # ceil(13.07)=14 -> 280x392; tokens = 32/2 · 10 · 14 = 2240.
    p = plan_visual(spec, "video", height=48, width=64, num_frames=128, fps=8.0)
    assert (len(p.frame_indices), p.resized, p.num_visual_tokens) == (32, (280, 392), 2240)
    # 0.4 s at 15 fps = 6 frames -> 0.8 frames, raised to min 4, floored to 4; tokens 2 · (h/28)(w/28)
    # 112x112 -> 112x112 = 12544 < 100352 -> beta = sqrt(8) -> ceil(11.31)=12 -> 336x336 -> 2·12·12 = 288.
    p = plan_visual(spec, "video", height=112, width=112, num_frames=6, fps=15.0)
    assert (len(p.frame_indices), p.resized, p.num_visual_tokens) == (4, (336, 336), 288)
    assert p.frame_indices == (0, 2, 3, 5)  # linspace(0, 5, 4) = 0, 1.67, 3.33, 5 -> round
    # 3 frames only: min frames 4 is capped by floor(3/2)*2 = 2
    assert qwen_num_frames(3, 8.0) == 2
    # 30 min at 30 fps = 54000 frames -> 3600 wanted, capped at 768; per-frame max = max(min(602112, 90316800/768·2
    # = 235200), 105369) = 235200; 1080x1920 -> beta = sqrt(2073600/235200) = 2.9692 -> floor(12.99)=12 -> 336,
    # floor(23.09)=23 -> 644; tokens = 384 · 12 · 23 = 105984.
    p = plan_visual(spec, "video", height=1080, width=1920, num_frames=54000, fps=30.0)
    assert (len(p.frame_indices), p.resized, p.num_visual_tokens) == (768, (336, 644), 105984)
    with pytest.raises(ValueError):
        qwen_num_frames(1, 30.0)


def test_qwen3_video_timestamps_match_transformers():
    """Qwen3-VL: '<t seconds>' per temporal group with t from transformers' _calculate_timestamps, plus markers."""
    tr = pytest.importorskip("transformers")
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    spec = load_spec("qwen3-vl")
    for nf, fps, h, w in [(128, 8.0, 48, 64), (41, 25.0, 48, 64), (6, 15.0, 112, 112), (17, 30000 / 1001, 90, 160)]:
        p = plan_visual(spec, "video", height=h, width=w, num_frames=nf, fps=fps)
        ts = Qwen3VLProcessor._calculate_timestamps(None, list(p.frame_indices), fps, 2)
        texts = [s[1] for s in p.segments if s[0] == "text"]
        assert texts == [f"<{t:.1f} seconds>" for t in ts]
        t, gh, gw = p.grid_thw
        per = gh * gw // 4
        assert p.num_visual_tokens == t * per
        markers = 2 + 2 * t  # outer pair (transformers 5.x keeps the template's) + one pair per group
        assert count_segments(spec, p.segments) == t * per + markers + sum(len(spec.encode(x)) for x in texts)
    # 48x64, factor 32: 64x64 = 4096 < 131072 -> beta = sqrt(131072/3072) = 6.532 -> ceil(9.80)*32 = 320, ceil(13.06)*32 = 448
    p = plan_visual(spec, "video", height=48, width=64, num_frames=128, fps=8.0)
    assert p.resized == (320, 448) and p.grid_thw == (16, 20, 28)


def test_internvl_tiling_matches_transformers():
    """InternVL dynamic tiling (tiles incl. thumbnail) equals transformers' GOT-OCR2/InternVL image processor."""
    tr = pytest.importorskip("transformers")
    proc = tr.GotOcr2ImageProcessorPil(crop_to_patches=True, min_patches=1, max_patches=12, size={"height": 448, "width": 448})
    spec = load_spec("internvl3")
    for h, w in SIZES + [(448, 896), (224, 224), (1000, 1000), (500, 3000)]:
        plan = plan_visual(spec, "image", height=h, width=w)
        ref = proc.get_number_of_image_patches(h, w, {})
        assert plan.num_visual_tokens == 256 * ref, (h, w)
        assert count_segments(spec, plan.segments) == 256 * ref + 2  # <img> ... </img>


def test_internvl_and_llava_video_worked_examples():
    """InternVL get_index (segment middles) and LLaVA-NeXT load_video (1 fps step, 64 cap), by hand."""
    # 128 frames, 8 segments: seg = 127/8 = 15.875 -> int(7.9375 + round(15.875·k)); round(79.375) = 79 -> 86,
    # round(95.25) = 95 -> 102, round(63.5) = 64 (half to even) -> 71
    np.testing.assert_array_equal(internvl_frame_indices(128, 8), [7, 23, 39, 55, 71, 86, 102, 118])
    spec = load_spec("internvl3")
    p = plan_visual(spec, "video", height=48, width=64, num_frames=128, fps=8.0)
    assert p.num_visual_tokens == 32 * 256 and len(p.frame_indices) == 32
    # 25 fps, 1 fps sampling -> step 25; 129 frames -> 0, 25, 50, 75, 100, 125 = 6 frames -> 1260 tokens
    np.testing.assert_array_equal(llava_frame_indices(129, 25.0, 1.0, 64), [0, 25, 50, 75, 100, 125])
    assert plan_visual(load_spec("llava-video"), "video", height=64, width=96, num_frames=129, fps=25.0).num_visual_tokens == 1260
    # over the cap: 10 min at 30 fps -> 600 frames at 1 fps > 64 -> uniform 64 frames
    idx = llava_frame_indices(18000, 30.0, 1.0, 64)
    assert len(idx) == 64 and idx[0] == 0 and idx[-1] == 17999


def test_llava_onevision_counts_what_its_processor_writes():
    """transformers' LlavaOnevisionProcessor writes frames · ceil(27 / 2)² + 1 ``<video>`` tokens per video (the
    pooled 14×14 grid of each 384-px frame, one newline); the spec samples frames like LLaVA-NeXT (1 fps, cap 32).
    An image alone in its sample: AnyRes — 480 × 640 px → best resolution 768 × 768, 4 crops + the whole image; 729
    tokens for the whole image + the crops' 54 × 54 grid unpadded to 40 × 54 (the image's 3:4) + 40 newlines = 2,929
    (by hand; tests/exec/test_hf_llava.py holds the rule equal to the processor's and the model's)."""
    spec = load_spec("llava-onevision")
    p = plan_visual(spec, "video", height=64, width=96, num_frames=129, fps=25.0)  # 6 frames at 1 fps
    assert p.num_visual_tokens == 6 * 196 + 1 and p.segments == (("token", "<|video_pad|>", 6 * 196 + 1),)
    assert len(plan_visual(spec, "video", height=64, width=96, num_frames=18000, fps=30.0).frame_indices) == 32
    transformers = pytest.importorskip("transformers")
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    class _Proc:  # the processor's own rule, on a stand-in holding what it reads (729 = 27² image tokens)
        num_image_tokens, video_token = 729, "<video>"
    img = plan_visual(spec, "image", height=480, width=640)
    assert img.grid_thw == (-5, 480, 640) and img.segments == (("token", "<image>", img.num_visual_tokens),)
    assert img.num_visual_tokens == 2929
    if not hasattr(LlavaOnevisionProcessor, "replace_video_token"):  # the rule's method since transformers 5.x
        pytest.skip(f"transformers {transformers.__version__} has no LlavaOnevisionProcessor.replace_video_token")
    text = LlavaOnevisionProcessor.replace_video_token(_Proc(), {"pixel_values_videos": torch.zeros(1, 6, 3, 4, 4)}, 0)
    assert text.count("<video>") == p.num_visual_tokens, transformers.__version__


def test_segments_to_ids_counts_agree():
    """The ids the readers build have exactly the length the index counts, for every family."""
    for name in ("qwen2-vl", "qwen3-vl", "internvl3", "llava-video"):
        spec = load_spec(name)
        for kind in ("image", "video"):
            p = plan_visual(spec, kind, height=90, width=160, num_frames=41, fps=25.0)
            ids = segments_to_ids(spec, p.segments)
            assert len(ids) == count_segments(spec, p.segments)
            assert int(np.isin(ids, spec.placeholder_ids).sum()) == p.num_visual_tokens


def test_smart_resize_bounds():
    """smart_resize output: multiples of the factor, within [min, max] pixels whenever the input allows."""
    rng = np.random.default_rng(1)
    for _ in range(500):
        h, w = (int(x) for x in rng.integers(8, 5000, 2))
        if max(h, w) / min(h, w) > 200:
            continue
        rh, rw = smart_resize(h, w, 28, 4 * 784, 16384 * 784)
        assert rh % 28 == 0 and rw % 28 == 0 and rh * rw <= 16384 * 784
        assert rh * rw >= 4 * 784 or math.isclose(rh * rw, 4 * 784, rel_tol=0.5)


_DELETE = object()
BAD_SPECS = [  # (bundled spec copied, key set to the value, what the one-line error must say)
    ("text", "text", [1], "text must be a JSON object, got [1]"),
    ("text", "text.tokenizer", 5, "text.tokenizer must be a non-empty string, got 5"),
    ("text", "eta", "abc", "eta must be 0 (causal) or 1 (full attention), got 'abc'"),
    ("text", "text.append_eos", "no", "text.append_eos must be true or false, got 'no'"),
    ("text", "bogus", 1, "unknown key bogus"),
    ("text", "vision", {"patch_size": 14}, "a text spec has no vision section"),
    ("text", "family", "gpt", "family must be one of qwen-vl, internvl, llava-video, text, got 'gpt'"),
    ("text", "text.eos_token", _DELETE, "text.eos_token is missing (text.append_eos is true)"),
    ("qwen2-vl", "vision.merge_size", -1, "vision.merge_size must be a whole number >= 1, got -1"),
    ("qwen2-vl", "vision.patch_size", 0, "vision.patch_size must be a whole number >= 1, got 0"),
    ("qwen2-vl", "vision.patch_size", 14.5, "vision.patch_size must be a whole number >= 1, got 14.5"),
    ("qwen2-vl", "vision.patch_size", True, "vision.patch_size must be a whole number >= 1, got True"),
    ("qwen2-vl", "vision.image.max_pixels", "big", "vision.image.max_pixels must be a number > 0, got 'big'"),
    ("qwen2-vl", "vision.image.min_pixels", 1e9, "vision.image.min_pixels must be <= vision.image.max_pixels"),
    ("qwen2-vl", "vision.video.max_pixels", 100, "vision.video.max_pixels must be >= (patch_size * merge_size)^2"),
    ("qwen2-vl", "vision.video.fps", float("nan"), "vision.video.fps must be a number > 0, got nan"),
    ("qwen2-vl", "vision.image.resize", "lanczos", "vision.image.resize must be one of transformers, qwen-vl-utils"),
    ("qwen2-vl", "vision.timestamp", True, "unknown key vision.timestamp"),
    ("qwen2-vl", "vision.image_std", [0.5, 0, 0.5], "vision.image_std must be a list of 3 numbers"),
    ("qwen2-vl", "vision.tokens.video_pad", _DELETE, "vision.tokens.video_pad is missing"),
    ("qwen2-vl", "vision.video.min_frames", 1000, "vision.video.min_frames must be <= vision.video.max_frames"),
    ("internvl3", "vision.image.max_tiles", 0, "vision.image.max_tiles must be a whole number >= 1, got 0"),
    ("internvl3", "vision.video.tiles_per_frame", 2, "vision.video.tiles_per_frame must be 1"),
    ("internvl3", "vision.video.num_frames_note", 5, "vision.video.num_frames_note is a comment and must be a string"),
    ("llava-video", "vision.tokens", {}, "vision.tokens.image is missing"),
    ("llava-video", "vision.image.anyres", {"grid_pinpoints": [[384, 384]], "max_patches": 9},
     "vision.image needs one of tokens_per_image"),
    ("llava-onevision", "vision.patch_size", _DELETE, "vision.patch_size is missing (vision.image.anyres"),
    ("llava-onevision", "vision.image.anyres.grid_pinpoints", [[384]], "vision.image.anyres.grid_pinpoints must be"),
]


def _spec_copy(tmp_path, name: str, key: str, value) -> str:
    """A copy of bundled spec ``name`` (same tokenizer) with ``key`` (dotted) set to ``value`` or deleted."""
    import copy
    import json

    raw = copy.deepcopy(load_spec(name).raw)
    *parents, last = key.split(".")
    d = raw
    for k in parents:
        d = d[k]
    if value is _DELETE:
        del d[last]
    else:
        d[last] = value
    path = tmp_path / f"{name}-{key}.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("name,key,value,needle", BAD_SPECS,
                         ids=[f"{c[0]}:{c[1]}={'<deleted>' if c[2] is _DELETE else repr(c[2])}"[:60] for c in BAD_SPECS])
def test_a_spec_is_checked_whole_when_it_loads(tmp_path, name, key, value, needle):
    """A wrong type, range or key is one ValueError at load that names the spec file and the key — not a TypeError
    at load, not every sample failing later (``patch_size: 0`` divided by zero), not other counts without a word
    (``merge_size: -1``) or a key ignored (``append_eos: "no"``, a typo)."""
    path = _spec_copy(tmp_path, name, key, value)
    with pytest.raises(ValueError) as err:
        load_spec(path)
    msg = str(err.value)
    assert msg.startswith(f"spec {path}: ") and needle in msg and "\n" not in msg, msg


def test_every_problem_of_a_spec_is_named_and_comments_are_allowed(tmp_path):
    import json

    raw = dict(load_spec("qwen2-vl").raw, eta="x", typo=1)
    raw["vision"] = dict(raw["vision"], merge_size=0, my_note="a comment anywhere")
    (tmp_path / "s.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError) as err:
        load_spec(tmp_path / "s.json")
    msg = str(err.value)
    assert "eta must be" in msg and "unknown key typo" in msg and "vision.merge_size" in msg and "my_note" not in msg
    for name in list_specs():  # the bundled specs' comments (description, reference, *_note) pass
        load_spec(_spec_copy(tmp_path, name, "reference_note", "a comment"))
