"""``micro_batches="auto"`` on tight global batches: solving the splits whose stage-1 bins overflow (issue 12).

Before, ``auto`` skipped every split in which some micro-batch's stage-1 bins (BFD with unit ``E``) needed more
than ``N`` ranks, although one group of all ``N`` ranks holds any ``Σs ≤ N·E``: on a tight batch it then went to
more micro-batches than memory needs. Now such splits are solved too, and the winner is compared, after the
local-search polish, with the best loose split (:func:`~fcp_data.plan.microbatch.plan_micro_batches`).

Both planners run here side by side on the same instances, alternating which goes first, built from the same
pieces as :func:`~fcp_data.plan.plan_batch` (``fcp_micro_batch`` with the search off while splits are compared,
then :func:`~fcp_data.plan.search.polisher`): **before** refuses a tight micro-batch in ``solve_one`` (exactly
the old skip), **now** is the library's ``auto``; a check asserts that **now** equals ``plan_batch``'s plan.

Instances: 2-16 ranks on one node, ``E`` in {2K, 4K, 8K} tokens, 4-40 sequences whose total is 0.8-4.5 ×
``N·E`` (Dirichlet split with concentration 0.3 / 0.7 / 2, each at most ``N·E``), Qwen3-8B / Llama3-8B /
Qwen3-1.7B / InternVL3-8B presets on ascend-910c / h100 / a100 / h200, v1 or v2 terms. Reported: instances
where the sum of makespans got better / equal / worse, the gains, and the planning time of both (median and
the ratio of the sums).

    .venv/bin/python benchmarks/bench_auto_tight.py            # 300 instances, ~30 s on 2 cores
    .venv/bin/python benchmarks/bench_auto_tight.py --instances 1000 --seed 3
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _args import count, parser, positive_int, run  # noqa: E402
from fcp_data.plan import plan_batch  # noqa: E402
from fcp_data.plan.bfd import bfd_groups  # noqa: E402
from fcp_data.plan.microbatch import plan_micro_batches  # noqa: E402
from fcp_data.plan.search import polisher  # noqa: E402
from fcp_data.plan.solvers import fcp_micro_batch  # noqa: E402
from fcp_data.presets import preset_cost_model  # noqa: E402

PRESETS = (("Qwen3-8B", "ascend-910c"), ("Llama3-8B", "h100"), ("Qwen3-1.7B", "a100"), ("InternVL3-8B", "h200"))
BINS = ((0.8, 1.0), (1.0, 2.0), (2.0, 4.5))


def instance(rng: np.random.Generator):
    m, hw = PRESETS[rng.integers(len(PRESETS))]
    N = int(rng.choice([2, 3, 4, 6, 8, 16]))
    E = int(rng.choice([2048, 4096, 8192]))
    cm = preset_cost_model(m, hw, v2=bool(rng.integers(2))).replace(tokens_per_rank=E, ranks_per_node=16)
    fill = float(rng.uniform(0.8, 4.5))
    n = int(rng.integers(4, 41))
    shares = rng.dirichlet(np.full(n, rng.choice([0.3, 0.7, 2.0])))
    L = np.clip((shares * fill * N * E).astype(np.int64), 1, N * E)
    return L, N, cm, fill


def tight(sub: np.ndarray, N: int, E: int) -> bool:
    return sum(max(1, math.ceil(float(sub[g].sum()) / E)) for g in map(np.asarray, bfd_groups(sub, E))) > N


def auto(L: np.ndarray, N: int, cm, skip_tight: bool) -> float:
    etas = np.zeros(L.size)
    opts = {"search": False}

    def solve_one(ids, left=1):
        if skip_tight and opts.get("search") is False and tight(L[ids], N, cm.tokens_per_rank):
            raise ValueError("tight micro-batch skipped (the search before)")
        return fcp_micro_batch(L[ids], etas[ids], N, cm, **opts), None

    mbs, _ = plan_micro_batches(L, etas, N, cm, solve_one, "auto", finish=polisher(opts, solve_one, N))
    return float(sum(mb.makespan for mb in mbs))


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--instances", type=positive_int, default=300, help="random tight global batches")
    ap.add_argument("--seed", type=count, default=1, help="random seed of the instances")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = []
    for i in range(args.instances):
        L, N, cm, fill = instance(rng)
        res = {}
        for skip in ((True, False) if i % 2 == 0 else (False, True)):
            t0 = time.perf_counter()
            res[skip] = (auto(L, N, cm, skip), time.perf_counter() - t0)
        lib = plan_batch(L, num_ranks=N, cost_model=cm, micro_batches="auto").makespan
        assert abs(lib - res[False][0]) <= 1e-9 * lib, (i, lib, res[False][0])  # "now" is the library's auto
        rows.append((fill, res[True][0], res[False][0], res[True][1], res[False][1]))
    r = np.array(rows)
    gain = r[:, 2] / r[:, 1] - 1
    print(f"{args.instances} instances, seed {args.seed}\n")
    print("| fill of N·E | instances | better | equal | worse | median gain where better | largest gain | worst |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for lo, hi in BINS + ((0.8, 4.5),):
        sel = (r[:, 0] >= lo) & (r[:, 0] < hi)
        g = gain[sel]
        better = g < -1e-12
        med = f"{-100 * np.median(g[better]):.2f} %" if better.any() else "—"
        big = f"{-100 * g.min():.2f} %" if g.size else "—"
        print(f"| {lo:g}-{hi:g} | {sel.sum()} | {better.sum()} | {(np.abs(g) <= 1e-12).sum()} | {(g > 1e-12).sum()} | "
              f"{med} | {big} | {100 * max(g.max(), 0) if g.size else 0:+.2f} % |")
    print(f"\nplanning time per global batch: before median {1e3 * np.median(r[:, 3]):.1f} ms, now "
          f"{1e3 * np.median(r[:, 4]):.1f} ms; sum now / before = {r[:, 4].sum() / r[:, 3].sum():.2f}×")
    return 0


if __name__ == "__main__":
    run(main)
