"""Mutation review (search.py, starts.py, placed_search.py and the escalation in solvers._search_candidates), second
pass: behaviour the suite left unpinned. References: the module docstrings/comments, brute force, the allocator."""
from __future__ import annotations

import numpy as np
import pytest
from test_plan_search import placed_instance

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.solvers import fcp_micro_batch

# tests/plan/test_plan_search.py's PACKING instance: 22 sequences, 99.7 % of 4 ranks x 4096 tokens, escalated
PACKING = np.array([1294, 2121, 452, 256, 1263, 1023, 73, 118, 2098, 14, 637, 290, 55, 583, 1389, 1154, 436, 990,
                    298, 1498, 240, 53])
PACKING_ETAS = np.isin(np.arange(PACKING.size), [1, 5, 7, 18, 21]).astype(np.float64)
PACKING_CM = CostModel(alpha1=4.259364898215977e-09, alpha2=1.1169053087008269e-05, alpha3=1551410.1979696408,
                       beta1=0.0013164553628956894, beta2=0.013997212790513731, bandwidth_intra=42903056514.99858,
                       bandwidth_inter=1e10, ranks_per_node=16, tokens_per_rank=4096)


def test_longer_search_starts_from_the_first_searchs_incumbent_too(monkeypatch):
    """solvers._search_candidates: "a longer search from every incumbent (the first one's too)": the second call's
    seeds are the incumbents after the first search, i.e. the first call's seeds plus the any-search track's
    incumbent (one of the groupings the first call returned)."""
    import fcp_data.plan.solvers as solvers

    calls = []
    real = solvers.search_groupings

    def spy(lengths, etas, num_ranks, cost_model, seeds, *a, **k):
        out = real(lengths, etas, num_ranks, cost_model, seeds, *a, **k)
        calls.append(([sorted(map(sorted, g)) for g in seeds], [sorted(map(sorted, g)) for g in out]))
        return out

    monkeypatch.setattr(solvers, "search_groupings", spy)
    fcp_micro_batch(PACKING, PACKING_ETAS, 4, PACKING_CM)
    assert len(calls) >= 2
    (seeds1, found1), (seeds2, _) = calls[0], calls[1]
    assert found1
    assert len(seeds2) == len(seeds1) + 1
    assert any(g in seeds2 and g not in seeds1 for g in found1)


EXAMPLE_CM = CostModel(alpha1=1.23e-09, alpha2=8.22e-05, alpha3=458000.0, beta1=0.00582, beta2=0.00647,
                       bandwidth_intra=1.04e10, bandwidth_inter=1e10, ranks_per_node=8, tokens_per_rank=4096)


def test_escalation_due_boundaries():
    """escalation_due: "at least ESCALATE_FILL full" (Σs = 0.9·N·E exactly qualifies, one token less does not) and
    "more than ESCALATE_GAP above" the M = 1 lower bound (half the gap: no; 1.5x the gap: yes); within the search's
    size bounds only (2 … SEARCH_MAX_SEQUENCES sequences, ≤ SEARCH_MAX_RANKS ranks, both inclusive)."""
    from fcp_data.plan.microbatch import split_lower_bound
    from fcp_data.plan.search import (ESCALATE_FILL, ESCALATE_GAP, SEARCH_MAX_RANKS, SEARCH_MAX_SEQUENCES,
                                      escalation_due, search_runs)

    E, N = EXAMPLE_CM.tokens_per_rank, 10
    L = np.full(9, E)
    assert L.sum() == ESCALATE_FILL * N * E
    e = np.zeros(L.size)
    bound = split_lower_bound(L, e, N, EXAMPLE_CM)(1)
    assert escalation_due(L, e, N, EXAMPLE_CM, None, bound * (1 + 1.5 * ESCALATE_GAP))
    assert not escalation_due(L, e, N, EXAMPLE_CM, None, bound * (1 + 0.5 * ESCALATE_GAP))
    L2 = L.copy()
    L2[0] -= 1
    bound2 = split_lower_bound(L2, e, N, EXAMPLE_CM)(1)
    assert not escalation_due(L2, e, N, EXAMPLE_CM, None, bound2 * 10)
    assert search_runs(2, SEARCH_MAX_RANKS) and search_runs(SEARCH_MAX_SEQUENCES, 2)
    assert not search_runs(1, 4) and not search_runs(SEARCH_MAX_SEQUENCES + 1, 4) and not search_runs(4, SEARCH_MAX_RANKS + 1)


