"""Video MLLM experiments under cost model v2 (DESIGN §4.1): the paper's Figures 4 and 6 (unfrozen / frozen vision
encoder, with the v1 comparison) and Table 6 (synthetic and real video)."""

from __future__ import annotations

import numpy as np

from common import LABELS, Ctx, Section, fmt_x, md_table, save_figure, speedup_bars, plan_systems, plt, simulate_cell, vision_alpha2
from fcp_data.presets import MODELS, model_heads, preset_cost_model
from workload_models import MLLM_SPECS, VIDEO_WORKLOADS, video_token_lengths

__all__ = ["MLLM_PRESETS", "video_pools", "run_figure4_6", "run_table6", "units_figure4_6", "degree_notation"]

MLLM_PRESETS = ("InternVL3-2B", "InternVL2.5-4B", "InternVL3-8B", "Qwen3-VL-2B", "Qwen3-VL-4B", "Qwen3-VL-8B")
HARDWARE = "ascend-910c"
GBS = 512
RANKS = 64
POOL = 4096
COLS = ("static-cp", "static-cp-batch", "ulysses", "megatron-dynamic", "fcp-pow2")
CMP_COLS = ("static-cp", "ulysses", "megatron-dynamic", "fcp-pow2")  # the v1 cells have no per-batch oracle
INTERNVL_VARIABLE = (1.0, 8, 64)  # frames = clamp(round(duration · 1 fps), 8, 64)


def _visual_tokens(wm, spec_name: str, n: int, *, seed: int, frames) -> np.ndarray:
    """Visual (placeholder) tokens of the same ``n`` clips :func:`video_token_lengths` counts: the spec's
    ``plan_visual(...).num_visual_tokens`` per clip header (same clips: same ``sample_clips`` seed)."""
    from dataclasses import replace

    from fcp_data.specs import load_spec, plan_visual

    spec = load_spec(spec_name)
    clips = wm.sample_clips(n, seed=seed)
    cache: dict[tuple[int, int, int, int], int] = {}
    out = np.empty(n, dtype=np.int64)
    for i in range(n):
        segs = 0 if frames is None else int(min(max(round(float(clips["duration"][i]) * frames[0]), frames[1]), frames[2]))
        key = (int(clips["width"][i]), int(clips["height"][i]), int(clips["num_frames"][i]), segs)
        if key not in cache:
            sp = spec if not segs else replace(spec, vision=dict(spec.vision, video=dict(spec.vision["video"], num_frames=segs)))
            cache[key] = plan_visual(sp, "video", height=key[1], width=key[0], num_frames=key[2], fps=wm.fps).num_visual_tokens
        out[i] = cache[key]
    return out


def video_pools(ctx: Ctx) -> dict[tuple[str, str], tuple[np.ndarray, float, np.ndarray]]:
    """(spec variant, workload) → (token lengths of POOL clips, visual-token fraction, visual tokens per clip)."""
    out = {}
    for w_i, (wname, wm) in enumerate(VIDEO_WORKLOADS.items()):
        seed = ctx.seed + 300 + w_i
        for variant, spec, frames in (("qwen3-vl", "qwen3-vl", None), ("internvl3", "internvl3", None),
                                      ("internvl3-1fps", "internvl3", INTERNVL_VARIABLE)):
            lengths = video_token_lengths(wm, spec, POOL, seed=seed, internvl_frames=frames)
            visual = _visual_tokens(wm, spec, POOL, seed=seed, frames=frames)
            if (visual >= lengths).any():  # internal invariant: every clip also has caption + EOS tokens
                raise AssertionError(f"{wname} {variant}: visual tokens >= clip tokens")
            out[(variant, wname)] = (lengths, float(visual.sum() / lengths.sum()), visual)
    return out


def _variants(model: str) -> tuple[str, ...]:
    return ("qwen3-vl",) if MLLM_SPECS[model] == "qwen3-vl" else ("internvl3", "internvl3-1fps")


