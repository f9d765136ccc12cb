"""What an MoE router's load-balancing loss costs under FCP (``output_router_logits=True``,
:mod:`fcp_exec.integrations.hf_router`), side by side with the same model without it.

Runs ``fcp train --model hf:CONFIG --nproc 2 --data synthetic --json`` on a Qwen3-MoE config (8 experts, top 2; the
size below) twice per pair — router loss off and on, the order flipped every pair, the same seed (the same global
batches and plans) — and prints per run the total step time over steps 1.. (step 0 warms up), then the median per
setting and each pair's ratio. The loss adds per micro-batch one all-reduce of ``E + 1`` float64 values and, per MoE
layer, a softmax, a top-k and two sums over the router logits; the stock model computes its own aux loss as well.

Run: ``python benchmarks/bench_router_loss.py [--pairs 3] [--steps 10] [--hidden 128] [--layers 4]`` (~1 minute a pair
on 2 cores).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _alternating import alternating_pairs
from _args import parser, positive_int, run

ROOT = Path(__file__).resolve().parent.parent


def write_config(folder: Path, router: bool, args) -> Path:
    raw = json.loads((ROOT / "examples" / "configs" / "qwen3_moe-tiny.json").read_text())
    raw.update(hidden_size=args.hidden, intermediate_size=2 * args.hidden, moe_intermediate_size=args.hidden // 2,
               num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=4,
               head_dim=args.hidden // 8, num_experts=8, num_experts_per_tok=2, output_router_logits=router,
               router_aux_loss_coef=0.01)
    path = folder / f"qwen3_moe-{'router' if router else 'plain'}.json"
    path.write_text(json.dumps(raw))
    return path


def run_once(config: Path, args) -> list[float]:
    """Step times (s) of one ``fcp train`` run."""
    cmd = [sys.executable, "-m", "fcp_cli", "train", "--model", f"hf:{config}", "--nproc", "2", "--data", "synthetic",
           "--max-tokens", str(args.max_tokens), "--steps", str(args.steps), "--seed", "0", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"bench_router_loss: fcp train failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    return [json.loads(line)["step_time_s"] for line in out.stdout.splitlines() if line.startswith("{")]


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=positive_int, default=3, help="alternating pairs of runs (default 3)")
    p.add_argument("--steps", type=positive_int, default=10,
                   help="steps per run, at least 2 (default 10; step 0 is not counted)")
    p.add_argument("--hidden", type=positive_int, default=128, help="hidden size, a multiple of 16 (default 128)")
    p.add_argument("--layers", type=positive_int, default=4, help="decoder layers, every one MoE (default 4)")
    p.add_argument("--max-tokens", type=positive_int, default=1024, help="longest synthetic document (default 1024)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error(f"--steps {args.steps}: at least 2 (step 0 warms up and is not counted)")
    if args.hidden % 16:
        p.error(f"--hidden {args.hidden}: a multiple of 16 (8 heads of an even head dim)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"fcp train --model hf:qwen3_moe (hidden {args.hidden}, {args.layers} MoE layers, 8 experts top 2) --nproc 2 "
          f"--data synthetic --max-tokens {args.max_tokens} --steps {args.steps}; load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        configs = {router: write_config(Path(tmp), router, args) for router in (False, True)}
        totals = alternating_pairs(lambda router: run_once(configs[router], args), args.pairs,
                                   lambda router: f"router loss {'on ' if router else 'off'}")
    med = {k: statistics.median(v) for k, v in totals.items()}
    ratios = [on / off for off, on in zip(totals[False], totals[True])]
    print(f"median total: off {med[False]:.2f} s, on {med[True]:.2f} s; per-pair ratio (on / off) "
          f"{', '.join(f'{r:.3f}' for r in ratios)}; load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    run(main)
