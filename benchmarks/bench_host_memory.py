"""CPU ranks that keep freed memory (:mod:`fcp_exec.host_memory`) against glibc's defaults, side by side.

Runs ``fcp train --model tiny-llm --nproc 2 --data synthetic --json`` (same seed: the same global batches and plans
in every run) alternately with ``FCP_KEEP_FREED_MEMORY=0`` (glibc's defaults: blocks of 32 MiB and more are mmapped
and page-faulted in on every allocation) and ``=1`` (fcp's default), the order flipped every pair, and prints per run
the total step time over steps 1.. (step 0 warms up), then the median per setting and each pair's ratio.

Run: ``python benchmarks/bench_host_memory.py [--pairs 3] [--steps 12] [--max-tokens 8192]`` (~1 minute a pair on 2
cores). Long documents (``--max-tokens``) put thousands of tokens on a rank, where the logits alone pass 32 MiB.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from _alternating import alternating_pairs
from _args import count, parser, positive_int, run

ROOT = Path(__file__).resolve().parent.parent


def run_once(keep: bool, args) -> list[float]:
    """Step times (s) of one ``fcp train`` run."""
    cmd = [sys.executable, "-m", "fcp_cli", "train", "--model", "tiny-llm", "--nproc", "2", "--data", "synthetic",
           "--max-tokens", str(args.max_tokens), "--steps", str(args.steps), "--seed", str(args.seed), "--json"]
    env = {**os.environ, "FCP_KEEP_FREED_MEMORY": "1" if keep else "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"bench_host_memory: fcp train failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return [json.loads(line)["step_time_s"] for line in out.stdout.splitlines() if line.startswith("{")]


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=positive_int, default=3, help="alternating pairs of runs (default 3)")
    p.add_argument("--steps", type=positive_int, default=12,
                   help="steps per run, at least 2 (default 12; step 0 is not counted)")
    p.add_argument("--max-tokens", type=positive_int, default=8192,
                   help="longest synthetic document, at least 16 (default 8192)")
    p.add_argument("--seed", type=count, default=0, help="fcp train --seed (the same in every run)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.steps < 2 or args.max_tokens < 16:
        p.error(f"--steps {args.steps} / --max-tokens {args.max_tokens}: need --steps >= 2 (step 0 is not counted) "
                "and --max-tokens >= 16")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"fcp train --model tiny-llm --nproc 2 --data synthetic --max-tokens {args.max_tokens} --steps {args.steps}; "
          f"load {os.getloadavg()[0]:.1f}")
    totals = alternating_pairs(lambda keep: run_once(keep, args), args.pairs,
                               lambda keep: f"FCP_KEEP_FREED_MEMORY={int(keep)}")
    med = {k: statistics.median(v) for k, v in totals.items()}
    ratios = [d / k for d, k in zip(totals[False], totals[True])]
    print(f"median total: glibc defaults {med[False]:.2f} s, keep freed memory {med[True]:.2f} s; per-pair ratio "
          f"(defaults / kept) {', '.join(f'{r:.2f}' for r in ratios)}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    run(main)
