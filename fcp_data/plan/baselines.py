"""Baselines on the same §4 cost model (DESIGN §5), each planning one micro-batch.

* ``static-cp`` (Megatron-LM context parallelism): one ring degree ``d`` for the whole batch, ``d``
  dividing ``num_ranks``; the ranks form ``N/d`` groups and the sequences are packed into them by LPT on
  the work proxy ``alpha1·(1+η)s² + alpha2·s`` within memory ``d·E``. Every feasible divisor is tried
  and the fastest kept (``degree=d`` fixes it: ``fcp simulate`` keeps one degree for the whole run, the
  best over all steps, as a Megatron job is configured once).
* ``ulysses`` (DeepSpeed-Ulysses): like static-cp, but ``d`` is a power of two dividing both the head
  count and ``num_ranks``, and the group time uses all-to-all traffic (:func:`ulysses_time`).
* ``megatron-dynamic`` (Megatron-LM's dynamic CP): each sequence longer than one rank's memory gets the
  power-of-two degree ``2^⌈log2 ⌈s/E⌉⌉`` in a group of its own; the short ones are LPT-balanced over the
  remaining ranks as degree-1 groups (best fit into the long groups' spare memory when no rank is
  left); then, greedily, the heaviest sequence of the slowest group doubles
  its degree (a short one moves to a degree-2 group of its own) while the makespan improves.

Every baseline takes the optional per-sequence ``visual`` tokens and pays the §4.1 terms of the cost model.

``fcp-pow2`` (FCP restricted to powers of two, FlexSP-like) lives with the FCP solver in
:mod:`fcp_data.plan.solvers`.
"""

from __future__ import annotations

import math

import numpy as np

from fcp_data.cost import CostModel
from fcp_data.cost import sequence_terms
from fcp_data.plan.bfd import group_terms_of
from fcp_data.plan.inputs import OptionError, require_arrays
from fcp_data.plan.lpt import labels_to_groups, lpt_groups, lpt_labels
from fcp_data.plan.placement import build_micro_batch
from fcp_data.plan.types import MicroBatchPlan

__all__ = ["static_cp", "ulysses", "megatron_dynamic", "ulysses_time", "ulysses_degrees", "work_proxy"]


def work_proxy(lengths: np.ndarray, etas: np.ndarray, cost_model: CostModel, visual: np.ndarray | None = None) -> np.ndarray:
    """Per-sequence compute on one rank (:meth:`~fcp_data.cost.CostModel.work`, where the formula lives)."""
    return cost_model.work(lengths, etas, visual)


def ulysses_time(S, Q, ranks: list[tuple[int, ...]], cost_model: CostModel, B=None, V=None, *, num_heads: int,
                 num_kv_heads: int) -> np.ndarray:
    """Group time of Ulysses sequence parallelism on §4 coefficients.

    Each rank holds ``S/d`` tokens; per layer and pass it all-to-alls Q, K, V out and O back, i.e.
    ``(2H + 2G)·hd`` values per token against the ring's ``2G·hd`` (K, V), and keeps ``1/d`` of them:
    ``X_u = alpha3 · (H+G)/G · S · (d−1)/d² / v``. The all-to-all cannot overlap attention, so
    ``T = A + alpha2·S/d + beta1 + (X_u + beta2 if d > 1)``. §4.1: each rank still runs attention over
    all ``S`` rows (for ``H/d`` heads), so it pays ``alpha_blk·B`` like a ring; the vision encoder
    ``alpha_vis·V/d``; one all-to-all is no ring, so no ``gamma``.
    """
    S = np.asarray(S, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    d = np.array([len(r) for r in ranks], dtype=np.float64)
    intra = np.array([cost_model.is_intra_node(r) for r in ranks], dtype=bool)
    v = np.where(intra, cost_model.bandwidth_intra, cost_model.bandwidth_inter)
    ratio = (num_heads + num_kv_heads) / num_kv_heads
    comp = cost_model.alpha1 * Q / d + cost_model.alpha2 * S / d
    if cost_model.alpha_blk:
        comp = comp + cost_model.alpha_blk * np.asarray(B, dtype=np.float64)
    if cost_model.alpha_vis and V is not None:
        comp = comp + cost_model.alpha_vis * np.asarray(V, dtype=np.float64) / d
    comp = comp + cost_model.beta1
    comm = np.where(d > 1, cost_model.alpha3 * ratio * S * (d - 1.0) / (d * d) / v + cost_model.beta2, 0.0)
    return comp + comm


def _infeasible(name: str, lengths: np.ndarray, num_ranks: int, cost_model: CostModel, why: str,
                top: int | None = None) -> ValueError:
    """No plan; ``top``: the largest degree ``name`` allows here — a sequence it cannot hold is named (no split helps)."""
    i = int(np.argmax(lengths))
    E = cost_model.tokens_per_rank
    if top is not None and int(lengths[i]) > top * E:
        return ValueError(f"{name}: sequence {i} ({int(lengths[i])} tokens) alone needs {cost_model.min_degree(float(lengths[i]))} "
                          f"ranks at tokens_per_rank={E}, but the largest degree {name} allows on {num_ranks} ranks is "
                          f"{top} ({top * E} tokens); more micro-batches cannot help: truncate or drop it, or use more "
                          "ranks (of a degree it allows)")
    return ValueError(f"{name}: no feasible plan on {num_ranks} ranks ({why}); longest sequence {i} has "
                      f"{int(lengths[i])} tokens, tokens_per_rank={cost_model.tokens_per_rank}; "
                      "use more micro-batches or more ranks")


def _fixed_degree(name: str, lengths, etas, num_ranks, cost_model, degrees, time_fn=None, visual=None) -> MicroBatchPlan:
    work = work_proxy(lengths, etas, cost_model, visual)
    best: MicroBatchPlan | None = None
    for d in degrees:
        if lengths.max() > d * cost_model.tokens_per_rank:
            continue
        groups = lpt_groups(work, lengths, num_ranks // d, d * cost_model.tokens_per_rank)
        if groups is None:
            continue
        S, Q, B, V = group_terms_of(groups, lengths, etas, visual)
        mb = build_micro_batch(groups, [d] * len(groups), S, Q, num_ranks, cost_model, time_fn=time_fn, B=B, V=V)
        if best is None or mb.makespan < best.makespan:
            best = mb
    if best is None:
        raise _infeasible(name, lengths, num_ranks, cost_model, f"no degree in {list(degrees)} holds the batch",
                          top=max(degrees, default=0))
    return best


def _only(name: str, degrees: list[int], degree: int | None) -> list[int]:
    if degree is None:
        return degrees
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)):
        raise OptionError(f"{name}: degree must be an int (the ring degree of every group), got {degree!r}")
    if degree not in degrees:
        raise OptionError(f"{name}: degree {degree} is not allowed here; valid degrees: {degrees}")
    return [int(degree)]


