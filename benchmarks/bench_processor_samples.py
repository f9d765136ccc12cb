"""Qwen-VL samples in a Hugging Face processor's format, read for FCP: what FCPTrainer pays before and during training.

A ``datasets.Dataset`` of ``--rows`` processor-format samples (``input_ids`` of 200–4,000 tokens with 0–3 images and
videos, ``pixel_values`` / ``pixel_values_videos`` with ``--dim`` values per patch row — 1,176 for Qwen2.5-VL; the
default 64 keeps the file small, which favours the per-sample read below — ``image_grid_thw``, ``video_grid_thw``,
``second_per_grid_ts``), written to a temporary folder and loaded back memory-mapped as a user's would be. Measured:

* **before training** — every sample's placeholder runs (for the sampler's visual layout) and token count:
  ``placeholder_spans`` + ``count_lengths`` from the ``input_ids`` Arrow column, against reading every row (what a
  dataset without that path costs: each row's pixels decoded into Python lists), timed on ``--read-rows`` rows and
  given per row;
* **per sample in training** — ``fcp_sample`` (processor format → FCP's) against reading the row itself, with the
  dataset's default (Python lists), ``numpy`` and ``torch`` formats.

Medians of ``--repeats`` runs; ratios from the same run. Run: ``python benchmarks/bench_processor_samples.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import parser, positive_int, run  # noqa: E402

IMG, VID, MERGE = 4, 5, 2


def _row(rng: np.random.Generator, dim: int) -> dict:
    ids, images, videos, pix_i, pix_v, spg = [], [], [], 0, 0, []
    for _ in range(int(rng.integers(0, 4))):
        ids += [int(v) for v in rng.integers(10, 2000, size=int(rng.integers(20, 400)))]
        t = 1 if rng.random() < 0.5 else 2 * int(rng.integers(1, 8))
        h, w = 2 * int(rng.integers(2, 12)), 2 * int(rng.integers(2, 12))
        ids += [2] + [IMG if t == 1 else VID] * (t * h * w // MERGE ** 2) + [3]
        if t == 1:
            images.append([t, h, w])
            pix_i += t * h * w
        else:
            videos.append([t, h, w])
            pix_v += t * h * w
            spg.append(1.0)
    ids += [int(v) for v in rng.integers(10, 2000, size=int(rng.integers(200, 1000)))]
    return {"input_ids": ids,
            "pixel_values": rng.random((pix_i, dim), dtype=np.float32) if images else None,
            "image_grid_thw": images or None,
            "pixel_values_videos": rng.random((pix_v, dim), dtype=np.float32) if videos else None,
            "video_grid_thw": videos or None, "second_per_grid_ts": spg or None}


def _dataset(rows: int, dim: int, folder: str):
    import datasets

    rng = np.random.default_rng(0)

    def gen():
        for _ in range(rows):
            yield _row(rng, dim)

    features = datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "pixel_values": datasets.Array2D(shape=(None, dim), dtype="float32"),
        "image_grid_thw": datasets.Sequence(datasets.Sequence(datasets.Value("int64"), length=3)),
        "pixel_values_videos": datasets.Array2D(shape=(None, dim), dtype="float32"),
        "video_grid_thw": datasets.Sequence(datasets.Sequence(datasets.Value("int64"), length=3)),
        "second_per_grid_ts": datasets.Sequence(datasets.Value("float64"))})
    ds = datasets.Dataset.from_generator(gen, features=features, cache_dir=folder)
    ds.save_to_disk(os.path.join(folder, "saved"))
    return datasets.load_from_disk(os.path.join(folder, "saved"))


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=positive_int, default=20_000, help="processor-format samples in the dataset")
    p.add_argument("--dim", type=positive_int, default=64, help="values per patch row (Qwen2.5-VL: 1176)")
    p.add_argument("--read-rows", type=positive_int, default=500,
                   help="rows read one by one for the per-row comparisons")
    p.add_argument("--repeats", type=positive_int, default=5, help="runs of each measurement (median)")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    from fcp_exec.integrations.hf_samples import fcp_sample, placeholder_spans
    from fcp_exec.integrations.hf_trainer_data import count_lengths

    print(f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="fcp-bench-proc-") as folder:
        t0 = time.perf_counter()
        ds = _dataset(opts.rows, opts.dim, folder)
        print(f"{opts.rows:,} rows written and loaded in {time.perf_counter() - t0:.1f} s")
        column = []
        for _ in range(opts.repeats):
            t0 = time.perf_counter()
            spans = placeholder_spans(ds, (IMG, VID))
            lengths = count_lengths(ds)
            column.append((time.perf_counter() - t0) / len(ds))
        assert len(spans) == len(lengths) == len(ds)
        c = statistics.median(column) * 1e6
        print(f"placeholder runs + token counts from the Arrow column: {c:.2f} µs/row "
              f"({c * len(ds) / 1e6:.2f} s for all {len(ds):,})")
        n = min(opts.read_rows, len(ds))
        for fmt in (None, "numpy", "torch"):
            view = ds if fmt is None else ds.with_format(fmt)
            read, convert = [], []
            for _ in range(opts.repeats):
                t0 = time.perf_counter()
                rows = [view[i] for i in range(n)]
                read.append((time.perf_counter() - t0) / n)
                t0 = time.perf_counter()
                for row in rows:
                    fcp_sample(row, image_token_id=IMG, video_token_id=VID, merge=MERGE)
                convert.append((time.perf_counter() - t0) / n)
            r, v = (statistics.median(x) * 1e6 for x in (read, convert))
            print(f"format {fmt or 'python'}: reading a row (pixels included) {r:.1f} µs (column / read = 1/{r / c:.0f}); "
                  f"fcp_sample {v:.1f} µs ({100 * v / r:.1f} % of the read)")
    return 0


if __name__ == "__main__":
    run(main)
