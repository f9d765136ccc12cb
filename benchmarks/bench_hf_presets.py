"""What a preset that knows the model's architecture changes in the plans (``fcp_data.hf_config``). Markdown table.

Before, a user training gpt-oss, Gemma 2 or a MoE model with fcp had the dense presets only: every layer charged
full attention and every expert's FLOPs. This plans Wikipedia global batches (``wikipedia_flexsp.txt``, capped at
128K tokens, truncated; GBS 512, ``draw_batches`` seed 0, ``micro_batches="auto"``) on 64 H100s (8 per node) for
models from ``fcp_data.hf_config.HF_PRESETS`` three ways and evaluates every plan under the architecture-aware
model:

* **aware**: the preset from the model's config (windowed layers' attention linear, ``top-k`` experts' FLOPs);
* **no windows**: the same model with every layer charged full attention (the dense presets' assumption);
* **all experts**: the same model with every expert's FLOPs per token (a dense model of the MoE's total size).

Evaluation ("exact windows"): the aware model, with each windowed layer charged the (query, key) pairs its mask
really has (``Σ_i min(i+1, w)``, where the preset charges ``w·s``: exact for documents much longer than the
window, an over-charge below it), so the aware plan is not graded by its own approximation. Loss = Σ step time of
the plan / Σ step time of the aware plan − 1. Also FCP's speedup over static CP (best fixed degree) and FCP-pow2
under the aware model (``fcp_data.plan.simulate``, what ``fcp simulate --preset NAME --shard-weights`` prints).

    .venv/bin/python benchmarks/bench_hf_presets.py            # 20 batches
    .venv/bin/python benchmarks/bench_hf_presets.py --steps 5  # quick
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _args  # noqa: E402
from _args import WIKIPEDIA, existing_file, names, parser, positive_int  # noqa: E402
from fcp_data.hf_config import HF_PRESETS, hf_model_config  # noqa: E402
from fcp_data.plan.microbatch import plan_micro_batches  # noqa: E402
from fcp_data.plan.placement import placed_times  # noqa: E402
from fcp_data.plan.simulate import simulate  # noqa: E402
from fcp_data.plan.solvers import fcp_micro_batch  # noqa: E402
from fcp_data.presets import HARDWARE, preset_cost_model  # noqa: E402
from fcp_data.workloads import apply_cap, draw_batches, load_lengths  # noqa: E402

RANKS, CAP, HW = 64, 131072, "h100"
MODELS = ("gpt-oss-20b", "gpt-oss-120b", "Gemma-2-9B", "Qwen3-30B-A3B", "Mixtral-8x7B")


def variants(name: str) -> dict[str, object]:
    """The aware ModelConfig and the blind ones that apply to it."""
    m = hf_model_config(HF_PRESETS[name])
    out = {"aware": m}
    if m.window_layers:
        out["no windows"] = dataclasses.replace(m, window=0, window_layers=0)
    if m.stored_params > m.active_params * 1.5:
        # stored = every layer + LM head + input embedding (the MoE presets are untied): all but the embedding
        out["all experts"] = dataclasses.replace(m, active_params=m.stored_params - m.hidden * m.vocab)
    return out


def plan(lengths: np.ndarray, cm) -> list:
    etas = np.zeros(lengths.size)

    def solve_one(ids, left=1):
        return fcp_micro_batch(lengths[ids], etas[ids], RANKS, cm), None

    mbs, _ = plan_micro_batches(lengths, etas, RANKS, cm, solve_one, "auto")
    return [[(g.ranks, g.seq_ids) for g in mb.groups] for mb in mbs]


def window_pairs(s: np.ndarray, w: int) -> np.ndarray:
    """Causal (query, key) pairs of a sliding window of ``w`` keys: Σ_i min(i+1, w)."""
    s = s.astype(np.float64)
    short = s * (s + 1) / 2
    long_ = w * (w + 1) / 2 + (s - w) * w
    return np.where(s <= w, short, long_)


def exact_time(mbs: list, lengths: np.ndarray, cm, m, per_layer: float) -> float:
    """Σ over micro-batches of the slowest group under ``cm``, each windowed layer charged its exact pairs."""
    total = 0.0
    for groups in mbs:
        s = [lengths[list(ids)].astype(np.float64) for _, ids in groups]
        S = np.array([x.sum() for x in s])
        Q = np.array([(x * x).sum() for x in s])
        t = placed_times(S, Q, [r for r, _ in groups], cm, S, np.zeros_like(S))
        if m.window_layers:  # the preset charged 2·w·s per windowed layer (in s² units); the mask has 2·pairs
            fix = np.array([(2 * window_pairs(x, m.window) - 2 * m.window * x).sum() for x in s])
            t = t + per_layer * m.window_layers * fix / np.array([len(r) for r, _ in groups])
        total += float(t.max())
    return total


def run(name: str, lengths: np.ndarray, batches: list) -> list[str]:
    vs = variants(name)
    aware_m = vs["aware"]
    shard = True
    models = {k: preset_cost_model(v, HW, shard_weights=shard) for k, v in vs.items()}
    aware = models["aware"]
    hw = HARDWARE[HW]
    per_layer = 4.0 * 2.0 * aware_m.heads * aware_m.head_dim / (hw.peak_flops * hw.attention_efficiency)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    for k, cm in models.items():
        times[k] = sum(exact_time(plan(lengths[ids], cm), lengths[ids], aware, aware_m, per_layer) for ids in batches)
    sim, _, _ = simulate(lengths, num_ranks=RANKS, cost_model=aware, global_batch_size=512, steps=len(batches), seed=0,
                         solvers=["fcp", "static-cp", "fcp-pow2"])
    mean = {k: float(np.mean(v)) for k, v in sim.items()}
    blind = "; ".join(f"{k} {times[k] / len(batches):.3f} s ({times[k] / times['aware'] - 1:+.1%})"
                      for k in times if k != "aware")
    return [f"| {name} | {aware_m.window or '—'}×{aware_m.window_layers}/{aware_m.layers} | "
            f"{aware_m.matmul_params / 1e9:.2f} / {aware_m.total_params / 1e9:.1f}B | {aware.tokens_per_rank} | "
            f"{times['aware'] / len(batches):.3f} s | {blind or '—'} | "
            f"{mean['static-cp'] / mean['fcp']:.3f}× / {mean['fcp-pow2'] / mean['fcp']:.3f}× | "
            f"{time.perf_counter() - t0:.0f} s |"]


def build_parser():
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=positive_int, default=20, help="global batches per model (default 20)")
    ap.add_argument("--models", type=names(HF_PRESETS, "model (fcp_data.hf_config.HF_PRESETS)"),
                    default=",".join(MODELS), help=f"comma-separated HF_PRESETS names (default {','.join(MODELS)})")
    ap.add_argument("--workload", type=existing_file, default=str(WIKIPEDIA),
                    help="one sequence length per line (default: ../shared/workloads/wikipedia_flexsp.txt next to "
                         "the repository)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    lengths, _ = apply_cap(load_lengths(args.workload), CAP, "truncate")
    batches = draw_batches(len(lengths), 512, args.steps, 0)
    print(f"Wikipedia GBS 512, {args.steps} batches, {RANKS} × {HW} (8 per node), weights sharded (FSDP2), "
          "micro_batches=auto; step times evaluated with exact window pairs\n")
    print("| model | window × windowed/all layers | params per token / total | tokens per rank | aware: step | "
          "blind preset: step (loss) | FCP vs static CP / FCP-pow2 | CPU |")
    print("|---|---|---|---:|---:|---|---|---:|")
    for name in args.models:
        for line in run(name, lengths, batches):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    _args.run(main)
