"""Planner benchmarks: solver latency, scaling, quality against the ILP, simulated step time.

Prints markdown tables. Run from the repository root::

    .venv/bin/python benchmarks/bench_planner.py                      # everything (~5-8 min on 2 cores)
    .venv/bin/python benchmarks/bench_planner.py --only latency,scaling

Sections:
  latency   512 sequences drawn from the Wikipedia workload (capped at 128K) on 64 ranks as one
            micro-batch, Qwen3-8B on ascend-910c: median solve time per solver (goal: fcp ≤ 20 ms).
  scaling   global batch size (128, 256, 512) × ranks (16, 32, 64), micro-batch planner included
            ("auto"), and 4096 sequences on 1024 ranks as one micro-batch (goal ≤ 1 s).
  quality   ≥ 200 random small single-node instances: FCP's makespan against the ILP optimum
            (goal: mean gap ≤ 3 %, worst ≤ 15 %).
  simulate  step time on Wikipedia, 64 ranks (4 nodes × 16), GBS 512, Qwen3-8B and Llama3-8B on
            ascend-910c: FCP's speedup over every baseline (static degrees fixed for the whole run).
  nscaling  planning time against the number of sequences (the first n of the workload, capped at N·E) at
            1024 ranks with micro_batches='auto', Qwen3-8B on ascend-910c and h100 (issue 15: time linear in
            n at fixed ranks, 400k under 4× the 100k time); also megatron-dynamic against FCP on the largest
            micro-batch (FCP stops evaluating that candidate above MEGATRON_CANDIDATE_MAX sequences × ranks).
            --nscaling-sizes picks the sizes (default 25000,50000,100000,200000,400000; ~3 min).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.plan import plan_batch  # noqa: E402
from fcp_data.workloads import apply_cap, load_lengths  # noqa: E402

CAP = 131072


def _median_ms(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def bench_latency(workload: np.ndarray, reps: int) -> None:
    cm = CostModel.preset("Qwen3-8B", "ascend-910c")
    rng = np.random.default_rng(0)
    batches = [workload[rng.choice(workload.size, 512, replace=False)] for _ in range(reps)]
    solvers = ["fcp", "fcp-dp", "fcp-pow2", "static-cp", "ulysses", "megatron-dynamic"]
    print(f"\n### Solver latency: 512 sequences, 64 ranks, one micro-batch, Qwen3-8B / ascend-910c ({reps} batches)\n")
    print("| solver | median wall [ms] | p90 wall [ms] | median CPU [ms] | mean makespan [s] |")
    print("|---|---:|---:|---:|---:|")
    for s in solvers:
        plan_batch(batches[0], num_ranks=64, cost_model=cm, solver=s)  # warm-up
        ts, cpu, spans = [], [], []
        for b in batches:
            t0, c0 = time.perf_counter(), time.thread_time()
            p = plan_batch(b, num_ranks=64, cost_model=cm, solver=s)
            ts.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.thread_time() - c0) * 1e3)
            spans.append(p.makespan)
        print(f"| {s} | {statistics.median(ts):.1f} | {np.percentile(ts, 90):.1f} | {statistics.median(cpu):.1f} | "
              f"{np.mean(spans):.3f} |")


def bench_scaling(workload: np.ndarray, reps: int) -> None:
    cm = CostModel.preset("Qwen3-8B", "ascend-910c")
    rng = np.random.default_rng(1)
    print(f"\n### Scaling: median planning time per global batch [ms] (micro_batches='auto', {reps} batches)\n")
    print("| GBS \\ ranks | 16 | 32 | 64 |")
    print("|---|---:|---:|---:|")
    for gbs in (128, 256, 512):
        row = []
        for n in (16, 32, 64):
            batches = [workload[rng.choice(workload.size, gbs, replace=False)] for _ in range(reps)]
            it = iter(batches * 2)
            row.append(_median_ms(lambda: plan_batch(next(it), num_ranks=n, cost_model=cm, micro_batches="auto"), reps))
        print(f"| {gbs} | " + " | ".join(f"{v:.1f}" for v in row) + " |")
    big = [workload[rng.choice(workload.size, 4096, replace=False)] for _ in range(3)]
    it = iter(big)
    ms = _median_ms(lambda: plan_batch(next(it), num_ranks=1024, cost_model=cm), 3)
    it = iter(big)
    ms_pow2 = _median_ms(lambda: plan_batch(next(it), num_ranks=1024, cost_model=cm, solver="fcp-pow2"), 3)
    print(f"\n4096 sequences on 1024 ranks, one micro-batch: fcp median {ms:.0f} ms, fcp-pow2 {ms_pow2:.0f} ms (goal ≤ 1000 ms)")


def bench_quality(instances: int, time_limit: float) -> None:
    cm = CostModel.preset("Qwen3-8B", "ascend-910c").replace(ranks_per_node=8)
    rng = np.random.default_rng(2)
    gaps, proved, ilp_ms = [], 0, []
    while len(gaps) < instances:
        n = int(rng.integers(3, 11))
        N = int(rng.choice([2, 4, 6, 8]))
        L = np.minimum(rng.lognormal(8.5, 1.5, size=n).astype(np.int64) + 1, N * cm.tokens_per_rank)
        etas = (rng.random(n) < 0.25).astype(float)
        if L.sum() > N * cm.tokens_per_rank:
            continue
        ilp = plan_batch(L, num_ranks=N, cost_model=cm, etas=etas, solver="ilp", time_limit=time_limit)
        fcp = plan_batch(L, num_ranks=N, cost_model=cm, etas=etas)
        ilp_ms.append(ilp.solve_ms)
        proved += bool(ilp.optimal)
        gaps.append(fcp.makespan / ilp.makespan - 1.0)
    g = np.array(gaps) * 100
    print(f"\n### Quality vs ILP: {instances} random single-node instances (3-10 sequences, 2-8 ranks, 25 % full attention)\n")
    print("| mean gap | p95 gap | worst gap | FCP optimal (gap < 1e-6) | ILP proved optimal | ILP median [ms] |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {g.mean():.3f} % | {np.percentile(g, 95):.3f} % | {g.max():.3f} % | {(g < 1e-4).mean() * 100:.0f} % | "
          f"{proved}/{instances} | {statistics.median(ilp_ms):.0f} |")


def bench_simulate(workload: np.ndarray, steps: int) -> None:
    from fcp_data.commands.simulate import simulate
    from fcp_data.presets import model_heads

    print(f"\n### Simulated step time: Wikipedia, 64 ranks (4 × 16), GBS 512, {steps} steps, ascend-910c\n")
    print("| model | solver | mean step [s] | FCP speedup |")
    print("|---|---|---:|---:|")
    solvers = ["fcp", "static-cp", "ulysses", "megatron-dynamic", "fcp-pow2"]
    for model in ("Qwen3-8B", "Llama3-8B"):
        cm = CostModel.preset(model, "ascend-910c")
        h, kv = model_heads(model)
        capped, _ = apply_cap(workload, min(CAP, 64 * cm.tokens_per_rank), "truncate")
        times, _, fixed = simulate(capped, num_ranks=64, cost_model=cm, global_batch_size=512, steps=steps, seed=0,
                                   solvers=solvers, options={"ulysses": {"num_heads": h, "num_kv_heads": kv}})
        base = np.mean(times["fcp"])
        for s in solvers:
            note = f" (d={fixed[s]})" if fixed[s] else ""
            print(f"| {model} | {s}{note} | {np.mean(times[s]):.3f} | {np.mean(times[s]) / base:.3f}x |")


def bench_nscaling(workload_path: str, sizes: list[int], ranks: int = 1024) -> None:
    from fcp_data.plan import megatron_dynamic

    raw = load_lengths(workload_path)
    print(f"\n### Planning time against sequences: {ranks} ranks, micro_batches='auto', Qwen3-8B, first n lengths of "
          f"the workload capped at N·E\n")
    print("| hardware | sequences | micro-batches | makespan [s] | CPU [s] | wall [s] | CPU / smallest ÷ n ratio | "
          "megatron-dynamic / fcp (largest micro-batch) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for hw in ("ascend-910c", "h100"):
        cm = CostModel.preset("Qwen3-8B", hw)
        base = None
        for n in sizes:
            lengths, _ = apply_cap(raw[:n], ranks * cm.tokens_per_rank, "truncate")
            t0, c0 = time.perf_counter(), time.process_time()
            plan = plan_batch(lengths, num_ranks=ranks, cost_model=cm, micro_batches="auto")
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            base = base or (cpu, n)
            mb = max(plan.micro_batches, key=lambda m: len(m.seq_ids))
            ids = np.array(sorted(mb.seq_ids))
            meg = megatron_dynamic(lengths[ids], np.zeros(ids.size), ranks, cm).makespan
            print(f"| {hw} | {n} | {len(plan.micro_batches)} | {plan.makespan:.3f} | {cpu:.1f} | {wall:.1f} | "
                  f"{cpu / base[0] / (n / base[1]):.2f} | {meg / mb.makespan:.2f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default=str(REPO.parent / "shared" / "workloads" / "wikipedia_flexsp.txt"))
    ap.add_argument("--only", default="latency,scaling,quality,simulate")
    ap.add_argument("--reps", type=int, default=30, help="batches per latency / scaling cell")
    ap.add_argument("--instances", type=int, default=200, help="quality instances (each solved by the ILP)")
    ap.add_argument("--time-limit", type=float, default=30.0, help="ILP time limit per instance [s]")
    ap.add_argument("--steps", type=int, default=20, help="simulated steps per model")
    ap.add_argument("--nscaling-sizes", default="25000,50000,100000,200000,400000",
                    help="sequence counts of the nscaling section")
    args = ap.parse_args(argv)
    only = set(args.only.split(","))
    workload = None
    if only & {"latency", "scaling", "simulate"}:
        raw = load_lengths(args.workload)
        workload, _ = apply_cap(raw, CAP, "truncate")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times grow with load; CPU times do not)")
        print(f"workload {args.workload}: {raw.size} sequences, median {int(np.median(raw))}, max {raw.max()}, capped at {CAP}")
    if "latency" in only:
        bench_latency(workload, args.reps)
    if "scaling" in only:
        bench_scaling(workload, max(5, args.reps // 3))
    if "quality" in only:
        bench_quality(args.instances, args.time_limit)
    if "simulate" in only:
        bench_simulate(workload, args.steps)
    if "nscaling" in only:
        bench_nscaling(args.workload, [int(v) for v in args.nscaling_sizes.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
