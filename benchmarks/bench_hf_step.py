"""Hugging Face models through fcp on this machine: adapter overhead and the cost of each reducer.

Part 1 (one process): a packed micro-batch of documents through a stock transformers Qwen3 model with ``sdpa``
attention (transformers' own packed-sequence path: ``position_ids`` restart per document, no mask, so it builds a
block-diagonal mask) against the same model after ``apply_fcp`` (``fcp_ring`` attention, degree 1: the CPU
per-document kernel). Forward+backward time, median of ``--reps``, both alternating in one run, and the loss/
gradient agreement (the two must compute the same thing).

Part 2 (``--nproc`` gloo processes): ``fcp train``'s Trainer on a Qwen3 config with the FCP planner and each
reducer (allreduce, ddp, fsdp2), the three trainers alternating step by step in the same processes so noise hits
all alike; median step time (slowest rank) and the ratio to allreduce, plus the plans used (idle ranks show as
Σd < nproc).

Run: ``python benchmarks/bench_hf_step.py`` (about 1–2 minutes on 2 cores; prints a Markdown table).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import count, parser, positive_int, positive_int_list, run  # noqa: E402

CONFIG = dict(model_type="qwen3", vocab_size=2000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768,
              eos_token_id=0, pad_token_id=1, tie_word_embeddings=False, attention_dropout=0.0)


def part1(lens: list[int], reps: int) -> dict:
    import torch

    from fcp_data import FCPCollator
    from fcp_data.slots import SampleSlot
    from fcp_exec.integrations import hf

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cfg = hf.load_config(_write_config())
    stock = hf.build_model(cfg, dtype=torch.float32, seed=0)
    fcp = hf.apply_fcp(copy.deepcopy(stock))
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(10, 2000, (n,), generator=g) for n in lens]
    total = sum(n - 1 for n in lens)
    slots = [SampleSlot(index=i, ranks=(0,), cp_rank=0, num_tokens=n, length=n, num_tokens_global=total, epoch=0,
                        global_batch=0, micro_batch=0, num_micro_batches=1) for i, n in enumerate(lens)]
    batch = FCPCollator(pad_token_id=1)([({"input_ids": d}, s) for d, s in zip(docs, slots)])

    def run_stock():
        stock.zero_grad(set_to_none=True)
        out = stock(input_ids=batch["input_ids"][None], position_ids=batch["position_ids"][None], use_cache=False)
        loss = hf.lm_loss(out.logits, batch)
        loss.backward()
        return float(loss.detach())

    def run_fcp():
        fcp.zero_grad(set_to_none=True)
        loss = hf.fcp_loss(fcp, batch)
        loss.backward()
        return float(loss.detach())

    times = {"stock sdpa (packed)": [], "fcp_ring degree 1": []}
    losses = {}
    for r in range(reps + 1):
        for name, fn in (("stock sdpa (packed)", run_stock), ("fcp_ring degree 1", run_fcp)):
            t0 = time.perf_counter()
            losses[name] = fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    gdiff = max(float((a.grad - b.grad).abs().max() / b.grad.abs().max().clamp_min(1e-30))
                for a, b in zip(fcp.parameters(), stock.parameters()))
    return {"tokens": int(batch["input_ids"].numel()), "docs": len(lens),
            "median_ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
            "loss_rel_diff": abs(losses["fcp_ring degree 1"] - losses["stock sdpa (packed)"]) / losses["stock sdpa (packed)"],
            "grad_rel_diff": gdiff}


def _write_config() -> str:
    path = Path(tempfile.gettempdir()) / f"fcp-bench-hf-{os.getpid()}.json"
    path.write_text(json.dumps(CONFIG))
    return str(path)


def bench_worker(cfgs: list, warmup: int, rounds: int, key: str = "reducer") -> dict:
    """Each rank steps every Trainer of ``cfgs`` in turn; per ``getattr(cfg, key)`` the slowest rank's step time,
    degrees and loss of every timed round."""
    import torch
    import torch.distributed as dist

    from fcp_exec.train import Trainer

    trainers = [Trainer(c) for c in cfgs]
    out: dict = {getattr(c, key): [] for c in cfgs}
    for r in range(warmup + rounds):
        for c, tr in zip(cfgs, trainers):
            dist.barrier()
            rec = tr.step()
            t = torch.tensor([rec["step_time_s"]], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if r >= warmup:
                out[getattr(c, key)].append({"t": float(t[0]), "degrees": rec["degrees"], "loss": rec["loss"],
                                             "tokens": rec["num_tokens"]})
    return out


def part2(nproc: int, steps: int, warmup: int) -> dict:
    from fcp_exec.launch import launch
    from fcp_exec.train import TrainConfig

    path = _write_config()
    cfgs = [TrainConfig(model=f"hf:{path}", data="synthetic", reducer=r, steps=1, global_batch_size=8,
                        num_synthetic=64, max_tokens=96, tokens_per_rank=48, dtype="float32", prefetch=2,
                        verbose=False) for r in ("allreduce", "ddp", "fsdp2")]
    res = launch(bench_worker, nproc, cfgs, warmup, steps, timeout=900.0)[0]
    out = {}
    for red, recs in res.items():
        mbs = [mb for x in recs for mb in x["degrees"]]
        out[red] = {"median_ms": 1e3 * statistics.median(x["t"] for x in recs),
                    "plans": f"{len(mbs)} micro-batches: {sum(2 in mb for mb in mbs)} with a ⟨2⟩ group, "
                             f"{sum(sum(mb) < nproc for mb in mbs)} with an idle rank",
                    "losses": [x["loss"] for x in recs]}
    return out


def build_parser():
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--lens", type=positive_int_list, default="2048,512,512,256,128,128,64,64",
                    help="part 1 document lengths (comma-separated)")
    ap.add_argument("--reps", type=positive_int, default=7, help="part 1 forward+backward passes per model (median)")
    ap.add_argument("--nproc", type=positive_int, default=2, help="part 2 gloo processes")
    ap.add_argument("--steps", type=positive_int, default=8, help="part 2 timed steps per reducer")
    ap.add_argument("--warmup", type=count, default=2, help="part 2 untimed steps per reducer first")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    load = os.getloadavg()[0]
    p1 = part1(list(args.lens), args.reps)
    print(f"## HF adapter on this machine (load {load:.1f}, {os.cpu_count()} cores)\n")
    print(f"Part 1: one packed micro-batch, {p1['docs']} documents, {p1['tokens']} tokens, Qwen3 4 layers × 128, fp32, "
          f"forward+backward, median of {args.reps}")
    s, f = p1["median_ms"]["stock sdpa (packed)"], p1["median_ms"]["fcp_ring degree 1"]
    print(f"| stock sdpa (packed) | fcp_ring degree 1 | ratio | loss rel. diff | grad rel. diff |\n|---:|---:|---:|---:|---:|")
    print(f"| {s:.1f} ms | {f:.1f} ms | {s / f:.2f}× | {p1['loss_rel_diff']:.1e} | {p1['grad_rel_diff']:.1e} |\n")
    p2 = part2(args.nproc, args.steps, args.warmup)
    base = p2["allreduce"]["median_ms"]
    print(f"Part 2: {args.nproc} gloo processes, FCP planner, {args.steps} timed steps per reducer (alternating), "
          f"median step (slowest rank)")
    print("| reducer | median step | vs allreduce | plans |\n|---|---:|---:|---|")
    for red, r in p2.items():
        print(f"| {red} | {r['median_ms']:.1f} ms | {r['median_ms'] / base:.2f}× | {r['plans']} |")
    same = all(abs(a - b) <= 1e-4 * abs(b) for red in ("ddp", "fsdp2")
               for a, b in zip(p2[red]["losses"], p2["allreduce"]["losses"]))
    print(f"\nlosses of the three reducers agree to 1e-4 (fp32): {'yes' if same else 'NO'}; load after: {os.getloadavg()[0]:.1f}")
    return 0 if same else 1


if __name__ == "__main__":
    run(main)
