"""Stage 1 (BFD), stage 2 (2-D DP vs the exact fast allocator) and placement.

The allocator tests compare the fast allocator with the paper's DP (and, on tiny tables, with brute
force over all degree vectors): a mismatch means the fast allocator is not exact and FCP would pick
worse degrees than Algorithm 1.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.cost import CostModel
from fcp_data.plan import allocate_dp, allocate_fast, bfd_groups, place_groups, pow2_mask, time_table
from fcp_data.plan.placement import pack_in_nodes
from fcp_data.plan.bfd import lpt_groups

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)


def _check_degrees(T, value, deg):
    K, N = T.shape
    assert deg.sum() <= N and deg.min() >= 1
    assert max(T[i, deg[i] - 1] for i in range(K)) == pytest.approx(value, rel=1e-12)


def test_fast_equals_dp_on_thousands_of_random_tables():
    """Random tables (non-monotone in d, with inf for memory) — value of fast == value of DP, 3000 cases."""
    rng = np.random.default_rng(0)
    for case in range(3000):
        N = int(rng.integers(1, 13))
        K = int(rng.integers(1, N + 3))
        T = rng.exponential(1.0, size=(K, N))
        T[rng.random((K, N)) < 0.15] = np.inf
        if case % 3 == 0:  # memory-style infeasibility: a prefix of small degrees
            for i in range(K):
                T[i, : rng.integers(0, max(1, N // 2))] = np.inf
        v_fast, d_fast = allocate_fast(T)
        v_dp, d_dp = allocate_dp(T)
        if not np.isfinite(v_dp):
            assert not np.isfinite(v_fast) and d_fast is None
            continue
        assert v_fast == v_dp
        _check_degrees(T, v_fast, d_fast)
        _check_degrees(T, v_dp, d_dp)


def test_fast_equals_dp_on_cost_model_tables():
    """Tables built from §4 with random groups (incl. multi-node degrees and pow2 masks), 1000 cases."""
    rng = np.random.default_rng(1)
    for case in range(1000):
        N = int(rng.integers(1, 40))
        K = int(rng.integers(1, min(N, 12) + 1))
        S = rng.integers(100, CM.tokens_per_rank * max(1, N // K), size=K).astype(float)
        Q = S * S * rng.uniform(0.05, 2.0, size=K)
        T = time_table(S, Q, N, CM, allowed=pow2_mask(N) if case % 4 == 0 else None)
        v_fast, d_fast = allocate_fast(T)
        v_dp, _ = allocate_dp(T)
        assert v_fast == v_dp or (not np.isfinite(v_fast) and not np.isfinite(v_dp))
        if d_fast is not None:
            _check_degrees(T, v_fast, d_fast)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5).flatmap(lambda N: st.tuples(
    st.just(N), st.lists(st.lists(st.floats(0.01, 100.0), min_size=N, max_size=N), min_size=1, max_size=N))))
def test_fast_is_brute_force_optimal(data):
    """Hypothesis: on tiny tables the fast allocator equals brute force over every degree vector."""
    N, rows = data
    T = np.array(rows)
    best = min(max(T[i, d[i] - 1] for i in range(len(rows)))
               for d in itertools.product(range(1, N + 1), repeat=len(rows)) if sum(d) <= N)
    v, deg = allocate_fast(T)
    assert v == pytest.approx(best, rel=1e-12)
    _check_degrees(T, v, deg)


def test_too_many_groups_is_infeasible():
    assert allocate_fast(np.ones((3, 2)))[1] is None
    assert not np.isfinite(allocate_dp(np.ones((3, 2)))[0])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30000), min_size=1, max_size=40), st.sampled_from([1000.0, 4096.0, 8192.0]))
def test_bfd_bins_respect_capacity(lengths, unit):
    """Every sequence lands in exactly one bin; a bin holds at most ceil(longest/unit)·unit tokens."""
    lengths = np.array(lengths)
    groups = bfd_groups(lengths, unit)
    assert sorted(i for g in groups for i in g) == list(range(lengths.size))
    for g in groups:
        cap = max(1, int(np.ceil(lengths[g].max() / unit))) * unit
        assert lengths[g].sum() <= cap


def test_lpt_balances_and_respects_capacity():
    """LPT into k groups: all items placed, capacity held, and the classic 4/3 bound vs the mean load."""
    rng = np.random.default_rng(5)
    for k in (3, 16, 40):
        w = rng.exponential(1.0, size=300)
        s = rng.integers(1, 100, size=300)
        groups = lpt_groups(w, s, k, capacity=1e9)
        assert sorted(i for g in groups for i in g) == list(range(300))
        loads = [w[g].sum() for g in groups]
        assert max(loads) <= w.sum() / k + w.max() + 1e-9  # list-scheduling bound
    assert lpt_groups(np.ones(3), np.array([10, 10, 10]), 2, capacity=15) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12), st.integers(1, 8), st.integers(0, 20))
def test_placement_disjoint_and_node_aware(degrees, rpn, extra):
    """Ranks disjoint, in range, degree kept; power-of-two degrees on power-of-two nodes never cross a
    node when they fit in one (buddy packing is always possible)."""
    N = sum(degrees) + extra
    ranks = place_groups(degrees, N, rpn)
    flat = [r for g in ranks for r in g]
    assert len(flat) == len(set(flat)) and all(0 <= r < N for r in flat)
    assert [len(g) for g in ranks] == degrees
    if rpn & (rpn - 1) == 0 and N % rpn == 0 and all(d & (d - 1) == 0 for d in degrees):
        for g in ranks:
            if len(g) <= rpn:
                assert len({r // rpn for r in g}) == 1


def test_placement_keeps_groups_in_nodes_when_possible():
    """3+1 and 2+2 on two nodes of 4: best fit places every group inside one node."""
    ranks = place_groups([2, 3, 1, 2], 8, 4)
    assert all(len({r // 4 for r in g}) == 1 for g in ranks)
    assert ranks[1] == (0, 1, 2)  # largest first, lowest node


def test_crossing_rank_sets_go_to_the_groups_that_lose_least():
    """Two degree-5 groups on 10 ranks with 8 per node: one rank set must cross nodes. The lighter
    group must take it (the heavier crossing would be slower); checked against both assignments."""
    from fcp_data.plan.placement import place_for_times, placed_times

    cm = CostModel(alpha1=1e-9, alpha2=1e-4, alpha3=6e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
                   bandwidth_inter=1e9, ranks_per_node=8, tokens_per_rank=100_000)
    S = np.array([1_000.0, 60_000.0])  # group 0 light, group 1 heavy
    Q = S * S
    ranks = place_for_times(S, Q, [5, 5], 10, cm)
    assert not cm.is_intra_node(ranks[0]) and cm.is_intra_node(ranks[1])
    best = placed_times(S, Q, ranks, cm).max()
    swapped = placed_times(S, Q, [ranks[1], ranks[0]], cm).max()
    assert best <= swapped


def test_stranded_slowest_group_is_packed_into_a_node():
    """Degrees 6, 6, 6, 5, 4, 4 on nodes of 16 + 15, one sequence per group (best fit strands one 4-group across
    nodes). repack_stranded returns the in-node packing: same groups and degrees, every group inside a node, times
    = the all-intra times; the makespan drops when the stranded group was the slowest and stays otherwise (only the
    stranded group gets faster). packed_placement (the candidate track) takes only the first case. A plan with
    nothing stranded comes back as the same object."""
    from fcp_data.plan.placement import build_micro_batch, packed_placement, repack_stranded

    cm = CostModel(alpha1=1e-9, alpha2=1e-4, alpha3=6e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
                   bandwidth_inter=1e9, ranks_per_node=16, tokens_per_rank=100_000)
    deg = [6, 6, 6, 5, 4, 4]
    zeros = np.zeros(6)
    for heavy in (4, 5, 0):  # a 4-group (whichever best fit strands gets the crossing set: both heavy), or a 6-group
        S = np.full(6, 1_000.0)
        S[[4, 5] if heavy != 0 else [0]] = 300_000.0
        mb = build_micro_batch([[g] for g in range(6)], deg, S, S * S, 31, cm)
        assert _stranded([g.ranks for g in mb.groups], 16) == 1
        out = repack_stranded(mb, S, zeros, 31, cm)
        assert _stranded([g.ranks for g in out.groups], 16) == 0 and [len(g.ranks) for g in out.groups] == deg
        assert [g.seq_ids for g in out.groups] == [g.seq_ids for g in mb.groups]
        assert len({r for g in out.groups for r in g.ranks}) == 31
        intra = cm.time(S, S * S, np.array(deg, dtype=float), True)
        assert np.allclose([g.time for g in out.groups], intra) and out.makespan == max(g.time for g in out.groups)
        alt = packed_placement([g.ranks for g in mb.groups], S, S * S, 31, cm)
        if heavy == 0:
            assert out.makespan == mb.makespan and alt is None
        else:
            assert out.makespan < mb.makespan and alt is not None and alt[0] == [g.ranks for g in out.groups]
        assert repack_stranded(out, S, zeros, 31, cm) is out


# ---------------------------------------------------------------- fast paths equal their references (issue 15)
def _bfd_reference(lengths, unit):
    """Best-fit decreasing one sequence at a time (the pre-issue-15 loop)."""
    import bisect
    import math

    order = np.lexsort((np.arange(len(lengths)), -np.asarray(lengths))).tolist()
    groups, rooms, ids = [], [], []
    for i in order:
        s = int(lengths[i])
        if s > unit:
            room, b = math.ceil(s / unit) * unit - s, len(groups)
            groups.append([i])
        else:
            pos = bisect.bisect_left(rooms, s)
            if pos < len(rooms):
                room, b = rooms.pop(pos) - s, ids.pop(pos)
                groups[b].append(i)
            else:
                room, b = unit - s, len(groups)
                groups.append([i])
        if room > 0:
            j = bisect.bisect_left(rooms, room)
            rooms.insert(j, room)
            ids.insert(j, b)
    return groups


def test_bfd_runs_of_equal_lengths_match_one_at_a_time():
    """bfd_groups places a run of equal lengths a bin at a time; the bins must be exactly those of the
    sequence-at-a-time loop (a difference changes every FCP plan), for integer and fractional units."""
    rng = np.random.default_rng(9)
    for t in range(400):
        n = int(rng.integers(1, 400))
        L = rng.integers(1, 40, n) if t % 2 else rng.lognormal(5, 1.5, n).astype(np.int64) + 1
        unit = float(rng.choice([L.max(), L.sum() / rng.integers(1, 30), rng.integers(1, 60), 7.3, L.mean() * 2.5]))
        assert bfd_groups(L, unit) == _bfd_reference(L, unit), (t, unit)


def test_lpt_exact_matches_the_heap_one_by_one():
    """lpt_exact (vectorised blocks) makes exactly lpt_place's choices (least load, lowest id, token room),
    with and without binding capacity, with ties in work, from non-empty starting loads."""
    from fcp_data.plan.lpt import lpt_exact, lpt_place

    rng = np.random.default_rng(3)
    for t in range(300):
        n, k = int(rng.integers(1, 3000)), int(rng.choice([1, 5, 31, 32, 100, 700]))
        s = rng.lognormal(5, 1.7, n).astype(np.int64).astype(float) + 1
        w = -np.sort(-(s * s * 1e-9 + s * 1e-4)) if t % 3 else rng.integers(1, 4, n).astype(float)
        cap = float(max(s.max(), s.sum() / k * rng.uniform(0.9, 1.6))) if t % 4 else np.inf
        load0 = rng.integers(0, 3, k).astype(float) * (t % 5 == 0)
        ld, tk = load0.tolist(), [0.0] * k
        want = lpt_place(w.tolist(), s.tolist(), ld, tk, cap)
        load, tok = load0.copy(), np.zeros(k)
        got = lpt_exact(w, s, load, tok, cap)
        assert (want is None) == (got is None), t
        if want is not None:
            assert got.tolist() == want and load.tolist() == ld and tok.tolist() == tk, t


def test_lpt_on_nearly_full_groups_is_not_quadratic():
    """50k sequences into 1000 groups filled to 99 %: the skip-and-push-back heap took ~5 s (every full group
    popped and pushed again for every sequence), the parking heap + vectorised blocks take ~25 ms. CPU-time
    bound 1.5 s (generous for a shared machine)."""
    import time

    from fcp_data.plan.lpt import lpt_heap

    rng = np.random.default_rng(0)
    L = np.minimum(rng.lognormal(6, 1.6, 50_000).astype(np.int64) + 1, 20_000).astype(float)
    w = L * L * 1e-8 + 3e-4 * L
    order = np.lexsort((np.arange(L.size), -w))
    cap = float(np.ceil(L.sum() / 1000 / 0.99))
    start = time.process_time()
    label = lpt_heap(w[order], L[order], 1000, cap)
    assert label is not None and np.bincount(label, weights=L[order], minlength=1000).max() <= cap
    assert time.process_time() - start < 1.5


# ---------------------------------------------------------------- sparse time table (issue 12, part B)
def _sparse_cases(seed: int, count: int):
    """Random (cost model, S, Q, B, V, N, allowed): v1 and v2 presets and a synthetic v2 model with every
    §4.1 term, multi-node degrees, memory-tight groups (S just below / at / above multiples of E), pow2 masks."""
    from fcp_data.presets import preset_cost_model

    cms = [preset_cost_model("Qwen3-8B", "ascend-910c", v2=False), preset_cost_model("Qwen3-8B", "ascend-910c", v2=True),
           preset_cost_model("Llama3-8B", "h100", v2=True), preset_cost_model("Qwen3-8B", "h100", v2=False),
           CM.replace(gamma=0.003, alpha_blk=1e-6, alpha_vis=1e-5)]
    rng = np.random.default_rng(seed)
    for case in range(count):
        cm = cms[case % len(cms)]
        N = int(rng.choice([1, 2, 3, 5, 8, 16, 17, 33, 64, 100, 257]))
        K = int(rng.integers(1, N + 2))
        E = cm.tokens_per_rank
        if case % 3 == 0:  # memory-tight: exactly k·E, one token either side
            S = (rng.integers(1, max(2, 2 * N // K), size=K) * E + rng.integers(-1, 2, size=K)).astype(float)
        else:
            S = rng.lognormal(7, 2.5, size=K).clip(1, E * N)
        Q = S * S * rng.uniform(0.01, 2.0, size=K)
        B, V = S * rng.uniform(1, 2, size=K), S * rng.uniform(0, 1, size=K)
        yield cm, np.maximum(S, 1.0), Q, B, V, N, (pow2_mask(N) if case % 4 == 0 else None)


def test_sparse_allocation_equals_dense_bit_for_bit(monkeypatch):
    """allocate_fast on the sparse TimeTable returns exactly the dense optimum and degrees (3000 random
    tables with v2 terms and memory-tight groups; the sparse path forced, small tables normally go dense);
    a difference would change FCP plans."""
    import fcp_data.plan.allocate as allocate_module

    monkeypatch.setattr(allocate_module, "_DENSE_MAX", 0)
    for cm, S, Q, B, V, N, allowed in _sparse_cases(11, 3000):
        dense = time_table(S, Q, N, cm, allowed=allowed, B=B, V=V)
        sparse = time_table(S, Q, N, cm, B=B, V=V, sparse=True)
        v_d, d_d = allocate_fast(dense)
        v_s, d_s = allocate_fast(sparse, N, allowed=allowed)
        assert v_s == v_d or (not np.isfinite(v_d) and not np.isfinite(v_s))
        assert (d_s is None) == (d_d is None)
        if d_d is not None:
            assert d_s.tolist() == d_d.tolist()
        if N <= 64:  # and the paper's DP agrees through the dense view of the sparse table
            assert allocate_dp(sparse, N, allowed=allowed)[0] == v_d or not np.isfinite(v_d)


def test_useful_degree_bound_against_the_dense_table():
    """Past each row's last useful degree the dense prefix minimum T̃ never falls again (the bound of
    useful_degree_bound is true for the float entries too), and no degree below the memory minimum is
    finite. With gamma > 0 the rows are short (O(sqrt(work/gamma)) degrees), not N."""
    widths = []
    for cm, S, Q, B, V, N, allowed in _sparse_cases(12, 2000):
        sparse = time_table(S, Q, N, cm, B=B, V=V, sparse=True).masked(allowed)
        T = np.asarray(sparse)
        assert T.tolist() == time_table(S, Q, N, cm, allowed=allowed, B=B, V=V).tolist()
        cand, first, last = sparse.useful_range()
        Tt = np.minimum.accumulate(T, axis=1)
        for i in range(S.size):
            if first[i] == cand.size:
                assert not np.isfinite(T[i]).any()
                continue
            assert not np.isfinite(T[i, : cand[first[i]] - 1]).any() and np.isfinite(T[i, cand[first[i]] - 1])
            d = cand[last[i]]
            assert (Tt[i, d - 1:] == Tt[i, d - 1]).all(), (i, d, N)
            if cm.gamma and N == 257 and allowed is None:
                widths.append(last[i] - first[i] + 1)
    assert widths and np.median(widths) < 257 / 4


def test_sparse_table_columns_and_memory():
    """table[:, j] is the dense column; at 4096 ranks × 4096 groups (v2 preset) the allocation stores a few
    degrees per group: its peak traced memory stays far below the dense table's 134 MB."""
    import tracemalloc

    from fcp_data.presets import preset_cost_model

    cm = preset_cost_model("Qwen3-8B", "ascend-910c", v2=True)
    rng = np.random.default_rng(3)
    S = rng.lognormal(7, 1.5, size=300).clip(1, 4 * cm.tokens_per_rank)
    Q = S * S
    sparse = time_table(S, Q, 64, cm, B=S, sparse=True)
    dense = time_table(S, Q, 64, cm, B=S)
    for j in (0, 5, 15, 16, 63):
        assert sparse[:, j].tolist() == dense[:, j].tolist()
    kept = np.asarray(sparse)  # now the entries are kept: columns and masked views must not change
    kept[:] = -1.0  # writing to the returned array must not reach the table
    for j in (0, 15, 63):
        assert sparse[:, j].tolist() == dense[:, j].tolist()
    assert np.asarray(sparse.masked(pow2_mask(64))).tolist() == time_table(S, Q, 64, cm, pow2_mask(64), B=S).tolist()
    N = 4096
    S = rng.lognormal(8, 1.5, size=N).clip(1, cm.tokens_per_rank)
    for model in (cm, preset_cost_model("Qwen3-8B", "ascend-910c", v2=False)):
        table = time_table(S, S * S, N, model, B=S, sparse=True)
        tracemalloc.start()
        value, deg = allocate_fast(table)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert deg is not None and deg.sum() <= N
        assert peak < 40e6, peak  # dense: K·N·8 bytes = 134 MB per array


