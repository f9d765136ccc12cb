"""Mutation review (tau.py / tau_kernel.py): behaviour the suite left unpinned.

The headroom kernel is compared directly against the numpy prefix scan (tau._fitting_prefix, itself held to the
full scan in test_plan_allocate) on inputs the tau_groupings-level test never produces: alpha_vis > 0 with visual
tokens (the presets it draws are text models, alpha_vis = 0), a long group of exactly ranks_per_node ranks (intra
bandwidth, DESIGN §4: all ranks on one node), and τ exactly equal to a prefix's time (``T ≤ τ`` is inclusive)."""
from __future__ import annotations

import numpy as np
import pytest

from fcp_data.cost import CostModel, sequence_terms  # noqa
from fcp_data.cost_kernel import kernel_switches
from fcp_data.plan.tau import _fitting_prefix
from fcp_data.plan.tau_kernel import headroom_loop

CM = CostModel(alpha1=2e-10, alpha2=3e-7, alpha3=4e3, beta1=1e-3, beta2=2e-3, bandwidth_intra=1e11,
               bandwidth_inter=5e9, ranks_per_node=4, tokens_per_rank=8192, gamma=1e-4, alpha_blk=1e-8,
               alpha_vis=5e-6)


def _kernel_take(per, ids, light, terms, tau, cm):
    take = np.zeros(len(ids), dtype=np.int64)
    headroom_loop(np.asarray(per, dtype=np.int64), np.stack([x[ids] for x in terms]),
                  np.ascontiguousarray(light, dtype=np.int64), np.stack(terms), float(tau), float(cm.tokens_per_rank),
                  float(cm.ranks_per_node), *kernel_switches(cm, terms[2], terms[3]), take)
    return take.tolist()


def _numpy_take(per, ids, light, terms, tau, cm):
    out, taken = [], 0
    for k, d in zip(ids, per):
        j = _fitting_prefix([k], light[taken:], terms, d, tau, cm) if d >= 2 and taken < light.size else 0
        out.append(j)
        taken += j
    return out


@pytest.mark.parametrize("d", [2, 3, 4, 5, 8])
def test_headroom_kernel_equals_numpy_prefix_scan_with_vision_and_node_boundary(d):
    rng = np.random.default_rng(7 + d)
    hits = 0
    for trial in range(40):
        n = 40
        L = np.concatenate(([int(d * 8192 * rng.uniform(0.5, 0.9))], rng.integers(50, 1500, n - 1)))
        vis = (L * rng.uniform(0, 0.9, n)).round()
        etas = (rng.random(n) < 0.3).astype(np.float64)
        terms = sequence_terms(L, etas, vis)
        light = np.argsort(L[1:], kind="stable")[::-1][::-1] + 1  # lightest first
        base_T = float(CM.time(terms[0][0], terms[1][0], d, d <= CM.ranks_per_node, B=terms[2][0], V=terms[3][0]))
        # τ: exactly the time of the long group with a prefix of j light sequences (the inclusive bound), and between
        for j in (1, 3, 7):
            S, Q, B, V = (x[0] + np.cumsum(x[light])[j - 1] for x in terms)
            tau_eq = float(CM.time(S, Q, d, d <= CM.ranks_per_node, B=B, V=V))
            for tau in (tau_eq, base_T * (1 + rng.uniform(0.01, 0.3))):
                want = _numpy_take([d], [0], light, terms, tau, CM)
                got = _kernel_take([d], [0], light, terms, tau, CM)
                assert got == want, (trial, d, j, tau)
                hits += want[0] > 0
    assert hits > 20


def test_headroom_kernel_inclusive_tau_and_vision_split_by_degree():
    """Hand-checkable: one long sequence on d = ranks_per_node = 4 ranks; τ set to the exact time with two light
    sequences taken: the kernel must take at least those two (inclusive ``T ≤ τ``, intra-node bandwidth at
    d = ranks_per_node, vision work divided by d)."""
    L = np.array([3 * 8192, 100, 100, 100, 100])
    vis = np.array([20000.0, 50.0, 50.0, 50.0, 50.0])
    terms = sequence_terms(L, np.zeros(5), vis)
    light = np.array([1, 2, 3, 4])
    S, Q, B, V = (x[[0, 1, 2]].sum() for x in terms)
    tau = float(CM.time(S, Q, 4, True, B=B, V=V))
    assert _numpy_take([4], [0], light, terms, tau, CM) == [2]
    assert _kernel_take([4], [0], light, terms, tau, CM) == [2]


