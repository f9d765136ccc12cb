"""What SFT labels cost per step: ``FCPCollator(sample_labels=True)`` against the sampler's label count.

Two ``fcp train`` Trainers on the same Qwen3 config and the same synthetic documents (identical ``input_ids``, so
identical plans and compute), on ``--nproc`` gloo processes, alternating step by step in the same processes:
one trains on the causal-LM labels with the sampler's denominator, the other on SFT labels (a random prompt
masked), where ``train_step`` reads the step's micro-batches first and counts the labels with one all-reduce.
Median step time (slowest rank) and the ratio; both sides use the all-reduce reducer.

Run: ``python benchmarks/bench_sft_step.py`` (about a minute on 2 cores; prints a Markdown table).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _args import count, parser, positive_int, run  # noqa: E402


def build_parser():
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=positive_int, default=2, help="gloo processes")
    ap.add_argument("--steps", type=positive_int, default=12, help="timed steps per side")
    ap.add_argument("--warmup", type=count, default=2, help="untimed steps per side first")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from bench_hf_step import _write_config, bench_worker  # the same tiny Qwen3 config and alternating loop

    from fcp_exec.launch import launch
    from fcp_exec.train import TrainConfig

    path = _write_config()
    cfgs = [TrainConfig(model=f"hf:{path}", data="synthetic", reducer="allreduce", steps=1, global_batch_size=8,
                        num_synthetic=64, max_tokens=96, tokens_per_rank=48, dtype="float32", prefetch=2,
                        verbose=False, sample_labels=sft) for sft in (False, True)]
    load = os.getloadavg()[0]
    res = launch(bench_worker, args.nproc, cfgs, args.warmup, args.steps, "sample_labels", timeout=900.0)[0]
    base = statistics.median(x["t"] for x in res[False])
    print(f"## SFT labels on this machine (load {load:.1f} → {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores, "
          f"{args.nproc} processes)\n")
    print(f"| Qwen3 4×128 synthetic text, allreduce, {args.steps} timed steps each, alternating | median step | ratio | "
          "label tokens per step (median) |")
    print("|---|---:|---:|---:|")
    for sft, name in ((False, "causal-LM labels, the sampler's count"),
                      (True, "SFT labels (`sample_labels=True`), counted by `train_step`")):
        med = statistics.median(x["t"] for x in res[sft])
        same = [x["degrees"] for x in res[sft]] == [x["degrees"] for x in res[False]]
        print(f"| {name} | {1e3 * med:.1f} ms | {med / base:.2f}× | {statistics.median(x['tokens'] for x in res[sft]):.0f}"
              f"{'' if same else ' (plans differ!)'} |")
    return 0


if __name__ == "__main__":
    run(main)