def static_cp(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, *,
              degree: int | None = None, visual: np.ndarray | None = None, **_: object) -> MicroBatchPlan:
    """Best fixed ring degree ``d | num_ranks`` (Megatron-LM CP), or exactly ``degree`` when given."""
    require_arrays("static_cp", lengths, etas, num_ranks, cost_model)
    degrees = _only("static-cp", [d for d in range(1, num_ranks + 1) if num_ranks % d == 0], degree)
    return _fixed_degree("static-cp", lengths, etas, num_ranks, cost_model, degrees, visual=visual)


def ulysses_degrees(num_ranks: int, num_heads: int) -> list[int]:
    """Powers of two dividing both ``num_ranks`` and ``num_heads``."""
    return [d for d in (2 ** k for k in range(0, 31)) if d <= num_ranks and num_ranks % d == 0 and num_heads % d == 0]


def ulysses(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, *,
            num_heads: int = 32, num_kv_heads: int = 8, degree: int | None = None, visual: np.ndarray | None = None,
            **_: object) -> MicroBatchPlan:
    """Best fixed power-of-two Ulysses degree dividing ``num_heads`` and ``num_ranks`` (DeepSpeed), or
    exactly ``degree`` when given."""
    require_arrays("ulysses", lengths, etas, num_ranks, cost_model)
    if num_heads < 1 or num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"ulysses needs num_heads a multiple of num_kv_heads >= 1, got {num_heads}, {num_kv_heads}")
    degrees = _only("ulysses", ulysses_degrees(num_ranks, num_heads), degree)

    def time_fn(S, Q, ranks, B=None, V=None):
        return ulysses_time(S, Q, ranks, cost_model, B, V, num_heads=num_heads, num_kv_heads=num_kv_heads)

    return _fixed_degree("ulysses", lengths, etas, num_ranks, cost_model, degrees, time_fn, visual=visual)


