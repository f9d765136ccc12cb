"""Real video workloads: ActivityNet Captions and YouCook2 durations → per-sample (s, v, η) for DESIGN §4.1.

``../shared/workloads/video/`` holds the real per-video metadata of two long-tailed video-language datasets
(durations, ActivityNet's real fps and frame counts, caption word counts; see that folder's README). This
module turns each row into one training sample of a video MLLM through the project's own token formulas
(:func:`fcp_data.specs.plan_visual` + :func:`fcp_data.specs.count_segments`, the code ``fcp index`` runs on a
real clip's header) and returns numpy arrays ready for the planners:

    wl = load_video_workload("activitynet", "qwen2.5-vl", split="train", mix="mixed", seed=0, cap=None)
    wl.tokens, wl.visual_tokens, wl.eta, wl.video_ids      # s_k, v_k, η_k of DESIGN §4.1, one per CSV row
    wl.describe()                                          # count, mean, p50/p90/p99/max, visual share, assumptions

Nothing about the visual tokens is invented here: the spec decides frames, resizing and layout. What the CSVs do
not contain is ASSUMED, and every assumption is a parameter with the default stated below (also in
docs/VIDEO_WORKLOADS.md and in ``describe()["assumptions"]``):

1. **Resolution** (neither CSV has one). Each video gets one (width, height) drawn from a named mix, chosen by
   ``blake2b(f"{seed}:{video_id}")`` (so the same video gets the same resolution in every split, spec and
   process; ``seed`` re-draws). Mixes (:data:`MIXES`): ``low`` = all 640×360; ``mixed`` = 640×360 / 854×480 /
   1280×720 with weights 1/3 each (a no-information prior over YouTube's common 16:9 renditions, not a
   measurement); ``high`` = all 1280×720. Any ``((width, height, weight), ...)`` tuple works too. All 16:9:
   4:3 sources (480×360, 640×480) have ~25 % fewer pixels at the same height and are not modelled.
2. **Frames**: ActivityNet rows carry the source video's real ``fps`` and ``frames`` (19,046 of 19,811 rows;
   frames/fps matches ``duration_s`` within 1 %); rows without them and all of YouCook2 use ``default_fps`` =
   30 and ``frames = max(1, round(duration_s · 30))``. The spec then samples frames exactly as its processor
   does: Qwen-VL 2 fps clamped to [4, 768] frames with the per-frame pixel budget
   ``min(max_pixels, total_pixels / k · 2)`` (this budget bounds every Qwen2.5-VL / Qwen3-VL video at
   ``total_pixels / (patch·merge)² = 115,200`` visual tokens, and makes Qwen2.5-VL non-monotone in resolution
   for videos ≥ 384 s: at 768 frames 1280×720 floors to 12×23 merged patches per frame pair, 640×360 keeps 13×23);
   InternVL3 the bundled fixed 32 frames × 1 tile ×
   256 tokens = 8,192 visual tokens for every video (so all internvl3 samples are nearly equally long), or,
   with ``internvl_frames=(fps, lo, hi)``, ``clamp(round(duration · fps), lo, hi)`` frames per video (the
   duration-dependent variant that benchmarks/paper/exp_video.py calls ``internvl3-1fps``: (1.0, 8, 64)).
3. **Text tokens**: ``ceil(caption_words_total · tokens_per_word)`` with ``tokens_per_word`` = 1.3 (English
   prose under a BPE tokenizer), plus ``prompt_tokens`` = 40 for the chat template and instruction
   (``<|im_start|>system … <|im_end|>``, the user turn with a dense-captioning instruction, the assistant
   header), plus the spec's EOS. YouCook2 ``test`` has no captions (0 caption tokens). Per-event timestamps in
   the answer are not counted (ActivityNet: 3.7 events per video → ~40 tokens, < 0.1 % of a sample). Text inside
   the visual layout (Qwen3-VL ``<t seconds>``, InternVL ``FrameN:``) is counted with the spec's bundled
   tokenizer (tiny-bpe, a stand-in: 10–12 tokens per Qwen3-VL ``<12.3 seconds>`` where Qwen's tokenizer, digits
   split, gives 6–8, i.e. ~+1 % on qwen3-vl totals); pass a :class:`~fcp_data.specs.Spec` loaded with the real
   tokenizer to change it.
4. **Sequence order** (what a truncation keeps): the spec's visual layout, then prompt, caption, EOS.
5. **Cap**: ``cap=None`` (default) keeps every length. ``cap=N`` with ``on_overlong="truncate"`` keeps the first
   N tokens (``visual_tokens`` becomes the placeholder count among them); ``"drop"`` removes those samples.
   ``describe()`` reports how many samples exceeded the cap (and 128K = 131,072 in any case). Through the two
   Qwen specs no sample exceeds 128K (the 115,200 visual-token bound above), so the paper's 128K cap is a no-op.
6. **η = 0** for every sample: the LLM backbone of each of these VLMs is causal (``Spec.eta``).
7. **Splits**: ActivityNet ``train`` / ``val_1`` / ``val_2`` / ``val`` (= val_1 + val_2 rows: the 4,885 shared
   videos appear twice, once per caption set, as two samples) / ``all``; YouCook2 ``train`` / ``val`` / ``test`` /
   ``all``. One sample per CSV row.

Speed: a row's layout depends only on (spec, width, height, frames, fps[, InternVL frame count]); each distinct
key calls ``plan_visual`` once (memoised for the process) and text segments are tokenised once per distinct
string, so the 10,009 ActivityNet train rows take 0.2 s (qwen2.5-vl), 1.2 s (internvl3) and 1.8 s (qwen3-vl, ~120
timestamp strings per video) on one core of a shared 2-core EPYC; no on-disk cache is needed.

``python benchmarks/paper/video_workloads.py`` prints the statistics table of docs/VIDEO_WORKLOADS.md.
"""

