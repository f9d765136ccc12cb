"""``fcp train``: train tiny-llm / tiny-mllm on N processes with FCP plans and ring attention."""

from __future__ import annotations

__all__ = ["register"]

EPILOG = """Each step is one global batch: its plan-annotated micro-batches run on the CP groups the planner
formed (ring attention inside each group), gradients are all-reduced over all ranks, then AdamW.
Printed per step: loss (global-batch mean), label tokens, the plan (⟨degree⟩×count per micro-batch),
step time and the time the loop waited for the planner. --json prints one object per step on stdout
({"step", "loss", "num_tokens", "degrees", "step_time_s"}) and nothing else there.

examples:
  fcp train --model tiny-llm --nproc 2 --steps 5
  fcp train --model tiny-mllm --nproc 2 --planner static-cp --steps 3 --json
  fcp train --model tiny-llm --nproc 3 --data synthetic --dtype float64 --max-tokens 160
  fcp index samples/text.jsonl --spec text --out idx && fcp train --data idx --nproc 2
  torchrun --nproc-per-node 4 -m fcp_data.cli train --model tiny-llm --steps 10"""


def register(subparsers, summary: str) -> None:
    import argparse

    from fcp_data.plan.solvers import SOLVER_NAMES

    p = subparsers.add_parser("train", help=summary, description=summary, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("tiny-llm", "tiny-mllm"), default="tiny-llm")
    p.add_argument("--nproc", type=int, default=None,
                   help="processes to start (default 2; under torchrun its WORLD_SIZE, no processes are started)")
    p.add_argument("--planner", default="fcp",
                   help=f"the sampler's solver: {', '.join(SOLVER_NAMES)}; static-cp:D / ulysses:D fix the degree "
                        "(static-cp:1 = data parallel only); default fcp")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32")
    p.add_argument("--data", default=None,
                   help="a length index built by `fcp index`, or 'synthetic'; default: the bundled samples "
                        "(text for tiny-llm, videos/images for tiny-mllm), indexed once into a cache folder")
    p.add_argument("--global-batch-size", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--max-tokens", type=int, default=2304,
                   help="cap on a sample's tokens: text is truncated, longer multimodal samples are left out "
                        "(default 2304, which keeps every bundled video)")
    p.add_argument("--cost", default=None, help="cost-model JSON (DESIGN §4, e.g. from `fcp profile`); default: "
                                                "a built-in CPU model with tokens_per_rank = max-tokens/2")
    p.add_argument("--tokens-per-rank", type=int, default=None, help="override the cost model's memory budget")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes per rank (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON object per step on stdout, nothing else")
    p.add_argument("--backend", default=None, help="torch.distributed backend (default nccl/hccl/gloo by device)")
    p.set_defaults(func=run)


def run(args) -> int:
    import json

    from fcp_data.cost import CostModel
    from fcp_exec.train import TrainConfig, run_training

    from fcp_exec.launch import resolve_nproc

    args.nproc = resolve_nproc(args.nproc)
    cost = CostModel.load(args.cost).to_dict() if args.cost else None
    cfg = TrainConfig(model=args.model, steps=args.steps, seed=args.seed, dtype=args.dtype, planner=args.planner,
                      global_batch_size=args.global_batch_size, lr=args.lr, data=args.data,
                      max_tokens=args.max_tokens, cost=cost, tokens_per_rank=args.tokens_per_rank,
                      num_workers=args.num_workers, json_lines=args.json, verbose=not args.json)
    res = run_training(cfg, args.nproc, backend=args.backend)
    if not args.json:
        steps = res["steps"]
        times = sorted(s["step_time_s"] for s in steps)
        waits = [s["planner_wait_s"] for s in steps]
        agree = len(set(res["checksums"])) == 1
        print(f"done: {len(steps)} steps, median step {times[len(times) // 2] * 1e3:.1f} ms, "
              f"planner wait total {sum(waits) * 1e3:.1f} ms; parameters identical on all "
              f"{len(res['checksums'])} ranks: {'yes' if agree else 'NO'}")
        if not agree:
            print(json.dumps(res["checksums"]))
            return 1
    return 0