def megatron_dynamic(lengths: np.ndarray, etas: np.ndarray, num_ranks: int, cost_model: CostModel, *,
                     visual: np.ndarray | None = None, below: float | None = None, **_: object) -> MicroBatchPlan | None:
    """Power-of-two degree per long sequence, LPT over the rest, greedy doubling of the slowest group. ``below``
    (FCP's candidate): None instead of the plan when its makespan cannot be below ``below`` — its configuration's
    time, with every group of at most a node inside one, is a lower bound of the placed makespan when the inter-node
    bandwidth does not exceed the intra-node one (a group that crosses nodes only gets slower)."""
    require_arrays("megatron_dynamic", lengths, etas, num_ranks, cost_model)
    E = cost_model.tokens_per_rank
    n = lengths.size
    work = work_proxy(lengths, etas, cost_model, visual)
    deg = np.ones(n, dtype=np.int64)  # degree of each sequence; > 1 means a group of its own
    for i in range(n):
        if lengths[i] > E:
            deg[i] = 1 << math.ceil(math.log2(math.ceil(lengths[i] / E)))
    ev = _MegatronEval(lengths, etas, visual, num_ranks, cost_model, work)
    cur = None if int(deg[deg > 1].sum()) > num_ranks else ev(deg)
    if cur is None:
        raise _infeasible("megatron-dynamic", lengths, num_ranks, cost_model,
                          f"power-of-two degrees of the long sequences need {int(deg[deg > 1].sum())} ranks",
                          top=1 << (int(num_ranks).bit_length() - 1))
    while True:  # greedy balance: give the slowest group's heaviest sequence twice the ranks
        slow = int(np.argmax(cur[3]))
        members = np.flatnonzero(cur[1] == slow)
        i = int(members[np.argmax(work[members])])
        trial = deg.copy()
        trial[i] *= 2
        if int(trial[trial > 1].sum()) > num_ranks:
            break
        nxt = ev(trial)
        if nxt is None or nxt[0] >= cur[0]:
            break
        deg, cur = trial, nxt
    span, label, degrees, _ = cur
    if below is not None and span >= below and cost_model.bandwidth_inter <= cost_model.bandwidth_intra:
        return None
    groups, gid = labels_to_groups(label, len(degrees), gid=True)
    S, Q, B, V = group_terms_of(groups, lengths, etas, visual, terms=ev.terms, gid=gid)
    return build_micro_batch(groups, degrees, S, Q, num_ranks, cost_model, B=B, V=V)


class _MegatronEval:
    """``ev(deg)``: megatron-dynamic's configuration for per-sequence degrees ``deg`` (a sequence with degree > 1
    gets a group of its own, the rest LPT on the ranks left or, with none left, the long groups' headroom) as
    ``(makespan, label, group degrees, group times)``, or None when it does not fit."""

    def __init__(self, lengths, etas, visual, num_ranks: int, cost_model: CostModel, work: np.ndarray) -> None:
        self.lengths, self.visual, self.N, self.cm, self.work = lengths, visual, num_ranks, cost_model, work
        self.order = np.lexsort((np.arange(lengths.size), -work))
        self.terms = sequence_terms(lengths, etas, visual)

    def _label_short(self, label, short_ids, long_ids, deg, r: int) -> int | None:
        """Label the short sequences (in place); the number of groups, or None when they do not fit."""
        lengths, E = self.lengths, self.cm.tokens_per_rank
        k = long_ids.size
        if short_ids.size and r < 1:  # no rank left: short sequences ride in the long groups' headroom
            room = deg[long_ids] * float(E) - lengths[long_ids]
            for i in short_ids.tolist():
                fits = np.flatnonzero(room >= lengths[i])
                if fits.size == 0:
                    return None
                g = int(fits[np.argmin(room[fits])])
                label[i] = g
                room[g] -= lengths[i]
        elif short_ids.size:
            # short_ids are in self.order: heaviest first, index order on ties, as lpt_labels would sort them
            sl = lpt_labels(self.work[short_ids], lengths[short_ids], r, E, presorted=True)
            if sl is None:
                return None
            present = np.bincount(sl, minlength=r) > 0  # renumber to the non-empty groups, in group-id order
            label[short_ids] = long_ids.size + (np.cumsum(present) - 1)[sl]
            k += int(present.sum())
        elif r < 0:
            return None
        return k

    def __call__(self, deg: np.ndarray):
        is_long = deg > 1
        long_ids = self.order[is_long[self.order]]
        short_ids = self.order[~is_long[self.order]]
        label = np.empty(self.lengths.size, dtype=np.int64)
        label[long_ids] = np.arange(long_ids.size)
        k = self._label_short(label, short_ids, long_ids, deg, self.N - int(deg[long_ids].sum()))
        if k is None:
            return None
        degrees = np.ones(k, dtype=np.int64)
        degrees[: long_ids.size] = deg[long_ids]
        s64, q64, b64, v64 = self.terms
        S = np.bincount(label, weights=s64, minlength=k)
        Q = np.bincount(label, weights=q64, minlength=k)
        B = np.bincount(label, weights=b64, minlength=k)
        V = None if self.visual is None else np.bincount(label, weights=v64, minlength=k)
        d = degrees.astype(np.float64)
        T = np.atleast_1d(self.cm.time(S, Q, d, d <= self.cm.ranks_per_node, B=B, V=V))
        return float(T.max()), label, degrees, T
