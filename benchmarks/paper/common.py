"""Shared pieces of the paper-replication evaluation (benchmarks/paper/run_all.py).

Every experiment plans the same drawn global batches with every system through
:func:`fcp_data.plan.plan_batch` (the computation behind ``fcp simulate``) on a preset cost model — cost model
v2 (DESIGN §4.1, the preset default) everywhere except the v1-vs-v2 comparison tables, which build v1 with
``v2=False`` — and reports mean step time (sum of micro-batch makespans) and speedups measured side by side in
one run, each FCP time next to the §4.1 lower bound (:func:`lower_bound`).
"""

from __future__ import annotations

import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch
from fcp_data.presets import HARDWARE, MODELS, model_heads, preset_cost_model

__all__ = ["REPO", "SIM_SYSTEMS", "LABELS", "Ctx", "Section", "SystemResult", "machine_info", "simulate_cell",
           "plan_systems", "lower_bound", "md_table", "fmt_s", "fmt_x", "vision_alpha2", "batch_pool_draws", "plt"]

REPO = Path(__file__).resolve().parents[2]
SIM_SYSTEMS = ("fcp", "static-cp", "ulysses", "megatron-dynamic", "fcp-pow2")
LABELS = {"fcp": "FCP", "static-cp": "static CP (fixed d)", "static-cp-batch": "static CP (per-batch d)",
          "ulysses": "Ulysses (fixed d)", "megatron-dynamic": "Megatron dyn-CP", "fcp-pow2": "FCP-pow2"}


def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as p

    return p


@dataclass
class Ctx:
    """Run settings shared by the experiments; ``violations`` collects every cell where FCP is slower."""

    workload_dir: Path
    figures: Path
    seed: int
    steps: int
    video_steps: int
    quick: bool
    bar: Any = None
    violations: list[str] = field(default_factory=list)
    configured: dict = field(default_factory=dict)  # (workload, model) -> fixed degrees simulate chose
    vpools: dict | None = None

    def tick(self, n: int = 1, what: str = "") -> None:
        if self.bar is not None:
            if what:
                self.bar.set_postfix_str(what[:40], refresh=False)
            self.bar.update(n)

    def wikipedia(self) -> np.ndarray:
        p = self.workload_dir / "wikipedia_flexsp.txt"
        if not p.exists():
            raise FileNotFoundError(f"{p} not found: pass --workload-dir pointing at the shared workloads folder")
        if not hasattr(self, "_wiki"):
            self._wiki = np.loadtxt(p, dtype=np.int64)
        return self._wiki


@dataclass
class Section:
    """A report section; ``summary`` rows ``[experiment, paper, ours]`` go to the headline table."""

    title: str
    body: str
    summary: list = field(default_factory=list)


@dataclass
class SystemResult:
    steps: list[float] = field(default_factory=list)
    solve_ms: list[float] = field(default_factory=list)
    micro_batches: list[int] = field(default_factory=list)
    plans: list[Any] = field(default_factory=list)
    lower_bound: list[float] = field(default_factory=list)

    @property
    def lb_gap(self) -> float:
        """Mean step time over the mean §4 lower bound, minus 1 (0 = provably optimal)."""
        return self.mean / float(np.mean(self.lower_bound)) - 1.0 if self.lower_bound else math.nan

    @property
    def mean(self) -> float:
        return float(np.mean(self.steps)) if self.steps else math.nan


