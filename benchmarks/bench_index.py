"""Length-index throughput: header probe vs full decode, decord vs PyAV probe, samples/s per worker (header probe,
decord, and --probe decode, which decodes the frames a reader samples), text tokens/s, and the load time of a
synthetic 10M-row index.

Run: ``python benchmarks/bench_index.py [--num-videos 300] [--rows 10000000]``. Everything is generated in a
temp dir (deterministic PyAV/libx264 mp4s with several resolutions, frame rates and long-tailed durations).
Ratios are measured side by side in the same run on the same files.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import tarfile
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

from _args import parser, positive_int, run
from fcp_data._resources import data_path
from fcp_data.index import LengthIndex, build_index
from fcp_data.index.format import COLUMNS, FORMAT_NAME, FORMAT_VERSION, write_columns
from fcp_data.index.probe import full_decode_frames, probe_video


def _make_samples_module():
    spec = importlib.util.spec_from_file_location("make_samples", data_path("samples") / "make_samples.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# "small": the resolutions of the bundled samples (cheap to generate, cheap to decode: the probe's fixed cost
# dominates). "realistic": the resolutions of video-MLLM training sets (MSR-VTT 320x240 up to InternVid 720p and
# OpenVid's 512p-1080p), capped at 720p to keep generation to about a minute.
SIZES = {
    "small": [(160, 120), (256, 144), (320, 240), (426, 240), (640, 360)],
    "realistic": [(320, 240), (640, 360), (854, 480), (1280, 720)],
}


def make_videos(root: Path, n: int, per_shard: int = 25, sizes: str = "small") -> tuple[list[Path], list[Path]]:
    ms = _make_samples_module()
    rng = np.random.default_rng(0)
    sizes = SIZES[sizes]
    rates = [Fraction(24), Fraction(25), Fraction(30000, 1001), Fraction(30)]
    files, shards = [], []
    vdir = root / "videos"
    vdir.mkdir(parents=True)
    for i in range(n):
        w, h = sizes[int(rng.integers(len(sizes)))]
        fps = rates[int(rng.integers(len(rates)))]
        dur = float(np.clip(rng.lognormal(1.2, 0.6), 1.0, 20.0))
        p = vdir / f"v{i:05d}.mp4"
        p.write_bytes(ms.make_video_bytes(w, h, fps, max(3, int(dur * fps)), i))
        files.append(p)
    for s in range(0, n, per_shard):
        sp = root / "wds" / f"shard-{s // per_shard:06d}.tar"
        sp.parent.mkdir(exist_ok=True)
        with tarfile.open(sp, "w") as tar:
            for p in files[s:s + per_shard]:
                tar.add(p, arcname=p.name)
        shards.append(sp)
    return files, shards


def timed(fn, items) -> list[float]:
    out = []
    for x in items:
        t = time.perf_counter()
        fn(x)
        out.append(time.perf_counter() - t)
    return out


def bench_probes(files: list[Path]) -> dict:
    res = {}
    for name, fn in [("probe_av", lambda p: probe_video(p, "av")), ("probe_decord", lambda p: probe_video(p, "decord")),
                     ("full_decode", full_decode_frames)]:
        fn(files[0])  # warm-up (library load)
        ts = timed(fn, files)
        if name in ("probe_av", "full_decode"):
            res["_av" if name == "probe_av" else "_full"] = ts
        res[name] = {"median_ms": 1e3 * statistics.median(ts), "total_s": sum(ts), "videos_per_s": len(ts) / sum(ts)}
    res["ratio_full_decode_over_av"] = res["full_decode"]["total_s"] / res["probe_av"]["total_s"]
    res["ratio_of_medians_full_over_av"] = res["full_decode"]["median_ms"] / res["probe_av"]["median_ms"]
    res["ratio_full_decode_over_decord"] = res["full_decode"]["total_s"] / res["probe_decord"]["total_s"]
    res["ratio_decord_over_av"] = res["probe_decord"]["total_s"] / res["probe_av"]["total_s"]
    res["mean_frames"] = float(np.mean([probe_video(p, "av").num_frames for p in files]))
    by_size: dict[str, list[int]] = {}
    for j, f in enumerate(files):
        h = probe_video(f, "av")
        by_size.setdefault(f"{h.width}x{h.height}", []).append(j)
    res["ratio_by_size"] = {k: statistics.median(res["_full"][j] for j in v) / statistics.median(res["_av"][j] for j in v)
                            for k, v in sorted(by_size.items(), key=lambda kv: int(kv[0].split("x")[0]))}
    del res["_full"], res["_av"]
    return res


def bench_build(shards: list[Path], root: Path, workers: list[int]) -> dict:
    res = {}
    for w in workers:
        for probe in ("av", "decord", "decode"):
            t = time.perf_counter()
            m, _ = build_index([str(s) for s in shards], "qwen2-vl", root / f"ix-{w}-{probe}", workers=w, probe=probe,
                               progress=False)
            dt = time.perf_counter() - t
            res[f"workers={w} probe={probe}"] = {"samples_per_s": m["num_samples"] / dt,
                                                 "samples_per_s_per_worker": m["num_samples"] / dt / w, "wall_s": dt}
    return res


def bench_text(root: Path, copies: int = 20) -> dict:
    lines = (data_path("samples") / "text.jsonl").read_text(encoding="utf-8").splitlines()
    p = root / "text.jsonl"
    with open(p, "w", encoding="utf-8") as f:
        for c in range(copies):
            for line in lines:
                d = json.loads(line)
                d["id"] = f"{d['id']}-{c}"
                f.write(json.dumps(d) + "\n")
    t = time.perf_counter()
    m, _ = build_index([str(p)], "text", root / "ix-text", workers=1, progress=False)
    dt = time.perf_counter() - t
    return {"docs": m["num_samples"], "tokens": m["tokens"]["sum"], "tokens_per_s": m["tokens"]["sum"] / dt, "wall_s": dt}


def bench_load(root: Path, rows: int) -> dict:
    rng = np.random.default_rng(0)
    out = root / "big"
    keys_len = np.full(rows, 12, dtype=np.int64)
    key_bytes = np.frombuffer(b"".join(f"clip-{i:07d}".encode() for i in range(rows)), dtype=np.uint8)
    cols = {k: np.zeros(rows, dtype=dt) for k, dt in COLUMNS.items()}
    cols["num_tokens"] = rng.integers(10, 100000, rows)
    cols.update(key_ptr=np.concatenate([[0], np.cumsum(keys_len)]), key_bytes=key_bytes,
                member_ptr=np.arange(rows + 1, dtype=np.int64), member_ext=np.zeros(rows, np.int16),
                member_offset=np.zeros(rows, np.int64), member_size=np.zeros(rows, np.int64))
    write_columns(out, cols)
    (out / "manifest.json").write_text(json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "num_samples": rows,
                                                   "num_errors": 0, "spec": {"name": "synthetic"}, "exts": ["mp4"],
                                                   "sources": []}))
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        ix = LengthIndex.load(out)
        n, k = len(ix), ix.keys[rows // 2]
        ts.append(time.perf_counter() - t)
    t = time.perf_counter()
    total = int(ix.num_tokens.sum())
    scan = time.perf_counter() - t
    assert n == rows and k == f"clip-{rows // 2:07d}" and total > 0
    return {"rows": rows, "load_median_s": statistics.median(ts), "num_tokens_sum_s": scan,
            "disk_mb": sum(p.stat().st_size for p in out.iterdir()) / 1e6}


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--num-videos", type=positive_int, default=300, help="generated videos")
    ap.add_argument("--rows", type=positive_int, default=10_000_000,
                    help="rows of the synthetic index whose load is timed, at most 10000000")
    ap.add_argument("--workers", type=positive_int, nargs="+", default=[1, 2],
                    help="worker counts of the index-build rows (default 1 2)")
    ap.add_argument("--sizes", choices=sorted(SIZES), default="small",
                    help="resolution mix of the generated videos (default: small, as the bundled samples)")
    ap.add_argument("--probes-only", action="store_true", help="only the probe vs full-decode section")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the report")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.rows > 10_000_000:
        ap.error(f"--rows {args.rows}: at most 10000000 (the synthetic keys are clip-NNNNNNN, 12 bytes each)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        t = time.perf_counter()
        files, shards = make_videos(root, args.num_videos, sizes=args.sizes)
        print(f"generated {len(files)} videos in {len(shards)} shards in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        res = {"probes": bench_probes(files)}
        if not args.probes_only:
            res.update(build=bench_build(shards, root, args.workers), text=bench_text(root), load=bench_load(root, args.rows))
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    p = res["probes"]
    print(f"videos: {args.num_videos} ({args.sizes} resolutions), mean {p['mean_frames']:.0f} frames")
    for k in ("probe_av", "probe_decord", "full_decode"):
        print(f"  {k:13s} median {p[k]['median_ms']:8.2f} ms/video   {p[k]['videos_per_s']:8.1f} videos/s")
    print(f"  full decode / PyAV probe   = {p['ratio_full_decode_over_av']:.1f}x (total time), "
          f"{p['ratio_of_medians_full_over_av']:.1f}x (medians)")
    print(f"  full decode / decord probe = {p['ratio_full_decode_over_decord']:.1f}x")
    print(f"  decord probe / PyAV probe  = {p['ratio_decord_over_av']:.2f}x")
    print("  full decode / PyAV probe by size (medians): " + ", ".join(f"{k} {v:.0f}x" for k, v in p["ratio_by_size"].items()))
    if args.probes_only:
        return 0
    for k, v in res["build"].items():
        print(f"fcp index qwen2-vl {k}: {v['samples_per_s']:.1f} samples/s ({v['samples_per_s_per_worker']:.1f} per worker)")
    for w in args.workers:
        b = res["build"]
        print(f"  workers={w}: --probe decode takes {b[f'workers={w} probe=decode']['wall_s'] / b[f'workers={w} probe=av']['wall_s']:.1f}x "
              "the header probe's wall time (decodes the frames the reader samples)")
    t = res["text"]
    print(f"text: {t['docs']} docs, {t['tokens']} tokens, {t['tokens_per_s'] / 1e6:.2f} M tokens/s (1 worker, incl. I/O)")
    ld = res["load"]
    print(f"load {ld['rows']:,}-row index: median {ld['load_median_s'] * 1e3:.1f} ms; sum(num_tokens) {ld['num_tokens_sum_s'] * 1e3:.0f} ms; {ld['disk_mb']:.0f} MB on disk")
    return 0


if __name__ == "__main__":
    run(main)
