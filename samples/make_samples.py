"""Generate the bundled sample data, deterministically (same bytes on every run with the same libraries).

Outputs (all under this folder unless ``--out`` says otherwise):

- ``text.jsonl``                  text documents ``{"id", "text"}`` with a long-tailed (log-normal) length
- ``wds/shard-00000{0..3}.tar``    webdataset shards: short mp4 videos (PyAV/libx264; several resolutions,
                                  frame rates and durations with a long tail), a few jpg images, and a
                                  ``.txt`` caption for every media sample
- ``../tokenizers/tiny-bpe.json`` (with ``--tokenizer``) a tiny byte-level BPE tokenizer trained on the
                                  text above with the HF ``tokenizers`` library, carrying the special tokens
                                  the specs in ``tokenizers/`` use

Run: ``python samples/make_samples.py [--out DIR] [--tokenizer]``. Total size stays under 2 MB.
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
from fractions import Fraction
from pathlib import Path

import numpy as np

__all__ = ["make_text", "make_video_bytes", "make_image_bytes", "make_shards", "train_tokenizer", "SPECIAL_TOKENS"]

SEED = 20260301
HERE = Path(__file__).resolve().parent

# Every special token used by the bundled specs; the tiny tokenizer knows all of them.
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|pad|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",  # Qwen2/2.5/3-VL
    "<img>", "</img>", "<IMG_CONTEXT>",  # InternVL
    "<image>",  # LLaVA-Video
]

_SYLLABLES = ["ka", "to", "ri", "mu", "se", "lan", "dor", "vi", "qu", "ne", "pha", "sil", "bro", "te", "ga",
              "mo", "zen", "la", "fi", "cor", "ul", "an", "est", "ion", "ter", "pra", "gu", "hel", "ox", "ry"]


def _vocabulary(rng: np.random.Generator, size: int = 2500) -> list[str]:
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        n = int(rng.integers(1, 4))
        w = "".join(_SYLLABLES[int(i)] for i in rng.integers(0, len(_SYLLABLES), n))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _sentence_stream(rng: np.random.Generator, vocab: list[str], num_words: int) -> str:
    # Zipf-like word frequencies, sentences of 6-20 words.
    ranks = np.minimum(rng.zipf(1.3, num_words), len(vocab)) - 1
    out, i = [], 0
    while i < num_words:
        n = int(rng.integers(6, 21))
        words = [vocab[int(r)] for r in ranks[i:i + n]]
        i += n
        if words:
            out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def make_text(num_docs: int = 320) -> list[dict]:
    """Text documents whose word counts are log-normal (median ~60 words) with a tail to ~6000 words."""
    rng = np.random.default_rng(SEED)
    vocab = _vocabulary(rng)
    lengths = np.clip(rng.lognormal(mean=4.1, sigma=1.1, size=num_docs), 3, 6000).astype(int)
    lengths[:3] = [6000, 2500, 1200]  # make sure the long tail is there even for a small num_docs
    return [{"id": f"doc-{i:05d}", "text": _sentence_stream(rng, vocab, int(n))} for i, n in enumerate(lengths)]


def make_video_bytes(width: int, height: int, fps: Fraction, num_frames: int, seed: int) -> bytes:
    """A small h264 mp4 (yuv420p) of a moving square over a gradient; single-threaded encoder → same bytes."""
    import av

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.options = {"crf": "36", "preset": "veryfast", "threads": "1", "bf": "0", "x264-params": "threads=1:lookahead-threads=1"}
        s.thread_count = 1
        s.codec_context.time_base = Fraction(1, 1) / fps
        yy, xx = np.mgrid[0:height, 0:width]
        base = np.stack([(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)),
                         np.full_like(xx, int(rng.integers(0, 256)))], axis=-1).astype(np.uint8)
        side = max(4, min(width, height) // 4)
        color = rng.integers(0, 256, 3).astype(np.uint8)
        for t in range(num_frames):
            img = base.copy()
            x = (t * 3) % max(width - side, 1)
            y = (t * 2) % max(height - side, 1)
            img[y:y + side, x:x + side] = color
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            frame.pts = t
            for pkt in s.encode(frame):
                c.mux(pkt)
        for pkt in s.encode():
            c.mux(pkt)
    return buf.getvalue()


def make_image_bytes(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    img = np.stack([(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)),
                    np.full_like(xx, int(rng.integers(0, 256)))], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=60)
    return buf.getvalue()


# (width, height) and frame rates cycled through; durations are log-normal with a forced tail.
_RESOLUTIONS = [(64, 48), (96, 64), (128, 96), (160, 90), (112, 112), (240, 136), (320, 180)]
_FRAME_RATES = [Fraction(8), Fraction(12), Fraction(15), Fraction(24), Fraction(25), Fraction(30000, 1001)]
_IMAGES = [(200, 150), (640, 360), (90, 300), (1000, 250), (448, 448), (33, 517)]


def video_plan(num_videos: int = 36) -> list[dict]:
    rng = np.random.default_rng(SEED + 1)
    durations = np.clip(rng.lognormal(mean=0.2, sigma=0.7, size=num_videos), 0.4, 20.0)
    durations[:2] = [16.0, 9.0]
    plan = []
    for i, d in enumerate(durations):
        w, h = _RESOLUTIONS[i % len(_RESOLUTIONS)]
        fps = _FRAME_RATES[(i * 5) % len(_FRAME_RATES)]
        if w * h > 30000:  # keep the big ones short so the bundle stays small
            d = min(d, 2.0)
        plan.append({"width": w, "height": h, "fps": fps, "num_frames": max(3, int(round(float(d * fps))))})
    return plan


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def make_shards(out: Path, num_shards: int = 4) -> list[Path]:
    rng = np.random.default_rng(SEED + 2)
    vocab = _vocabulary(np.random.default_rng(SEED))
    samples = []
    for i, v in enumerate(video_plan()):
        samples.append((f"clip-{i:04d}", "mp4", make_video_bytes(v["width"], v["height"], v["fps"], v["num_frames"], SEED + i)))
    for j, (w, h) in enumerate(_IMAGES):
        samples.append((f"img-{j:04d}", "jpg", make_image_bytes(w, h, SEED + 100 + j)))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(num_shards):
        p = out / f"shard-{s:06d}.tar"
        with tarfile.open(p, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, ext, data in samples[s::num_shards]:
                caption = _sentence_stream(rng, vocab, int(rng.integers(5, 41)))
                _add(tar, f"{key}.{ext}", data)
                _add(tar, f"{key}.txt", caption.encode())
        paths.append(p)
    return paths


def train_tokenizer(texts: list[str], out: Path, vocab_size: int = 2000) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--tokenizer", action="store_true", help="also (re)train tokenizers/tiny-bpe.json")
    args = ap.parse_args(argv)
    docs = make_text()
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "text.jsonl", "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
    shards = make_shards(args.out / "wds")
    if args.tokenizer:
        train_tokenizer([d["text"] for d in docs], HERE.parent / "tokenizers" / "tiny-bpe.json")
    total = sum(p.stat().st_size for p in [args.out / "text.jsonl", *shards])
    print(f"wrote {len(docs)} documents and {len(shards)} shards to {args.out} ({total / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
