"""Training with rings across processes equals training without: `fcp train` twice on the same data, once with a
memory budget that forces CP groups of degree > 1 (ring attention across the processes — GPUs under NCCL) and once
with a budget where every sequence fits one rank (no ring), and the same losses step by step.

``python benchmarks/ring_vs_dp_check.py --nproc N [--backend nccl|gloo] [--model hf:CONFIG] [--steps 3]``

Why this is a reference: the loss of a global batch is ``Σ token losses / num_tokens_global`` whatever the plan,
so two plans of the same global batches give the same loss and, after the optimizer step, the same weights — up to
float32 rounding (summation order). The ring run must have formed at least one group of degree > 1 (checked from
its plans); otherwise nothing was compared. Tolerance: ``--tol`` (default 1e-6) on the relative loss difference of
every step. Each sample is capped at ``--max-tokens`` (= the ring run's capacity) so that neither run truncates.
Exit 0 equal, 1 different (or no ring formed), 2 a run failed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from _args import nonempty, parser, positive_float, positive_int, run  # noqa: E402  (benchmarks/ is not a package)


def _train(args, tokens_per_rank: int) -> list[dict]:
    cmd = [sys.executable, "-m", "fcp_cli", "train", "--model", args.model, "--nproc", str(args.nproc),
           "--steps", str(args.steps), "--dtype", "float32", "--global-batch-size", str(args.global_batch_size),
           "--max-tokens", str(args.max_tokens), "--tokens-per-rank", str(tokens_per_rank), "--json"]
    if args.backend:
        cmd += ["--backend", args.backend]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=args.timeout)
    if proc.returncode != 0:
        print(f"ring_vs_dp_check: `{' '.join(cmd[2:])}` failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}",
              file=sys.stderr)
        raise SystemExit(2)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = [r for r in records if "loss" in r and "step" in r]
    if len(steps) != args.steps:
        print(f"ring_vs_dp_check: expected {args.steps} step records, got {len(steps)}:\n{proc.stdout[-2000:]}",
              file=sys.stderr)
        raise SystemExit(2)
    return steps


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=positive_int, default=2, help="processes, at least 2 (one per GPU under NCCL)")
    ap.add_argument("--backend", choices=("nccl", "gloo", "hccl"), default=None,
                    help="fcp train --backend (default: the device's)")
    ap.add_argument("--model", type=nonempty,
                    default="hf:" + os.path.join(ROOT, "examples", "configs", "qwen3-tiny.json"),
                    help="fcp train --model: a preset or hf:CONFIG (default hf:examples/configs/qwen3-tiny.json)")
    ap.add_argument("--steps", type=positive_int, default=3, help="training steps of each run")
    ap.add_argument("--global-batch-size", type=positive_int, default=8, help="fcp train --global-batch-size")
    ap.add_argument("--max-tokens", type=positive_int, default=1024, help="cap on a sample's tokens (both runs)")
    ap.add_argument("--tol", type=positive_float, default=1e-6,
                    help="relative loss difference allowed per step (float32 rounding measured 3e-8 on CPU; a ring "
                         "that reads the wrong key chunk differed by 6e-5)")
    ap.add_argument("--timeout", type=positive_float, default=600.0, help="seconds each fcp train run may take")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.nproc < 2:
        ap.error("--nproc must be at least 2 (a ring needs two processes)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    ring_budget = -(-args.max_tokens // args.nproc)  # the longest sample needs every rank
    ring = _train(args, ring_budget)
    flat = _train(args, 4 * args.max_tokens)  # every sample fits one rank
    degrees = sorted({int(d) for r in ring for mb in r.get("degrees", []) for d in mb})
    print(f"ring run (tokens_per_rank {ring_budget}): group degrees {degrees}; "
          f"no-ring run (tokens_per_rank {4 * args.max_tokens}): "
          f"{sorted({int(d) for r in flat for mb in r.get('degrees', []) for d in mb})}")
    worst = 0.0
    for a, b in zip(ring, flat):
        rel = abs(a["loss"] - b["loss"]) / abs(b["loss"])
        worst = max(worst, rel)
        print(f"step {a['step']}: loss with rings {a['loss']:.8f}, without {b['loss']:.8f}, relative {rel:.2e}")
    ok = worst <= args.tol and max(degrees, default=1) > 1
    print(f"ring_vs_dp_check: {'PASS' if ok else 'FAIL'} worst relative loss difference {worst:.2e} "
          f"(tolerance {args.tol:g}); largest ring degree {max(degrees, default=1)}")
    return 0 if ok else 1


if __name__ == "__main__":
    run(main)