def test_placed_descent_starts_from_the_best_incumbent(monkeypatch):
    """solvers._search_candidates: the descent on the placed makespan starts from the incumbent of least allocation
    value (``min(best.values())``) — tests/plan/test_plan_search.py's 26-sequence, 33-rank instance, where it runs."""
    import fcp_data.plan.solvers as solvers

    L, e, cm = placed_instance()
    seen, starts = {}, []
    real_sc, real_pd = solvers._search_candidates, solvers.placed_descent

    def sc(lengths, etas, num_ranks, cost_model, visual, best, *a, **k):
        seen["best"] = best
        return real_sc(lengths, etas, num_ranks, cost_model, visual, best, *a, **k)

    def pd(groups, *a, **k):
        values = sorted(b[0] for b in seen["best"].values())
        starts.append((groups, min(seen["best"].values(), key=lambda b: b[0])[1], values))
        return real_pd(groups, *a, **k)

    monkeypatch.setattr(solvers, "_search_candidates", sc)
    monkeypatch.setattr(solvers, "placed_descent", pd)
    fcp_micro_batch(L, e, 33, cm)
    assert starts
    for groups, want, values in starts:
        assert values[0] < values[-1]  # the choice matters here
        assert groups == want


def test_more_starts_until_enough_distinct_local_optima(monkeypatch):
    """search_groupings: "at least num_starts of them and more until SEARCH_COMPOUND distinct local optima are found".
    With every descent ending in the same grouping (a stub), every distinct start is descended — not only the first
    num_starts."""
    import fcp_data.plan.search as search

    calls = []

    def stub(label, terms, work, N, cm, max_steps=64, compound=True, budget=None):
        calls.append((tuple(search._canonical(np.asarray(label)).tolist()), compound))
        return 0, 1.0, np.zeros(len(label), dtype=np.int64)

    monkeypatch.setattr(search, "local_search", stub)
    L = np.array([3000, 2500, 2000, 1500, 1000, 800, 600, 400, 300, 200])
    e = np.zeros(L.size)
    N = 8
    cm = EXAMPLE_CM
    work = np.asarray(cm.time(*sequence_terms(L, e)[:2], 1, True))
    out = search.search_groupings(L, e, N, cm, [], work, num_starts=2)
    plain = [c for c, compound in calls if not compound]
    from fcp_data.plan.starts import mixed_starts, repair_bins
    from fcp_data.plan.bfd import bfd_groups
    starts = repair_bins(bfd_groups(L, cm.tokens_per_rank), L, N, cm.tokens_per_rank) + mixed_starts(work, N)
    distinct = {tuple(search._canonical(search._to_label(g, L.size)).tolist()) for g in starts}
    assert len(distinct) > 2 + 1
    assert len(plain) == len(set(plain)) == len(distinct)
    assert out == [[list(range(L.size))]]


def test_placed_descent_runs_on_two_nodes_and_splits_a_crossing_ring():
    """placed_descent returns None only on one node (num_ranks ≤ ranks_per_node). On 2 nodes of 4 ranks with a slow
    inter-node link, 8 equal sequences in one group run as one 8-rank ring across the nodes; a move to a new group
    (the only kind of neighbour of a single group) splits it, and the descent returns a grouping whose placed makespan
    is lower."""
    from fcp_data.plan.placed_search import placed_descent, placed_value

    cm = CostModel(alpha1=1e-10, alpha2=1e-6, alpha3=4e5, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
                   bandwidth_inter=1e9, ranks_per_node=4, tokens_per_rank=8192)
    L, e = np.full(8, 6000), np.zeros(8)
    start = [list(range(8))]
    found = placed_descent(start, L, e, 8, cm)
    assert found is not None
    assert placed_value(found[2], L, e, 8, cm)[0] < placed_value(start, L, e, 8, cm)[0]
    assert placed_descent(start, L, e, 4, cm.replace(ranks_per_node=4)) is None  # one node: at once


