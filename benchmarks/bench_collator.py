"""FCPCollator throughput (one process) and DataLoader throughput with 0 vs 2 workers.

Data: generated text samples whose lengths are Wikipedia document lengths (``wikipedia_flexsp.txt``,
first ``--docs`` documents, truncated at ``--cap``); ``input_ids`` are made by the dataset on access.

1. Collator alone (torch threads = 1): groups of documents filling ``degree × --tokens-per-rank`` tokens,
   collated for cp_rank 0 of degree 1, 2, 4, 8. Reports packed (global) tokens per second — the tokens of
   the whole group that one call packs, pads, labels and shards — and local tokens per second.
2. DataLoader(FCPDataset, batch_sampler=FCPSampler, collate_fn=FCPCollator) on rank 0 of ``--ranks`` ranks
   (preset ``--model``/``--hardware`` with ``tokens_per_rank`` = ``--tokens-per-rank``), one epoch, num_workers
   0 vs 2 side by side: batches/s and local tokens/s delivered to a loop that does nothing else. "sampler"
   includes planning (a do-nothing loop outruns the planner, so this is planner-bound); "pre-planned" feeds
   the same lists materialised beforehand, timing only the data path (read, collate, worker IPC).

    .venv/bin/python benchmarks/bench_collator.py
    .venv/bin/python benchmarks/bench_collator.py --future-tokens 0,1,3 --collator-only   # MTP look-ahead cost
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from _args import (count_list, existing_file, hardware_preset, model_preset, parser, positive_int,
                   run)
from fcp_data.collator import FCPCollator
from fcp_data.presets import preset_cost_model
from fcp_data.sampler import FCPDataset, FCPSampler, SampleSlot
from fcp_data.workloads import load_lengths

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORKLOAD = ROOT.parent / "shared" / "workloads" / "wikipedia_flexsp.txt"


class GeneratedText:
    """Sample ``i``: ``lengths[i]`` token ids (deterministic, generated on access like a tokenizer would)."""

    def __init__(self, lengths: np.ndarray, vocab: int = 151936):
        self.lengths, self.vocab = [int(x) for x in lengths], vocab

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, self.vocab, (self.lengths[i],), generator=g)}


def _groups(lengths: np.ndarray, budget: int, count: int) -> list[list[int]]:
    out, cur, tot = [], [], 0
    for i, n in enumerate(lengths):
        n = int(min(n, budget))
        if tot + n > budget and cur:
            out.append(cur)
            cur, tot = [], 0
            if len(out) == count:
                break
        cur.append(i)
        tot += n
    return out


def bench_collator(lengths: np.ndarray, tokens_per_rank: int, repeats: int, depths: tuple[int, ...] = (0,)) -> None:
    """Packed tokens per second of one collate call per degree; with several look-ahead ``depths``
    (``FCPCollator(future_tokens=d)``, multi-token prediction) side by side, interleaved call by call."""
    torch.set_num_threads(1)
    data = GeneratedText(lengths)
    collates = {d: FCPCollator(pad_token_id=0, future_tokens=d) for d in depths}
    head = " | ".join(f"future_tokens={d}" for d in depths)
    print(f"collator alone (1 thread): degree | packed tokens/s (median): {head} | local tokens/s | docs/call"
          + (" | ratio to future_tokens=0" if len(depths) > 1 else ""))
    for degree in (1, 2, 4, 8):
        budget = degree * tokens_per_rank
        calls = []
        for grp in _groups(lengths, budget, 8):
            items = []
            for i in grp:
                n = int(lengths[i])
                slot = SampleSlot(index=i, ranks=tuple(range(degree)), cp_rank=0, num_tokens=min(n, budget), length=n,
                                  num_tokens_global=1, epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1)
                items.append((data[i], slot))
            calls.append(items)
        rates: dict[int, list[float]] = {d: [] for d in depths}
        local_rates, docs = [], []
        for _ in range(repeats):
            for items in calls:
                for d, collate in collates.items():
                    t = time.perf_counter()
                    out = collate(items)
                    dt = time.perf_counter() - t
                    rates[d].append(sum(s.num_tokens for _, s in items) / dt)
                    if d == depths[0]:
                        local_rates.append(out["input_ids"].numel() / dt)
                        docs.append(len(items))
        med = {d: float(np.median(r)) for d, r in rates.items()}
        ratio = " | " + " / ".join(f"{med[d] / med[depths[0]]:.2f}" for d in depths[1:]) if len(depths) > 1 else ""
        print(f"  {degree} | " + " | ".join(f"{med[d] / 1e6:8.1f} M" for d in depths)
              + f" | {np.median(local_rates) / 1e6:8.1f} M | {np.median(docs):.0f}{ratio}")


def bench_loader(lengths: np.ndarray, args) -> None:
    cm = preset_cost_model(args.model, args.hardware, tokens_per_rank=args.tokens_per_rank)
    data = FCPDataset(GeneratedText(lengths))
    print(f"DataLoader, rank 0 of {args.ranks}, global batch {args.batch} sequences, {lengths.size} docs (one epoch):")
    res = {}
    for mode in ("sampler", "pre-planned"):
        for workers in (0, 2):
            sampler = FCPSampler(lengths, num_ranks=args.ranks, rank=0, cost_model=cm, global_batch_size=args.batch,
                                 on_overlong="truncate", prefetch=2)
            # pre-planned: the same lists materialised first, so only the data path (read, collate, IPC) is timed
            batches = list(sampler) if mode == "pre-planned" else sampler
            loader = DataLoader(data, batch_sampler=batches, collate_fn=FCPCollator(), num_workers=workers,
                                prefetch_factor=4 if workers else None)
            t = time.perf_counter()
            n_batches = n_tok = 0
            for b in loader:
                n_batches += 1
                n_tok += b["input_ids"].numel()
            dt = time.perf_counter() - t
            res[mode, workers] = n_tok / dt
            wait = "" if mode == "pre-planned" else f" (planner wait {sum(sampler.planner_waits) * 1e3:.0f} ms)"
            print(f"  {mode:11s} num_workers={workers}: {n_batches} batches in {dt:.2f} s = {n_batches / dt:7.1f} "
                  f"batches/s, {n_tok / dt / 1e6:6.2f} M local tokens/s{wait}")
        print(f"  {mode}: 2 workers vs 0: {res[mode, 2] / res[mode, 0]:.2f}x")


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--workload", type=existing_file, default=str(DEFAULT_WORKLOAD),
                    help="one document length per line (default: ../shared/workloads/wikipedia_flexsp.txt next to "
                         "the repository)")
    ap.add_argument("--docs", type=positive_int, default=16384, help="first documents of the workload used")
    ap.add_argument("--cap", type=positive_int, default=32768, help="documents truncated at this many tokens")
    ap.add_argument("--tokens-per-rank", type=positive_int, default=16384,
                    help="tokens per rank: the collator's groups fill degree × this; the loader's preset budget")
    ap.add_argument("--repeats", type=positive_int, default=3, help="passes over the collator-alone calls")
    # the DataLoader part's options: None when not given, so that --collator-only can refuse them (else ignored)
    ap.add_argument("--ranks", type=positive_int, default=None,
                    help="ranks of the DataLoader part, rank 0 measured (default 8)")
    ap.add_argument("--batch", type=positive_int, default=None,
                    help="global batch size (sequences) of the DataLoader part (default 128)")
    ap.add_argument("--model", type=model_preset, default=None,
                    help="model preset of the DataLoader part (default Qwen3-1.7B)")
    ap.add_argument("--hardware", type=hardware_preset, default=None,
                    help="hardware preset of the DataLoader part (default h100)")
    ap.add_argument("--future-tokens", type=count_list, default="0",
                    help="comma-separated look-ahead depths for the collator-alone rows (multi-token prediction), "
                         "side by side; the first is the baseline of the ratios, e.g. 0,1,3")
    ap.add_argument("--collator-only", action="store_true", help="skip the DataLoader part")
    return ap


LOADER_DEFAULTS = {"ranks": 8, "batch": 128, "model": "Qwen3-1.7B", "hardware": "h100"}


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    given = [f"--{k}" for k in LOADER_DEFAULTS if getattr(args, k) is not None]
    if args.collator_only and given:
        ap.error(f"{', '.join(given)} set the DataLoader part, which --collator-only skips")
    for k, v in LOADER_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    depths = tuple(args.future_tokens)
    lengths = np.minimum(load_lengths(args.workload)[: args.docs], args.cap)
    print(f"{lengths.size} Wikipedia lengths truncated at {args.cap} (mean {lengths.mean():.0f} tokens); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads available")
    bench_collator(lengths, args.tokens_per_rank, args.repeats, depths)
    if not args.collator_only:
        bench_loader(lengths, args)


if __name__ == "__main__":
    run(main)
