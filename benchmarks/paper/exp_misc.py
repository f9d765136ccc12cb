"""Overheads (Tables 1–2), robustness (Tables 4–5), extreme heterogeneity, and beyond the paper — all on the v2
presets (DESIGN §4.1)."""

from __future__ import annotations

import json
import time

import numpy as np

from common import Ctx, Section, batch_pool_draws, fmt_x, md_table, plan_systems, plt
from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch
from fcp_data.presets import preset_cost_model
from workload_models import apply_cap

__all__ = ["run_overheads", "run_robustness", "run_extreme", "run_beyond", "true_step_time"]

MODEL, HARDWARE, CAP = "Qwen3-8B", "ascend-910c", 128 * 1024
NOISE_KEYS = ("alpha1", "alpha2", "alpha3", "beta1", "beta2", "bandwidth_intra", "bandwidth_inter", "gamma", "alpha_blk")


def _wiki(ctx: Ctx, cap: int | None = CAP) -> np.ndarray:
    return apply_cap(ctx.wikipedia(), cap, "truncate")


def run_overheads(ctx: Ctx, reps: int = 5) -> Section:
    """Solver time (``plan_batch`` wall time: micro-batch split, stage 1, stage 2, placement) and total
    scheduling time (+ drawing the batch and serialising the plan to §6 JSON, what a sampler would ship)."""
    cm = preset_cost_model(MODEL, HARDWARE, v2=True)
    pool = _wiki(ctx)
    rows = []
    for gbs, ranks in ((128, 64), (256, 64), (512, 64), (512, 16), (512, 32)):
        solve, total = [], []
        rng = np.random.default_rng(ctx.seed + gbs + ranks)
        for _ in range(reps):
            t0 = time.perf_counter()
            b = pool[rng.integers(0, pool.size, gbs)]
            t1 = time.perf_counter()
            p = plan_batch(b, num_ranks=ranks, cost_model=cm, solver="fcp", micro_batches="auto")
            t2 = time.perf_counter()
            json.dumps(p.to_dict())
            t3 = time.perf_counter()
            solve.append((t2 - t1) * 1e3)
            total.append((t3 - t0) * 1e3)
            ctx.tick(1, f"overheads {gbs}/{ranks}")
        rows.append([gbs, ranks, f"{np.median(solve):.1f}", f"{max(solve):.1f}", f"{np.median(total):.1f}"])
    body = f"""FCP planning latency on this machine for Wikipedia batches (128K cap, truncation), {MODEL} on {HARDWARE},
`micro_batches="auto"`, median of {reps} batches (seeded). "Solver" = `plan_batch` (micro-batch split, BFD, exact
degree allocation over several bin units and power-of-two masks, node-aware placement, and the static-CP /
Megatron-dynamic plans it also evaluates so it is never worse than them). "Total" adds drawing the batch and
serialising the plan to §6 JSON. The paper's total scheduling time also covers its data pipeline on NPU hosts, so
only the solver columns compare like for like.

{md_table(["GBS", "ranks", "solver median ms", "solver max ms", "total median ms"], rows)}

Paper (Tables 1–2): solver 23–86 ms, total scheduling 282–905 ms over the same GBS / device grid.
"""
    med = [float(r[2]) for r in rows]
    tot = [float(r[4]) for r in rows]
    return Section("Overheads — the paper's Tables 1–2", body,
                   [["Tables 1–2 solver / total scheduling time (GBS 128–512, 16–64 ranks)", "23–86 ms / 282–905 ms",
                     f"{min(med):.0f}–{max(med):.0f} ms / {min(tot):.0f}–{max(tot):.0f} ms (median, this 2-core CPU)"]])


def true_step_time(plan, lengths: np.ndarray, cm: CostModel) -> float:
    """A plan's step time re-evaluated under ``cm`` on its own placement (§4, group by group)."""
    total = 0.0
    for mb in plan.micro_batches:
        total += max(cm.group_time(lengths[list(g.seq_ids)], ranks=g.ranks) for g in mb.groups)
    return total


def _degrees(plan, n: int) -> np.ndarray:
    d = np.zeros(n, dtype=np.int64)
    for mb in plan.micro_batches:
        for g in mb.groups:
            d[list(g.seq_ids)] = g.degree
    return d