def _cells():
    """(workload index, workload, model, token variant, frozen) of Figures 4/6."""
    return [(w_i, w, m, v, fr) for w_i, w in enumerate(VIDEO_WORKLOADS) for m in MLLM_PRESETS for v in _variants(m)
            for fr in (False, True)]


def units_figure4_6(ctx: Ctx) -> int:
    return len(_cells()) * 2 * ctx.video_steps  # v2 cells + the v1 comparison


def _video_cell(ctx: Ctx, pools, cell, ver: str):
    """One Figure 4/6 cell under the v2 preset (``alpha_vis`` + visual tokens; frozen ViT: ``frozen_vision``)
    or, for the comparison, the v1 preset with the encoder folded into ``alpha2`` (no visual tokens)."""
    w_i, wname, model, variant, frozen = cell
    lengths, vf, vis = pools[(variant, wname)]
    if ver == "v2":
        cm, visual = preset_cost_model(model, HARDWARE, v2=True, frozen_vision=frozen), vis
    else:
        cm, visual = vision_alpha2(model, HARDWARE, frozen=frozen, visual_fraction=vf), None
    label = f"fig4/6 {ver} {wname} {model} {variant} {'frozen' if frozen else 'unfrozen'}"
    return simulate_cell(lengths, model=model, cost_model=cm, num_ranks=RANKS, gbs=GBS, steps=ctx.video_steps,
                         seed=ctx.seed + 500 + w_i, ctx=ctx, label=label, visual=visual, oracle=ver == "v2")


def _fig46_rows(ctx: Ctx, pools):
    """Run every cell under v2 and v1: (v2 rows, v1→v2 rows, speedups keyed (w, m, v, frozen, ver), gaps)."""
    rows, cmp_rows, speed, gaps = [], [], {}, []
    for cell in _cells():
        _, wname, model, variant, frozen = cell
        lengths = pools[(variant, wname)][0]
        out = {ver: _video_cell(ctx, pools, cell, ver) for ver in ("v2", "v1")}
        for ver, (res, _) in out.items():
            speed[(wname, model, variant, frozen, ver)] = {c: res[c].mean / res["fcp"].mean for c in COLS if c in res}
        (res, fixed), (r1, f1) = out["v2"], out["v1"]
        f, lb = res["fcp"].mean, float(np.mean(res["fcp"].lower_bound))
        sp = speed[(wname, model, variant, frozen, "v2")]
        vit = "frozen" if frozen else "unfrozen"
        rows.append([wname, model, variant, vit, f"{np.mean(lengths):,.0f} / {lengths.max():,}", f"{f:.3f}",
                     f"{lb:.3f}", f"{res['fcp'].lb_gap * 100:.1f} %", *[f"{res[c].mean:.3f}" for c in COLS],
                     *[fmt_x(sp[c]) for c in COLS], f"{fixed['static-cp']}/{fixed['ulysses']}"])
        s1 = speed[(wname, model, variant, frozen, "v1")]
        cmp_rows.append([wname, model, variant, vit, f"{f1['static-cp']} → {fixed['static-cp']}",
                         f"{f1['ulysses']} → {fixed['ulysses']}",
                         *[f"{fmt_x(s1[c])} → {fmt_x(sp[c])}" for c in CMP_COLS],
                         f"{r1['fcp'].lb_gap * 100:.1f} % → {res['fcp'].lb_gap * 100:.1f} %"])
        gaps.append((res["fcp"].lb_gap, res["static-cp"].mean / lb - 1))
        speed[(wname, model, variant, frozen, "v1")]["_d"] = f1["static-cp"]
        speed[(wname, model, variant, frozen, "v2")]["_d"] = fixed["static-cp"]
    return rows, cmp_rows, speed, gaps