def _all_neighbours(groups):
    """Every grouping one move (to another group or a new one) or one swap away (independent of placed_search)."""
    out = []
    K = len(groups)
    for gi in range(K):
        for s in groups[gi]:
            for gj in range(K + 1):
                if gj == gi or (gj == K and len(groups[gi]) == 1):
                    continue
                new = [list(g) for g in groups] + [[]]
                new[gi].remove(s)
                new[gj].append(s)
                out.append([sorted(g) for g in new if g])
    for gi in range(K):
        for gj in range(gi + 1, K):
            for a in groups[gi]:
                for b in groups[gj]:
                    new = [list(g) for g in groups]
                    new[gi] = sorted([x for x in new[gi] if x != a] + [b])
                    new[gj] = sorted([x for x in new[gj] if x != b] + [a])
                    out.append(new)
    return out


def test_placed_descent_takes_the_best_neighbour_and_ends_in_a_local_optimum():
    """placed_search docstring: each step takes *the best* neighbour by placed makespan (moves and swaps), while one
    improves by a relative 1e-9. One step (max_evals = the neighbour count) reaches the minimum over all neighbours;
    the full descent ends where no neighbour improves."""
    from fcp_data.plan.placed_search import placed_descent, placed_value

    cm = CostModel(alpha1=3e-10, alpha2=1e-6, alpha3=4e5, beta1=1e-3, beta2=1e-3, bandwidth_intra=1e11,
                   bandwidth_inter=1e9, ranks_per_node=4, tokens_per_rank=8192)
    L = np.array([9000, 7000, 6500, 5000, 3000, 2500, 1200, 800])
    e = np.zeros(L.size)
    start = [[0, 1, 2, 3, 4, 5], [6, 7]]
    pv = lambda g: placed_value(g, L, e, 8, cm)[0]  # noqa: E731
    neigh = _all_neighbours(start)
    values = sorted(pv(g) for g in neigh)
    assert values[0] < pv(start) * (1 - 1e-9) and values[0] < values[-1]
    one = placed_descent(start, L, e, 8, cm, max_evals=len(neigh))
    assert one is not None and pv(one[2]) == values[0]
    full = placed_descent(start, L, e, 8, cm)
    assert full is not None
    end = pv(full[2])
    assert end <= values[0]
    assert all(pv(g) >= end * (1 - 1e-9) for g in _all_neighbours(full[2]))


# ---------------------------------------------------------------- starts.py, by hand from the docstrings

def test_repair_bins_merges_the_two_roomiest_until_the_count_fits():
    """E = 10, N = 2. Bins 9, 3, 4, 2 (rooms 1, 7, 6, 8): merge the roomiest two (2 and 3 → 5, at the lower id),
    then 5 and 4 (rooms 5, 6) → 9 | 9: two bins = N, and memory fits: one result. Bins 6, 6, 6: merge 0 + 1 → 12 | 6
    (count = N, returned although memory needs 3 ranks), then → 18 (fits, fewer bins): both returned. Input that
    fits: []."""
    from fcp_data.plan.starts import repair_bins

    assert repair_bins([[0], [1], [2], [3]], np.array([9, 3, 4, 2]), 2, 10) == [[[0], [1, 2, 3]]]
    assert repair_bins([[0], [1], [2]], np.array([6, 6, 6]), 2, 10) == [[[0, 1], [2]], [[0, 1, 2]]]
    assert repair_bins([[0], [1]], np.array([6, 6]), 2, 10) == []
    assert repair_bins([[0], [1]], np.array([6, 6]), 3, 10) == []  # fits with fewer bins than ranks
    assert repair_bins([[0], [1]], np.array([10, 10]), 2, 10) == []  # ceil(10/10) = 1: exactly full fits
    # fewer bins than ranks that need more (2 + 2 of N = 3): no start (the docstring says why)
    assert repair_bins([[0], [1]], np.array([15, 15]), 3, 10) == []