def run_robustness(ctx: Ctx, trials: int = 4) -> Section:
    cm = preset_cost_model(MODEL, HARDWARE, v2=True)
    rows, stats = [], {}
    for wname, pool in (("wikipedia", _wiki(ctx)), ("github", None)):
        if pool is None:
            from workload_models import TEXT_WORKLOADS

            pool = TEXT_WORKLOADS["github"].sample(200_000, seed=ctx.seed + 102, cap=CAP)
        batches = batch_pool_draws(pool, 512, ctx.steps, ctx.seed + 41)
        clean = [plan_batch(b, num_ranks=64, cost_model=cm, solver="fcp", micro_batches="auto") for b in batches]
        for b, c in zip(batches, clean):  # re-timing a plan under its own model must give its makespan
            if abs(true_step_time(c, b, cm) - c.makespan) > 1e-9 * c.makespan:
                raise AssertionError(f"plan makespan {c.makespan} != §4 re-timing {true_step_time(c, b, cm)}")
        rng = np.random.default_rng(ctx.seed + 43)
        for noise in (0.05, 0.1, 0.2, 0.3, 0.5):
            match, growth, same_plan = [], [], 0
            for b, c in zip(batches, clean):
                base_deg = _degrees(c, b.size)
                for _ in range(trials):
                    noisy = cm.replace(**{k: getattr(cm, k) * (1.0 + rng.uniform(-noise, noise)) for k in NOISE_KEYS})
                    p = plan_batch(b, num_ranks=64, cost_model=noisy, solver="fcp", micro_batches="auto")
                    deg = _degrees(p, b.size)
                    match.append(float(np.mean(deg == base_deg)))
                    same_plan += int(np.array_equal(deg, base_deg))
                    growth.append(true_step_time(p, b, cm) / c.makespan - 1.0)
                ctx.tick(1, f"robustness {wname} {noise}")
            stats[(wname, noise)] = (np.mean(match), np.mean(growth))
            rows.append([wname, f"±{noise * 100:.0f} %", f"{np.mean(match) * 100:.1f} %",
                         f"{same_plan / len(match) * 100:.0f} %", f"{np.mean(growth) * 100:+.2f} %",
                         f"{np.max(growth) * 100:+.2f} %"])
    body = f"""Cost model v2 (the preset default). Each of the §4/§4.1 coefficients {", ".join(f"`{k}`" for k in NOISE_KEYS)} is
multiplied by an independent
factor 1+ε, ε ~ U(−p, p); FCP re-plans with the noisy model; the plan is then timed with the TRUE model on its own
placement. {MODEL} on {HARDWARE}, 64 ranks, GBS 512, 128K cap (truncation), {ctx.steps} batches × {trials} noise draws
per level (seeds {ctx.seed}+41/+43). "Degree match" = share of sequences whose CP degree equals the clean plan's;
"identical" = share of re-plans with every degree equal.

{md_table(["workload", "noise p", "degree match", "identical degrees", "mean true-time growth", "worst growth"], rows)}

Paper (Tables 4–5): no change up to 20 % noise; about 90 % degree match and +5–6 % step time at 50 %.
"""
    summary = [[f"Tables 4–5 robustness, {w}: degree match / true step-time growth at ±20 % and ±50 % noise",
                "no change ≤ 20 %; ~90 % / +5–6 % at 50 %",
                f"{stats[(w, 0.2)][0] * 100:.0f} % / {stats[(w, 0.2)][1] * 100:+.1f} % at 20 %; "
                f"{stats[(w, 0.5)][0] * 100:.0f} % / {stats[(w, 0.5)][1] * 100:+.1f} % at 50 %"] for w in ("wikipedia", "github")]
    return Section("Robustness to cost-model error — the paper's Tables 4–5", body, summary)


def _configured(ctx: Ctx) -> dict[str, int]:
    """The fixed degrees `fcp simulate` chose for the ordinary Wikipedia workload (Figure 3's cell)."""
    key = ("wikipedia", MODEL)
    if key not in ctx.configured:
        from common import simulate_cell

        cm = preset_cost_model(MODEL, HARDWARE, v2=True)
        _, fixed = simulate_cell(_wiki(ctx), model=MODEL, cost_model=cm, num_ranks=64, gbs=512, steps=ctx.steps,
                                 seed=ctx.seed, oracle=False)
        ctx.configured[key] = {"static-cp": fixed["static-cp"], "ulysses": fixed["ulysses"]}
    return ctx.configured[key]