def _video_why(speed) -> str:
    """The synthetic video cell where v1 and v2 disagree most (speedup over fixed-degree static CP), with the §4.1
    terms a static ring of v1's degree pays under v2."""
    keys = sorted({k[:4] for k in speed})
    w, m, var, fr = max(keys, key=lambda k: abs(speed[(*k, "v2")]["static-cp"] - speed[(*k, "v1")]["static-cp"]))
    s1, s2 = speed[(w, m, var, fr, "v1")], speed[(w, m, var, fr, "v2")]
    cm = preset_cost_model(m, HARDWARE, v2=True, frozen_vision=fr)
    d1 = s1["_d"]
    v1_vis = (1 if fr else 4) * 8  # FLOPs per visual token in units of P_vit: common.vision_alpha2
    v2_vis = (2 if fr else 6) * MODELS[m].patches_per_visual_token  # fcp_data.presets alpha_vis
    moved = sum(speed[(*k, "v1")]["_d"] != speed[(*k, "v2")]["_d"] for k in keys)
    wider = sum(speed[(*k, "v1")]["_d"] > speed[(*k, "v2")]["_d"] for k in keys)
    return f"""Where v1 and v2 disagree: the best fixed static-CP degree changes in {moved} of {len(keys)} cells (v1's is the wider
ring in {wider} of them), and FCP's speedup over it moves most in **{w} {m} {var} {'frozen' if fr else 'unfrozen'}**:
{fmt_x(s1["static-cp"])} (v1, fixed d = {d1}) → {fmt_x(s2["static-cp"])} (v2, fixed d = {s2["_d"]}). v1 charges a ring no
per-step cost, so a wide static ring over short clips looks free and static CP sits at the v1 bound. v2 charges every
group of degree d `gamma·(d−1)` per micro-batch (here gamma = {cm.gamma * 1e3:.2f} ms, {cm.gamma * (d1 - 1) * 1e3:.1f} ms at d = {d1}) and every
rank `alpha_blk` per token of its group ({cm.alpha_blk * 1e6:.2f} µs/token, not divided by d), so a fixed degree wide enough
for the longest clips taxes all the short ones, while FCP gives short clips d = 1 and rings only to long ones.
The vision term (`alpha_vis`: {v2_vis}·P_vit FLOPs per visual token in v2 vs {v1_vis}·P_vit folded into `alpha2` in v1, both
divided by d) changes absolute times (the FCP s column) far more than which plan wins."""


def run_figure4_6(ctx: Ctx) -> Section:
    pools = ctx.vpools = video_pools(ctx)
    rows, cmp_rows, speed, gaps = _fig46_rows(ctx, pools)
    headers = ["workload", "model", "token spec", "ViT", "mean / max tokens", "FCP s", "§4.1 lower bound s",
               "FCP above bound", *[f"{LABELS[c]} s" for c in COLS], *[f"vs {LABELS[c]}" for c in COLS],
               "fixed d (CP/Uly)"]
    cmp_headers = ["workload", "model", "token spec", "ViT", "static CP fixed d (v1 → v2)",
                   "Ulysses fixed d (v1 → v2)", *[f"vs {LABELS[c]} (v1 → v2)" for c in CMP_COLS],
                   "FCP above bound (v1 → v2)"]

    def rng(frozen, variants, col=None, ver="v2"):
        v = [(min(sp["static-cp"], sp["ulysses"]) if col is None else sp[col])
             for (w, m, var, fr, vr), sp in speed.items() if fr == frozen and var in variants and vr == ver]
        return f"{min(v):.2f}×–{max(v):.2f}× (mean {np.mean(v):.2f}×)"

    dur = ("qwen3-vl", "internvl3-1fps")
    per_base = "; ".join(
        f"{'frozen' if fr else 'unfrozen'}: {rng(fr, dur, 'static-cp')} vs static CP, {rng(fr, dur, 'ulysses')} vs "
        f"Ulysses, {rng(fr, dur, 'megatron-dynamic')} vs Megatron dyn-CP" for fr in (False, True))
    fig = _plot(ctx, speed)
    cmp_table = md_table(cmp_headers, cmp_rows) + "\n\n" + _video_why(speed)
    body = _fig46_body(ctx, pools, md_table(headers, rows), cmp_table, rng, per_base, gaps, fig)
    summary = [[f"Fig. {4 if not fr else 6} video MLLMs, {'frozen' if fr else 'unfrozen'} ViT",
                "1.14×–1.38×" if not fr else "1.16×–1.40×",
                f"{rng(fr, dur)} vs better of static CP / Ulysses; {rng(fr, dur, 'ulysses')} vs Ulysses; "
                f"{rng(fr, dur, 'megatron-dynamic')} vs Megatron dyn-CP; static CP ≤ "
                f"{max(g[1] for g in gaps) * 100:.1f} % above the §4.1 lower bound (v1: {rng(fr, dur, ver='v1')} "
                "vs better of static CP / Ulysses)"] for fr in (False, True)]
    return Section("Video MLLMs — the paper's Figures 4 (unfrozen) and 6 (frozen)", body, summary)


