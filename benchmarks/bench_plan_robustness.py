"""Robustness of FCP's plans to profiling error (issue 12; the FCP paper's Tables 4-5). Markdown tables.

Setup: Wikipedia lengths (``/work/shared/workloads/wikipedia_flexsp.txt``, capped at 128K tokens, truncated),
global batches of 512 drawn as ``fcp simulate`` does (``draw_batches``, seed 0), 64 ranks, Qwen3-8B on
ascend-910c (v1 or v2 preset terms, explicit), ``micro_batches="auto"``. For each noise level ``ε`` and
trial, every cost coefficient (alpha1-3, beta1-2, both bandwidths, and the v2 gamma/alpha_blk/alpha_vis) is
multiplied by its own factor drawn uniformly in ``[1−ε, 1+ε]``; FCP plans with the perturbed model, and the
chosen plan is evaluated under the true coefficients (each group's §4/§4.1 time on its real ranks,
micro-batches summed). Every choice sees the same perturbations (paired). Reported against the plan the
default planner makes with the true coefficients:

* degree match: share of sequences whose CP degree is the same in both plans;
* true step-time loss: Σ true time of the perturbed plans / Σ true time of the true plans − 1, ± one standard
  error over the (batch, trial) pairs;
* M changed: share of (batch, trial) pairs whose micro-batch count differs from the true plan's.

Rows: ``robust_tol = 0`` (the default planner) and the robust choice (``robust_tol > 0``,
:mod:`fcp_data.plan.robust`). ``--explain`` prints, for the worst pairs of the default planner, what flipped
(M, group count, the widest rings) and the loss each coefficient's error causes alone.

    .venv/bin/python benchmarks/bench_plan_robustness.py --quick
    .venv/bin/python benchmarks/bench_plan_robustness.py --batches 12 --trials 4 --noise 0.2,0.5
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _args import (WIKIPEDIA, existing_file, fraction_list, parser, positive_float_list,  # noqa: E402
                   positive_int, run)
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


def factors(eps: float, rng: np.random.Generator) -> dict[str, float]:
    """One factor per coefficient, uniform in ``[1−ε, 1+ε]``."""
    return {k: float(rng.uniform(1 - eps, 1 + eps)) for k in NOISY}


def perturb(cm: CostModel, eps: float, rng: np.random.Generator) -> CostModel:
    """Each coefficient times its own factor, uniform in ``[1−ε, 1+ε]`` (zeros stay zero)."""
    return scaled(cm, factors(eps, rng))


def scaled(cm: CostModel, f: dict[str, float]) -> CostModel:
    """``cm`` with the coefficients of ``f`` multiplied by their factors."""
    return cm.replace(**{k: getattr(cm, k) * x for k, x in f.items()})


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


def shape(mbs: list) -> str:
    """``M``, the group count and the five widest rings of a plan."""
    d = sorted((len(r) for groups in mbs for r, _ in groups), reverse=True)
    return f"M={len(mbs)}, {len(d)} groups, widest {d[:5]}"


def explain(draws: list, ref: list, true_cm: CostModel, eps: float, trials: int, worst: int = 5) -> None:
    """The ``worst`` (batch, trial) pairs of the default planner at noise ``eps``: what flipped, and the true
    loss of planning with each coefficient's error alone (the others exact)."""
    rng = np.random.default_rng(int(eps * 1000) + 7)
    ref_t = [true_time(p, L, true_cm) for p, L in zip(ref, draws)]
    rows = []
    for t in range(trials):
        for i, L in enumerate(draws):
            f = factors(eps, rng)
            p = plan(L, scaled(true_cm, f), 0.0)
            rows.append((true_time(p, L, true_cm) / ref_t[i] - 1, t, i, f, p))
    rows.sort(key=lambda r: -r[0])
    print(f"\nWorst pairs at ±{eps * 100:.0f} % (default planner):\n")
    for loss, t, i, f, p in rows[:worst]:
        alone = {k: true_time(plan(draws[i], scaled(true_cm, {k: f[k]}), 0.0), draws[i], true_cm) / ref_t[i] - 1
                 for k in NOISY if getattr(true_cm, k)}
        big = ", ".join(f"{k} ×{f[k]:.2f}: {v * 100:+.2f} %" for k, v in sorted(alone.items(), key=lambda kv: -kv[1])
                        if abs(v) >= 5e-4)
        print(f"- batch {i}, trial {t}: {loss * 100:+.2f} %; true plan {shape(ref[i])}; perturbed {shape(p)}; "
              f"one coefficient alone: {big or 'none ≥ 0.05 %'}")