from __future__ import annotations

import csv
import hashlib
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from fcp_data.specs import Spec, load_spec, plan_visual  # noqa: E402

__all__ = ["MIXES", "DATASETS", "SPLITS", "VideoWorkload", "load_video_workload", "resolution_of", "default_video_dir",
           "stats_table"]

CAP_128K = 131_072
MIXES: dict[str, tuple[tuple[int, int, float], ...]] = {
    "low": ((640, 360, 1.0),),
    "mixed": ((640, 360, 1 / 3), (854, 480, 1 / 3), (1280, 720, 1 / 3)),
    "high": ((1280, 720, 1.0),),
}
DATASETS = {"activitynet": "activitynet_captions.csv", "youcook2": "youcook2.csv"}
SPLITS = {"activitynet": {"train": ("train",), "val_1": ("val_1",), "val_2": ("val_2",), "val": ("val_1", "val_2"),
                          "all": ("train", "val_1", "val_2")},
          "youcook2": {"train": ("train",), "val": ("val",), "test": ("test",), "all": ("train", "val", "test")}}

# (spec fingerprint, internvl frame count or 0, width, height, frames, fps) -> (layout tokens, visual tokens)
_LAYOUT_MEMO: dict[tuple, tuple[int, int]] = {}
_TEXT_MEMO: dict[tuple[str, str], int] = {}


def default_video_dir() -> Path:
    """``$FCP_WORKLOAD_DIR/video`` if set, else ``<repo>/../shared/workloads/video``."""
    env = os.environ.get("FCP_WORKLOAD_DIR")
    return (Path(env) if env else REPO.parent / "shared" / "workloads") / "video"


