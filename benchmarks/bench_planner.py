"""Planner benchmarks: solver latency, scaling, quality against the ILP, simulated step time.

Prints markdown tables. Run from the repository root::

    .venv/bin/python benchmarks/bench_planner.py                      # latency,scaling,quality,simulate (~5-8 min)
    .venv/bin/python benchmarks/bench_planner.py --only latency,scaling

Without --only the four sections latency, scaling, quality and simulate run (~5-8 min on 2 cores); memory, auto,
digest and nscaling run only when --only names them.

Sections:
  latency   512 sequences drawn from the Wikipedia workload (capped at 128K) on 64 ranks as one
            micro-batch, Qwen3-8B on ascend-910c: median solve time per solver (goal: fcp ≤ 20 ms).
  scaling   global batch size (128, 256, 512) × ranks (16, 32, 64), micro-batch planner included
            ("auto"), and 4096 sequences on 1024 ranks as one micro-batch (goal ≤ 1 s).
  quality   ≥ 200 random small single-node instances: FCP's makespan against the ILP optimum
            (goal: mean gap ≤ 3 %, worst ≤ 15 %).
  simulate  step time on Wikipedia, 64 ranks (4 nodes × 16), GBS 512, Qwen3-8B and Llama3-8B on
            ascend-910c: FCP's speedup over every baseline (static degrees fixed for the whole run).
  memory    one micro-batch of n Wikipedia sequences on N ranks (512×64, 2048×256, 4096×1024, 8192×2048,
            16384×4096; --sizes), Qwen3-8B / ascend-910c (v2 preset; --v1 for v1): median planning time and peak
            RSS above the interpreter's baseline, each size in a fresh subprocess (issue 12 goals: 512×64
            ≤ 10 ms, 4096×1024 ≤ 150 ms, 16384×4096 ≤ 1 s and ≤ 200 MB). With numba installed (fcp[fast]) the
            first plan imports it (~1 s, ~124 MB of the peak RSS); FCP_JIT=0 measures the numpy path.
  auto      micro_batches='auto' against one plan per step: N = 1024, GBS 4096, --steps global batches (default
            50): median time of a single plan, of auto (pruned by the §4 lower bound) and of the unpruned
            M = 1, 2, 3 search, and whether pruned and unpruned chose the same M and makespan on every step
            (goal: auto ≤ 1.5× a single plan).
  digest    one line per (instance, solver): makespan and a hash of every group's ranks, sequences and time, on
            random Wikipedia batches (8-1024 ranks, v1/v2 presets, full attention, visual tokens; fcp also with
            micro_batches='auto'). Run it on two checkouts and diff the output: a performance change must
            leave it identical (issue 12: plans hash-identical unless exactly improved).
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

from _args import (WIKIPEDIA, count, count_list, existing_file, int_pairs, names, parser,  # noqa: E402
                   positive_float, positive_int, positive_int_list, run)
from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.plan import plan_batch  # noqa: E402
from fcp_data.workloads import apply_cap, load_lengths  # noqa: E402

CAP = 131072


def speed_reference(steps: int = 5_000_000) -> float:
    """Seconds a fixed pure-Python loop takes (median of 3): printed with the timing sections, because a shared host's
    speed varies several-fold with its neighbours at the same load average — compare timings at similar values."""
    runs = []
    for _ in range(3):
        t0, acc = time.perf_counter(), 0
        for i in range(steps):
            acc += i
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


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
    from fcp_data.plan.simulate import simulate
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


SIZES = ((512, 64), (2048, 256), (4096, 1024), (8192, 2048), (16384, 4096))


def _size_child(workload_path: str, n: int, ranks: int, reps: int, v2: bool) -> None:
    """Run in a fresh interpreter: plan ``reps`` batches of ``n`` sequences on ``ranks`` ranks; print JSON with
    the median time and the peak RSS above the RSS before the first plan (imports and workload loaded)."""
    import json
    import resource

    from fcp_data.presets import preset_cost_model

    cm = preset_cost_model("Qwen3-8B", "ascend-910c", v2=v2)
    workload, _ = apply_cap(load_lengths(workload_path), min(CAP, ranks * cm.tokens_per_rank), "truncate")
    rng = np.random.default_rng(n + ranks)
    batches = [workload[rng.choice(workload.size, n, replace=False)] for _ in range(reps)]
    def peak_kb() -> int:
        """This process's peak RSS: VmHWM (ru_maxrss survives exec on Linux, so a child would report the peak of
        the benchmark process that started it)."""
        try:
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        except (OSError, StopIteration, ValueError):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    base = peak_kb()
    ts, spans = [], []
    for b in batches:
        t0 = time.perf_counter()
        spans.append(plan_batch(b, num_ranks=ranks, cost_model=cm).makespan)
        ts.append((time.perf_counter() - t0) * 1e3)
    peak = peak_kb()
    print(json.dumps({"median_ms": statistics.median(ts), "min_ms": min(ts), "rss_mb": (peak - base) / 1024,
                      "base_mb": base / 1024, "makespan": float(np.mean(spans))}))


def bench_memory(workload_path: str, sizes: list[tuple[int, int]], reps: int, v2: bool) -> None:
    import json
    import subprocess

    print(f"\n### One micro-batch at scale: Wikipedia, Qwen3-8B / ascend-910c ({'v2' if v2 else 'v1'} preset), each size in "
          "a fresh process\n")
    print("| sequences × ranks | median [ms] | min [ms] | peak RSS above baseline [MB] | baseline RSS [MB] | "
          "mean makespan [s] | load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n, ranks in sizes:
        r = max(3, reps if n * ranks <= 1 << 21 else reps // 4)
        out = subprocess.run([sys.executable, __file__, "--workload", workload_path, "--_size",
                              f"{n},{ranks},{r},{int(v2)}"], capture_output=True, text=True, check=True)
        m = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {n} × {ranks} | {m['median_ms']:.1f} | {m['min_ms']:.1f} | {m['rss_mb']:.0f} | {m['base_mb']:.0f} | "
              f"{m['makespan']:.3f} | {os.getloadavg()[0]:.1f} |", flush=True)


def bench_auto(workload: np.ndarray, steps: int, ranks: int = 1024, gbs: int = 4096) -> None:
    from fcp_data.plan import fcp_micro_batch, plan_micro_batches
    from fcp_data.presets import preset_cost_model

    print(f"\n### micro_batches='auto' vs one plan: {ranks} ranks, GBS {gbs}, {steps} steps, Qwen3-8B / ascend-910c\n")
    print("| preset | single [ms] | auto [ms] | unpruned M=1,2,3 [ms] | auto / single | unpruned / single | "
          "same M and makespan | chosen M (counts) | load |")
    print("|---|---:|---:|---:|---:|---:|---|---|---:|")
    for v2 in (True, False):
        cm = preset_cost_model("Qwen3-8B", "ascend-910c", v2=v2)
        rng = np.random.default_rng(7)
        t_one, t_auto, t_ref, same, chosen = [], [], [], 0, []
        for _ in range(steps):
            b = np.minimum(workload[rng.choice(workload.size, gbs, replace=False)], ranks * cm.tokens_per_rank)
            e = np.zeros(b.size)
            t0 = time.perf_counter()
            plan_batch(b, num_ranks=ranks, cost_model=cm, micro_batches=1)
            t1 = time.perf_counter()
            auto = plan_batch(b, num_ranks=ranks, cost_model=cm, micro_batches="auto")
            t2 = time.perf_counter()
            ref, _ = plan_micro_batches(b, e, ranks, cm, lambda ids, left=1: (fcp_micro_batch(b[ids], e[ids], ranks, cm),
                                                                                None), "auto", prune=False)
            t3 = time.perf_counter()
            t_one.append(t1 - t0), t_auto.append(t2 - t1), t_ref.append(t3 - t2)
            same += len(ref) == len(auto.micro_batches) and sum(m.makespan for m in ref) == auto.makespan
            chosen.append(len(auto.micro_batches))
        one, au, rf = (statistics.median(t) * 1e3 for t in (t_one, t_auto, t_ref))
        counts = ", ".join(f"M={m}: {chosen.count(m)}" for m in sorted(set(chosen)))
        print(f"| {'v2' if v2 else 'v1'} | {one:.0f} | {au:.0f} | {rf:.0f} | {au / one:.2f}x | {rf / one:.2f}x | "
              f"{same}/{steps} | {counts} | {os.getloadavg()[0]:.1f} |", flush=True)


def bench_digest(workload: np.ndarray, seed: int, count: int) -> None:
    import hashlib

    from fcp_data.presets import preset_cost_model

    rng = np.random.default_rng(seed)
    shapes = [(64, 8), (128, 16), (512, 64), (300, 32), (1024, 128), (96, 12), (40, 6), (2048, 256), (4096, 1024)]
    for i in range(count):
        cm = preset_cost_model("Qwen3-8B", ["ascend-910c", "h100"][(i // 2) % 2], v2=bool(i % 2))
        n, N = shapes[i % len(shapes)]
        b = np.minimum(workload[rng.choice(workload.size, n, replace=False)], N * cm.tokens_per_rank)
        etas = (rng.random(n) < 0.2).astype(float) if i % 3 == 0 else None
        vis = (b * rng.uniform(0, 0.8, n)).astype(np.int64) if i % 5 == 0 else None
        solvers = ["fcp", "fcp-pow2", "static-cp"] + (["megatron-dynamic", "ulysses"] if N <= 256 else [])
        for s in solvers + (["fcp-dp"] if N <= 32 else []):
            for mb in ([1, "auto"] if s == "fcp" and N <= 256 else [1]):
                try:
                    p = plan_batch(b, num_ranks=N, cost_model=cm, etas=etas, visual=vis, solver=s, micro_batches=mb)
                except ValueError as e:
                    print(i, s, mb, "error", str(e)[:60])
                    continue
                key = repr(p.makespan) + repr([[(g.ranks, g.seq_ids, repr(g.time)) for g in m.groups]
                                                for m in p.micro_batches])
                print(i, n, N, s, mb, f"{p.makespan:.6f}", hashlib.sha1(key.encode()).hexdigest()[:16], flush=True)


SECTIONS = ("latency", "scaling", "quality", "simulate", "memory", "auto", "digest", "nscaling")
DEFAULT_SECTIONS = "latency,scaling,quality,simulate"


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--workload", type=existing_file, default=str(WIKIPEDIA),
                    help="one sequence length per line (default: ../shared/workloads/wikipedia_flexsp.txt next to "
                         "the repository)")
    ap.add_argument("--only", type=names(SECTIONS, "section"), default=DEFAULT_SECTIONS,
                    help=f"comma-separated sections to run, of {', '.join(SECTIONS)} (default {DEFAULT_SECTIONS})")
    ap.add_argument("--reps", type=positive_int, default=30, help="batches per latency / scaling cell")
    ap.add_argument("--instances", type=positive_int, default=200, help="quality instances (each solved by the ILP)")
    ap.add_argument("--time-limit", type=positive_float, default=30.0, help="ILP time limit per instance [s]")
    ap.add_argument("--steps", type=positive_int, default=20, help="simulated steps per model")
    ap.add_argument("--nscaling-sizes", type=positive_int_list, default="25000,50000,100000,200000,400000",
                    help="sequence counts of the nscaling section")
    ap.add_argument("--sizes", type=int_pairs, default=",".join(f"{n}x{r}" for n, r in SIZES),
                    help="memory section: comma-separated sequences x ranks")
    ap.add_argument("--v1", action="store_true", help="memory section: v1 preset instead of v2")
    ap.add_argument("--auto-steps", type=positive_int, default=50, help="auto section: global batches")
    ap.add_argument("--digest-seed", type=count, default=0, help="digest section: random seed")
    ap.add_argument("--digest-count", type=positive_int, default=45, help="digest section: instances")
    ap.add_argument("--_size", type=count_list, help=argparse.SUPPRESS)  # memory section: n,ranks,reps,v2 of a child
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args._size:
        n, ranks, reps, v2 = args._size
        _size_child(args.workload, n, ranks, reps, bool(v2))
        return 0
    only = set(args.only)
    workload = None
    if only & {"latency", "scaling", "simulate", "auto", "digest"}:
        raw = load_lengths(args.workload)
        workload, _ = apply_cap(raw, CAP, "truncate")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall times grow with load; CPU times "
              "less so, but a shared host's speed also varies: see the speed reference)")
        print(f"workload {args.workload}: {raw.size} sequences, median {int(np.median(raw))}, max {raw.max()}, capped at {CAP}")
    if only & {"latency", "memory"}:
        print(f"speed reference: 5M-step Python loop {speed_reference():.2f} s (compare timings at similar values; "
              "0.23-0.69 s on this 2-core host on 2026-12-02)")
    if "latency" in only:
        bench_latency(workload, args.reps)
    if "scaling" in only:
        bench_scaling(workload, max(5, args.reps // 3))
    if "quality" in only:
        bench_quality(args.instances, args.time_limit)
    if "simulate" in only:
        bench_simulate(workload, args.steps)
    if "memory" in only:
        bench_memory(args.workload, args.sizes, args.reps, not args.v1)
    if only & {"latency", "memory"}:
        print(f"\nspeed reference at the end: {speed_reference():.2f} s (this host's speed can change ~3x within a minute)")
    if "auto" in only:
        bench_auto(workload, args.auto_steps)
    if "digest" in only:
        bench_digest(workload, args.digest_seed, args.digest_count)
    if "nscaling" in only:
        bench_nscaling(args.workload, args.nscaling_sizes)
    return 0


if __name__ == "__main__":
    run(main)