def _fig46_body(ctx: Ctx, pools, table: str, cmp_table: str, rng, per_base: str, gaps, fig: str) -> str:
    from fcp_data.specs import load_spec

    fixed_frames = load_spec("internvl3").vision["video"]["num_frames"]
    fixed_all = np.concatenate([pools[("internvl3", w)][0] for w in VIDEO_WORKLOADS])
    fixed_lo, fixed_hi = int(fixed_all.min()), int(fixed_all.max())
    spec_rows = [[f"{w}", *[f"{np.mean(pools[(v, w)][0]):,.0f} (p99 {np.quantile(pools[(v, w)][0], 0.99):,.0f})"
                            for v in ("qwen3-vl", "internvl3", "internvl3-1fps")],
                  f"{pools[('qwen3-vl', w)][1]:.3f}", VIDEO_WORKLOADS[w].source] for w in VIDEO_WORKLOADS]
    dur = ("qwen3-vl", "internvl3-1fps")
    return f"""Settings: {RANKS} ranks = 4 nodes × 16 ({HARDWARE}), GBS {GBS} clips drawn with replacement from a pool of
{POOL} SYNTHETIC clips per workload (`benchmarks/paper/workload_models.py`, seeds {ctx.seed}+300+workload) by `fcp simulate`
(seed {ctx.seed}+500+workload), {ctx.video_steps} steps per cell, no cap needed (the longest clip fits),
`micro_batches="auto"`; columns as in Figure 3.

Clip token lengths come from the bundled token specs (`fcp_data.specs`, the same code `fcp index` runs on a real
clip's header). Qwen3-VL presets use `qwen3-vl` (2 frames/s, 16-px patches, 2×2 merge, timestamps); InternVL presets
use `internvl3` exactly as bundled (**{fixed_frames} frames for every clip** → every clip has
{fixed_lo:,}–{fixed_hi:,} tokens) and, as a second row, a duration-dependent variant `internvl3-1fps`
({INTERNVL_VARIABLE[0]:g} frame/s clamped to {INTERNVL_VARIABLE[1]}–{INTERNVL_VARIABLE[2]} frames; an assumption about the
paper's frame sampling, which must vary with duration for its InternVL speedups to exist).

{md_table(["workload", "qwen3-vl tokens", "internvl3 tokens", "internvl3-1fps tokens", "visual share", "clip statistics"], spec_rows)}

**Cost model v2** (DESIGN §4.1, the preset default): `preset_cost_model(model, hw, frozen_vision=...)` — `gamma`
per ring step, `alpha_blk` per token and rank, and the vision encoder as `alpha_vis` per visual token
(6·P_vit·4 patches per token **unfrozen**: forward + backward; 2·P_vit·4 **frozen**: forward only); every system and
the lower bound get each clip's visual tokens (`plan_visual(...).num_visual_tokens` of the same spec). The §4.1 lower
bound is `common.lower_bound` (as in Figure 3, with `alpha_vis·v_k` in the area term).

{table}

FCP speedup over the better fixed-degree baseline (Megatron-LM / DeepSpeed setting), v2:
unfrozen {rng(False, dur)}, frozen {rng(True, dur)} over the duration-dependent token specs; with the bundled
fixed-32-frame InternVL spec {rng(False, ("internvl3",))} unfrozen.
Per baseline over the duration-dependent specs — {per_base}.
Paper: 1.14×–1.38× unfrozen, 1.16×–1.40× frozen.

Across all {len(gaps)} video cells under v2 the fixed-degree static CP is at most {max(g[1] for g in gaps) * 100:.1f} % above
the §4.1 lower bound that no plan can beat (FCP at most {max(g[0] for g in gaps) * 100:.1f} %), so no planner could gain more
than that over static CP on these pools.

![Figures 4 and 6](figures/{fig})

### v1 vs v2 on the same synthetic video cells

The same batches under the **v1** presets (`v2=False`; the vision encoder folded into `alpha2`, `common.vision_alpha2`:
× 4 unfrozen, × 1 frozen, weighted by the visual-token share; no visual tokens; bound `Σ(alpha1·s² + alpha2·s)/N +
M·beta1`) and under v2, shown as v1 → v2. v1 ranges over the duration-dependent specs: unfrozen {rng(False, dur, ver="v1")},
frozen {rng(True, dur, ver="v1")} vs the better of static CP / Ulysses.

{cmp_table}
"""
def _plot(ctx: Ctx, speed) -> str:
    keys = sorted({(m, v) for (w, m, v, fr, vr) in speed}, key=lambda k: (MLLM_PRESETS.index(k[0]), k[1]))
    fig, axes = plt().subplots(2, len(VIDEO_WORKLOADS), figsize=(5 * len(VIDEO_WORKLOADS), 7), sharey=True)
    for row, frozen in enumerate((False, True)):
        for ax, wname in zip(axes[row], VIDEO_WORKLOADS):
            speedup_bars(ax, [f"{m}\n{v}" for m, v in keys], COLS,
                         {c: [speed[(wname, m, v, frozen, "v2")][c] for m, v in keys] for c in COLS},
                         title=f"{wname} ({'frozen' if frozen else 'unfrozen'} ViT, cost model v2)", fontsize=6,
                         rotation=40, title_size=9)
        axes[row][0].set_ylabel("FCP speedup")
    axes[0][-1].legend(fontsize=7)
    return save_figure(ctx, fig, "fig4_6_video_speedup.png")


