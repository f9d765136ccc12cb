"""Stage-1 search for tight micro-batches: repaired bins, mixed-capacity starts, local search (issue 12).

Why: near ``N·tokens_per_rank`` the paper's stage 1 (BFD with unit capacity) scatters headroom over its
bins, so a tight batch needs ``N + 1`` bins and falls back to uniform-capacity groupings, which never give
mixed splits such as ``1 + 2`` or ``4 + 4 + 4 + 2`` ranks. Three additions, all feeding the exact stage-2
allocator (:func:`~fcp_data.plan.allocate.allocate_fast`), which re-chooses every degree:

* :func:`repair_bins` — merge the two bins with most headroom until their minimum degrees fit ``N`` (the start
  constructions, and :func:`wider_bins` for the third search, live in :mod:`fcp_data.plan.starts`);
* :func:`mixed_starts` — for every group count ``K ≤ min(N, n)``: degrees split ``N`` as evenly as
  possible (``N mod K`` groups get one rank more), sequences heaviest first to the group whose work per rank
  grows least among those with token room (capacity ``d_g·E``);
* :func:`local_search` — best-improvement descent over group labels. Neighbours: move one sequence (to
  another group or to a new group of its own: a split), swap two sequences of different groups, merge
  two groups, split a group in two (LPT on work). Every neighbour is scored by the exact allocator
  (the optimal degrees of its groups), vectorised over all neighbours of one step; a step is taken only
  if it lowers the makespan by a relative 1e-9, so the search ends and never gets worse than its start.

Bounded: :func:`search_plan` runs only on micro-batches of at most :data:`SEARCH_MAX_SEQUENCES` sequences
and :data:`SEARCH_MAX_RANKS` ranks (the tight, small ones where stage 1 fails; the paper's 512 × 64
micro-batches keep their old cost), descends from the :data:`SEARCH_STARTS` best starts and stops after
:data:`SEARCH_MAX_STEPS` steps per start.
Deterministic: stable sorts and ``argmin`` with index tie-breaks only.
"""

from __future__ import annotations

import itertools

import numpy as np

from fcp_data.cost import CostModel, sequence_terms
from fcp_data.plan.bfd import bfd_groups
from fcp_data.plan.exhaustive import partition_count, partition_labels
from fcp_data.plan.microbatch import split_lower_bound
from fcp_data.plan.starts import mixed_starts, repair_bins, wider_bins
from fcp_data.plan.types import CPGroup, MicroBatchPlan

__all__ = ["polisher", "repair_bins", "mixed_starts", "local_search", "search_groupings", "search_runs", "neighbour_labels",
           "double_moves", "repartitions",
           "SEARCH_MAX_SEQUENCES", "SEARCH_MAX_RANKS", "SEARCH_STARTS", "SEARCH_MAX_STEPS", "SEARCH_BUDGET", "Budget",
           "ESCALATE_GAP", "ESCALATE_FILL", "ESCALATE_BUDGET",
           "ESCALATE_STARTS", "ESCALATE_ENUMERATE", "ESCALATE_UNITS", "ESCALATE_UNITS_BUDGET", "wider_bins", "escalation_due"]

