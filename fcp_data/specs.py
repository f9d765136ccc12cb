"""Token specs: how many tokens a model family's processor turns a text, image or video into.

A spec is a JSON file in ``tokenizers/`` (``--spec qwen2-vl``) or anywhere (``--spec path.json``). It names
the text tokenizer (an HF ``tokenizer.json``, relative to the spec file) and the vision formula parameters.
The formulas below reproduce the public processors, computed from the header only (frame count, average fps,
width, height) so that ``fcp index`` never decodes a video:

- ``qwen-vl`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): qwen-vl-utils 0.0.14 ``smart_nframes`` (frames at ``fps``,
  clamped to [min_frames, max_frames], floored to the temporal patch 2), frame indices
  ``torch.linspace(0, n-1, k).round()`` (reproduced in float32), per-frame pixel budget
  ``max(min(max_pixels, total_pixels / k * 2), int(min_pixels * 1.05))`` and ``smart_resize`` to multiples of
  ``factor = 2 * patch_size``; visual tokens = (k/2)·(H/factor)·(W/factor). Images use transformers'
  ``smart_resize`` (spec ``image.resize``; it differs from qwen-vl-utils only for sides under factor/2). Qwen3-VL adds, per temporal group,
  ``"<t seconds>"`` text (t = mean timestamp of the group's two frames, one decimal) and its own
  ``<|vision_start|>``/``<|vision_end|>`` pair (transformers ``Qwen3VLProcessor.replace_video_token``).
- ``internvl``: 448-px tiles × 256 tokens. Images: dynamic tiling (closest aspect ratio with 1..12 tiles,
  ties to more tiles while the image covers more than half of them, + a thumbnail when >1 tile), each image
  ``<img>`` + 256·tiles ``<IMG_CONTEXT>`` + ``</img>``. Videos: ``num_frames`` segments (InternVL ``get_index``),
  one tile each, ``"FrameN: <img>…</img>"`` joined by newlines.
- ``llava-video``: frames every ``round(avg_fps / fps)`` source frames, uniformly ``max_frames`` when more;
  210 ``<image>`` tokens per frame. Images: 729 tokens (one 384-px crop; AnyRes is not modelled). With
  ``video.newline`` (spec ``llava-onevision``: transformers' ``LlavaOnevisionProcessor``) a video is
  ``tokens_per_frame`` (196: 27×27 patches pooled to 14×14) per frame + one ``image_newline`` token, all of them
  ``tokens.video``; with ``image.anyres`` an image alone in its sample is its AnyRes count (:mod:`fcp_data.anyres`),
  read as its crops, and one of several is one square crop (27² + 1 tokens).
- ``text``: tokens of the document (+ EOS when ``append_eos``).

A sample's token sequence is a :class:`VisualPlan`'s segments followed by the caption tokens and EOS; the
index counts it and the readers build it with the same code, so the two agree by construction.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fcp_data import text_tokens
from fcp_data._resources import data_path

__all__ = ["Spec", "VisualPlan", "load_spec", "list_specs", "smart_resize", "qwen_num_frames", "torch_linspace_round",
           "internvl_grid", "internvl_frame_indices", "llava_frame_indices", "plan_visual", "segments_to_ids",
           "count_segments"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Spec:
    """A loaded token spec.

    name: spec name; family: ``qwen-vl``/``internvl``/``llava-video``/``text``; eta: mask factor of DESIGN §4
    for the LLM sequence (0 = causal; the LLM backbone of every VLM here is causal, so video samples get 0 too);
    text: tokenizer settings; vision: formula parameters (empty for text specs); path: the JSON file;
    tokenizer_path: resolved ``tokenizer.json``; fingerprint: sha256 of spec JSON + tokenizer bytes.
    """

    name: str
    family: str
    eta: float
    text: dict
    vision: dict
    path: str
    tokenizer_path: str
    fingerprint: str
    raw: dict = field(repr=False)

    def __post_init__(self) -> None:
        if self.family not in ("qwen-vl", "internvl", "llava-video", "text"):
            raise ValueError(f"spec {self.name!r}: unknown family {self.family!r}; use qwen-vl, internvl, llava-video or text")
        if self.eta not in (0.0, 1.0):
            raise ValueError(f"spec {self.name!r}: eta must be 0 (causal) or 1 (full attention), got {self.eta}")
        if self.family != "text" and not self.vision:
            raise ValueError(f"spec {self.name!r}: family {self.family} needs a 'vision' section")

    @property
    def is_multimodal(self) -> bool:
        return self.family != "text"

    def tokenizer(self):
        """The HF ``tokenizers.Tokenizer`` (cached per process)."""
        return _load_tokenizer(self.tokenizer_path)

    def token_id(self, token: str) -> int:
        tid = self.tokenizer().token_to_id(token)
        if tid is None:
            raise ValueError(f"spec {self.name!r}: token {token!r} is not in {self.tokenizer_path}; add it as a special token")
        return int(tid)

    @property
    def eos_id(self) -> int | None:  # the spec's EOS, else its tokenizer_config.json's (fcp_data.text_tokens)
        return text_tokens.eos_id(self)

    @property
    def placeholder_tokens(self) -> tuple[str, ...]:
        """Tokens the vision encoder's outputs replace (what the collator looks for)."""
        t = self.vision.get("tokens", {})
        if self.family == "qwen-vl":
            return (t["image_pad"], t["video_pad"])
        if self.family == "internvl":
            return (t["img_context"],)
        if self.family == "llava-video":
            return tuple(dict.fromkeys((t["image"], t.get("video", t["image"]))))
        return ()

    @property
    def placeholder_ids(self) -> tuple[int, ...]:
        return tuple(self.token_id(t) for t in self.placeholder_tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens added)."""
        return _encode_cached(self.tokenizer_path, text) if len(text) <= 64 else \
            self.tokenizer().encode(text, add_special_tokens=False).ids


@functools.lru_cache(maxsize=8)
def _load_tokenizer(path: str):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the HF tokenizers parser raises a bare Exception
        raise ValueError(f"{path} is not a valid HF tokenizer.json ({e})") from None


@functools.lru_cache(maxsize=4096)
def _encode_cached(path: str, text: str) -> list[int]:
    return _load_tokenizer(path).encode(text, add_special_tokens=False).ids


def list_specs() -> list[str]:
    """Names of the bundled specs."""
    return sorted(p.stem for p in data_path("tokenizers").glob("*.json") if _is_spec_file(p))


def _is_spec_file(p: Path) -> bool:
    try:
        with open(p, encoding="utf-8") as f:
            head = f.read(4096)
        return '"family"' in head
    except OSError:
        return False


def load_spec(name_or_path: str | Path, tokenizer: str | Path | None = None) -> Spec:
    """Load a bundled spec by name (``qwen2-vl``) or a spec JSON by path; ``tokenizer`` overrides its tokenizer."""
    p = Path(name_or_path)
    if p.suffix == ".json":
        if not p.is_file():
            raise FileNotFoundError(f"spec file {p} not found (bundled specs: {', '.join(list_specs())})")
    else:
        p = data_path("tokenizers") / f"{str(name_or_path).lower()}.json"
        if not p.exists() or not _is_spec_file(p):
            raise ValueError(f"unknown spec {str(name_or_path)!r}: use one of {', '.join(list_specs())} or a path to a spec .json")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"spec {p} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"spec {p} must be a JSON object, got {type(raw).__name__}")
    from fcp_data.index.spec_check import check_spec

    check_spec(raw, p)  # every key, type and range, here: a wrong value would crash or miscount every sample later
    text = dict(raw.get("text") or {})
    if tokenizer:  # an explicit tokenizer must exist: falling back to the spec's would count the wrong tokens
        tok = Path(tokenizer)
        if not tok.is_file():
            raise FileNotFoundError(f"tokenizer {tok} not found; pass a tokenizer.json file")
    else:
        tok = p.parent / text.get("tokenizer", "tiny-bpe.json")
        if not tok.is_file():
            tok = data_path("tokenizers") / text.get("tokenizer", "tiny-bpe.json")
        if not tok.is_file():
            raise FileNotFoundError(f"spec {p.name}: tokenizer {tok} not found; pass --tokenizer path/to/tokenizer.json")
    h = hashlib.sha256(json.dumps(raw, sort_keys=True).encode())
    tok_bytes = tok.read_bytes()
    h.update(tok_bytes + text_tokens.fingerprint_extra(text, tok, tok_bytes))  # b"" unless the EOS comes from beside
    return Spec(name=str(raw.get("name", p.stem)), family=str(raw.get("family", "")), eta=float(raw.get("eta", 0.0)),
                text=text, vision=dict(raw.get("vision") or {}), path=str(p.resolve()), tokenizer_path=str(tok.resolve()),
                fingerprint=h.hexdigest(), raw=raw)


# ---------------------------------------------------------------- Qwen-VL (qwen-vl-utils 0.0.14)

def smart_resize(height: int, width: int, factor: int, min_pixels: float, max_pixels: float,
                 max_ratio: float = 200, variant: str = "qwen-vl-utils") -> tuple[int, int]:
    """Height and width rounded to multiples of ``factor`` with min_pixels ≤ H·W ≤ max_pixels, aspect kept.

    ``variant`` picks where the two public copies differ for sides under factor/2: qwen-vl-utils clamps the
    rounded sides to ≥ factor first, transformers' image processor clamps only after the max_pixels downscale.
    """
    if min(height, width) <= 0:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > max_ratio:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.1f} exceeds {max_ratio}")
    if variant not in ("qwen-vl-utils", "transformers"):
        raise ValueError(f"smart_resize variant must be 'qwen-vl-utils' or 'transformers', got {variant!r}")
    utils = variant == "qwen-vl-utils"
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if utils:
        h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
        if not utils:
            h_bar, w_bar = max(factor, h_bar), max(factor, w_bar)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen_num_frames(total_frames: int, video_fps: float, fps: float = 2.0, min_frames: int = 4,
                    max_frames: int = 768, frame_factor: int = 2) -> int:
    """qwen-vl-utils ``smart_nframes`` for the ``fps`` mode."""
    if total_frames <= 0 or video_fps <= 0:
        raise ValueError(f"video needs frames and a positive fps, got {total_frames} frames at {video_fps} fps")
    lo = math.ceil(min_frames / frame_factor) * frame_factor
    hi = math.floor(min(max_frames, total_frames) / frame_factor) * frame_factor
    n = min(min(max(total_frames / video_fps * fps, lo), hi), total_frames)
    n = math.floor(n / frame_factor) * frame_factor
    if not (frame_factor <= n <= total_frames):
        raise ValueError(f"video too short: {total_frames} frames give {n} sampled frames (need >= {frame_factor})")
    return int(n)


def torch_linspace_round(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps).round().long()`` in float32, without importing torch."""
    if steps == 1:
        return np.array([round(start)], dtype=np.int64)
    s, e = np.float32(start), np.float32(end)
    step = np.float32((e - s) / np.float32(steps - 1))
    i = np.arange(steps)
    half = steps // 2
    lo = s + step * i[:half].astype(np.float32)
    hi = e - step * (steps - 1 - i[half:]).astype(np.float32)
    return np.rint(np.concatenate([lo, hi]).astype(np.float32)).astype(np.int64)