def degree_notation(degrees) -> str:
    """⟨d⟩×count, largest degree first (the paper's Table 6 notation)."""
    vals, counts = np.unique(np.asarray(degrees), return_counts=True)
    return " ".join(f"⟨{int(v)}⟩×{int(c)}" for v, c in sorted(zip(vals, counts), reverse=True))


def _table6_rows(ctx: Ctx, label: str, b: np.ndarray, v: np.ndarray, model: str, ranks: int,
                 degrees=()) -> list[list[str]]:
    """Table 6 rows of one batch under the v2 preset (trained ViT, visual tokens given to every system): each
    system's groups, the §4.1 lower bound, and static CP at each of ``degrees`` (pinned)."""
    cm = preset_cost_model(model, HARDWARE, v2=True)
    res = plan_systems([b], model=model, cost_model=cm, num_ranks=ranks, ctx=ctx, label=label, visual=[v],
                       systems=("fcp", "fcp-pow2", "megatron-dynamic", "static-cp", "ulysses"))
    f = res["fcp"].mean
    rows, head = [], f"{label.split(' ')[-1]} (n={b.size}, {int(b.sum()):,} tok, max {int(b.max()):,})"
    for s, r in res.items():
        plan = r.plans[0]
        name = {"static-cp": "static CP (best d for this batch)", "ulysses": "Ulysses (best d for this batch)"}.get(s, LABELS[s])
        rows.append([head, name, " ‖ ".join(degree_notation(mb.degrees) for mb in plan.micro_batches),
                     f"{plan.makespan:.3f}", fmt_x(plan.makespan / f)])
        head = ""
    lb = res["fcp"].lower_bound[0]
    rows.append(["", "§4.1 lower bound (no plan is faster)", "—", f"{lb:.3f}", fmt_x(lb / f)])
    for d in degrees:
        try:
            plan = plan_systems([b], model=model, cost_model=cm, num_ranks=ranks, systems=("static-cp",),
                                fixed={"static-cp": d}, visual=[v])["static-cp"].plans[0]
            rows.append(["", f"static CP d={d}", " ‖ ".join(degree_notation(m.degrees) for m in plan.micro_batches),
                         f"{plan.makespan:.3f}", fmt_x(plan.makespan / f)])
        except ValueError as err:
            rows.append(["", f"static CP d={d}", f"infeasible: {str(err)[:70]}…", "—", "—"])
    return rows