def machine_info() -> dict[str, str]:
    def sh(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=REPO).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    model = ""
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    return {"cpu": model or platform.processor(), "nproc": sh(["nproc"]) or str(os.cpu_count()),
            "python": platform.python_version(), "numpy": np.__version__, "os": platform.platform(),
            "commit": sh(["git", "rev-parse", "--short", "HEAD"]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def _opts(model: str, solver: str) -> dict[str, int]:
    if solver.startswith("ulysses"):
        h, kv = model_heads(model)
        return {"num_heads": h, "num_kv_heads": kv}
    return {}


def _check(ctx: Ctx | None, label: str, out: dict[str, SystemResult]) -> None:
    """Record every system whose mean step time beats FCP's (FCP must never be slower)."""
    if ctx is None or "fcp" not in out:
        return
    for s, r in out.items():
        if s != "fcp" and out["fcp"].mean > r.mean * (1 + 1e-9):
            ctx.violations.append(f"{label}: FCP {out['fcp'].mean:.4f} s > {LABELS.get(s, s)} {r.mean:.4f} s "
                                  f"({(out['fcp'].mean / r.mean - 1) * 100:.2f} % slower)")


def simulate_cell(pool: np.ndarray, *, model: str, cost_model: CostModel, num_ranks: int, gbs: int, steps: int,
                  seed: int, ctx: Ctx | None = None, label: str = "", oracle: bool = True,
                  systems=SIM_SYSTEMS, visual: np.ndarray | None = None
                  ) -> tuple[dict[str, SystemResult], dict[str, int | None]]:
    """One cell = ``fcp simulate`` (:func:`fcp_data.plan.simulate.simulate`) on ``pool``: the same
    ``draw_batches`` batches for every system, ``plan_batch(..., micro_batches="auto")``, and
    ``static-cp``/``ulysses`` at the single degree with the best total over the run.
    ``oracle`` adds ``static-cp-batch``: static CP re-choosing its degree for every micro-batch. ``visual``:
    visual tokens per pool sequence (§4.1), given to every system and to the lower bound."""
    from fcp_data.plan.simulate import simulate
    from fcp_data.workloads import draw_batches

    times, _, fixed = simulate(pool, num_ranks=num_ranks, cost_model=cost_model, global_batch_size=gbs, steps=steps,
                               seed=seed, solvers=list(systems), options={"ulysses": _opts(model, "ulysses")},
                               visual=visual)
    out = {name: SystemResult(steps=list(times[name])) for name in systems}
    out["fcp"].lower_bound = [lower_bound(pool[ids], num_ranks, cost_model, visual=None if visual is None else visual[ids])
                              for ids in draw_batches(pool.size, gbs, steps, seed)]
    if oracle:
        out["static-cp-batch"] = SystemResult(steps=[
            plan_batch(pool[ids], num_ranks=num_ranks, cost_model=cost_model, solver="static-cp", micro_batches="auto",
                       visual=None if visual is None else visual[ids]).makespan
            for ids in draw_batches(pool.size, gbs, steps, seed)])
    _check(ctx, label, out)
    if ctx is not None:
        ctx.tick(steps, label)
    return out, fixed


def lower_bound(lengths: np.ndarray, num_ranks: int, cm: CostModel, etas: np.ndarray | None = None,
                visual: np.ndarray | None = None) -> float:
    """A §4/§4.1 lower bound on any plan's step time.

    v1 (§4): every group pays ``C = work/d + beta1`` at least, so a micro-batch takes ≥ its work / N + beta1,
    and a step ≥ ``Σ(alpha1·(1+η)s² + alpha2·s) / N + M·beta1`` with ``M = ⌈Σs / (N·E)⌉`` the fewest
    micro-batches memory allows.

    v2 (§4.1, when ``cm`` has gamma/alpha_blk/alpha_vis): a group's time is at least each member's time alone on
    the same degree, ``t_k(d) = T(s_k, q_k, d, B=b_k, V=v_k)`` at intra-node bandwidth while ``d ≤ ranks_per_node``
    and inter-node above (a wider group must span nodes; T is non-decreasing in S, Q, B, V, the KV time, and T ≥ C), so a step of time τ puts sequence ``k`` on a degree of at least ``d_k(τ) = min{d ≥ ⌈s_k/E⌉ :
    t_k(d) ≤ τ}`` (and τ ≥ ``max_k min_d t_k(d)``, the critical path). Rank-seconds: a group of degree d spends
    ``d·C ≥ Σ_k(alpha1·q_k + alpha2·s_k + alpha_vis·v_k) + d·alpha_blk·Σ_k b_k`` (``alpha_blk`` does not shrink with
    d), so τ ≥ ``area(τ) = Σ_k(alpha1·q_k + alpha2·s_k + alpha_vis·v_k + d_k(τ)·alpha_blk·b_k)/N + M·beta1``.
    ``area`` does not increase with τ; the bound is the smallest τ ≥ the critical path with τ ≥ area(τ), found by
    bisection (the returned value is the infeasible end, so it stays a bound). ``gamma`` (shared by a group) enters
    only through ``t_k``.
    """
    s = np.asarray(lengths, dtype=np.float64)
    e = np.zeros_like(s) if etas is None else np.asarray(etas, dtype=np.float64)
    m = max(1, math.ceil(s.sum() / (num_ranks * cm.tokens_per_rank)))
    area = cm.alpha1 * ((1 + e) * s * s).sum() + cm.alpha2 * s.sum()
    if not cm.is_v2:
        return float(area / num_ranks + m * cm.beta1)
    v = np.zeros_like(s) if visual is None else np.asarray(visual, dtype=np.float64)
    b = (1 + e) * s
    dk = np.maximum(1.0, np.ceil(s / cm.tokens_per_rank))
    fixed = (area + cm.alpha_vis * v.sum()) / num_ranks + m * cm.beta1
    d = np.arange(1, num_ranks + 1, dtype=np.float64)[None, :]
    t = cm.time(s[:, None], (b * s)[:, None], d, intra=d <= cm.ranks_per_node, B=b[:, None], V=v[:, None])
    t = np.where(d >= dk[:, None], t, np.inf)
    crit = float(t.min(axis=1).max())

    def excess(tau: float) -> float:  # area(tau) - tau; decreasing in tau
        deg = np.argmax(t <= tau, axis=1) + 1.0  # smallest degree meeting tau (exists for tau >= crit)
        return fixed + cm.alpha_blk * float((deg * b).sum()) / num_ranks - tau

    if excess(crit) <= 0:
        return crit
    lo, hi = crit, crit + excess(crit)  # area(hi) <= area(crit) = hi, so hi is feasible
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return float(lo)


def plan_systems(batches: list[np.ndarray], *, model: str, cost_model: CostModel, num_ranks: int,
                 systems=SIM_SYSTEMS, ctx: Ctx | None = None, label: str = "", fixed: dict[str, int] | None = None,
                 visual: list[np.ndarray] | None = None) -> dict[str, SystemResult]:
    """Plan explicit batches with every system (``micro_batches='auto'``), keeping the plans. ``fixed``
    pins a degree (``{"static-cp": 8}``); without it static-cp/ulysses choose per micro-batch. A system
    that cannot plan a batch raises — nothing is silently skipped. ``visual``: visual tokens per batch (§4.1).
    FCP's result also holds the §4.1 lower bound of every batch (``lower_bound``)."""
    out = {s: SystemResult() for s in systems}
    for i_b, b in enumerate(batches):
        for s in systems:
            opts = dict(_opts(model, s))
            if fixed and fixed.get(s) is not None:
                opts["degree"] = fixed[s]
            t0 = time.perf_counter()
            p = plan_batch(b, num_ranks=num_ranks, cost_model=cost_model, solver=s, micro_batches="auto",
                           visual=None if visual is None else visual[i_b], **opts)
            r = out[s]
            r.steps.append(p.makespan)
            r.solve_ms.append((time.perf_counter() - t0) * 1e3)
            r.micro_batches.append(len(p.micro_batches))
            r.plans.append(p)
        if "fcp" in out:
            out["fcp"].lower_bound.append(lower_bound(b, num_ranks, cost_model,
                                                      visual=None if visual is None else visual[i_b]))
        if ctx is not None:
            ctx.tick(1, label)
    _check(ctx, label, out)
    return out


def vision_alpha2(model: str, hardware: str, *, frozen: bool, visual_fraction: float) -> CostModel:
    """The **v1** preset of an MLLM with its vision encoder's compute folded into ``alpha2`` (a documented
    ``preset_cost_model`` override): how video cells were modelled before §4.1, kept for the v1-vs-v2
    comparison tables only (the v2 cells use ``alpha_vis`` and the visual tokens instead).

    The v1 presets charge the vision encoder for memory only. Per LLM visual token the encoder sees 4 patches
    (2×2 merge for Qwen3-VL; pixel-shuffle 0.5 for InternVL: 1024 patches → 256 tokens), each costing
    ``2·P_vit`` forward FLOPs (within-frame ViT attention omitted). Each CP rank encodes the frames whose
    tokens it holds, so the cost scales with ``S/d`` like ``alpha2``. Unfrozen: forward + backward +
    recompute = the LLM's training factor 4; frozen: forward only (factor 1: no backward through the
    encoder, no recompute). ``alpha2 += visual_fraction · factor · 8·P_vit / (peak · linear_efficiency)``.
    The frozen encoder's smaller optimizer state would raise ``tokens_per_rank`` slightly; not modelled.
    """
    base = preset_cost_model(model, hardware, v2=False)
    m, hw = MODELS[model], HARDWARE[hardware]
    factor = 1.0 if frozen else 4.0
    extra = visual_fraction * factor * 8.0 * m.vision_params / (hw.peak_flops * hw.linear_efficiency)
    return preset_cost_model(model, hardware, v2=False, alpha2=base.alpha2 + extra)


def batch_pool_draws(pool: np.ndarray, gbs: int, steps: int, seed: int) -> list[np.ndarray]:
    """``steps`` global batches of ``gbs`` lengths drawn uniformly with replacement from ``pool``."""
    rng = np.random.default_rng(seed)
    return [pool[rng.integers(0, pool.size, gbs)] for _ in range(steps)]


def speedup_bars(ax, labels: list[str], cols, values: dict[str, list[float]], *, title: str, fontsize: int = 7,
                 rotation: int = 30, title_size: int | None = None) -> None:
    """One panel of grouped bars: FCP's speedup over each baseline of ``cols`` at every x label (``values[c]``,
    one per label), with the 1.0 line."""
    x = np.arange(len(labels))
    w = 0.8 / len(cols)
    for i, c in enumerate(cols):
        ax.bar(x + (i - len(cols) / 2 + 0.5) * w, values[c], w, label=LABELS[c])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylim(bottom=0.8)
    ax.set_xticks(x, labels, rotation=rotation, ha="right", fontsize=fontsize)
    ax.set_title(title, **({} if title_size is None else {"fontsize": title_size}))


def save_figure(ctx: "Ctx", fig, name: str) -> str:
    """Write ``fig`` to the report's figures folder and close it; returns ``name``."""
    fig.tight_layout()
    fig.savefig(ctx.figures / name, dpi=110)
    plt().close(fig)
    return name


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt_s(x: float) -> str:
    return f"{x:.3f}" if x >= 0.1 else f"{x * 1e3:.1f} ms"


def fmt_x(x: float) -> str:
    return f"{x:.2f}×"