def run_extreme(ctx: Ctx) -> Section:
    from exp_video import degree_notation

    cm = preset_cost_model(MODEL, HARDWARE, v2=True)
    conf = _configured(ctx)
    rng = np.random.default_rng(ctx.seed + 77)
    rows, xs, ys, zs = [], [], [], []
    for n_short in (16, 32, 63, 127, 255, 511):
        b = np.concatenate([[CAP], rng.integers(2048, 8193, n_short)]).astype(np.int64)
        label = f"extreme 1+{n_short}"
        res = plan_systems([b], model=MODEL, cost_model=cm, num_ranks=64, ctx=ctx, label=label,
                           systems=("fcp", "static-cp", "ulysses", "megatron-dynamic", "fcp-pow2"))
        at = plan_systems([b], model=MODEL, cost_model=cm, num_ranks=64, ctx=ctx, label=label + " configured",
                          systems=("fcp", "static-cp", "ulysses"), fixed=conf)
        f = res["fcp"].mean
        s = np.asarray(b, dtype=np.float64)
        share = cm.alpha1 * s[0] ** 2 / (cm.alpha1 * (s * s).sum() + cm.alpha2 * s.sum())
        g = " ‖ ".join(degree_notation(mb.degrees) for mb in res["fcp"].plans[0].micro_batches)
        v_static, v_uly = at["static-cp"].mean / f, at["ulysses"].mean / f
        v_dyn = res["megatron-dynamic"].mean / f
        v_hind = min(res["static-cp"].mean, res["ulysses"].mean) / f
        rows.append([f"1 × 128K + {n_short} × U[2K, 8K]", f"{share * 100:.0f} %", f"{f:.3f}",
                     f"{res['fcp'].lower_bound[0]:.3f}", g,
                     f"{at['static-cp'].mean:.3f}", f"{at['ulysses'].mean:.3f}", f"{res['megatron-dynamic'].mean:.3f}",
                     f"{res['static-cp'].mean:.3f} ({degree_notation(res['static-cp'].plans[0].micro_batches[0].degrees)})",
                     f"{res['ulysses'].mean:.3f}", fmt_x(v_static), fmt_x(v_uly), fmt_x(v_dyn), fmt_x(v_hind)])
        xs.append(n_short)
        ys.append(min(v_static, v_uly))
        zs.append((v_dyn, v_hind))
    p = plt()
    fig, ax = p.subplots(figsize=(5.5, 3.6))
    ax.plot(xs, ys, marker="o", label="vs static CP / Ulysses at configured degree")
    ax.plot(xs, [z[0] for z in zs], marker="^", label="vs Megatron dynamic CP")
    ax.plot(xs, [z[1] for z in zs], marker="s", label="vs static CP / Ulysses re-tuned for the batch")
    ax.axhline(2.24, ls="--", color="gray", label="paper 2.24×")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("short sequences next to one 128K sequence")
    ax.set_ylabel("FCP speedup over best baseline")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ctx.figures / "extreme_heterogeneity.png", dpi=110)
    p.close(fig)
    body = f"""One 128K-token sequence with n sequences of 2K–8K tokens (uniform, seed {ctx.seed}+77), {MODEL} on {HARDWARE}
(cost model v2), 64 ranks. "Long attention share" = the 128K sequence's attention work over the whole batch's compute.
"Configured" = static CP d={conf['static-cp']} and Ulysses d={conf['ulysses']}, the fixed degrees `fcp simulate` chose
for the ordinary Wikipedia workload (Figure 3, same model) — a Megatron/DeepSpeed job is configured once and then
meets this batch, the paper's scenario. "Re-tuned" = the best degree for this very batch (hindsight).

{md_table(["batch", "long attention share", "FCP s", "§4.1 lower bound s", "FCP groups", f"static CP d={conf['static-cp']}",
           f"Ulysses d={conf['ulysses']}", "Megatron dyn-CP", "static CP re-tuned (groups)", "Ulysses re-tuned",
           f"× vs static CP d={conf['static-cp']}", f"× vs Ulysses d={conf['ulysses']}", "× vs Megatron dyn-CP",
           "× vs better re-tuned"], rows)}

Against Megatron-LM / DeepSpeed at their configured degree (the paper's baselines) FCP reaches
{max(ys):.2f}× when the long sequence's attention dominates the batch: at degree {conf['static-cp']} the 128K sequence's attention, `alpha1·s²/d`, is a straggler no
re-packing of the short sequences can hide. Against a static degree re-tuned with hindsight for the batch, §4 caps the
gain near 2×: static CP with d = N/2 can hold the long sequence alone in one half and the rest in the other, a
makespan of about `2·max(W_long, W_rest)/N ≤ 2·W/N`, while FCP's is at least the balanced bound `W/N` (W = total §4
work, ring traffic hidden behind attention, one `beta2` per group). Only ring traffic that attention does not hide
(inter-node, short sequences) could push re-tuned static CP beyond 2×; in these batches attention hides it. Megatron's dynamic CP also gives the long
sequence its own large power-of-two group, so it stays close to FCP on this batch.

![extreme](figures/extreme_heterogeneity.png)
"""
    return Section("Extreme heterogeneity (the paper's 2.24× case)", body,
                   [["Extreme heterogeneity: 1 × 128K + n × 2–8K", "2.24×",
                     f"up to {max(ys):.2f}× vs static CP / Ulysses at their configured degree; up to "
                     f"{max(z[0] for z in zs):.2f}× vs Megatron dyn-CP; up to {max(z[1] for z in zs):.2f}× vs a degree "
                     "re-tuned for the batch (§4 bound ≈ 2×, see section)"]])