# ---------------------------------------------------------------- tau.py's counting rules, by hand

from fcp_data.plan import tau as tau_mod  # noqa: E402


def _bins(works, room, beta1=0.5, m=0):
    """tau._rest_bins for the items ``works`` (heaviest first) at τ = beta1 + room."""
    w = np.asarray(works, dtype=np.float64)
    suffix = np.concatenate((np.cumsum(w[::-1])[::-1], [0.0]))
    return tau_mod._rest_bins(beta1 + room, m, w, -w, suffix, beta1)


def test_rest_bins_counting_rule_by_hand():
    """Module docstring: degree-1 bins of work ≤ τ − beta1; each item heavier than *half* a bin opens its own, the
    lighter ones fill the headroom, then new bins (ceil); an item heavier than a bin: infeasible; nothing left: 0."""
    assert _bins([1.0, 1.0], 2.0) == 1  # two exact halves share one bin (not "heavier than half")
    assert _bins([1.5, 0.4], 2.0) == 1  # the light one fits the big one's headroom
    assert _bins([1.5, 1.0, 1.0], 2.0) == 2  # 0.5 headroom, 1.5 spills: one more bin (ceil 0.75)
    assert _bins([1.2, 1.2, 1.2], 2.0) == 3  # three items over half a bin: three bins
    assert _bins([0.6, 0.6, 0.6, 0.6, 0.6], 2.0) == 2  # all light: ceil(3 / 2)
    assert _bins([3.0], 2.0) == np.inf  # heavier than a bin
    assert _bins([1.0, 0.5], 2.0, m=2) == 0  # order[m:] empty
    assert _bins([1.0], 0.0) == np.inf  # no room at all


def test_min_ranks_for_is_inclusive():
    """Fewest ranks whose running-minimum time is ≤ τ (inclusive); N + 1 where none."""
    Tt = np.array([[5.0, 3.0, 3.0, 2.0], [9.0, 8.0, 7.0, 7.0]])
    assert tau_mod.min_ranks_for(Tt, 3.0).tolist() == [2, 5]
    assert tau_mod.min_ranks_for(Tt, 7.0).tolist() == [1, 3]
    assert tau_mod.min_ranks_for(Tt, 7.0, rows=1).tolist() == [1]