def measure(draws: list, ref: list, true_cm: CostModel, eps: float, tol: float, trials: int) -> str:
    """One table row: degree match, true step-time loss ± standard error, share of pairs whose M changed."""
    rng = np.random.default_rng(int(eps * 1000) + 7)  # the same perturbations for every choice
    ref_t = np.array([true_time(p, L, true_cm) for p, L in zip(ref, draws)])
    match = n = m_changed = 0
    diffs = []
    for _ in range(trials):
        for L, p0, t0 in zip(draws, ref, ref_t):
            p = plan(L, perturb(true_cm, eps, rng), tol)
            match += int((degrees(p, L.size) == degrees(p0, L.size)).sum())
            n += L.size
            m_changed += int(len(p) != len(p0))
            diffs.append(true_time(p, L, true_cm) - t0)
    d = np.array(diffs)
    scale = ref_t.sum() * trials
    loss, se = d.sum() / scale, d.std(ddof=1) * np.sqrt(d.size) / scale if d.size > 1 else 0.0
    label = "default" if tol == 0 else f"robust {tol:g}"
    return (f"| {eps * 100:.0f} % | {label} | {match / n * 100:.1f} % | {loss * 100:+.2f} % ± {se * 100:.2f} | "
            f"{m_changed / len(diffs) * 100:.0f} % |")


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--workload", type=existing_file, default=str(WIKIPEDIA),
                    help="one sequence length per line (default: ../shared/workloads/wikipedia_flexsp.txt next to "
                         "the repository)")
    ap.add_argument("--batches", type=positive_int, default=12, help="global batches of 512")
    ap.add_argument("--trials", type=positive_int, default=4, help="perturbations per batch and noise level")
    ap.add_argument("--noise", type=fraction_list, default="0.05,0.2,0.5",
                    help="noise levels ε (comma-separated, each in [0, 1))")
    ap.add_argument("--robust-tol", type=positive_float_list, default="0.01",
                    help="tolerances of the robust choice (comma-separated, each > 0)")
    ap.add_argument("--models", choices=("v1", "v2", "both"), default="both", help="cost-model terms of the preset")
    ap.add_argument("--explain", action="store_true", help="also print the worst pairs and what flipped")
    ap.add_argument("--quick", action="store_true", help="3 batches, 2 trials")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    noise, tols = args.noise, args.robust_tol
    raw = load_lengths(args.workload)
    batches, trials = (3, 2) if args.quick else (args.batches, args.trials)
    pool, _ = apply_cap(raw, CAP, "truncate")
    draws = [pool[ids] for ids in draw_batches(pool.size, 512, batches, 0)]
    for v2 in {"v1": (False,), "v2": (True,), "both": (False, True)}[args.models]:
        true_cm = preset_cost_model("Qwen3-8B", "ascend-910c", v2=v2)
        print(f"\n### Robustness to coefficient noise: Wikipedia GBS 512, 64 ranks, Qwen3-8B / ascend-910c, cost model "
              f"{'v2' if v2 else 'v1'} ({batches} batches × {trials} trials, load average {os.getloadavg()[0]:.1f})\n")
        print("| noise ±ε | choice | degree match | true step-time loss ± s.e. | M changed |")
        print("|---:|---|---:|---:|---:|")
        ref = [plan(L, true_cm, 0.0) for L in draws]
        for eps in noise:
            for tol in [0.0] + tols:
                print(measure(draws, ref, true_cm, eps, tol, trials), flush=True)
        if args.explain:
            for eps in noise:
                explain(draws, ref, true_cm, eps, trials)
    return 0


if __name__ == "__main__":
    run(main)
