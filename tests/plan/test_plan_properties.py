"""Property test of plan validity (issue 13): for random micro-batches — lengths, ranks (1–16, several
nodes), random §4/§4.1 coefficients and tightness from almost empty to 100 % of N·tokens_per_rank — every
deterministic solver's plan is valid, checked here independently of the planner's own code:

- every sequence is in exactly one group of one micro-batch (none lost, none twice);
- ranks are in ``[0, N)`` and no rank serves two groups of one micro-batch;
- every group fits in memory (``Σ s ≤ d · tokens_per_rank``);
- every ring group's time is the §4.1 formula written out here term by term on its real ranks (intra- vs
  inter-node bandwidth), to 1e-9 relative (Ulysses has its own all-to-all model); the micro-batch makespan is its slowest group, the plan's the sum;
- FCP is never slower than any ring baseline that can plan the same input (the planner's promise: their
  configurations are in its search space). Ulysses' all-to-all can beat any ring under random coefficients
  (low bandwidth); on the presets ``tests/plan/test_plan_vs_baselines.py`` compares against it too.

A solver may refuse an input it cannot plan (``ValueError``), never return an invalid plan."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.cost import CostModel
from fcp_data.plan import plan_batch

from _reference import reference_time  # tests/plan/_reference.py: §4.1 term by term

SOLVERS = ("fcp", "fcp-pow2", "static-cp", "ulysses", "megatron-dynamic")


def _check(plan, lengths, etas, visual, cm: CostModel, N: int, name: str) -> None:
    seen = []
    total = 0.0
    for m, mb in enumerate(plan.micro_batches):
        used = []
        for g in mb.groups:
            assert all(0 <= r < N for r in g.ranks), f"{name}: rank out of range in {g.ranks}"
            used += list(g.ranks)
            s = lengths[list(g.seq_ids)]
            assert s.sum() <= len(g.ranks) * cm.tokens_per_rank, f"{name}: group over memory"
            if name != "ulysses":  # Ulysses pays all-to-alls, not a ring: its own time model (baselines.ulysses_time)
                t = reference_time(cm, s.tolist(), etas[list(g.seq_ids)].tolist(), visual[list(g.seq_ids)].tolist(),
                                    g.ranks)
                assert math.isclose(g.time, t, rel_tol=1e-9), f"{name}: group time {g.time} != formula {t}"
            seen += list(g.seq_ids)
        assert len(used) == len(set(used)), f"{name}: micro-batch {m} gives a rank two groups"
        assert math.isclose(mb.makespan, max(g.time for g in mb.groups), rel_tol=1e-12)
        total += mb.makespan
    assert sorted(seen) == list(range(lengths.size)), f"{name}: sequences lost or repeated"
    assert math.isclose(plan.makespan, total, rel_tol=1e-12)


cost_models = st.builds(
    lambda a1, a2, a3, b1, b2, bw, rpn, g, blk, vis: CostModel(
        alpha1=a1, alpha2=a2, alpha3=a3, beta1=b1, beta2=b2, bandwidth_intra=bw, bandwidth_inter=bw / 8,
        tokens_per_rank=4096, ranks_per_node=rpn, gamma=g, alpha_blk=blk, alpha_vis=vis),
    st.sampled_from([1e-11, 2e-10, 3e-9]), st.sampled_from([1e-8, 5e-7, 4e-6]), st.sampled_from([1e3, 2e4, 3e5]),
    st.sampled_from([0.0, 1e-3]), st.sampled_from([0.0, 2e-4, 5e-3]), st.sampled_from([1e10, 5e10, 2e11]),
    st.sampled_from([2, 4, 8]), st.sampled_from([0.0, 1e-4, 3e-3]), st.sampled_from([0.0, 1e-7, 2e-6]),
    st.sampled_from([0.0, 1e-5]))


@settings(max_examples=60, deadline=None)
@given(cm=cost_models, N=st.integers(1, 16), n=st.integers(1, 24), tight=st.floats(0.02, 1.0), data=st.data(),
       micro=st.sampled_from([1, "auto"]))
def test_every_solver_returns_a_valid_plan_and_fcp_is_never_slower(cm, N, n, tight, data, micro):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31), label="seed"))
    raw = rng.lognormal(0.0, 1.2, size=n)
    lengths = np.maximum(1, np.floor(raw / raw.sum() * tight * N * cm.tokens_per_rank)).astype(np.int64)
    lengths = np.minimum(lengths, N * cm.tokens_per_rank)
    etas = (rng.random(n) < 0.3).astype(np.float64)
    visual = np.floor(lengths * rng.random(n) * (rng.random(n) < 0.5))
    spans = {}
    for name in SOLVERS:
        opts = {"num_heads": 16, "num_kv_heads": 8} if name == "ulysses" else {}
        try:
            plan = plan_batch(lengths, num_ranks=N, cost_model=cm, etas=etas, visual=visual, solver=name,
                              micro_batches=micro, **opts)
        except ValueError:
            assert name != "fcp" or micro == 1, "fcp with micro_batches='auto' refused a plannable batch"
            continue
        _check(plan, lengths, etas, visual, cm, N, name)
        spans[name] = plan.makespan
    if "fcp" in spans and micro == 1:  # the ring baselines lie in FCP's search space; Ulysses (all-to-all) does not
        for name, span in spans.items():
            if name == "ulysses":
                continue
            assert spans["fcp"] <= span * (1 + 1e-9), f"fcp {spans['fcp']} slower than {name} {span}"


@pytest.mark.parametrize("bad", ["lost", "twice", "memory", "time"])
def test_the_checker_catches_invalid_plans(bad):
    """The checker itself: a plan edited to lose a sequence, hold one twice, exceed memory or misstate a time fails."""
    from fcp_data.plan.types import CPGroup, MicroBatchPlan, Plan

    cm = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
                   bandwidth_inter=2.5e10, tokens_per_rank=4096, ranks_per_node=4)
    lengths, etas, vis = np.array([3000, 2000, 500]), np.zeros(3), np.zeros(3)
    plan = plan_batch(lengths, num_ranks=4, cost_model=cm)
    _check(plan, lengths, etas, vis, cm, 4, "fcp")
    groups = list(plan.micro_batches[0].groups)
    g = groups[0]
    if bad == "lost":
        groups[0] = CPGroup(ranks=g.ranks, seq_ids=g.seq_ids[1:] or g.seq_ids, time=g.time)
        if groups[0].seq_ids == g.seq_ids:
            groups = groups[1:]
    elif bad == "twice":
        groups[0] = CPGroup(ranks=g.ranks, seq_ids=g.seq_ids + groups[-1].seq_ids[:1], time=g.time)
    elif bad == "memory":
        lengths = lengths * 100
    else:
        groups[0] = CPGroup(ranks=g.ranks, seq_ids=g.seq_ids, time=g.time * 1.01)
    mb = MicroBatchPlan(groups=tuple(groups), makespan=max(x.time for x in groups))
    broken = Plan(num_ranks=4, solver="fcp", solve_ms=0.0, makespan=mb.makespan, micro_batches=(mb,))
    with pytest.raises(AssertionError):
        _check(broken, lengths, etas, vis, cm, 4, "edited")
