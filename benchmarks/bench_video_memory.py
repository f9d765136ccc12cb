"""Peak memory of reading one long high-resolution video sample (``IndexedDataset[i]``): the frames are decoded a
chunk at a time and resized before the next chunk (``fcp_data.video.DECODE_CHUNK_BYTES``), against the one-batch
decode that held every sampled frame at full size plus a float32 copy (``--chunk-mb 0`` decodes all sampled frames
in one chunk, as the reader did before). Side by side in one run, alternating, each read in a fresh
process: the growth of the peak resident set (``ru_maxrss``) over the process's size right before the read.

The video is made here (PyAV, mpeg4): ``--frames`` frames of ``--width``×``--height`` at ``--fps``, indexed with the
``--spec`` token rule (``fcp index``), so the number of sampled frames is the spec's (Qwen2-VL: 2 fps, up to 768).

Run: ``python benchmarks/bench_video_memory.py [--frames 128 --width 1920 --height 1080 --fps 2 --reps 3]``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _args import count, existing_dir, nonempty, parser, positive_int, run  # noqa: E402

_CHILD = r"""
import json, resource, sys
import fcp_data.video as video
from fcp_data import IndexedDataset
chunk = int(sys.argv[2])
video.DECODE_CHUNK_BYTES = chunk if chunk > 0 else 1 << 62   # 0: every sampled frame in one chunk
ds = IndexedDataset(sys.argv[1])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
s = ds[0]
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grow_mb": (after - before) / 1024, "frames": int(s["grid_thw"][0][0]),
                  "pixels": float(s["pixel_values"].double().sum())}))
"""


def _make_video(path: Path, frames: int, width: int, height: int, fps: int) -> None:
    import av
    import numpy as np

    with av.open(str(path), "w") as c:
        st = c.add_stream("mpeg4", rate=fps)
        st.width, st.height, st.pix_fmt = width, height, "yuv420p"
        ramp = np.linspace(0, 120, width, dtype=np.uint8)[None, :, None]
        for i in range(frames):
            img = (np.full((height, width, 3), (i * 7) % 128, np.uint8) + ramp).astype(np.uint8)
            for p in st.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in st.encode(None):
            c.mux(p)


def _read(index: Path, chunk_bytes: int, tree: str | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": tree or str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(index), str(chunk_bytes)], capture_output=True, text=True,
                       check=False, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"the read failed: {r.stderr.strip()[-800:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def build_parser():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=positive_int, default=128, help="frames of the generated video")
    ap.add_argument("--width", type=positive_int, default=1920, help="its width in pixels")
    ap.add_argument("--height", type=positive_int, default=1080, help="its height in pixels")
    ap.add_argument("--fps", type=positive_int, default=2, help="its frame rate")
    ap.add_argument("--spec", type=nonempty, default="qwen2-vl", help="the token spec it is indexed with")
    ap.add_argument("--chunk-mb", type=count, default=64, help="decode chunk of the chunked read, MiB")
    ap.add_argument("--reps", type=positive_int, default=3, help="alternating rounds of reads (median)")
    ap.add_argument("--old-tree", type=existing_dir, default=None,
                    help="another checkout of fcp (e.g. `git worktree add /tmp/old 8a63e1b`, before the chunked "
                         "decode) read side by side as a third row (default: none)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from fcp_data.index import build_index

    with tempfile.TemporaryDirectory(prefix="fcp-bench-video-") as tmp:
        media = Path(tmp) / "media"
        media.mkdir()
        _make_video(media / "v.mp4", args.frames, args.width, args.height, args.fps)
        build_index([str(media)], args.spec, Path(tmp) / "idx", progress=False)
        rows = {"chunked": [], "one batch": []} | ({"old tree": []} if args.old_tree else {})
        for _ in range(args.reps):
            rows["chunked"].append(_read(Path(tmp) / "idx", args.chunk_mb << 20))
            rows["one batch"].append(_read(Path(tmp) / "idx", 0))
            if args.old_tree:  # its reader has no chunks: the setting is ignored there
                rows["old tree"].append(_read(Path(tmp) / "idx", 0, args.old_tree))
    same = {r["pixels"] for rs in rows.values() for r in rs}
    print(f"{args.frames} frames {args.width}x{args.height} @ {args.fps} fps, spec {args.spec}: "
          f"{rows['chunked'][0]['frames']} temporal patches per read; pixel sums equal: {len(same) == 1}")
    med = {k: statistics.median(r["grow_mb"] for r in rs) for k, rs in rows.items()}
    for k, rs in rows.items():
        each = ", ".join(f"{r['grow_mb']:.0f}" for r in rs)
        print(f"  {k:9s}: peak RSS growth median {med[k]:8.1f} MiB  ({each})")
    for k in rows:
        if k != "chunked":
            print(f"  ratio {k} / chunked: {med[k] / max(med['chunked'], 1e-9):.2f}x")
    return 0 if len(same) == 1 else 1


if __name__ == "__main__":
    run(main)
