"""Starting groupings for the stage-1 search of :mod:`fcp_data.plan.search` (issue 12).

* :func:`repair_bins` — BFD bins merged (the two with most headroom) until their minimum degrees fit ``N``;
* :func:`mixed_starts` — for every group count ``K``: degrees split ``N`` as evenly as possible, sequences
  heaviest first to the group whose work per rank grows least;
* :func:`wider_bins` — BFD bins of ``c·E`` tokens for ``c = 2 …`` (repaired): near capacity the ``E``-token bins
  and the even splits can all lead the descent into one basin of groupings whose memory-minimum degrees do not fit
  the nodes; wider bins give other mixes of group sizes.
"""

from __future__ import annotations

import numpy as np

from fcp_data.plan.bfd import bfd_groups

__all__ = ["repair_bins", "mixed_starts", "wider_bins"]


def repair_bins(groups: list[list[int]], lengths: np.ndarray, num_ranks: int, tokens_per_rank: int
                ) -> list[list[list[int]]]:
    """Merge bins until ``Σ ceil(S_g / E) ≤ N``: each time the two bins with most headroom
    (``ceil(S/E)·E − S``; lowest bin id on ties) become one. Returns the bins when their count first
    drops to ``N`` (a start for the search even if memory still fails there) and the bins that fit (if they
    differ); ``[]`` if the input already fits — or already holds fewer than ``N`` bins: it is no start then
    (returning it and the bins that fit made the plan of ``test_final_plan_packs_a_stranded_slowest_group_into_a_node``
    5 % slower, 0.6064 → 0.6368 s; stop 61)."""
    E = float(tokens_per_rank)
    bins = [list(g) for g in groups]
    sizes = [float(np.sum(lengths[g])) for g in bins]

    def need(S: float) -> int:
        return max(1, int(np.ceil(S / E - 1e-12)))

    out: list[list[list[int]]] = []
    while sum(need(S) for S in sizes) > num_ranks and len(bins) > 1:
        room = np.array([need(S) * E - S for S in sizes])
        a, b = sorted(np.lexsort((np.arange(room.size), -room))[:2].tolist())
        bins[a] = sorted(bins[a] + bins[b])
        sizes[a] += sizes[b]
        del bins[b], sizes[b]
        if len(bins) == num_ranks:
            out.append([list(g) for g in bins])
    if out and sum(need(S) for S in sizes) <= num_ranks and len(bins) < num_ranks:
        out.append(bins)
    return out


def mixed_starts(work: np.ndarray, num_ranks: int) -> list[list[list[int]]]:
    """One grouping per ``K = 1 … min(N, n)``: degrees split ``N`` as evenly as possible (``N mod K``
    groups get one rank more), sequences heaviest first to the group whose work per rank stays least
    (lowest id on ties). Memory is ignored: the search (:func:`local_search`) repairs it."""
    n, N = int(work.size), int(num_ranks)
    M = min(N, n)
    Ks = np.arange(1, M + 1)[:, None]  # one row per K, all K at once
    g = np.arange(M)[None, :]
    deg = np.where(g < Ks, N // Ks + (g < N % Ks), 0).astype(np.float64)
    deg_safe = np.where(deg > 0, deg, 1.0)
    load = np.zeros((M, M))
    label = np.zeros((M, n), dtype=np.int64)
    rows = np.arange(M)
    for i in np.lexsort((np.arange(n), -work)).tolist():
        pick = np.argmin(np.where(deg > 0, (load + work[i]) / deg_safe, np.inf), axis=1)  # lowest id on ties
        label[:, i] = pick
        load[rows, pick] += work[i]
    return [[np.flatnonzero(lab == k).tolist() for k in range(K) if np.any(lab == k)]
            for K, lab in zip(range(1, M + 1), label)]


def wider_bins(lengths: np.ndarray, num_ranks: int, tokens_per_rank: int, units: int) -> list[list[list[int]]]:
    """The BFD bins of ``c·E`` tokens for ``c = 2 … units``, each as :func:`repair_bins` returns them when they need
    more than ``N`` ranks (else as they are), in that order."""
    out: list[list[list[int]]] = []
    for c in range(2, int(units) + 1):
        bins = bfd_groups(lengths, c * tokens_per_rank)
        out += repair_bins(bins, lengths, num_ranks, tokens_per_rank) or [bins]
    return out