def test_mixed_starts_by_hand():
    """work 5, 4, 3, 2, 1 on N = 3: K = 1 all together; K = 2 on 2 + 1 ranks (N mod K groups get one more): 5 → g0
    (2.5 < 5), 4 → g1 (4 < 4.5), 3 → g0 (4 < 7), 2 → g0 (5 < 6), 1 → g1 (5 < 5.5); K = 3 one rank each (classic
    LPT): 5 | 4 + 1 | 3 + 2. Ties to the lowest id: two equal items on 2 ranks, K = 2: one each."""
    from fcp_data.plan.starts import mixed_starts

    assert mixed_starts(np.array([5.0, 4.0, 3.0, 2.0, 1.0]), 3) == [[[0, 1, 2, 3, 4]], [[0, 2, 3], [1, 4]],
                                                                    [[0], [1, 4], [2, 3]]]
    assert mixed_starts(np.array([2.0, 2.0]), 2) == [[[0, 1]], [[0], [1]]]
    # the work per rank *with* the item: 3 → g0 (1.5 < 3), 3 → g0 (3 = 3, lowest id), 1 → g1 (1 < 3.5)
    assert mixed_starts(np.array([3.0, 3.0, 1.0]), 3) == [[[0, 1, 2]], [[0, 1], [2]], [[0], [1], [2]]]
    assert len(mixed_starts(np.ones(6), 4)) == 4 and len(mixed_starts(np.ones(3), 8)) == 3  # K = 1 … min(N, n)


