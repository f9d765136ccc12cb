"""End-to-end step time on this machine: FCP plans vs static CP (degree 2) vs data parallel (degree 1).

2 gloo processes train tiny-llm (float32) through FCPSampler → FCPCollator → ring attention → AdamW.
The data: one heterogeneous global batch — one long document of ``--long`` tokens and ``--num-short``
short ones (log-normal around 150 tokens, 32–512) — trained on every step (one global batch per epoch).
With ``--shuffled``, ``warmup + rounds`` copies of that pattern are shuffled together instead, so global
batches hold 0..k long documents (every planner still sees the same batches in the same order, because
the samplers share the seed) and the sampler's prefetch works inside the epoch.

Three trainers live in the same two processes and **alternate step by step** (fcp, static-cp:2,
static-cp:1, fcp, ...), so machine noise hits all three alike; each step's time is the slowest rank's.
The cost model is fitted on this machine first (``fcp profile`` code path, same run: single documents of
``--profile-lens`` plus packed groups of 1/4/16 documents of 64/128/256 tokens, as training packs them)
unless ``--cost`` is given (e.g. the JSON of ``fcp profile --nproc 2 --out cost.json``); its
``tokens_per_rank`` is set to ``--long`` so that data parallelism (degree 1) is allowed.

Prints per planner: median step time, total time and tokens/s over the same global batches, the ratio
to FCP, the §4 predicted total, the plans used (⟨degree⟩×count per micro-batch), and the planner wait
per step (goal: zero); then the FCP speed-ups (ratio of totals and median of per-step ratios).

Run: ``python benchmarks/e2e_cpu.py`` (about 2–4 minutes on 2 cores).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _args import count, existing_file, parser, positive_int, positive_int_list, run  # noqa: E402

PLANNERS = ("fcp", "static-cp:2", "static-cp:1")


def bench_worker(cfgs: list, warmup: int, rounds: int) -> dict:
    import torch
    import torch.distributed as dist

    from fcp_exec.train import Trainer

    trainers = [Trainer(c) for c in cfgs]
    out = {c.planner: [] for c in cfgs}
    for r in range(warmup + rounds):
        for c, tr in zip(cfgs, trainers):
            dist.barrier()
            rec = tr.step()
            t = torch.tensor([rec["step_time_s"], rec["planner_wait_s"]], dtype=torch.float64, device=tr.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            rec["step_time_s"], rec["planner_wait_s"] = float(t[0]), float(t[1])
            if r >= warmup:
                out[c.planner].append(rec)
    return out


def build_parser():
    ap = parser(__doc__.split("\n")[0])
    ap.add_argument("--long", type=positive_int, default=4096, help="tokens of the one long document per pattern")
    ap.add_argument("--num-short", type=count, default=24, help="short documents (32-512 tokens) per pattern")
    ap.add_argument("--rounds", type=positive_int, default=10, help="timed steps per planner (default 10)")
    ap.add_argument("--warmup", type=count, default=1, help="untimed steps per planner first")
    ap.add_argument("--tokens-per-rank", type=positive_int, default=None,
                    help="memory budget E (default --long, so data parallelism fits; below --long DP is skipped)")
    ap.add_argument("--cost", type=existing_file, default=None,
                    help="cost JSON (fcp profile --out); default: fit one now with the profiler")
    # the profiler's options: None when not given, so that --cost can refuse them (they would be ignored)
    ap.add_argument("--profile-lens", type=positive_int_list, default=None,
                    help="single-document lengths the profiler times, comma-separated (default 256,512,1024,2048,4096; "
                         "not with --cost)")
    ap.add_argument("--profile-reps", type=positive_int, default=None,
                    help="repetitions per profile point, median kept (default 3; not with --cost)")
    ap.add_argument("--shuffled", action="store_true",
                    help="many copies of the pattern shuffled together (global batches hold 0..k long documents, "
                         "plans prefetched inside the epoch) instead of the same 1-long + N-short batch every step")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    given = [f"--{k.replace('_', '-')}" for k in ("profile_lens", "profile_reps") if getattr(args, k) is not None]
    if args.cost and given:
        ap.error(f"{' and '.join(given)} set the profiler, which --cost {args.cost} replaces: give one of them")
    args.profile_lens = args.profile_lens or [256, 512, 1024, 2048, 4096]
    args.profile_reps = args.profile_reps or 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    from fcp_data.cost import CostModel
    from fcp_data.plan import plan_batch
    from fcp_exec.launch import launch
    from fcp_exec.profiler import format_fit, run_profile
    from fcp_exec.train import TrainConfig, format_degrees, parse_planner

    nproc = 2
    import os

    print(f"# e2e_cpu: tiny-llm float32 on {nproc} gloo processes; {os.cpu_count()} CPUs, load average at start "
          f"{os.getloadavg()[0]:.1f} (other processes on the machine add noise)")
    t0 = time.perf_counter()
    if args.cost:
        cost = CostModel.load(args.cost)
        print(f"cost model from {args.cost}")
    else:
        lens = tuple(args.profile_lens)
        fit, raw = run_profile(nproc, seq_lens=lens, reps=args.profile_reps)
        cost = fit.cost_model
        print(f"## cost model fitted on this machine ({time.perf_counter() - t0:.0f} s)")
        print(format_fit(fit))
    cost = cost.replace(tokens_per_rank=args.tokens_per_rank or args.long, ranks_per_node=nproc)
    planners = PLANNERS if cost.tokens_per_rank >= args.long else PLANNERS[:2]
    if planners != PLANNERS:
        print(f"data parallel (degree 1) skipped: the {args.long}-token document exceeds tokens_per_rank "
              f"{cost.tokens_per_rank}")

    rng = np.random.default_rng(0)
    copies = args.warmup + args.rounds if args.shuffled else 1
    pattern = []
    for _ in range(copies):
        pattern.append(args.long)
        pattern += np.clip(rng.lognormal(np.log(150), 0.6, args.num_short), 32, 512).astype(int).tolist()
    lengths = tuple(int(v) for v in pattern)
    gbs = 1 + args.num_short
    cfgs = [TrainConfig(model="tiny-llm", data="synthetic", synthetic_lengths=lengths, max_tokens=args.long,
                        global_batch_size=gbs, cost=cost.to_dict(), planner=p, steps=1, dtype="float32",
                        verbose=False) for p in planners]
    if args.shuffled:
        print(f"## data: {copies} global batches of {gbs} sequences ({sum(lengths) // copies} tokens on average; "
              f"one {args.long}-token document per {gbs} sequences, the rest 32-512 tokens), shuffled together")
    else:
        print(f"## data: every step the same global batch of {gbs} sequences, {sum(lengths)} tokens: one "
              f"{args.long}-token document and {args.num_short} of 32-512 tokens (one global batch per epoch: each "
              "step's plan is its epoch's first, planned speculatively while the previous epoch ran)")
    t1 = time.perf_counter()
    res = next(r for r in launch(bench_worker, nproc, cfgs, args.warmup, args.rounds) if r is not None)
    print(f"## step times, alternating planners step by step ({time.perf_counter() - t1:.0f} s)")

    # the sampler of one rank, to recompute each step's global batch and its predicted makespan
    from fcp_data import FCPSampler

    sampler = FCPSampler(np.array(lengths), num_ranks=nproc, rank=0, cost_model=cost, global_batch_size=gbs, seed=0)
    if args.shuffled:
        ids = [sampler.global_batch_indices(g) for g in range(args.warmup, args.warmup + args.rounds)]
    else:
        ids = [sampler.global_batch_indices(0, epoch=e) for e in range(args.warmup, args.warmup + args.rounds)]
    med, tot = {}, {}
    tokens = sum(int(np.array(lengths)[i].sum()) for i in ids)
    print(f"{'planner':<13} {'median ms':>10} {'total s':>8} {'tokens/s':>9} {'vs fcp':>7} {'predicted s':>12} "
          f"{'wait med/max ms':>16}  plans (first 3 steps)")
    for p in planners:
        recs = res[p]
        times = [r["step_time_s"] for r in recs]
        waits = [r["planner_wait_s"] for r in recs]
        med[p], tot[p] = statistics.median(times), sum(times)
        solver, degree = parse_planner(p)
        extra = {} if degree is None else {"degree": degree}
        pred = sum(plan_batch(np.array(lengths)[i], num_ranks=nproc, cost_model=cost, solver=solver,
                              micro_batches="auto", **extra).makespan for i in ids)
        plans = "; ".join(format_degrees(r["degrees"]) for r in recs[:3])
        print(f"{p:<13} {med[p] * 1e3:>10.1f} {tot[p]:>8.2f} {tokens / tot[p]:>9.0f} {tot[p] / tot['fcp']:>7.2f} "
              f"{pred:>12.2f} {statistics.median(waits) * 1e3:>8.2f}/{max(waits) * 1e3:<7.2f}  {plans}")
    if args.shuffled:
        longs = [int((np.array(lengths)[i] == args.long).sum()) for i in ids]
        print(f"long documents per timed global batch: {longs}")
    paired = {p: statistics.median(a["step_time_s"] / b["step_time_s"] for a, b in zip(res[p], res["fcp"]))
              for p in planners[1:]}
    names = {"static-cp:2": "static CP (degree 2)", "static-cp:1": "data parallel (degree 1)"}
    print(f"FCP speed-up over the same {len(ids)} global batches (ratio of total times; median of per-step ratios): "
          + ", ".join(f"{tot[p] / tot['fcp']:.2f}x ({paired[p]:.2f}x) over {names[p]}" for p in planners[1:]))
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    run(main)