def run_beyond(ctx: Ctx) -> Section:
    cm = preset_cost_model(MODEL, HARDWARE, v2=True)
    wiki = _wiki(ctx, None)
    longest = int(wiki.max())
    rows = []
    for ranks, gbs in ((256, 1024), (1024, 4096)):
        batches = batch_pool_draws(wiki, gbs, max(1, ctx.steps // 4), ctx.seed + ranks)
        forced = batches[0].copy()
        forced[0] = longest
        batches.append(forced)
        res = plan_systems(batches, model=MODEL, cost_model=cm, num_ranks=ranks, ctx=ctx,
                           label=f"beyond {ranks}", systems=("fcp", "static-cp", "megatron-dynamic", "fcp-pow2"))
        for i, b in enumerate(batches):
            tag = f"with the {longest / 1e6:.2f}M doc" if i == len(batches) - 1 else f"random #{i}"
            f = res["fcp"].steps[i]
            rows.append([ranks, gbs, tag, f"{int(b.max()):,}", f"{f:.3f}", f"{res['fcp'].lower_bound[i]:.3f}",
                         *[f"{res[s].steps[i]:.3f} ({fmt_x(res[s].steps[i] / f)})" for s in ("static-cp", "megatron-dynamic", "fcp-pow2")],
                         f"{res['fcp'].solve_ms[i]:.0f}", res["fcp"].micro_batches[i]])
    plan_ms = [float(r[-2]) for r in rows if r[0] == 1024]
    summary = [[f"Beyond: uncapped Wikipedia (≤ {longest / 1e6:.2f}M tokens), 1024 ranks, GBS 4096", "—",
                f"FCP plans in {min(plan_ms) / 1e3:.1f}–{max(plan_ms) / 1e3:.1f} s on this CPU; speedups in the section"]]
    body = f"""The Wikipedia file without a cap (longest document {longest:,} tokens, which needs
{cm.min_degree(longest)} ranks of {cm.tokens_per_rank:,} tokens), {MODEL} on {HARDWARE} (cost model v2). Random batches (seed
{ctx.seed}+ranks) rarely hold a >128K document ({int((wiki > CAP).sum())} of {wiki.size:,} are), so the last row of each size forces the longest one
into the batch. Planner latency is the wall time of `plan_batch(..., solver="fcp", micro_batches="auto")` on this
machine (one run each, not a median). "static CP" here re-chooses its degree per micro-batch (a fixed degree would
have to be ≥ {cm.min_degree(longest)} for every batch); Ulysses is absent because its degree is bounded by the
{__import__("fcp_data.presets", fromlist=["x"]).model_heads(MODEL)[0]} heads, too few ranks for the longest document.

{md_table(["ranks", "GBS", "batch", "max tokens", "FCP s", "§4.1 lower bound s", "static CP s (× FCP)", "Megatron dyn-CP s",
           "FCP-pow2 s", "FCP plan ms", "µbatches"], rows)}
"""
    return Section("Beyond the paper: uncapped Wikipedia on 256 and 1024 ranks", body, summary)