def test_wider_bins_are_the_repaired_bfd_bins_of_each_width():
    """wider_bins: for c = 2 … units (inclusive), BFD bins of c·E tokens, repaired (repair_bins) when they need more
    than N ranks, else (or when repair_bins gives nothing) as they are — in that order."""
    from fcp_data.plan.bfd import bfd_groups
    from fcp_data.plan.starts import repair_bins, wider_bins

    rng = np.random.default_rng(2)
    for _ in range(20):
        L = rng.integers(100, 3000, int(rng.integers(4, 20)))
        N, E, units = int(rng.integers(2, 9)), 2048, int(rng.integers(2, 6))
        want = []
        for c in range(2, units + 1):
            bins = bfd_groups(L, c * E)
            need = sum(max(1, -(-int(L[g].sum()) // E)) for g in bins)
            want += (repair_bins(bins, L, N, E) if need > N else []) or [bins]  # none repaired: as they are
        assert wider_bins(L, N, E, units) == want


# ---------------------------------------------------------------- search.py internals, by hand / brute force

def test_neighbour_labels_by_hand():
    """label [0, 0, 1], work [3, 2, 1]: moves (sequence × other group or a new group 2, no new group for a
    singleton), swaps (pairs in different groups), merges (pairs of groups), 2-way LPT splits of groups with ≥ 2
    members (3 stays — ties to the first half — 2 goes to the new group 2)."""
    from fcp_data.plan.search import neighbour_labels

    got = neighbour_labels(np.array([0, 0, 1]), np.array([3.0, 2.0, 1.0])).tolist()
    moves = [[1, 0, 1], [2, 0, 1], [0, 1, 1], [0, 2, 1], [0, 0, 0]]
    swaps = [[1, 0, 0], [0, 1, 0]]
    merges = [[0, 0, 0]]
    splits = [[0, 2, 1]]
    assert got == moves + swaps + merges + splits


def test_double_moves_and_repartitions_by_hand():
    """double_moves: every pair of single moves of two *different* sequences, each to another group or the new
    group K (label [0, 0, 1]: 6 moves, 15 pairs, 3 of one sequence twice: 12 rows, each changing exactly 2 entries).
    repartitions(k = 2): every id pair among 0 … K whose union has 2 … max_union members, every assignment with the
    union's first sequence in the first id: (0, 1) 3 members → 4 rows, (0, 2) 2 members → 2 rows, (1, 2) 1 member →
    none."""
    from fcp_data.plan.search import double_moves, repartitions

    label = np.array([0, 0, 1])
    dm = double_moves(label)
    assert dm.shape == (12, 3)
    assert all(int((row != label).sum()) == 2 for row in dm)
    assert len({tuple(r) for r in dm.tolist()}) == 12
    rp = repartitions(label, 2, 10, 1 << 20)
    assert rp.shape == (6, 3)
    assert sorted(map(tuple, rp[:4].tolist())) == sorted([(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)])
    assert sorted(map(tuple, rp[4:].tolist())) == sorted([(0, 0, 1), (0, 2, 1)])
    assert repartitions(label, 3, 10, 1 << 20).shape[0] == 9  # ids (0, 1, 2), 3 members: 3^2 assignments


def test_values_equal_a_brute_force_of_the_docstring():
    """_values/_score: excess = max(0, Σ ceil(S_g/E) − N); value = the k-th largest entry (k = N − #groups) of the
    groups' running-minimum tables (memory-feasible entries only at excess 0: S ≤ d·E inclusive; all entries above);
    spread = the sum of the entries ranked k … N − 1. Random groupings of 6 sequences on 5 ranks, sizes so that some
    groups fill d·E exactly."""
    from fcp_data.plan.search import _score

    cm = CostModel(alpha1=3e-10, alpha2=2e-6, alpha3=3e5, beta1=2e-3, beta2=3e-3, bandwidth_intra=5e10,
                   bandwidth_inter=1e10, ranks_per_node=4, tokens_per_rank=1000, gamma=1e-4)
    L = np.array([1000, 500, 500, 1500, 250, 750])
    e = np.array([0, 1, 0, 0, 1, 0], dtype=np.float64)
    terms = np.stack(sequence_terms(L, e), axis=1)
    N, E = 5, 1000
    rng = np.random.default_rng(0)
    labels = [rng.integers(0, int(rng.integers(1, 6)), L.size) for _ in range(60)] + [np.array([0, 1, 1, 2, 3, 3])]
    ex, val, spr = _score(labels, terms, N, cm)
    exact_fill = 0
    for r, lab in enumerate(labels):
        gs = [np.flatnonzero(lab == g) for g in np.unique(lab)]
        need = sum(max(1, int(np.ceil(L[g].sum() / E - 1e-12))) for g in gs)
        excess = max(0, need - N)
        entries = []
        for g in gs:
            S, Q, B, V = terms[g].sum(axis=0)
            row, best = [], np.inf
            for d in range(1, N + 1):
                t = float(cm.time(S, Q, d, d <= cm.ranks_per_node, B=B, V=V))
                if excess == 0 and S > d * E:
                    t = np.inf
                best = min(best, t)
                row.append(best)
            exact_fill += any(S == d * E for d in range(1, N + 1))
            entries += row
        entries.sort(reverse=True)
        k = N - len(gs)
        assert ex[r] == excess
        if k < 0:
            assert val[r] == np.inf
            continue
        assert val[r] == pytest.approx(entries[k], rel=1e-12)
        assert spr[r] == pytest.approx(sum(entries[k:N]), rel=1e-12)
    assert exact_fill > 10


def test_best_prefers_a_flatter_grouping_at_an_equal_value():
    """_best: fewer missing ranks first; values within a relative 1e-9 are equal, then the lower spread wins; at an
    equal value a lower spread (by 1e-9) is an improvement (crossing a plateau)."""
    from fcp_data.plan.search import _best

    cur = (0, 1.0, 5.0)
    ex = np.array([0, 0])
    assert _best((ex, np.array([1.0, 1.0]), np.array([4.0, 6.0])), cur) == (0, (0, 1.0, 4.0))
    assert _best((ex, np.array([1.0, 1.0 + 1e-12]), np.array([4.5, 3.0])), cur) == (1, (0, 1.0 + 1e-12, 3.0))
    assert _best((ex, np.array([1.0, 1.0]), np.array([5.0, 6.0])), cur) is None
    assert _best((np.array([1, 0]), np.array([0.5, 2.0]), np.array([0.0, 9.0])), (1, 1.0, 1.0)) == (1, (0, 2.0, 9.0))


def test_polisher_keeps_the_plan_unless_strictly_faster():
    """polisher: a micro-batch is re-planned and the new plan kept only where it is *faster* (equal: the old one)."""
    from fcp_data.plan.search import polisher
    from fcp_data.plan.types import CPGroup, MicroBatchPlan

    old = MicroBatchPlan(groups=(CPGroup(ranks=(0, 1), seq_ids=(3, 7), time=1.0),), makespan=1.0)
    same = MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=(0,), time=1.0), CPGroup(ranks=(1,), seq_ids=(1,), time=0.5)),
                          makespan=1.0)
    faster = MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=(0,), time=0.9), CPGroup(ranks=(1,), seq_ids=(1,), time=0.5)),
                            makespan=0.9)
    opts = {"search": False}
    assert polisher(opts, lambda ids: (same, None), 2)([old]) == [old] and "search" not in opts
    got = polisher({}, lambda ids: (faster, None), 2)([old])[0]
    assert got.makespan == 0.9 and [g.seq_ids for g in got.groups] == [(3,), (7,)]  # local ids mapped back


