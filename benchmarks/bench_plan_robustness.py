"""Robustness of FCP's plans to profiling error (issue 12; the FCP paper's Tables 4-5). Markdown tables.

Setup: Wikipedia lengths (``/work/shared/workloads/wikipedia_flexsp.txt``, capped at 128K tokens, truncated),
global batches of 512 drawn as ``fcp simulate`` does (``draw_batches``, seed 0), 64 ranks, Qwen3-8B on
ascend-910c (v1 or v2 preset terms, explicit), ``micro_batches="auto"``. For each noise level ``ε`` and
trial, every cost coefficient (alpha1-3, beta1-2, both bandwidths, and the v2 gamma/alpha_blk/alpha_vis) is
multiplied by its own factor drawn uniformly in ``[1−ε, 1+ε]``; FCP plans with the perturbed model, and the
chosen plan is evaluated under the true coefficients (each group's §4/§4.1 time on its real ranks,
micro-batches summed). Reported against the plan made with the true coefficients:

* degree match: share of sequences whose CP degree is the same in both plans;
* true step-time loss: Σ true time of the perturbed plans / Σ true time of the true plans − 1.

Rows: ``robust_tol = 0`` (the default planner) and the robust choice (``robust_tol > 0``, see
:func:`fcp_data.plan.solvers.fcp_micro_batch`).

    .venv/bin/python benchmarks/bench_plan_robustness.py --quick
    .venv/bin/python benchmarks/bench_plan_robustness.py --batches 12 --trials 8
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fcp_data.cost import CostModel  # noqa: E402
from fcp_data.plan.microbatch import plan_micro_batches  # noqa: E402
from fcp_data.plan.placement import placed_times  # noqa: E402
from fcp_data.plan.solvers import fcp_micro_batch  # noqa: E402
from fcp_data.presets import preset_cost_model  # noqa: E402
from fcp_data.workloads import apply_cap, draw_batches, load_lengths  # noqa: E402

NOISY = ("alpha1", "alpha2", "alpha3", "beta1", "beta2", "bandwidth_intra", "bandwidth_inter", "gamma", "alpha_blk",
         "alpha_vis")
RANKS = 64
CAP = 131072


def perturb(cm: CostModel, eps: float, rng: np.random.Generator) -> CostModel:
    """Each coefficient times its own factor, uniform in ``[1−ε, 1+ε]`` (zeros stay zero)."""
    return cm.replace(**{k: getattr(cm, k) * float(rng.uniform(1 - eps, 1 + eps)) for k in NOISY})


def plan(lengths: np.ndarray, cm: CostModel, robust_tol: float) -> list:
    """FCP with ``micro_batches="auto"``; the micro-batches as lists of ``(ranks, seq_ids)``."""
    etas = np.zeros(lengths.size)

    def solve_one(ids, left=1):
        return fcp_micro_batch(lengths[ids], etas[ids], RANKS, cm, robust_tol=robust_tol), None

    mbs, _ = plan_micro_batches(lengths, etas, RANKS, cm, solve_one, "auto")
    return [[(g.ranks, g.seq_ids) for g in mb.groups] for mb in mbs]


def true_time(mbs: list, lengths: np.ndarray, cm: CostModel) -> float:
    """Σ over micro-batches of the slowest group's time under ``cm`` on its real ranks."""
    total = 0.0
    for groups in mbs:
        s = [lengths[list(ids)].astype(np.float64) for _, ids in groups]
        S = np.array([x.sum() for x in s])
        Q = np.array([(x * x).sum() for x in s])
        total += float(placed_times(S, Q, [r for r, _ in groups], cm, S, np.zeros_like(S)).max())
    return total


def degrees(mbs: list, n: int) -> np.ndarray:
    """CP degree of each sequence."""
    out = np.zeros(n, dtype=np.int64)
    for groups in mbs:
        for ranks, ids in groups:
            out[list(ids)] = len(ranks)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default=str(REPO.parent / "shared" / "workloads" / "wikipedia_flexsp.txt"))
    ap.add_argument("--batches", type=int, default=8, help="global batches of 512")
    ap.add_argument("--trials", type=int, default=4, help="perturbations per batch and noise level")
    ap.add_argument("--noise", default="0.05,0.1,0.2,0.5", help="noise levels ε (comma-separated)")
    ap.add_argument("--robust-tol", type=float, default=0.01, help="tolerance of the robust choice")
    ap.add_argument("--models", choices=("v1", "v2", "both"), default="both")
    ap.add_argument("--quick", action="store_true", help="3 batches, 2 trials")
    args = ap.parse_args(argv)
    try:
        noise = [float(x) for x in args.noise.split(",")]
        raw = load_lengths(args.workload)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.batches < 1 or args.trials < 1 or not all(0 <= e < 1 for e in noise) or args.robust_tol < 0:
        print("error: --batches/--trials must be >= 1, noise levels in [0, 1), --robust-tol >= 0", file=sys.stderr)
        return 2
    batches, trials = (3, 2) if args.quick else (args.batches, args.trials)
    pool, _ = apply_cap(raw, CAP, "truncate")
    draws = [pool[ids] for ids in draw_batches(pool.size, 512, batches, 0)]
    for v2 in {"v1": (False,), "v2": (True,), "both": (False, True)}[args.models]:
        true_cm = preset_cost_model("Qwen3-8B", "ascend-910c", v2=v2)
        print(f"\n### Robustness to coefficient noise: Wikipedia GBS 512, 64 ranks, Qwen3-8B / ascend-910c, cost model "
              f"{'v2' if v2 else 'v1'} ({batches} batches × {trials} trials, load average {os.getloadavg()[0]:.1f})\n")
        print("| noise ±ε | choice | degree match | true step-time loss |")
        print("|---:|---|---:|---:|")
        ref = [plan(L, true_cm, 0.0) for L in draws]
        ref_t = sum(true_time(p, L, true_cm) for p, L in zip(ref, draws))
        for eps in noise:
            for tol in (0.0, args.robust_tol):
                rng = np.random.default_rng(int(eps * 1000) + 7)
                match, got_t, n = 0, 0.0, 0
                for _ in range(trials):
                    for L, p0 in zip(draws, ref):
                        p = plan(L, perturb(true_cm, eps, rng), tol)
                        match += int((degrees(p, L.size) == degrees(p0, L.size)).sum())
                        n += L.size
                        got_t += true_time(p, L, true_cm)
                label = "default" if tol == 0 else f"robust {tol:g}"
                print(f"| {eps * 100:.0f} % | {label} | {match / n * 100:.1f} % | {(got_t / (ref_t * trials) - 1) * 100:+.2f} % |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