@dataclass(frozen=True, kw_only=True, slots=True)
class VideoWorkload:
    """One sample per CSV row of a split.

    tokens: s_k (int64, after the cap); visual_tokens: v_k, the spec's vision placeholders among them (int64);
    eta: η_k (float64, the spec's mask factor: 0, causal); video_ids: dataset ids (str); caption_tokens: the
    caption part of s_k; width/height: the assumed resolution; num_frames/fps: the header given to the spec;
    num_over_cap: rows whose uncapped length exceeded ``cap`` (0 without a cap); num_over_128k: the same for
    131,072 tokens, before any cap; uncapped_tokens: s_k before the cap (all rows, also the dropped ones);
    assumptions: human-readable list of every assumed input.
    """

    dataset: str
    spec: str
    split: str
    mix: str
    seed: int
    cap: int | None
    on_overlong: str
    tokens: np.ndarray
    visual_tokens: np.ndarray
    eta: np.ndarray
    video_ids: np.ndarray
    caption_tokens: np.ndarray
    width: np.ndarray
    height: np.ndarray
    num_frames: np.ndarray
    fps: np.ndarray
    num_over_cap: int
    num_over_128k: int
    uncapped_tokens: np.ndarray
    assumptions: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        n = self.tokens.size
        for name in ("visual_tokens", "eta", "video_ids", "caption_tokens", "width", "height", "num_frames", "fps"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"VideoWorkload.{name} has shape {getattr(self, name).shape}, expected ({n},)")
        if n and (self.visual_tokens > self.tokens).any():
            raise ValueError("VideoWorkload: visual_tokens exceed tokens for some sample")

    def __len__(self) -> int:
        return int(self.tokens.size)

    def describe(self) -> dict[str, Any]:
        """Statistics of ``tokens`` (count, mean, min, p50, p90, p99, max), the visual share (mean of v/s and
        Σv/Σs), the cap outcome, and the assumptions."""
        s = self.tokens.astype(np.float64)
        v = self.visual_tokens.astype(np.float64)
        q = np.quantile(s, [0.5, 0.9, 0.99]) if s.size else [math.nan] * 3
        return {"dataset": self.dataset, "split": self.split, "spec": self.spec, "mix": self.mix, "seed": self.seed,
                "count": int(s.size), "mean": float(s.mean()) if s.size else math.nan,
                "min": int(s.min()) if s.size else 0, "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]),
                "max": int(s.max()) if s.size else 0,
                "mean_visual_share": float((v / s).mean()) if s.size else math.nan,
                "visual_share_of_tokens": float(v.sum() / s.sum()) if s.size else math.nan,
                "mean_visual_tokens": float(v.mean()) if s.size else math.nan,
                "cap": self.cap, "on_overlong": self.on_overlong, "num_over_cap": self.num_over_cap,
                "num_over_128k": self.num_over_128k, "num_rows": int(self.uncapped_tokens.size),
                "assumptions": list(self.assumptions)}