# ---------------------------------------------------------------- InternVL

def internvl_grid(height: int, width: int, min_tiles: int = 1, max_tiles: int = 12, tile: int = 448) -> tuple[int, int]:
    """(columns, rows) of InternVL ``dynamic_preprocess`` (``find_closest_aspect_ratio``)."""
    ratios = sorted({(i, j) for i in range(1, max_tiles + 1) for j in range(1, max_tiles + 1)
                     if min_tiles <= i * j <= max_tiles}, key=lambda r: (r[0] * r[1], r))
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for r in ratios:
        diff = abs(aspect - r[0] / r[1])
        if diff < best_diff:
            best_diff, best = diff, r
        elif diff == best_diff and area > 0.5 * tile * tile * r[0] * r[1]:
            best = r
    return best


def internvl_frame_indices(total_frames: int, num_segments: int) -> np.ndarray:
    """InternVL ``get_index`` without a time bound: the middle of ``num_segments`` equal segments."""
    end = total_frames - 1
    seg = float(end) / num_segments
    return np.array([int(seg / 2 + np.round(seg * k)) for k in range(num_segments)], dtype=np.int64)


# ---------------------------------------------------------------- LLaVA-Video

def llava_frame_indices(total_frames: int, avg_fps: float, fps: float = 1.0, max_frames: int = 64,
                        force_sample: bool = False) -> np.ndarray:
    """LLaVA-NeXT ``load_video``: every ``round(avg_fps/fps)``-th frame, uniform ``max_frames`` when more."""
    step = max(1, round(avg_fps / fps))
    idx = np.arange(0, total_frames, step, dtype=np.int64)
    if len(idx) > max_frames or force_sample:
        idx = np.linspace(0, total_frames - 1, max_frames, dtype=int).astype(np.int64)
    return idx