def _place_reference(degrees, num_ranks, R):
    """The pre-issue-12 placement loop (numpy scans per group): largest first; whole free nodes for a
    group larger than a node; best fit (fewest free ranks that hold it, lowest node); else spread over
    the nodes with most free ranks."""
    num_nodes = -(-num_ranks // R)
    free = [list(range(n * R, min((n + 1) * R, num_ranks))) for n in range(num_nodes)]
    count = np.array([len(f) for f in free])
    out = [None] * len(degrees)

    def take(n, k):
        got, free[n] = free[n][:k], free[n][k:]
        count[n] -= len(got)
        return got

    for g in sorted(range(len(degrees)), key=lambda g: (-degrees[g], g)):
        need, ranks = degrees[g], []
        if need > R:
            for n in np.flatnonzero(count == R).tolist():
                if need < R:
                    break
                ranks += take(n, R)
                need -= R
        if need > 0:
            fits = np.flatnonzero(count >= need)
            if fits.size:
                ranks += take(int(fits[np.argmin(count[fits])]), need)
            else:
                for n in np.lexsort((np.arange(num_nodes), -count)).tolist():
                    k = min(need, int(count[n]))
                    ranks += take(n, k)
                    need -= k
                    if need == 0:
                        break
        out[g] = tuple(sorted(ranks))
    return out


def _stranded(ranks, R):
    """Groups of degree 2…R whose ranks span more than one node."""
    return sum(1 for g in ranks if 1 < len(g) <= R and g[0] // R != g[-1] // R)


def _packing_exists(degrees, N, R) -> bool:
    """Brute force: can every group of degree 2…R lie inside one node (the others only need Σ degrees ≤ N ranks,
    which holds)? Tries every node for every such group."""
    caps = [min((n + 1) * R, N) - n * R for n in range(-(-N // R))]
    rigid = [d for d in degrees if 1 < d <= R]
    for nodes in itertools.product(range(len(caps)), repeat=len(rigid)):
        used = [0] * len(caps)
        for d, n in zip(rigid, nodes):
            used[n] += d
        if all(u <= c for u, c in zip(used, caps)):
            return True
    return False


def test_placement_equals_the_reference_loop():
    """place_groups (bucketed best fit, one pass for the degree-1 tail) places every group exactly as the
    reference loop: 6000 random degree vectors (any, powers of two, larger than a node, partial last node)."""
    rng = np.random.default_rng(21)
    for t in range(6000):
        R, N = int(rng.choice([1, 2, 3, 4, 5, 8, 16, 64])), int(rng.integers(1, 200))
        K = int(rng.integers(1, N + 1))
        deg = [rng.integers(1, max(2, N // K + 1), K), 2 ** rng.integers(0, 6, K), rng.integers(1, 2 * R + 2, K),
               np.maximum(1, rng.exponential(3, K).astype(int))][t % 4].tolist()
        while sum(deg) > N:
            deg.pop()
        if deg:
            assert place_groups(deg, N, R) == _place_reference(deg, N, R), (R, N, deg)


def test_pack_in_nodes_finds_a_packing_whenever_one_exists():
    """Against brute force, 1500 small instances (nodes of 2–8 ranks, 2–4 nodes, partial last node, groups larger
    than a node, degree-1 groups), half of them built to have an in-node packing (each node's capacity cut into
    random parts, shuffled) — the tight ones best fit decreasing gets wrong: pack_in_nodes returns a valid
    placement with every group of degree 2…R inside one node exactly when such a packing exists (None
    otherwise). The issue-12 example (6, 6, 6, 5, 4, 4 on 16 + 15 ranks): best fit strands a group, the search
    does not."""
    rng = np.random.default_rng(5)
    fixed = 0
    for t in range(1500):
        R, nodes = int(rng.integers(2, 9)), int(rng.integers(2, 5))
        N = nodes * R - int(rng.integers(0, R))
        if t % 2:  # a packing exists by construction
            deg = []
            for n in range(nodes):
                cap = min((n + 1) * R, N) - n * R
                cuts = sorted(rng.choice(np.arange(1, cap), size=int(rng.integers(0, cap)), replace=False).tolist()) if cap > 1 else []
                deg += np.diff([0, *cuts, cap]).tolist()
            deg = [int(d) for d in rng.permutation(deg)][: 7 + sum(1 for d in deg if d == 1)]
        else:
            deg = rng.integers(1, R + 3, int(rng.integers(1, 8))).tolist()
            while sum(deg) > N:
                deg.pop()
        if not deg or sum(1 for d in deg if 1 < d <= R) > 7:
            continue
        got = pack_in_nodes(deg, N, R)
        assert (got is not None) == _packing_exists(deg, N, R), (R, N, deg, got)
        if got is not None:
            flat = [r for g in got for r in g]
            assert len(flat) == len(set(flat)) and all(0 <= r < N for r in flat) and [len(g) for g in got] == deg
            assert _stranded(got, R) == 0 and all(list(g) == sorted(g) for g in got)
            fixed += _stranded(place_groups(deg, N, R), R) > 0
    assert fixed >= 10, fixed  # 13 with this seed: the draw reaches the cases best fit gets wrong
    assert _stranded(_place_reference([6, 6, 6, 5, 4, 4], 31, 16), 16) == 1
    assert _stranded(pack_in_nodes([6, 6, 6, 5, 4, 4], 31, 16), 16) == 0


def test_running_min_answers_like_the_dense_running_minimum():
    """RunningMin (tau groupings' table): row minima equal the dense T̃'s last column, and min_ranks on every
    row prefix equals 1 + (T̃ > τ).sum(axis=1) at τ = its floor, dense entries above it and larger values
    (300 random tables, v1/v2, infeasible rows); below the floor it refuses."""
    from fcp_data.presets import preset_cost_model

    rng = np.random.default_rng(31)
    cms = [preset_cost_model("Qwen3-8B", "ascend-910c", v2=False), preset_cost_model("Qwen3-8B", "ascend-910c", v2=True)]
    for case in range(300):
        cm = cms[case % 2]
        N, K = int(rng.choice([1, 2, 5, 16, 17, 40, 128, 300])), int(rng.integers(1, 60))
        S = rng.lognormal(9, 2, K).clip(1, N * cm.tokens_per_rank * (1.1 if case % 7 == 0 else 1))
        table = time_table(S, S * S * rng.uniform(1, 2, K), N, cm, B=S, sparse=True)
        rm = table.running_min(cm.beta1)
        Tt = np.minimum.accumulate(np.asarray(table), axis=1)
        assert rm[:, -1].tolist() == Tt[:, -1].tolist()
        lo = max(Tt[:, -1].max(), cm.beta1)
        if not np.isfinite(lo):
            continue
        above = Tt[(Tt >= lo) & np.isfinite(Tt)]
        for tau in [lo, lo * 1.5, lo * 10] + list(above[:6]):
            for m in (K, K // 2, 1, 0):
                assert rm[:m].min_ranks(tau).tolist() == (1 + (Tt[:m] > tau).sum(axis=1)).tolist()
        with pytest.raises(ValueError):
            rm.min_ranks(lo * 0.5)


def test_tau_fitting_prefix_equals_the_full_scan():
    """The headroom fill's doubling prefix scan (tau._fitting_prefix) returns what scanning every candidate
    returns (the first index where time > τ or memory fails); a failure means the makespan-driven
    ``-tau+`` groupings changed."""
    from fcp_data.cost import sequence_terms
    from fcp_data.plan.tau import _fitting_prefix
    from fcp_data.presets import preset_cost_model

    rng = np.random.default_rng(3)
    cm = preset_cost_model("Qwen3-8B", "ascend-910c", v2=True)
    for _ in range(300):
        n = int(rng.integers(2, 300))
        lengths = rng.integers(1, 20000, size=n)
        terms = sequence_terms(lengths.astype(float), (rng.random(n) < 0.2).astype(float), rng.integers(0, 50, n).astype(float))
        members = [int(rng.integers(n))]
        cand = np.setdiff1d(np.arange(n), members)[::-1]
        d = int(rng.integers(2, 33))
        tau = float(cm.time(*(x[members].sum() for x in terms[:2]), d, d <= cm.ranks_per_node,
                            B=terms[2][members].sum(), V=terms[3][members].sum())) * float(rng.uniform(0.9, 3.0))
        S, Q, B, V = (x[members].sum() + np.cumsum(x[cand]) for x in terms)
        T = np.atleast_1d(cm.time(S, Q, d, d <= cm.ranks_per_node, B=B, V=V))
        ok = (T <= tau) & (S <= d * cm.tokens_per_rank)
        assert _fitting_prefix(members, cand, terms, d, tau, cm) == int(ok.size if ok.all() else np.argmin(ok))