def resolution_of(video_ids, mix: str | tuple = "mixed", seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(width, height) per video id: ``blake2b(f"{seed}:{id}")`` as a uniform in [0, 1) picks from the mix's
    cumulative weights; deterministic across processes and independent of row order."""
    table = _mix(mix)
    w = np.array([r[0] for r in table], dtype=np.int64)
    h = np.array([r[1] for r in table], dtype=np.int64)
    cum = np.cumsum([r[2] for r in table], dtype=np.float64)
    cum /= cum[-1]
    u = np.array([int.from_bytes(hashlib.blake2b(f"{seed}:{vid}".encode(), digest_size=8).digest(), "little")
                  for vid in video_ids], dtype=np.float64) / 2.0 ** 64
    k = np.minimum(np.searchsorted(cum, u, side="right"), len(table) - 1)
    return w[k], h[k]


def _mix(mix) -> tuple[tuple[int, int, float], ...]:
    if isinstance(mix, str):
        if mix not in MIXES:
            raise ValueError(f"unknown resolution mix {mix!r}: use one of {', '.join(MIXES)} or ((width, height, weight), ...)")
        return MIXES[mix]
    table = tuple((int(a), int(b), float(c)) for a, b, c in mix)
    if not table or any(a <= 0 or b <= 0 or c < 0 for a, b, c in table) or sum(c for *_, c in table) <= 0:
        raise ValueError(f"a resolution mix needs (width > 0, height > 0, weight >= 0) rows with a positive total, got {mix!r}")
    return table


def _read_rows(dataset: str, split: str, video_dir: Path) -> list[dict[str, str]]:
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}: use one of {', '.join(DATASETS)}")
    if split not in SPLITS[dataset]:
        raise ValueError(f"{dataset} has no split {split!r}: use one of {', '.join(SPLITS[dataset])}")
    path = video_dir / DATASETS[dataset]
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass video_dir= or set FCP_WORKLOAD_DIR to the shared workloads folder")
    keep = SPLITS[dataset][split]
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] in keep]
    return sorted(rows, key=lambda r: keep.index(r["split"]))  # CSV order within a split (sort is stable)


def _count_text(spec: Spec, text: str) -> int:
    key = (spec.fingerprint, text)
    n = _TEXT_MEMO.get(key)
    if n is None:
        n = _TEXT_MEMO[key] = len(spec.encode(text))
    return n


def _layout(spec: Spec, iv_frames: int, width: int, height: int, frames: int, fps: float, cap: int | None = None
            ) -> tuple[int, int]:
    """(tokens, visual tokens) of the spec's visual layout for one header (exactly ``count_segments`` of
    ``plan_visual``); with ``cap``, of its first ``cap`` tokens."""
    key = (spec.fingerprint, iv_frames, width, height, frames, fps)
    if cap is None and key in _LAYOUT_MEMO:
        return _LAYOUT_MEMO[key]
    sp = spec
    if iv_frames:
        sp = replace(spec, vision=dict(spec.vision, video=dict(spec.vision["video"], num_frames=iv_frames)))
    vp = plan_visual(sp, "video", height=height, width=width, num_frames=frames, fps=fps)
    placeholders = set(sp.placeholder_tokens)
    total = visual = 0
    for seg in vp.segments:
        n = _count_text(sp, seg[1]) if seg[0] == "text" else int(seg[2])
        if cap is not None:
            n = min(n, cap - total)
        total += n
        if seg[0] == "token" and seg[1] in placeholders:
            visual += n
        if cap is not None and total >= cap:
            break
    if cap is None:
        if visual != vp.num_visual_tokens:  # internal invariant: the segments hold exactly the plan's placeholders
            raise AssertionError(f"{sp.name}: {visual} placeholders in the segments, plan says {vp.num_visual_tokens}")
        _LAYOUT_MEMO[key] = (total, visual)
    return total, visual


def load_video_workload(dataset: str, spec: str | Spec, *, split: str = "train", mix: str | tuple = "mixed",
                        seed: int = 0, cap: int | None = None, on_overlong: str = "truncate",
                        tokens_per_word: float = 1.3, prompt_tokens: int = 40, default_fps: float = 30.0,
                        internvl_frames: tuple[float, int, int] | None = None,
                        video_dir: str | Path | None = None) -> VideoWorkload:
    """Per-sample (s, v, η) of a real dataset split under a token spec; the module docstring lists every
    assumption and its default. ``spec``: a bundled name (``qwen2.5-vl``, ``qwen3-vl``, ``internvl3``, any VLM
    spec) or a loaded :class:`~fcp_data.specs.Spec`."""
    sp = load_spec(spec) if isinstance(spec, (str, Path)) else spec
    if not isinstance(sp, Spec):
        raise TypeError(f"spec must be a spec name, a spec .json path or a fcp_data.specs.Spec, got {type(spec).__name__}")
    if not sp.is_multimodal:
        raise ValueError(f"spec {sp.name!r} is text-only: use a VLM spec such as qwen2.5-vl, qwen3-vl or internvl3")
    if internvl_frames is not None and sp.family != "internvl":
        raise ValueError(f"internvl_frames applies to an internvl spec, not {sp.family!r}")
    if cap is not None and (int(cap) != cap or cap < 1):
        raise ValueError(f"cap must be a positive token count or None, got {cap!r}")
    if on_overlong not in ("truncate", "drop"):
        raise ValueError(f"on_overlong must be 'truncate' or 'drop', got {on_overlong!r}")
    if not tokens_per_word > 0 or prompt_tokens < 0 or not default_fps > 0:
        raise ValueError("tokens_per_word and default_fps must be > 0 and prompt_tokens >= 0")
    mix_table = _mix(mix)
    mix_name = mix if isinstance(mix, str) else "custom"
    rows = _read_rows(dataset, split, Path(video_dir) if video_dir else default_video_dir())

    n = len(rows)
    ids = np.array([r["video_id"] for r in rows], dtype=object)
    dur = np.array([float(r["duration_s"]) for r in rows], dtype=np.float64)
    real = np.array([bool(r.get("fps")) and bool(r.get("frames")) for r in rows], dtype=bool)
    fps = np.array([float(r["fps"]) if ok else default_fps for r, ok in zip(rows, real)], dtype=np.float64)
    frames = np.array([int(r["frames"]) if ok else max(1, round(d * default_fps)) for r, ok, d in zip(rows, real, dur)],
                      dtype=np.int64)
    words = np.array([float(r["caption_words_total"] or 0) for r in rows], dtype=np.float64)
    caption = np.ceil(words * tokens_per_word - 1e-9).astype(np.int64)
    width, height = resolution_of(ids, mix_table, seed)
    iv = np.zeros(n, dtype=np.int64)  # InternVL frame count per video when duration-dependent, else 0 (the spec's)
    if internvl_frames is not None:
        f, lo, hi = internvl_frames
        iv = np.clip(np.rint(dur * f), lo, hi).astype(np.int64)

    eos = 1 if sp.text.get("append_eos") else 0
    layout = np.empty(n, dtype=np.int64)
    visual = np.empty(n, dtype=np.int64)
    for i in range(n):
        layout[i], visual[i] = _layout(sp, int(iv[i]), int(width[i]), int(height[i]), int(frames[i]), float(fps[i]))
    text = caption + int(prompt_tokens) + eos
    uncapped = layout + text
    keep = np.ones(n, dtype=bool)
    tokens, vis = uncapped.copy(), visual.copy()
    over = np.zeros(n, dtype=bool) if cap is None else uncapped > cap
    if cap is not None and over.any():
        if on_overlong == "drop":
            keep = ~over
        else:
            tokens[over] = cap
            for i in np.flatnonzero(over):  # the first `cap` tokens: layout first, then text
                if layout[i] > cap:
                    vis[i] = _layout(sp, int(iv[i]), int(width[i]), int(height[i]), int(frames[i]), float(fps[i]), cap)[1]

    spec_label = sp.name + (f"-{internvl_frames[0]:g}fps[{internvl_frames[1]},{internvl_frames[2]}]" if internvl_frames else "")
    mix_txt = ", ".join(f"{a}x{b}:{c:.3g}" for a, b, c in mix_table)
    frames_txt = (f"{sp.name}: fps {sp.vision['video'].get('fps')}, frames [{sp.vision['video'].get('min_frames')}, "
                  f"{sp.vision['video'].get('max_frames')}], per-frame pixels min(max_pixels "
                  f"{sp.vision['video'].get('max_pixels')}, total_pixels {sp.vision['video'].get('total_pixels')} / k * 2)"
                  if sp.family == "qwen-vl" else
                  f"{sp.name}: {sp.vision['video'].get('num_frames')} frames per video (bundled)" if internvl_frames is None else
                  f"{sp.name}: clamp(round(duration * {internvl_frames[0]:g}), {internvl_frames[1]}, {internvl_frames[2]}) frames")
    assumptions = (
        f"resolution mix {mix_name!r} ({mix_txt}) per video id via blake2b(seed={seed}:id); not in the CSVs",
        f"source fps/frames: the CSV's real values for {int(real.sum())} of {n} rows, else {default_fps:g} fps and "
        f"round(duration*{default_fps:g}) frames",
        f"frame sampling and layout: fcp_data.specs.plan_visual ({frames_txt})",
        f"text: ceil(caption_words_total * {tokens_per_word:g}) + {prompt_tokens} prompt-template tokens + {eos} EOS",
        "order: visual layout, prompt, caption, EOS; eta = spec.eta = " + f"{sp.eta:g}",
        f"cap: {'none' if cap is None else f'{cap} tokens, {on_overlong}'}; {int(over.sum())} of {n} rows over the cap, "
        f"{int((uncapped > CAP_128K).sum())} over 128K",
    )
    return VideoWorkload(dataset=dataset, spec=spec_label, split=split, mix=mix_name, seed=int(seed), cap=cap,
                         on_overlong=on_overlong, tokens=tokens[keep], visual_tokens=vis[keep],
                         eta=np.full(int(keep.sum()), float(sp.eta)), video_ids=ids[keep], caption_tokens=caption[keep],
                         width=width[keep], height=height[keep], num_frames=frames[keep], fps=fps[keep],
                         num_over_cap=int(over.sum()), num_over_128k=int((uncapped > CAP_128K).sum()),
                         uncapped_tokens=uncapped, assumptions=assumptions)


# ---------------------------------------------------------------- the statistics table (docs/VIDEO_WORKLOADS.md)

TABLE_CASES = (  # (dataset, split, spec, internvl_frames, mixes)
    ("activitynet", "train", "qwen2.5-vl", None, ("low", "mixed", "high")),
    ("activitynet", "train", "qwen3-vl", None, ("low", "mixed", "high")),
    ("activitynet", "train", "internvl3", None, ("mixed",)),
    ("activitynet", "train", "internvl3", (1.0, 8, 64), ("mixed",)),
    ("activitynet", "val", "qwen2.5-vl", None, ("low", "mixed")),
    ("activitynet", "val", "qwen3-vl", None, ("low", "mixed")),
    ("activitynet", "val", "internvl3", None, ("mixed",)),
    ("youcook2", "train", "qwen2.5-vl", None, ("low", "mixed", "high")),
    ("youcook2", "train", "qwen3-vl", None, ("low", "mixed", "high")),
    ("youcook2", "train", "internvl3", None, ("mixed",)),
    ("youcook2", "train", "internvl3", (1.0, 8, 64), ("mixed",)),
    ("youcook2", "val", "qwen2.5-vl", None, ("mixed",)),
    ("youcook2", "val", "qwen3-vl", None, ("mixed",)),
)


def stats_table(cases=TABLE_CASES, *, seed: int = 0, video_dir: Path | None = None) -> tuple[str, list[float]]:
    """Markdown table of :meth:`VideoWorkload.describe` per case, and the load time of each row in seconds."""
    head = ["dataset", "split", "spec", "mix", "count", "mean", "min", "p50", "p90", "p99", "max",
            "visual share (mean v/s)", "> 128K", "load s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    times = []
    for dataset, split, spec, ivf, mixes in cases:
        for mix in mixes:
            t0 = time.perf_counter()
            d = load_video_workload(dataset, spec, split=split, mix=mix, seed=seed, internvl_frames=ivf,
                                    video_dir=video_dir).describe()
            times.append(time.perf_counter() - t0)
            lines.append("| " + " | ".join([dataset, split, d["spec"], mix if spec.startswith("qwen") else "(any)",
                                            f"{d['count']:,}", f"{d['mean']:,.0f}", f"{d['min']:,}", f"{d['p50']:,.0f}",
                                            f"{d['p90']:,.0f}", f"{d['p99']:,.0f}", f"{d['max']:,}",
                                            f"{d['mean_visual_share']:.3f}", str(d["num_over_128k"]),
                                            f"{times[-1]:.2f}"]) + " |")
    return "\n".join(lines), times


def _cli():
    """benchmarks/_args (the shared command line), imported only when this module runs as a script."""
    bench = str(Path(__file__).resolve().parents[1])
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import _args

    return _args


def build_parser():
    a = _cli()
    count, existing_dir, parser = a.count, a.existing_dir, a.parser
    ap = parser("Statistics of the real video workloads (docs/VIDEO_WORKLOADS.md).")
    ap.add_argument("--seed", type=count, default=0, help="random seed of the resolution mixes")
    ap.add_argument("--video-dir", type=existing_dir, default=None,
                    help="folder with activitynet_captions.csv and youcook2.csv (default: $FCP_WORKLOAD_DIR/video if "
                         "set, else ../shared/workloads/video next to the repository)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    t0 = time.perf_counter()
    table, _ = stats_table(seed=args.seed, video_dir=args.video_dir)
    print(table)
    print(f"\n(total {time.perf_counter() - t0:.1f} s; the per-row load time includes plan_visual for keys not seen "
          "by an earlier row of the same process)")
    return 0


if __name__ == "__main__":
    _cli().run(main)