def _ten():
    L = np.array([3000, 2500, 2000, 1500, 1000, 800, 600, 400, 300, 200])
    e = np.zeros(L.size)
    return L, e, np.asarray(EXAMPLE_CM.time(*sequence_terms(L, e)[:2], 1, True))


def test_search_groupings_orders_starts_and_picks_the_best_optima_for_compound_steps(monkeypatch):
    """search_groupings (docstring), local_search stubbed: the starts are descended best score first (excess, then
    value, then their order); the local optima sorted by (excess, value) — the best SEARCH_COMPOUND (3) distinct ones
    get the compound steps; only memory-feasible (excess 0) groupings are returned, in that order."""
    import fcp_data.plan.search as search

    L, e, work = _ten()
    n, N = L.size, 8
    results = [(1, 0.5), (0, 2.0), (0, 1.0), (0, 3.0), (0, 1.5)]  # what the 5 plain descents end in
    labels = [np.arange(n) % (i + 2) for i in range(len(results))]
    plain, compound = [], []

    def stub(label, terms, work, N, cm, max_steps=64, compound=True, budget=None):
        label = np.asarray(label)
        if not compound:
            i = len(plain)
            plain.append(label.copy())
            return results[i][0], results[i][1], search._canonical(labels[i])
        key = tuple(label.tolist())
        i = [tuple(search._canonical(x).tolist()) for x in labels].index(key)
        compound_calls.append(i)
        return results[i][0], results[i][1], label

    compound_calls = compound
    monkeypatch.setattr(search, "local_search", stub)
    out = search.search_groupings(L, e, N, EXAMPLE_CM, [], work, num_starts=5)
    assert len(plain) == 5
    terms = np.stack(sequence_terms(L, e), axis=1)
    ex, val, _ = search._score(plain, terms, N, EXAMPLE_CM)
    keys = list(zip(ex.tolist(), val.tolist()))
    assert keys == sorted(keys)  # best score first
    assert compound == [2, 4, 1]  # (0, 1.0), (0, 1.5), (0, 2.0)
    want = [[np.flatnonzero(search._canonical(labels[i]) == g).tolist()
             for g in range(int(search._canonical(labels[i]).max()) + 1)] for i in (2, 4, 1, 3)]
    assert out == want


def test_local_search_tries_the_compound_steps_when_stuck(monkeypatch):
    """local_search: when no single step improves (neighbours stubbed to the start itself) and compound is on, it
    scores the compound steps — double moves on small groupings (n·G ≤ DOUBLE_MOVE_MAX) and re-splits of two and of
    three groups — and takes the best if it improves."""
    import fcp_data.plan.search as search

    L, e, work = _ten()
    terms = np.stack(sequence_terms(L, e), axis=1)
    t6, w6 = terms[:6], work[:6]
    start = np.zeros(6, dtype=np.int64)
    calls = []
    real_dm, real_rp = search.double_moves, search.repartitions
    monkeypatch.setattr(search, "neighbour_labels", lambda label, work: label[None, :].copy())
    monkeypatch.setattr(search, "double_moves", lambda label: calls.append("double") or real_dm(label))
    monkeypatch.setattr(search, "repartitions", lambda label, k, *a: calls.append(k) or real_rp(label, k, *a))
    ex, value, label = search.local_search(start, t6, w6, 4, EXAMPLE_CM, max_steps=1)
    assert calls == ["double", 2, 3]
    ex0, v0, _ = search._score([start], t6, 4, EXAMPLE_CM)
    assert (ex, value) < (int(ex0[0]), float(v0[0]))  # 6 sequences on one 4-rank ring is not the best
    assert search.local_search(start, t6, w6, 4, EXAMPLE_CM, max_steps=1, compound=False)[1] == float(v0[0])