# ---------------------------------------------------------------- the token layout of one visual input

@dataclass(frozen=True, kw_only=True, slots=True)
class VisualPlan:
    """How one image or video becomes tokens.

    segments: ``("text", str)`` (tokenised with the spec tokenizer) or ``("token", str, count)`` (a special
    token repeated); num_visual_tokens: the placeholder tokens among them; frame_indices: source frames to
    decode (video); resized: (H, W) each frame/image is resized to (Qwen-VL) or the tile grid (cols, rows)
    (InternVL images); grid_thw: Qwen-VL patch grid (t, h, w) before merging, else None.
    """

    kind: str
    segments: tuple
    num_visual_tokens: int
    frame_indices: tuple = ()
    resized: tuple[int, int] | None = None
    grid_thw: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("image", "video"):
            raise ValueError(f"VisualPlan.kind must be 'image' or 'video', got {self.kind!r}")


def plan_visual(spec: Spec, kind: str, *, height: int, width: int, num_frames: int = 1, fps: float = 0.0,
                images_in_sample: int = 1) -> VisualPlan:
    """The token layout of one image (``kind='image'``) or video from its header values (``images_in_sample``: the
    images of its sample, for a rule that depends on it — LLaVA-OneVision's one crop each of several)."""
    v, fam = spec.vision, spec.family
    if fam == "qwen-vl":
        return _plan_qwen(spec, kind, height, width, num_frames, fps)
    if fam == "internvl":
        t = v["tokens"]
        per_tile = int(v["tokens_per_tile"])
        if kind == "image":
            im = v["image"]
            cols, rows = internvl_grid(height, width, im["min_tiles"], im["max_tiles"], v["tile_size"])
            tiles = cols * rows + (1 if im.get("use_thumbnail", True) and cols * rows > 1 else 0)
            segs = (("token", t["img_start"], 1), ("token", t["img_context"], per_tile * tiles), ("token", t["img_end"], 1))
            return VisualPlan(kind=kind, segments=segs, num_visual_tokens=per_tile * tiles, resized=(cols, rows))
        n = int(v["video"]["num_frames"])
        idx = internvl_frame_indices(num_frames, n)
        segs: list = []
        for i in range(n):
            segs += [("text", ("\n" if i else "") + f"Frame{i + 1}: "), ("token", t["img_start"], 1),
                     ("token", t["img_context"], per_tile), ("token", t["img_end"], 1)]
        return VisualPlan(kind=kind, segments=tuple(segs), num_visual_tokens=per_tile * n, frame_indices=tuple(idx.tolist()))
    if fam == "llava-video":
        tok = v["tokens"]["image"]
        if kind == "image" and v["image"].get("anyres"):  # LLaVA-OneVision (fcp_data.anyres)
            from fcp_data import anyres

            a, tile = v["image"]["anyres"], int(v["image_size"])
            if images_in_sample > 1:  # one square crop (padded, resized) + a newline
                n, crops = (tile // int(v["patch_size"])) ** 2 + 1, 1
            else:
                n = anyres.image_tokens((height, width), a["grid_pinpoints"], tile, int(v["patch_size"]),
                                        a["max_patches"])
                crops = anyres.num_crops((height, width), a["grid_pinpoints"], tile)
            return VisualPlan(kind=kind, segments=(("token", tok, n),), num_visual_tokens=n, resized=(height, width),
                              grid_thw=(-crops, height, width))
        if kind == "image":
            n = int(v["image"]["tokens_per_image"])
            return VisualPlan(kind=kind, segments=(("token", tok, n),), num_visual_tokens=n)
        vv = v["video"]
        idx = llava_frame_indices(num_frames, fps, vv["fps"], vv["max_frames"], vv.get("force_sample", False))
        n = int(v["tokens_per_frame"]) * len(idx) + (1 if vv.get("newline") else 0)
        segs = (("token", v["tokens"].get("video", tok), n),)
        return VisualPlan(kind=kind, segments=segs, num_visual_tokens=n, frame_indices=tuple(idx.tolist()))
    raise ValueError(f"spec {spec.name!r} is text-only; it cannot index {kind} samples (use a VLM spec such as qwen2-vl)")


def _plan_qwen(spec: Spec, kind: str, height: int, width: int, num_frames: int, fps: float) -> VisualPlan:
    v = spec.vision
    p, m, tp = int(v["patch_size"]), int(v["merge_size"]), int(v["temporal_patch_size"])
    factor, t = p * m, v["tokens"]
    if kind == "image":
        im = v["image"]
        h, w = smart_resize(height, width, factor, im["min_pixels"], im["max_pixels"], im.get("max_ratio", 200),
                            im.get("resize", "transformers"))
        n = (h // factor) * (w // factor)
        segs = (("token", t["vision_start"], 1), ("token", t["image_pad"], n), ("token", t["vision_end"], 1))
        return VisualPlan(kind=kind, segments=segs, num_visual_tokens=n, resized=(h, w), grid_thw=(1, h // p, w // p))
    vv = v["video"]
    k = qwen_num_frames(num_frames, fps, vv["fps"], vv["min_frames"], vv["max_frames"], vv.get("frame_factor", 2))
    idx = torch_linspace_round(0, num_frames - 1, k)
    max_px = max(min(vv["max_pixels"], vv["total_pixels"] / k * vv.get("frame_factor", 2)), int(vv["min_pixels"] * 1.05))
    h, w = smart_resize(height, width, factor, vv["min_pixels"], max_px, v["image"].get("max_ratio", 200))
    grid_t = -(-k // tp)
    per_group = (h // factor) * (w // factor)
    if v.get("timestamps"):
        ids = idx.tolist() + [int(idx[-1])] * (grid_t * tp - k)
        segs = []
        for g in range(grid_t):
            ts = (ids[g * tp] / fps + ids[g * tp + tp - 1] / fps) / 2
            segs += [("text", f"<{ts:.1f} seconds>"), ("token", t["vision_start"], 1), ("token", t["video_pad"], per_group),
                     ("token", t["vision_end"], 1)]
        if v.get("video_outer_markers", True):  # transformers >= 5 keeps the template's own pair around the groups
            segs = [("token", t["vision_start"], 1)] + segs + [("token", t["vision_end"], 1)]
    else:
        segs = [("token", t["vision_start"], 1), ("token", t["video_pad"], grid_t * per_group), ("token", t["vision_end"], 1)]
    return VisualPlan(kind=kind, segments=tuple(segs), num_visual_tokens=grid_t * per_group, frame_indices=tuple(idx.tolist()),
                      resized=(h, w), grid_thw=(grid_t, h // p, w // p))


def segments_to_ids(spec: Spec, segments, at_start: bool = False) -> list[int]:
    """Token ids of a segment list (text tokenised, special tokens repeated); ``at_start``: it opens its input."""
    out: list[int] = []
    for k, seg in enumerate(segments):
        if seg[0] == "text":
            out += text_tokens.block_text_ids(spec, seg[1], at_start and k == 0)
        else:
            out += [spec.token_id(seg[1])] * int(seg[2])
    return out


def count_segments(spec: Spec, segments, at_start: bool = False) -> int:
    return sum(len(text_tokens.block_text_ids(spec, s[1], at_start and k == 0)) if s[0] == "text" else int(s[2])
               for k, s in enumerate(segments))