SEARCH_MAX_SEQUENCES = 32  # above this the descent's O(n²) neighbours cost more than stage 1 gains
SEARCH_MAX_RANKS = 64
SEARCH_STARTS = 4
SEARCH_MAX_STEPS = 64
SEARCH_BUDGET = 6_000_000  # table entries per micro-batch: at most about 0.1 s of one core (measured)
# A second, longer search where the first one's plan stays far above the micro-batch lower bound (see
# fcp_data.plan.solvers._search_candidates): measured on 40 tight micro-batches (80-100 % full, 4-32 sequences,
# 2-64 ranks) the first search ended 6.7 % above the best plan known on average (133 % at worst: 22 sequences that
# pack exactly into 4 one-rank bins); 10x the budget from 12 starts ends 0.3 % above it.
ESCALATE_GAP = 0.02  # relative gap to the lower bound above which the longer search runs
ESCALATE_FILL = 0.9  # ... on micro-batches at least this full (Σs / (N·E)): where packing decides the plan; on
# looser ones the longer search gained 0.1-0.5 % on average for 1.2-8x the planning time
ESCALATE_BUDGET = 10 * SEARCH_BUDGET
ESCALATE_STARTS = 12
# ... and when a micro-batch has at most this many groupings (Bell(9): up to 9 sequences) it scores every one: on 100
# tight 3-9-sequence instances 1 plan 5.1 % faster, none slower, CPU p90 114 -> 131 ms, max 346 -> 542 ms
ESCALATE_ENUMERATE = 21_147
# ... and where the plan is still that far above the bound, a third search (its own budget, SEARCH_STARTS starts)
# descends from BFD bins of c·E tokens too, c = 2 … ESCALATE_UNITS (:func:`wider_bins`): other mixes of group sizes.
# On 20 tight v2 micro-batches it made 4 plans 15-28 % faster, none slower: there the other starts led into groupings
# whose memory-minimum degrees do not fit the nodes (28 sequences / 25 ranks: 0.1345 -> 0.0965 s). BENCHMARKS: "a
# third search".
ESCALATE_UNITS = 8
ESCALATE_UNITS_BUDGET = ESCALATE_BUDGET // 8
_STEP_COST = 100_000  # entries one scoring costs besides its table (numpy call overhead, about 1-2 ms)
SEARCH_COMPOUND = 3  # local optima that also get the compound steps
_IMPROVE = 1e-9
PAIR_UNION_MAX = 10  # sequences of two groups up to which a stuck descent re-splits them exactly
TRIPLE_UNION_MAX = 8  # the same for three groups (3^7 = 2187 assignments)
REPARTITION_BUDGET = 8192  # rows per kind of re-split and step
DOUBLE_MOVE_MAX = 96  # sequences × (groups + 1) up to which a stuck descent tries pairs of moves


