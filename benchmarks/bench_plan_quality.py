"""Planner quality against the ILP's proven optimum, by tightness (issue 12). Prints markdown tables.

Instances: 2-16 ranks on one node (``ranks_per_node = 16``, so the ILP's model is exact), 3-20 sequences
whose total is a fraction of ``N·tokens_per_rank`` drawn uniformly inside each tightness bin (0-50, 50-80,
80-95, 95-100 %); lengths are a Dirichlet split of that total (each at most ``N·E``), 25 % full attention.
Cost models: presets (several models × hardware from :mod:`fcp_data.presets`, v1 or v2 terms) with the
intra-node bandwidth redrawn log-uniformly in 1e10-2e11 B/s, plus random coefficients (v2 ones with
gamma and alpha_blk) — half the instances each; ``tokens_per_rank`` is redrawn in 1K-16K so that ILPs stay
small.

Reference: ``plan_batch(..., solver="ilp", time_limit=T)``; only instances where HiGHS proved optimality
(``Plan.optimal``) enter the gap columns, the others are counted apart. The planner is run twice side
by side: today's (``fcp_micro_batch(..., search=False)``, the planner before issue 12) and the new one
(default: with :mod:`fcp_data.plan.search`). Gap = makespan / ILP optimum − 1.

    .venv/bin/python benchmarks/bench_plan_quality.py --quick          # ~2 min on 2 cores
    .venv/bin/python benchmarks/bench_plan_quality.py --per-bin 40 --time-limit 20
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _args import count, parser, positive_float, positive_int, run  # noqa: E402
from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.plan import plan_batch  # noqa: E402
from fcp_data.plan.solvers import fcp_micro_batch  # noqa: E402
from fcp_data.presets import preset_cost_model  # noqa: E402

BINS = ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.0))
PRESETS = (("Qwen3-8B", "ascend-910c"), ("Llama3-8B", "h100"), ("Qwen3-1.7B", "a100"), ("InternVL3-8B", "h200"),
           ("Llama3.2-3B", "h100"), ("Qwen3-4B", "ascend-910c"))


def random_cost_model(rng: np.random.Generator, v2: bool) -> CostModel:
    """A preset (redrawn intra-node bandwidth) or random coefficients; one node of 16 ranks."""
    E = int(rng.choice([1024, 2048, 4096, 8192, 16384]))
    bw = float(10 ** rng.uniform(10, np.log10(2e11)))
    if rng.random() < 0.5:
        model, hw = PRESETS[int(rng.integers(len(PRESETS)))]
        return preset_cost_model(model, hw, v2=v2, bandwidth_intra=bw, ranks_per_node=16, tokens_per_rank=E)
    extra = dict(gamma=float(10 ** rng.uniform(-5, -3)), alpha_blk=float(10 ** rng.uniform(-9, -7))) if v2 else {}
    return CostModel(alpha1=float(10 ** rng.uniform(-10, -8)), alpha2=float(10 ** rng.uniform(-6, -4)),
                     alpha3=float(10 ** rng.uniform(4.5, 6.5)), beta1=float(10 ** rng.uniform(-3, -1.5)),
                     beta2=float(10 ** rng.uniform(-3, -1.5)), bandwidth_intra=bw, bandwidth_inter=min(bw, 2.5e10),
                     ranks_per_node=16, tokens_per_rank=E, **extra)


def random_instance(rng: np.random.Generator, lo: float, hi: float, v2: bool, max_ranks: int = 16,
                    max_sequences: int = 20) -> tuple[np.ndarray, np.ndarray, int, CostModel]:
    """``(lengths, etas, num_ranks, cost_model)`` with ``Σs / (N·E)`` in ``[lo, hi]``."""
    while True:
        cm = random_cost_model(rng, v2)
        N = int(rng.integers(2, max_ranks + 1))
        n = int(rng.integers(3, max_sequences + 1))
        total = rng.uniform(max(lo, 0.02), hi) * N * cm.tokens_per_rank
        L = np.floor(rng.dirichlet(np.full(n, 0.8)) * total).astype(np.int64)
        if L.min() >= 1 and L.max() <= N * cm.tokens_per_rank and lo <= L.sum() / (N * cm.tokens_per_rank) <= hi:
            return L, (rng.random(n) < 0.25).astype(np.float64), N, cm


def run_bin(rng, lo: float, hi: float, count: int, time_limit: float, v2: bool) -> dict:
    """Solve ``count`` instances of one bin with the ILP, today's planner and the new one."""
    rows = {"proven": 0, "unproven": 0, "new": [], "old": [], "unproven_new": [], "ms_new": [], "ms_old": []}
    for _ in range(count):
        L, e, N, cm = random_instance(rng, lo, hi, v2)
        t0 = time.perf_counter()
        new = fcp_micro_batch(L, e, N, cm).makespan
        t1 = time.perf_counter()
        old = fcp_micro_batch(L, e, N, cm, search=False).makespan
        t2 = time.perf_counter()
        rows["ms_new"].append((t1 - t0) * 1e3)
        rows["ms_old"].append((t2 - t1) * 1e3)
        ilp = plan_batch(L, num_ranks=N, cost_model=cm, etas=e, solver="ilp", time_limit=time_limit)
        if not ilp.optimal:
            rows["unproven"] += 1
            rows["unproven_new"].append(new / ilp.makespan - 1)
            continue
        rows["proven"] += 1
        rows["new"].append(new / ilp.makespan - 1)
        rows["old"].append(old / ilp.makespan - 1)
    return rows


def _stats(g: list) -> str:
    if not g:
        return "– | –"
    a = np.array(g) * 100
    return f"{a.mean():.3f} % | {a.max():.2f} %"


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--per-bin", type=positive_int, default=30,
                    help="instances per tightness bin and cost-model version")
    ap.add_argument("--time-limit", type=positive_float, default=20.0, help="ILP time limit per instance [s]")
    ap.add_argument("--seed", type=count, default=0, help="random seed of the instances")
    ap.add_argument("--models", choices=("v1", "v2", "both"), default="both", help="cost-model terms of the presets")
    ap.add_argument("--quick", action="store_true", help="6 instances per bin, ILP limit 5 s")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    per_bin, limit = (6, 5.0) if args.quick else (args.per_bin, args.time_limit)
    versions = {"v1": (False,), "v2": (True,), "both": (False, True)}[args.models]
    for v2 in versions:
        rng = np.random.default_rng(args.seed + 1000 * v2)
        print(f"\n### Quality vs ILP, cost model {'v2' if v2 else 'v1'} ({per_bin} instances per bin, ILP limit {limit:g} s, "
              f"load average {os.getloadavg()[0]:.1f})\n")
        print("| tightness | instances | ILP proven | new mean gap | new max gap | today mean gap | today max gap | "
              "new ≤ today | new median [ms] | today median [ms] | unproven: new vs ILP incumbent (mean) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for lo, hi in BINS:
            r = run_bin(rng, lo, hi, per_bin, limit, v2)
            ok = sum(a <= b + 1e-12 for a, b in zip(r["new"], r["old"]))
            unp = f"{np.mean(r['unproven_new']) * 100:+.2f} % ({r['unproven']})" if r["unproven"] else "–"
            print(f"| {lo * 100:.0f}-{hi * 100:.0f} % | {per_bin} | {r['proven']} | {_stats(r['new'])} | {_stats(r['old'])} | "
                  f"{ok}/{r['proven']} | {np.median(r['ms_new']):.1f} | {np.median(r['ms_old']):.1f} | {unp} |", flush=True)
    return 0


if __name__ == "__main__":
    run(main)