def test_tau_star_is_the_smallest_feasible_target_and_groupings_follow_it(monkeypatch):
    """τ* (module docstring: the smallest τ whose rank count — Σ f_k(τ) over the long sequences + the rest's bins —
    fits N, bisection to 1e-4): feasible, and 0.1 % lower is not (or it is the floor lo); the long set is exactly the
    sequences slower than τ* alone (overflowing ones always); the single-out candidates put each long sequence alone,
    first, longest first, and the others on at most N − Σ f_k groups."""
    from fcp_data.cost import CostModel, sequence_terms

    captured = []
    real = tau_mod._bisect

    def spy(t, N, cm):
        ok = real(t, N, cm)
        captured.append((t, ok))
        return ok

    monkeypatch.setattr(tau_mod, "_bisect", spy)
    rng = np.random.default_rng(5)
    checked = with_singles = 0
    # fixed: equal long sequences whose count reaches N/2 (M binds exactly) and one that leaves 1 rank for the rest
    base = dict(alpha1=2e-9, alpha2=1e-6, alpha3=1e4, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
                bandwidth_inter=2e10, ranks_per_node=8, tokens_per_rank=65536)
    fixed = [(np.array([20000] * 5 + [300, 200, 100]), 11, base), (np.array([20000] * 4 + [300, 200]), 10, base),
             (np.array([30000, 300, 200, 100]), 3, base)]

    def instances():
        yield from fixed
        for _ in range(40):
            cm_kw = dict(alpha1=float(10 ** rng.uniform(-10, -8)), alpha2=float(10 ** rng.uniform(-6, -5)),
                         alpha3=float(10 ** rng.uniform(4, 6)), beta1=float(10 ** rng.uniform(-3, -2)),
                         beta2=float(10 ** rng.uniform(-3, -2)), bandwidth_intra=1e11, bandwidth_inter=2e10,
                         ranks_per_node=8, tokens_per_rank=8192)
            n, N = int(rng.integers(3, 40)), int(rng.choice([4, 8, 16]))
            yield np.minimum(rng.lognormal(7.5, 1.4, n).astype(np.int64) + 1, 24576), N, cm_kw

    for trial, (L, N, cm_kw) in enumerate(instances()):
        cm = CostModel(**cm_kw)
        n = L.size
        etas = np.zeros(n)
        captured.clear()
        cands = tau_mod.tau_groupings(L, etas, N, cm)
        t, ok = captured[0]
        if not ok:
            continue
        s, q, b, v = sequence_terms(L, etas)
        work_sorted = (t.solo - cm.beta1)[t.order]
        suffix = np.concatenate((np.cumsum(work_sorted[::-1])[::-1], [0.0]))

        def count(tau):
            over = s > cm.tokens_per_rank
            long_ = over | (t.solo > tau)
            m = int(long_.sum())
            if m > min(n, max(int(over.sum()), N // 2)):  # at most N/2 rings of ≥ 2 ranks; overflowing ones always
                return np.inf, m
            assert sorted(t.order[:m].tolist()) == sorted(np.flatnonzero(long_).tolist())
            need = int(tau_mod.min_ranks_for(t.Tt, tau, m).sum()) if m else 0
            return need + tau_mod._rest_bins(tau, m, work_sorted, -work_sorted, suffix, cm.beta1), m

        lo = float(max(t.Tt[:, -1].max() if t.M else 0.0, cm.beta1))
        c, m = count(t.tau)
        assert c <= N and m == t.m0, trial
        if count(lo)[0] <= N:
            assert t.tau == lo, trial
        elif t.tau > lo * (1 + 1e-12):
            assert count(t.tau * (1 - 1e-3))[0] > N, trial
        per = np.minimum(tau_mod.min_ranks_for(t.Tt[:m], t.tau), N) if m else np.zeros(0, dtype=np.int64)
        singles = [g for g, filled in cands if filled is False]
        with_singles += bool(singles)
        if trial < len(fixed):
            assert t.m0 == {0: 5, 1: 4, 2: 1}[trial] and singles, trial  # the long ones alone, as the rule says
        for groups in singles:
            assert [g[0] for g in groups[:m]] == t.order[:m].tolist() and all(len(g) == 1 for g in groups[:m])
            assert len(groups) - m <= N - int(per.sum())
            assert all(L[g].sum() <= cm.tokens_per_rank for g in groups[m:])  # degree-1 bins: one rank's memory
            assert sorted(i for g in groups for i in g) == list(range(n))
        checked += 1
    assert checked >= 20 and with_singles >= 15, (checked, with_singles)


def test_fill_headroom_takes_the_lightest_first(monkeypatch):
    """_fill_headroom (numpy path): the long group takes the longest prefix of the remaining sequences *lightest first*
    that keeps its time ≤ τ: with τ = the time of {long, 100, 200} on 2 ranks it takes exactly those two and leaves
    the 3000-token one, whatever the order they arrive in (rest is heaviest first)."""
    from fcp_data import jit

    monkeypatch.setattr(jit, "_ACTIVE", [False])
    L = np.array([10000, 3000, 200, 100])
    terms = sequence_terms(L, np.zeros(4))
    tau = float(CM.time(*(x[[0, 2, 3]].sum() for x in terms[:2]), 2, True, B=terms[2][[0, 2, 3]].sum(),
                        V=terms[3][[0, 2, 3]].sum()))
    groups, left = tau_mod._fill_headroom([[0]], np.array([2]), np.array([1, 2, 3]), terms, tau, CM)
    assert groups == [[0, 3, 2]] and left.tolist() == [1]


def test_overflowing_sequences_lead_the_order_even_when_faster(monkeypatch):
    """Order: memory-overflowing sequences first, then by solo time. A 9000-token text sequence (over E = 8192)
    is faster alone than a 6000-token one with 5000 visual tokens (alpha_vis): the overflowing one still comes first
    and is always singled out."""
    captured = []
    real = tau_mod._bisect
    monkeypatch.setattr(tau_mod, "_bisect", lambda t, N, cm: captured.append(t) or real(t, N, cm))
    L = np.array([9000, 6000, 500, 400, 300])
    vis = np.array([0.0, 5000.0, 0.0, 0.0, 0.0])
    terms = sequence_terms(L, np.zeros(5), vis)
    solo = CM.time(terms[0], terms[1], 1, True, B=terms[2], V=terms[3])
    assert solo[1] > solo[0]  # the premise
    cands = tau_mod.tau_groupings(L, np.zeros(5), 8, CM, visual=vis)
    t = captured[0]
    assert t.order[0] == 0 and t.n_over == 1
    assert cands and all(any(g[0] == 0 and len(g) >= 1 for g in groups) for groups, _ in cands)
    assert all(groups[0][0] == 0 for groups, filled in cands if filled is not None)


def test_coarse_variants_follow_the_rule(monkeypatch):
    """Coarse variants (module docstring): for c in coarsen, only the sequences needing *more than* c ranks at τ*
    stay alone (overflowing ones always), the rest is LPT-balanced into (ranks left) // c groups of at most c·E
    tokens (rings of about c ranks). Checked per c: the singled-out prefix, the group count (every group of an LPT
    from empty groups gets an item), the memory, and that the variant exists whenever LPT cannot fail (the rest's
    tokens ≤ k·(c·E − its longest))."""
    from fcp_data.cost import CostModel

    captured = []
    real = tau_mod._bisect
    monkeypatch.setattr(tau_mod, "_bisect", lambda t, N, cm: captured.append(t) or real(t, N, cm))
    rng = np.random.default_rng(9)
    seen = {2: 0, 3: 0, 4: 0}
    # fixed: four long sequences that need exactly 2 ranks each at τ* (the c = 2 variant mixes them, "more than c")
    fixed_cm = CostModel(alpha1=2e-9, alpha2=1e-6, alpha3=1e4, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
                         bandwidth_inter=2e10, ranks_per_node=8, tokens_per_rank=8192)
    fixed = [(fixed_cm, 10, np.array([5000] * 4 + [300, 200]))]

    def instances():
        yield from fixed
        for _ in range(40):
            cm = CostModel(alpha1=float(10 ** rng.uniform(-10, -8.5)), alpha2=float(10 ** rng.uniform(-6, -5)),
                           alpha3=float(10 ** rng.uniform(4, 5.5)), beta1=float(10 ** rng.uniform(-3, -2)),
                           beta2=float(10 ** rng.uniform(-3, -2)), bandwidth_intra=1e11, bandwidth_inter=2e10,
                           ranks_per_node=8, tokens_per_rank=8192)
            N = int(rng.choice([8, 12, 16]))
            n = int(rng.integers(6, 40))
            L = np.maximum(1, np.floor(rng.dirichlet(np.full(n, 0.4)) * rng.uniform(0.5, 0.95) * N * 8192)).astype(np.int64)
            yield cm, N, np.minimum(L, 3 * 8192)

    for trial, (cm, N, L) in enumerate(instances()):
        n = L.size
        etas = np.zeros(n)
        for c in (2, 3, 4):
            captured.clear()
            cands = tau_mod.tau_groupings(L, etas, N, cm, fill=False, coarsen=(c,))
            if not captured or not cands and not captured[0].tau:
                continue
            t = captured[0]
            if not t.tau:
                continue
            per_all = np.minimum(tau_mod.min_ranks_for(t.Tt, t.tau), N)
            if trial == 0:
                assert t.m0 == 4 and per_all[:4].tolist() == [2, 2, 2, 2]  # the premise
            j = max(t.n_over, int(np.count_nonzero(per_all[:t.m0] > c)))
            k = (N - int(per_all[:j].sum())) // c
            coarse = [g for g, filled in cands if filled is None]
            assert len(coarse) <= 1
            rest = t.order[j:]
            if j < n and k >= 1:
                kk = min(k, rest.size)
                if L[rest].sum() <= kk * (c * 8192 - L[rest].max()):
                    assert coarse, (trial, c)
            if coarse:
                groups = coarse[0]
                assert [g for g in groups[:j]] == [[i] for i in t.order[:j].tolist()], (trial, c)
                assert len(groups) - j == min(k, rest.size), (trial, c)
                assert all(L[g].sum() <= c * 8192 for g in groups[j:])
                # the rest: LPT (heaviest work first, least loaded group with token room, lowest id), by a naive loop
                load, tok, parts = [0.0] * k, [0.0] * k, [[] for _ in range(k)]
                for i in rest.tolist():
                    g = min((g for g in range(k) if tok[g] + L[i] <= c * 8192), key=lambda g: (load[g], g))
                    load[g] += float(t.solo[i] - cm.beta1)
                    tok[g] += float(L[i])
                    parts[g].append(i)
                assert {frozenset(g) for g in groups[j:]} == {frozenset(p) for p in parts if p}, (trial, c)
                assert sorted(i for g in groups for i in g) == list(range(n))
                seen[c] += 1
    assert min(seen.values()) >= 10, seen