def run_table6(ctx: Ctx) -> Section:
    model, ranks, gbs = "Qwen3-VL-8B", 32, 128
    pools = ctx.vpools or video_pools(ctx)
    rows = []
    for w_i, wname in enumerate(("openvid", "msr-vtt")):
        lengths, _, vis = pools[("qwen3-vl", wname)]
        ids = np.random.default_rng(ctx.seed + 900 + w_i).integers(0, lengths.size, gbs)  # = batch_pool_draws
        rows += _table6_rows(ctx, f"table6 {wname}", lengths[ids], vis[ids], model, ranks, degrees=(1, 2, 4, 8, 16))
    real_rows = _table6_real(ctx, model, ranks, gbs)
    heads, kv = model_heads(model)
    fcp_rows = [r for r in rows if r[1] == "FCP"]
    summary = [["Table 6 case study, FCP groups (32 ranks, v2)", "heterogeneous ⟨d⟩ mixes per batch",
                "; ".join(f"{r[0].split(' ')[0]}: {r[2]}" for r in fcp_rows)]]
    body = f"""CP groups chosen for one OpenVid-like and one MSR-VTT-like global batch ({gbs} clips, Qwen3-VL token spec) of
{model} on {ranks} ranks = 2 nodes × 16 ({HARDWARE}), unfrozen ViT, **cost model v2** (`alpha_vis` with each clip's
visual tokens, `gamma`, `alpha_blk`), seed {ctx.seed}+900. Groups per micro-batch in ⟨degree⟩×count notation
(micro-batches separated by ‖); "× FCP" = step time / FCP step time; the §4.1 lower bound row is the bound of
`common.lower_bound` for that batch. Ulysses degrees must divide the {heads} heads.

{md_table(["batch", "system", "groups", "step s", "× FCP"], rows)}

The same case study on one batch of each **real** video dataset (train split, `qwen3-vl` spec, resolution mix
`mixed`, see "Real video workloads" above), same v2 preset and visual tokens, seed {ctx.seed}+950:

{md_table(["batch", "system", "groups", "step s", "× FCP"], real_rows)}
"""
    summary.append(["Table 6 on real video (v2)", "—", "; ".join(f"{r[0].split(' ')[0]}: {r[2]}" for r in real_rows if r[1] == "FCP")])
    return Section("Case study — the paper's Table 6", body, summary)


def _table6_real(ctx: Ctx, model: str, ranks: int, gbs: int) -> list[list[str]]:
    from exp_v2 import REAL_DATASETS, real_pools

    pools = getattr(ctx, "real_pools", None) or real_pools(ctx)
    rows = []
    for w_i, ds in enumerate(REAL_DATASETS):
        wl = pools[(ds, "qwen3-vl")]
        ids = np.random.default_rng(ctx.seed + 950 + w_i).integers(0, len(wl), gbs)
        rows += _table6_rows(ctx, f"table6 {ds}", wl.tokens[ids].astype(np.int64),
                             wl.visual_tokens[ids].astype(np.int64), model, ranks)
    return rows
