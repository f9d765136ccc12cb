"""``python -m fcp_data.demo`` (what ``make demo`` runs): the whole pipeline on the bundled samples.

1. index the bundled text and video samples with ``fcp index``;
2. take one global batch the sampler would draw, plan it with ``fcp plan`` and compare FCP with the
   ILP and the baselines with ``fcp compare``;
3. train tiny-mllm for a few steps on 2 processes with ``fcp train`` (FCPSampler → FCPCollator → ring
   attention), printing losses and the plans of every step;
4. draw a Gantt chart of one planned micro-batch with ``fcp simulate --plot``.

Every step runs the ``fcp`` command a user would type (echoed with ``$``), so the output doubles as a
tutorial. Outputs go to ``--out`` (default ``demo_out/``). Under 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _header(title: str) -> None:
    print(f"\n{'=' * 78}\n{title}\n{'=' * 78}", flush=True)


def _fcp(*args: str, pretty: list[str] | None = None) -> None:
    """Echo and run ``fcp ARGS`` (through this interpreter, so the venv's fcp is used)."""
    shown = " ".join(shlex.quote(a) for a in (pretty or args))
    print(f"$ fcp {shown}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "fcp_data.cli", *args])
    if rc:
        raise SystemExit(f"demo: `fcp {shown}` failed with exit code {rc}")
    print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _pick_batch(index_dir: Path, num_ranks: int, batch_size: int, cost_path: Path, out: Path) -> list[int]:
    """The global batch (of the sampler's first epoch) with the longest sample; writes its lengths."""
    import numpy as np

    from fcp_data import CostModel, FCPSampler
    from fcp_data.index import LengthIndex

    idx = LengthIndex.load(index_dir)
    sampler = FCPSampler(idx.num_tokens, num_ranks=num_ranks, rank=0, cost_model=CostModel.load(cost_path),
                         global_batch_size=batch_size, seed=0)
    g = max(range(sampler.num_global_batches()),
            key=lambda b: int(np.asarray(idx.num_tokens)[sampler.global_batch_indices(b)].max()))
    lengths = [int(idx.num_tokens[i]) for i in sampler.global_batch_indices(g)]
    out.write_text("\n".join(map(str, lengths)) + "\n")
    return lengths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fcp_data.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    ap.add_argument("--steps", type=int, default=4, help="tiny-mllm training steps (default 4)")
    ap.add_argument("--nproc", type=int, default=2, help="training processes (default 2)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the planning example (default 8)")
    args = ap.parse_args(argv)

    from fcp_data._resources import data_path
    from fcp_exec.train import builtin_cost_model

    t_start = time.perf_counter()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    samples = data_path("samples")
    shards = sorted((samples / "wds").glob("shard-*.tar"))
    import torch

    print("FCP demo — Flexible Context Parallelism on the bundled samples")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPU cores; "
          f"outputs in {_rel(out)}/")

    _header("1. Index the bundled samples (token count of every sample, no tokenisation at train time)")
    _fcp("index", str(samples / "text.jsonl"), "--spec", "text", "--out", str(out / "index-text"), "--no-progress",
         pretty=["index", _rel(samples / "text.jsonl"), "--spec", "text", "--out", _rel(out / "index-text")])
    _fcp("index", *map(str, shards), "--spec", "qwen2-vl", "--out", str(out / "index-video"), "--workers", "2",
         "--no-progress",
         pretty=["index", _rel(samples / "wds") + "/shard-*.tar", "--spec", "qwen2-vl", "--out",
                 _rel(out / "index-video"), "--workers", "2"])

    _header(f"2. Plan one global batch of videos on {args.ranks} ranks, and compare with the ILP and baselines")
    cost_path = out / "cost-tiny-mllm.json"
    builtin_cost_model(2304, args.ranks).save(cost_path)
    print(f"cost model: the built-in CPU model of the tiny models (tokens_per_rank "
          f"{builtin_cost_model(2304, args.ranks).tokens_per_rank}), written to {_rel(cost_path)}; "
          "`fcp profile` fits one on your machine")
    lengths_path = out / "batch_lengths.txt"
    lengths = _pick_batch(out / "index-video", args.ranks, 12, cost_path, lengths_path)
    print(f"global batch: {len(lengths)} samples, {sum(lengths)} tokens, lengths {sorted(lengths, reverse=True)} "
          f"-> {_rel(lengths_path)}")
    common = ["--lengths", str(lengths_path), "--ranks", str(args.ranks), "--cost", str(cost_path)]
    pretty = ["--lengths", _rel(lengths_path), "--ranks", str(args.ranks), "--cost", _rel(cost_path)]
    _fcp("plan", *common, pretty=["plan", *pretty])
    _fcp("compare", *common, "--ilp", "--time-limit", "20", pretty=["compare", *pretty, "--ilp", "--time-limit", "20"])

    _header(f"3. Train tiny-mllm for {args.steps} steps on {args.nproc} processes "
            "(FCPSampler -> FCPCollator -> ring attention -> AdamW)")
    print("each line: global-batch mean loss, label tokens, the plan (⟨degree⟩×groups, '|' between "
          "micro-batches), step time, time spent waiting for the planner")
    _fcp("train", "--model", "tiny-mllm", "--nproc", str(args.nproc), "--steps", str(args.steps),
         "--data", str(out / "index-video"), "--global-batch-size", "8",
         pretty=["train", "--model", "tiny-mllm", "--nproc", str(args.nproc), "--steps", str(args.steps),
                 "--data", _rel(out / "index-video"), "--global-batch-size", "8"])

    _header("4. Gantt chart of one planned micro-batch")
    gantt = out / "gantt.png"
    _fcp("simulate", *common, "--global-batch-size", str(len(lengths)), "--steps", "1", "--plot", str(gantt),
         "--no-progress", pretty=["simulate", *pretty, "--global-batch-size", str(len(lengths)), "--steps", "1",
                                  "--plot", _rel(gantt)])

    _header("Done")
    print(f"total {time.perf_counter() - t_start:.0f} s. Files in {_rel(out)}/:")
    for p in sorted(out.iterdir()):
        print(f"  {p.name}{'/' if p.is_dir() else ''}")
    print("next: `fcp profile --nproc 2 --out cost.json` fits the cost model on this machine; "
          "`fcp train --help`; `make test`.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
