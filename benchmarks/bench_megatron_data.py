"""Megatron indexed datasets (``.bin``/``.idx``) read by fcp (``MegatronIndexedDocuments``) against megatron-core's own
reader (``IndexedDataset``), side by side on the same files.

A corpus of ``--docs`` documents (20–``--max-len`` tokens, uint16 ids; every 10th of 3 sequences, as
``--split-sentences`` writes them) is written with megatron-core's ``IndexedDatasetBuilder`` into a temporary folder.
Measured, medians of ``--repeats`` runs:

* **open** — fcp: parse the ``.idx``, validate it (header, counts, document boundaries, contiguity, offsets against the
  ``.bin`` size) and compute every document's token count (what ``FCPSampler`` plans with); megatron-core: open
  ``IndexedDataset`` and compute the same counts from its ``sequence_lengths`` / ``document_indices``;
* **read** — ``--reads`` documents in a shuffled order as ``input_ids`` int64 tensors: fcp ``docs[i]`` against
  megatron-core reading the document's sequences (``ds[k]``) and concatenating them;
* **load_lengths** — ``load_lengths(PREFIX.idx)``, what ``fcp plan/compare/simulate --lengths`` reads.

Run: ``python benchmarks/bench_megatron_data.py`` (needs megatron-core for the writer and the reference reader).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import parser, positive_int, run  # noqa: E402


def _write(prefix: Path, docs: int, max_len: int, seed: int) -> int:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    tokens = 0
    for d in range(docs):
        n = int(rng.integers(20, max_len))
        parts = [n // 3, n // 3, n - 2 * (n // 3)] if d % 10 == 0 else [n]
        builder.add_document(torch.from_numpy(rng.integers(1, 60_000, n).astype(np.int64)), parts)
        tokens += n
    builder.finalize(f"{prefix}.idx")
    return tokens


def _median(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def build_parser():
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--docs", type=positive_int, default=200_000, help="documents in the corpus (default 200,000)")
    p.add_argument("--max-len", type=positive_int, default=4_000,
                   help="longest document, tokens, above 20 (default 4,000)")
    p.add_argument("--reads", type=positive_int, default=20_000, help="documents read per timing (default 20,000)")
    p.add_argument("--repeats", type=positive_int, default=5, help="runs of each timing (median)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.max_len <= 20:
        p.error(f"--max-len {args.max_len}: documents are 20 to --max-len tokens; give more than 20")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from fcp_data.megatron_indexed import MegatronIndexedDocuments
    from fcp_data.workloads import load_lengths

    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "corpus_text_document"
        t = time.perf_counter()
        tokens = _write(prefix, args.docs, args.max_len, 0)
        print(f"corpus: {args.docs:,} documents, {tokens:,} tokens ({tokens * 2 / 2**20:.0f} MiB .bin), written in "
              f"{time.perf_counter() - t:.1f} s by megatron-core")

        def mega_open():
            ds = IndexedDataset(str(prefix))
            csum = np.concatenate([[0], np.cumsum(ds.sequence_lengths, dtype=np.int64)])
            b = ds.document_indices
            return ds, csum[b[1:]] - csum[b[:-1]]

        t_fcp, docs = _median(lambda: MegatronIndexedDocuments(prefix), args.repeats)
        t_meg, (ds, lengths) = _median(mega_open, args.repeats)
        assert docs.num_tokens.tolist() == lengths.tolist(), "fcp and megatron-core count different documents"
        order = np.random.default_rng(1).permutation(len(docs))[:args.reads]
        bounds = ds.document_indices

        def fcp_read():
            return sum(int(docs[int(i)]["input_ids"].numel()) for i in order)

        def mega_read():
            total = 0
            for i in order:
                parts = [ds[k] for k in range(int(bounds[i]), int(bounds[i + 1]))]
                total += int(torch.from_numpy(np.concatenate(parts).astype(np.int64)).numel())
            return total

        r_fcp, n_fcp = _median(fcp_read, args.repeats)
        r_meg, n_meg = _median(mega_read, args.repeats)
        assert n_fcp == n_meg
        t_ll, _ = _median(lambda: load_lengths(f"{prefix}.idx"), args.repeats)
        print(f"{'':24s} {'fcp':>12s} {'megatron-core':>14s} {'fcp / megatron':>15s}")
        print(f"{'open + counts':24s} {t_fcp * 1e3:10.1f} ms {t_meg * 1e3:12.1f} ms {t_fcp / t_meg:14.2f}x")
        print(f"{'read, per document':24s} {r_fcp / len(order) * 1e6:10.1f} us {r_meg / len(order) * 1e6:12.1f} us "
              f"{r_fcp / r_meg:14.2f}x")
        print(f"load_lengths(.idx): {t_ll * 1e3:.1f} ms for {args.docs:,} documents")


if __name__ == "__main__":
    run(main)