def _values(agg: np.ndarray, index: np.ndarray, num_ranks: int, cost_model: CostModel
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores of many groupings at once, compared lexicographically: ``(excess, value, spread)``. ``agg``:
    ``(U, 4)`` sums ``(S, Q, B, V)`` of the distinct groups (row 0: the empty group); ``index``: ``(C, G)``
    rows of ``agg`` forming each grouping (0: no group; empty groups take no rank). ``excess = max(0,
    Σ_g ceil(S_g/E) − N)``: ranks missing for memory. At ``excess = 0`` the value is the exact min-max
    allocation (:func:`allocate_fast` on the grouping's table); above, the allocation ignoring memory — it
    guides the search through a plateau of equal excess towards balanced groups, while every step that
    frees a rank is taken first. ``spread``: the sum of the entries of ``T̃`` ranked ``k … N−1`` (the value
    is entry ``k``): at an equal value it prefers groupings whose other groups are also fast, so a descent
    can cross a plateau of the makespan (number partitioning near capacity). ``inf``: more groups than ranks.
    Times are computed once per distinct group, not per grouping (neighbours share all but two or three
    groups)."""
    C, G = index.shape
    N, E = int(num_ranks), float(cost_model.tokens_per_rank)
    used = index > 0
    need_u = np.maximum(np.ceil(agg[:, 0] / E - 1e-12), 1.0)
    need_u[0] = 0.0
    excess = np.maximum(need_u[index].sum(axis=1) - N, 0.0).astype(np.int64)
    d = np.arange(1, N + 1, dtype=np.float64)
    S, Q, B, V = (agg[:, j, None] for j in range(4))
    T = np.atleast_2d(cost_model.time(S, Q, d, d <= cost_model.ranks_per_node, B=B, V=V))
    relaxed = np.minimum.accumulate(T, axis=1)
    strict = np.minimum.accumulate(np.where(S <= d * E, T, np.inf), axis=1)
    relaxed[0] = strict[0] = -np.inf
    k = N - used.sum(axis=1)  # the k-th largest entry (0-based) is the optimum, k < 0: too many groups
    out, spread = np.full(C, np.inf), np.full(C, np.inf)
    for over in (False, True):
        table = relaxed if over else strict
        for kk in np.unique(k[(k >= 0) & ((excess > 0) == over)]).tolist():
            rows = np.flatnonzero((k == kk) & ((excess > 0) == over))
            part = np.partition(-table[index[rows]].reshape(rows.size, G * N), sorted({kk, N - 1}), axis=1)
            out[rows] = -part[:, kk]
            spread[rows] = -part[:, kk:N].sum(axis=1)
    return excess, out, spread


def neighbour_labels(label: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Every neighbour of the grouping ``label`` (group id per sequence, ids ``0 … K−1`` all used), one row
    each, in a fixed order: moves (sequence × target group, target ``K`` = a new group of its own), swaps
    (pairs ``i < j`` in different groups), merges (pairs ``a < b``), 2-way splits of each group with ≥ 2
    members (LPT on ``work``; the lighter-loaded half on ties becomes group ``K``)."""
    n, K = label.size, int(label.max()) + 1
    sizes = np.bincount(label, minlength=K)
    i, g = np.divmod(np.arange(n * (K + 1)), K + 1)
    ok = (g != label[i]) & ~((g == K) & (sizes[label[i]] == 1))
    i, g = i[ok], g[ok]
    moves = np.repeat(label[None, :], i.size, axis=0)
    moves[np.arange(i.size), i] = g
    a, b = np.triu_indices(n, 1)
    keep = label[a] != label[b]
    a, b = a[keep], b[keep]
    swaps = np.repeat(label[None, :], a.size, axis=0)
    swaps[np.arange(a.size), a] = label[b]
    swaps[np.arange(a.size), b] = label[a]
    ga, gb = np.triu_indices(K, 1)
    merges = np.where(label[None, :] == gb[:, None], ga[:, None], label[None, :])
    splits = []
    for grp in np.flatnonzero(sizes >= 2).tolist():
        members = np.flatnonzero(label == grp)
        x = label.copy()
        load = [0.0, 0.0]
        for m in members[np.lexsort((members, -work[members]))].tolist():
            h = 0 if load[0] <= load[1] else 1
            load[h] += work[m]
            x[m] = grp if h == 0 else K
        splits.append(x)
    return np.concatenate([moves, swaps, merges] + ([np.stack(splits)] if splits else []), axis=0)


def double_moves(label: np.ndarray) -> np.ndarray:
    """Pairs of moves of two different sequences (each to another group or the one new group ``K``):
    the compound steps out of a local optimum where each move alone breaks memory or the makespan."""
    n, K = label.size, int(label.max()) + 1
    i, g = np.divmod(np.arange(n * (K + 1)), K + 1)
    ok = g != label[i]
    i, g = i[ok], g[ok]
    p, q = np.triu_indices(i.size, 1)
    keep = i[p] != i[q]
    p, q = p[keep], q[keep]
    out = np.repeat(label[None, :], p.size, axis=0)
    rows = np.arange(p.size)
    out[rows, i[p]] = g[p]
    out[rows, i[q]] = g[q]
    return out


def repartitions(label: np.ndarray, k: int, max_union: int, budget: int) -> np.ndarray:
    """For every ``k`` group ids among ``0 … K`` (in combination order; ``K`` is a new, empty group) whose
    union holds at most ``max_union`` sequences: every assignment of the union to those ``k`` ids (the
    union's first sequence stays in the first; empty groups allowed) — the exact re-optimisation of ``k``
    groups, a step that single and double moves cannot make. At most ``budget`` rows (whole combinations
    only)."""
    K = int(label.max()) + 1
    rows, total = [], 0
    for combo in itertools.combinations(range(K + 1), k):  # id K: a new group (re-split into one more)
        ids = np.array(combo)
        members = np.flatnonzero(np.isin(label, ids))
        m = members.size
        if m > max_union or m < 2:
            continue
        codes = np.arange(k ** (m - 1))
        digits = (codes[:, None] // k ** np.arange(m - 1)[None, :]) % k
        digits = np.concatenate([np.zeros((codes.size, 1), dtype=np.int64), digits], axis=1)
        if total + codes.size > budget:
            break
        x = np.repeat(label[None, :], codes.size, axis=0)
        x[:, members] = ids[digits]
        rows.append(x)
        total += codes.size
    return np.concatenate(rows, axis=0) if rows else np.zeros((0, label.size), dtype=np.int64)


def _canonical(label: np.ndarray) -> np.ndarray:
    """Relabel groups in order of first appearance, dropping empty ids (so ids are ``0 … K−1``)."""
    _, first, inv = np.unique(label, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    return rank[inv.reshape(-1)]


def _score(labels, terms: np.ndarray, num_ranks: int, cost_model: CostModel
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_values` of whole groupings given as label rows (group ids ``0 … G−1``, gaps allowed; at
    most 62 sequences: a group is keyed by the bit mask of its members)."""
    L = np.asarray(labels if isinstance(labels, np.ndarray) else np.stack(labels))
    G = int(L.max()) + 1
    bit = np.left_shift(np.int64(1), np.arange(L.shape[1], dtype=np.int64))
    masks = np.zeros((L.shape[0], G), dtype=np.int64)
    np.add.at(masks, (np.arange(L.shape[0])[:, None], L), bit[None, :])
    uniq, inv = np.unique(np.concatenate(([0], masks.ravel())), return_inverse=True)  # uniq[0] = 0: empty
    members = ((uniq[:, None] >> np.arange(L.shape[1], dtype=np.int64)[None, :]) & 1).astype(np.float64)
    return _values(members @ terms, inv[1:].reshape(masks.shape), num_ranks, cost_model)


def _best(scores: tuple[np.ndarray, np.ndarray, np.ndarray], cur: tuple[int, float, float]):
    """``(row, score)`` of the best candidate if it beats ``cur``, else None. Order: fewer missing ranks,
    then a value lower by a relative 1e-9 (values within that are equal), then a spread lower by the same;
    first row on ties."""
    exs, vals, spr = scores
    if not vals.size:
        return None
    e = int(exs.min())
    rows = np.flatnonzero(exs == e)
    v = float(vals[rows].min())
    rows = rows[vals[rows] <= v + abs(v) * _IMPROVE]
    j = int(rows[np.argmin(spr[rows])])
    ex0, v0, s0 = cur
    flatter = v <= v0 * (1 + _IMPROVE) and spr[j] < s0 * (1 - _IMPROVE)
    better = e < ex0 or (e == ex0 and (v < v0 * (1 - _IMPROVE) or flatter))
    return (j, (e, float(vals[j]), float(spr[j]))) if better else None


class Budget:
    """Time-table entries a search may still evaluate (rows × groups × ranks, plus :data:`_STEP_COST` for
    the fixed cost of a step, summed over its steps): a deterministic bound on its work, unlike a clock, so
    every rank stops at the same step."""

    __slots__ = ("left",)

    def __init__(self, entries: int) -> None:
        self.left = int(entries)

    def take(self, rows: int, groups: int, num_ranks: int) -> bool:
        """Spend the cost of scoring ``rows`` groupings; False (nothing spent) when it is not left."""
        cost = int(rows) * int(groups) * int(num_ranks) + _STEP_COST
        if cost > self.left:
            return False
        self.left -= cost
        return True


def local_search(label: np.ndarray, terms: np.ndarray, work: np.ndarray, num_ranks: int, cost_model: CostModel,
                 max_steps: int = SEARCH_MAX_STEPS, compound: bool = True, budget: Budget | None = None
                 ) -> tuple[int, float, np.ndarray]:
    """Best-improvement descent from ``label`` (see :func:`neighbour_labels`): take the neighbour of least
    ``(excess, value, spread)`` (:func:`_best`) while it beats the current one; when none does and ``compound``,
    the best of the compound steps (:func:`double_moves` on small groupings, :func:`repartitions` of two and
    three groups). At most ``max_steps`` steps, and it stops where ``budget`` cannot pay the next scoring.
    Returns ``(excess, value, label)``; the score never gets worse than the start's (``excess = 0``: memory
    holds and ``value`` is the optimal makespan of the grouping)."""
    label = _canonical(np.asarray(label, dtype=np.int64))
    ex, val, spr = _score([label], terms, num_ranks, cost_model)
    cur = (int(ex[0]), float(val[0]), float(spr[0]))
    budget = budget or Budget(1 << 62)
    for _ in range(max_steps):
        G = int(label.max()) + 2  # the groups a neighbour may have
        cands = neighbour_labels(label, work)
        if not budget.take(cands.shape[0], G, num_ranks):
            break
        j = _best(_score(cands, terms, num_ranks, cost_model), cur)
        if j is None and compound:  # stuck: the compound steps
            big = label.size * G > DOUBLE_MOVE_MAX
            cands = np.concatenate(([] if big else [double_moves(label)]) + [
                repartitions(label, 2, PAIR_UNION_MAX, REPARTITION_BUDGET),
                repartitions(label, 3, TRIPLE_UNION_MAX, REPARTITION_BUDGET)])
            ok = cands.shape[0] and budget.take(cands.shape[0], G, num_ranks)
            j = _best(_score(cands, terms, num_ranks, cost_model), cur) if ok else None
        if j is None:
            break
        cur, label = j[1], _canonical(cands[j[0]])
    excess, value = cur[0], cur[1]
    return excess, value, label


def search_runs(num_sequences: int, num_ranks: int) -> bool:
    """Whether :func:`search_groupings` searches a micro-batch of this size (otherwise it returns ``[]``, so a
    solver run with and without the search gives the same plan: ``auto`` skips re-planning it)."""
    return 2 <= num_sequences <= SEARCH_MAX_SEQUENCES and num_ranks <= SEARCH_MAX_RANKS


def escalation_due(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                   visual: np.ndarray | None, best: float) -> bool:
    """Whether a micro-batch whose best plan so far takes ``best`` gets the longer second search: it is searched
    at all (:func:`search_runs`), at least :data:`ESCALATE_FILL` full, and ``best`` is more than
    :data:`ESCALATE_GAP` above its lower bound (:func:`~fcp_data.plan.microbatch.split_lower_bound`, ``M = 1``)."""
    N = int(num_ranks)
    return (search_runs(int(lengths.size), N) and float(np.sum(lengths)) >= ESCALATE_FILL * N * cost_model.tokens_per_rank
            and best > split_lower_bound(lengths, etas, N, cost_model, visual)(1) * (1 + ESCALATE_GAP))


def search_groupings(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel,
                     seeds: list[list[list[int]]], work: np.ndarray, visual: np.ndarray | None = None, *,
                     budget: int = SEARCH_BUDGET, num_starts: int = SEARCH_STARTS, enumerate_max: int = 0
                     ) -> list[list[list[int]]]:
    """Locally optimal groupings for a small micro-batch: descends (:func:`local_search`) from each of
    ``seeds`` (the incumbents of the caller's other candidates, kept as given) and from the repaired BFD
    bins and the :func:`mixed_starts`, best score first, with single steps — at least ``num_starts``
    (:data:`SEARCH_STARTS`) of them and more until :data:`SEARCH_COMPOUND` distinct local optima are found — then continues those
    best distinct local optima with the compound steps too. Returns the
    groupings found (lists of sequence ids, ascending within a group); empty above the size bounds. With at most
    ``enumerate_max`` groupings in all, the best of every one (by the same score) is the first seed."""
    n, N = int(lengths.size), int(num_ranks)
    if not search_runs(n, N):
        return []
    terms = np.stack(sequence_terms(lengths, etas, visual), axis=1)
    starts = repair_bins(bfd_groups(lengths, cost_model.tokens_per_rank), lengths, N, cost_model.tokens_per_rank)
    labels = [_to_label(g, n) for g in starts + mixed_starts(work, N)]
    if labels:
        ex, vals, _ = _score(labels, terms, N, cost_model)
        order = np.lexsort((np.arange(vals.size), vals, ex))
        labels = [labels[int(i)] for i in order]
    seeds = [_to_label(g, n) for g in seeds]
    if partition_count(n, min(n, N)) <= enumerate_max:  # small: the best grouping of all leads
        every = partition_labels(n, min(n, N))
        ex, vals, _ = _score(every, terms, N, cost_model)
        seeds.insert(0, every[int(np.lexsort((np.arange(vals.size), vals, ex))[0])])
    found, seen, optima = [], set(), set()
    budget = Budget(budget)
    for j, lab in enumerate(seeds + labels):  # plain descents
        if j >= len(seeds) + num_starts and len(optima) >= SEARCH_COMPOUND:
            break  # enough starts, and enough distinct local optima for the compound phase
        key = tuple(_canonical(lab).tolist())
        if key not in seen:
            seen.add(key)
            found.append(local_search(lab, terms, work, N, cost_model, compound=False, budget=budget))
            optima.add(tuple(found[-1][2].tolist()))
    found.sort(key=lambda r: (r[0], r[1]))  # stable: ties keep the start order
    out, optima = [], set()
    for excess, value, best in found:
        key = tuple(best.tolist())
        if key in optima:
            continue
        if len(optima) < SEARCH_COMPOUND:  # the best distinct local optima also get the compound steps
            optima.add(key)
            excess, value, best = local_search(best, terms, work, N, cost_model, budget=budget)
        if excess == 0 and np.isfinite(value):
            out.append([np.flatnonzero(best == g).tolist() for g in range(int(best.max()) + 1)])
    return out


def _to_label(groups: list[list[int]], n: int) -> np.ndarray:
    """Lists of sequence ids -> group id per sequence."""
    label = np.empty(n, dtype=np.int64)
    for g, members in enumerate(groups):
        label[list(members)] = g
    return label


def polisher(solver_options: dict, solve_one, num_ranks: int):
    """``finish`` of :func:`~fcp_data.plan.microbatch.plan_micro_batches` for ``auto``, which compares splits with
    the search off (``solver_options["search"] = False``): the search back on, and every micro-batch re-planned by
    ``solve_one`` on its own sequences (ascending global ids), kept where that is faster. Not re-planned where the
    search does not run (:func:`search_runs`): the solver is deterministic, so it would return the same plan (at
    1024 ranks this was half of ``auto``'s time)."""
    def polished(mb: MicroBatchPlan) -> MicroBatchPlan:
        if not search_runs(sum(len(g.seq_ids) for g in mb.groups), num_ranks):
            return mb
        ids = np.array(sorted(k for g in mb.groups for k in g.seq_ids), dtype=np.int64)
        new, _ = solve_one(ids)
        if not new.makespan < mb.makespan:
            return mb
        return MicroBatchPlan(groups=tuple(CPGroup(ranks=g.ranks, seq_ids=tuple(int(ids[k]) for k in g.seq_ids),
                                                   time=g.time) for g in new.groups), makespan=new.makespan)

    def finish(mbs: list[MicroBatchPlan]) -> list[MicroBatchPlan]:
        solver_options.pop("search", None)
        return [polished(mb) for mb in mbs]

    return finish
