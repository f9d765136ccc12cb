"""FCPSampler: epoch coverage, equal list counts on every rank, epoch order, drop_last, over-long samples,
O(1) resume and config mismatch (DESIGN.md §7). Uses the real planner (fcp_data.plan.plan_batch).

The reference for coverage is the dataset itself: over one epoch every kept sample must sit in exactly one
CP group; the reference for resume is the uninterrupted iteration of the same sampler.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.sampler import FCPSampler, SampleSlot, SlotList

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)


# the sampler's bookkeeping does not depend on the plan: the planner's local search is off (conftest.py)
pytestmark = pytest.mark.usefixtures("no_local_search")


def _lengths(n=300, seed=0, cap=None):
    rng = np.random.default_rng(seed)
    x = np.maximum(1, rng.lognormal(5.0, 1.2, size=n)).astype(np.int64)
    return np.minimum(x, cap) if cap else x


def _sampler(lengths, rank=0, **kw):
    kw.setdefault("num_ranks", 8)
    kw.setdefault("cost_model", CM)
    if "global_batch_tokens" not in kw:
        kw.setdefault("global_batch_size", 64)
    kw.setdefault("on_overlong", "truncate")
    return FCPSampler(lengths, rank=rank, **kw)


def _all_rank_lists(lengths, num_ranks=8, epoch=0, **kw):
    out = []
    for r in range(num_ranks):
        s = _sampler(lengths, rank=r, num_ranks=num_ranks, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def _key(lst: SlotList):
    return (lst.epoch, lst.global_batch, lst.micro_batch, lst.ranks, lst.cp_rank, tuple(s.index for s in lst),
            tuple(s.num_tokens for s in lst), lst.num_tokens_global)


@pytest.mark.parametrize("mode", [{"global_batch_size": 64}, {"global_batch_tokens": 9000}])
def test_every_sample_in_exactly_one_group_per_epoch_and_equal_list_counts(mode):
    """Invariants of §7 over all 8 ranks (simulated in one process): same number of lists, len() equal to
    it, groups agree on all their ranks, each kept sample in exactly one group per epoch,
    num_tokens_global = Σ(num_tokens − 1) over the global batch. A failure means ranks would deadlock
    or train on a wrong sample set."""
    lengths = _lengths(200)
    per_rank = _all_rank_lists(lengths, **mode)
    n_lists = {len(x) for x in per_rank}
    assert len(n_lists) == 1
    assert len(_sampler(lengths, **mode)) == n_lists.pop()
    seen: list[int] = []
    tokens_per_gb: dict[int, int] = {}
    for pos in range(len(per_rank[0])):
        lists = [x[pos] for x in per_rank]
        assert len({(x.global_batch, x.micro_batch, x.num_tokens_global) for x in lists}) == 1
        groups: dict[tuple, list] = {}
        for r, lst in enumerate(lists):
            if not lst:
                assert lst.ranks == () and lst.cp_rank == -1
                continue
            assert all(isinstance(s, SampleSlot) and s.rank == r for s in lst)
            assert lst.ranks[lst.cp_rank] == r
            groups.setdefault(lst.ranks, []).append((lst.cp_rank, tuple(s.index for s in lst)))
        for ranks, members in groups.items():
            assert sorted(c for c, _ in members) == list(range(len(ranks)))  # every rank of the group got it
            assert len({idx for _, idx in members}) == 1                    # with the same samples
            idx = members[0][1]
            seen.extend(idx)
            g = lists[0].global_batch
            toks = sum(min(int(lengths[i]), 8 * 512) - 1 for i in idx)
            tokens_per_gb[g] = tokens_per_gb.get(g, 0) + toks
            assert sum(min(int(lengths[i]), 8 * 512) for i in idx) <= len(ranks) * 512  # memory of §4
    assert sorted(seen) == list(range(lengths.size))
    for pos in range(len(per_rank[0])):
        lst = per_rank[0][pos]
        assert lst.num_tokens_global == tokens_per_gb[lst.global_batch]


def test_epoch_order_is_a_seeded_permutation():
    """Same (seed, epoch) → same order on a fresh sampler; another epoch or seed → another order; each
    epoch's global batches are consecutive slices of one permutation of all samples."""
    lengths = _lengths(200)
    a, b = _sampler(lengths), _sampler(lengths)
    orders = {}
    for e in range(3):
        a.set_epoch(e)
        b.set_epoch(e)
        oa = np.concatenate([a.global_batch_indices(g) for g in range(a.num_global_batches())])
        ob = np.concatenate([b.global_batch_indices(g) for g in range(b.num_global_batches())])
        assert np.array_equal(oa, ob)
        assert sorted(oa.tolist()) == list(range(200))
        orders[e] = oa
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])
    c = _sampler(lengths, seed=1)
    assert not np.array_equal(np.concatenate([c.global_batch_indices(g) for g in range(c.num_global_batches())]),
                              orders[0])


def test_drop_last_semantics():
    """100 samples, batches of 64: drop_last=False plans the partial batch of 36 (all samples seen),
    drop_last=True drops it. Token mode: the last, not-full batch is dropped only with drop_last."""
    lengths = _lengths(100)
    keep, drop = _sampler(lengths), _sampler(lengths, drop_last=True)
    assert keep.num_global_batches() == 2 and keep.global_batch_indices(1).size == 36
    assert drop.num_global_batches() == 1
    seen_drop = {s.index for r in _all_rank_lists(lengths, drop_last=True) for lst in r for s in lst}
    assert len(seen_drop) == 64
    tk = _sampler(lengths, global_batch_tokens=5000)
    td = _sampler(lengths, global_batch_tokens=5000, drop_last=True)
    assert td.num_global_batches() == tk.num_global_batches() - 1
    sizes = [int(tk.num_tokens[tk.global_batch_indices(g)].sum()) for g in range(tk.num_global_batches())]
    assert all(s <= 5000 for s in sizes[:-1]) and sum(sizes) == int(tk.num_tokens.sum())


def test_overlong_error_truncate_drop():
    """error names the sample; truncate keeps num_ranks·tokens_per_rank tokens (slot.num_tokens, length
    unchanged); drop removes the sample from every epoch; both are counted."""
    lengths = _lengths(50, cap=3000)
    lengths[7] = 10_000
    lengths[20] = 5000
    with pytest.raises(ValueError, match="sample 7 with 10000 tokens"):
        _sampler(lengths, on_overlong="error")
    t = _sampler(lengths, on_overlong="truncate")
    assert (t.num_truncated, t.num_dropped) == (2, 0)
    slots = {s.index: s for r in _all_rank_lists(lengths, on_overlong="truncate") for lst in r for s in lst}
    assert slots[7].num_tokens == 4096 and slots[7].length == 10_000 and slots[7].truncated
    d = _sampler(lengths, on_overlong="drop")
    assert (d.num_truncated, d.num_dropped) == (0, 2)
    seen = {s.index for r in _all_rank_lists(lengths, on_overlong="drop") for lst in r for s in lst}
    assert seen == set(range(50)) - {7, 20}


@pytest.mark.parametrize("stop_after", [1, 3, "boundary", "boundary+2"])
def test_resume_mid_global_batch_equals_uninterrupted(stop_after):
    """Take the state after k lists (mid-global-batch, or exactly at the end of global batch 0), load it into a fresh sampler: the
    rest equals the uninterrupted run, and only the remaining global batches are planned (O(1) resume:
    no replay). A failure means a restarted job would repeat or skip samples."""
    lengths = _lengths(300)
    ref = _sampler(lengths, rank=3, global_batch_size=96)
    ref.set_epoch(2)
    full = [_key(x) for x in ref]
    n0 = sum(1 for k in full if k[1] == 0)
    if isinstance(stop_after, str):
        stop_after = n0 + (2 if stop_after.endswith("+2") else 0)
    src = _sampler(lengths, rank=3, global_batch_size=96)
    src.set_epoch(2)
    it = iter(src)
    head = [_key(next(it)) for _ in range(stop_after)]
    state = src.state_dict()
    assert state == it.state_dict()
    assert (state["epoch"], state["global_batch"], state["micro_batch"]) == full[stop_after][:3]
    assert n0 > 3  # so stop_after = 1, 3 are mid-global-batch
    it.close()
    dst = _sampler(lengths, rank=3, global_batch_size=96)
    dst.load_state_dict(state)
    tail = [_key(x) for x in dst]
    assert head + tail == full
    assert len(dst.planner_waits) == dst.num_global_batches(2) - state["global_batch"]
    # the iterator itself is re-positionable (what StatefulDataLoader uses)
    it2 = iter(_sampler(lengths, rank=3, global_batch_size=96))
    it2.load_state_dict(state)
    assert [_key(x) for x in it2] == tail


def test_state_from_other_config_is_refused():
    """A state saved with another seed, batch size or data is a ValueError naming the field; one with another world
    size or rank too when it is mid-global-batch (at a boundary it resumes: tests/data/test_sampler_resume.py)."""
    lengths = _lengths(120)
    state = _sampler(lengths).state_dict()
    mid = {**state, "micro_batch": 1}
    for kw, field, st in (({"num_ranks": 4}, "num_ranks", mid), ({"seed": 3}, "seed", state),
                          ({"global_batch_size": 32}, "global_batch_size", state), ({"rank": 2}, "rank", mid)):
        with pytest.raises(ValueError, match=field):
            _sampler(lengths, **kw).load_state_dict(st)
    other = lengths.copy()
    other[0] += 1
    with pytest.raises(ValueError, match="data_digest"):
        _sampler(other).load_state_dict(state)
    with pytest.raises(ValueError, match="keys"):
        _sampler(lengths).load_state_dict({**state, "extra": 1})


def test_len_matches_iteration_for_fixed_micro_batches_and_constructor_checks():
    """len() equals the yielded count with micro_batches fixed too; bad arguments are ValueErrors."""
    lengths = _lengths(132, cap=2000)  # batches of 64, 64, 4: the last one gets min(8, 4) micro-batches
    s = _sampler(lengths, micro_batches=8)
    lists = list(s)
    assert len(s) == len(lists) == 8 + 8 + 4
    assert [x.num_micro_batches for x in lists] == [8] * 16 + [4] * 4
    with pytest.raises(ValueError, match="exactly one"):
        FCPSampler(lengths, num_ranks=2, cost_model=CM)
    with pytest.raises(ValueError, match="rank"):
        FCPSampler(lengths, num_ranks=2, rank=2, cost_model=CM, global_batch_size=4)
    with pytest.raises(ValueError, match="must be > 0"):
        FCPSampler(np.array([3, 0, 2]), num_ranks=2, cost_model=CM, global_batch_size=4)
    single = FCPSampler(lengths, cost_model=CM, global_batch_size=16, on_overlong="truncate")
    assert (single.rank, single.num_ranks) == (0, 1)
    clone = pickle.loads(pickle.dumps(s))  # e.g. a launcher that deep-copies its loaders: same position
    assert clone.state_dict() == s.state_dict()
    assert [_key(x) for x in clone] == [_key(x) for x in s] and clone.epoch == 1  # both go on with epoch 1
    fresh = pickle.loads(pickle.dumps(_sampler(lengths, micro_batches=8)))
    assert [_key(x) for x in fresh] == [_key(x) for x in lists]


def test_len_at_an_epochs_end_is_the_next_epochs():
    """After an epoch ends without set_epoch, iter() goes on with the next epoch, and len() counts that one (found by
    a review: len() still counted the finished epoch, so a DataLoader's len() was off by one in every later epoch whose
    "auto" plans hold another number of micro-batches)."""
    s = _sampler(_lengths(300, seed=3), num_ranks=4, global_batch_size=16)
    counts = []
    for _ in range(4):
        n = len(s)
        counts.append((n, sum(1 for _ in s)))
    assert all(n == got for n, got in counts), counts
    assert len({got for _, got in counts}) > 1, f"every epoch has the same length here: the test shows nothing {counts}"


def _counting(sampler) -> list:
    """Record the global batches ``sampler`` plans (its real planner still runs)."""
    calls, plan = [], sampler.plan_global_batch

    def counted(g, epoch=None):
        calls.append((sampler.epoch if epoch is None else epoch, g))
        return plan(g, epoch)

    sampler.plan_global_batch = counted
    return calls


@pytest.mark.parametrize("keep", [None, 2])
def test_len_plans_are_the_iterations_plans(monkeypatch, keep):
    """len() with micro_batches="auto" plans the epoch; the iteration that follows takes those plans instead of planning
    every global batch a second time (DataLoader and trainers call len() first), up to _KEEP_PLANS of them (here also
    2: the rest are planned again); the lists equal those of a sampler on which len() was never called (reference),
    over two epochs, with and without the background window (prefetch 2: plans ahead, into the next epoch too)."""
    import fcp_data.sampler as sampler_module

    if keep is not None:
        monkeypatch.setattr(sampler_module, "_KEEP_PLANS", keep)
    lengths = _lengths(300, cap=2000)
    for prefetch in (0, 2):
        ref = _sampler(lengths, prefetch=prefetch)
        expected = [[_key(x) for x in iter(ref)], [_key(x) for x in iter(ref)]]
        s = _sampler(lengths, prefetch=prefetch)
        calls = _counting(s)
        n = len(s)
        planned = s.num_global_batches()
        assert calls == [(0, g) for g in range(planned)]
        got = [_key(x) for x in iter(s)]
        kept = planned if keep is None else keep
        assert n == len(got) and got == expected[0]
        again = [c for c in calls[planned:] if c[0] == 0]  # (the window may already plan epoch 1's first batch)
        assert again == [(0, g) for g in range(kept, planned)], f"replanned {again}"
        s.set_epoch(1)  # the trainer's usual call (len() of a finished epoch's position counts that epoch)
        assert len(s) == len(expected[1]) and [_key(x) for x in iter(s)] == expected[1]  # epoch 1: same again


def test_a_fixed_degree_holds_sequences_of_its_group_only():
    """static-cp held to degree 2: a sequence over 2·tokens_per_rank fits the ranks (8·512) but no group of degree
    2. It was accepted, and the first global batch holding one failed mid-epoch, at every retry (found by a review);
    now the over-long policy applies to the group's capacity: refused at construction, or truncated to it."""
    lengths = _lengths(150, cap=1024)
    lengths[[3, 70]] = [1500, 3000]  # over 2·512, under 8·512
    with pytest.raises(ValueError, match=r"longer than degree·tokens_per_rank = 2·512 = 1024 tokens .* sample 3 "):
        _sampler(lengths, solver="static-cp", solver_options={"degree": 2}, on_overlong="error")
    s = _sampler(lengths, solver="static-cp", solver_options={"degree": 2}, on_overlong="truncate")
    assert s.num_truncated == 2 and s.num_tokens.max() == 1024
    lists = list(s)
    assert lists and all(lst.ranks == () or len(lst.ranks) == 2 for lst in lists)
    assert _sampler(lengths, solver="static-cp", on_overlong="error").num_tokens.max() == 3000  # no degree: N ranks


def test_solver_options_reach_the_planner_and_the_fingerprint():
    """solver_options={"degree": 2} with static-cp: every global batch's plan equals plan_batch(..., degree=2)
    called directly (the reference) and every group has degree 2; the options are part of the state's
    fingerprint (a JSON round trip loads, other options are a ValueError naming solver_options); options
    the solver rejects fail at construction. A failure means the sampler ignores or mangles the options."""
    import json

    from fcp_data.plan import plan_batch

    lengths = _lengths(150, cap=1024)
    s = _sampler(lengths, solver="static-cp", solver_options={"degree": 2})
    for g in range(s.num_global_batches()):
        ids = s.global_batch_indices(g)
        ref = plan_batch(s.num_tokens[ids], num_ranks=8, cost_model=CM, solver="static-cp", micro_batches="auto",
                         degree=2)
        got = s.plan_global_batch(g)
        assert got.micro_batches == ref.micro_batches
    lists = list(s)
    assert lists and all(lst.ranks == () or len(lst.ranks) == 2 for lst in lists)
    default = _sampler(lengths, solver="static-cp")
    assert any(len(lst.ranks) not in (0, 2) for lst in default)  # without the option the degree differs
    state = json.loads(json.dumps(s.state_dict()))
    _sampler(lengths, solver="static-cp", solver_options={"degree": 2}).load_state_dict(state)
    mid = {**state, "global_batch": 0, "micro_batch": 1}  # at a boundary another planning config may resume
    for other in (None, {"degree": 4}):
        with pytest.raises(ValueError, match="solver_options"):
            _sampler(lengths, solver="static-cp", solver_options=other).load_state_dict(mid)
    with pytest.raises(ValueError, match="does not accept"):
        _sampler(lengths, solver="fcp", solver_options={"degree": 2})
    with pytest.raises(ValueError, match="degree 3"):
        _sampler(lengths, solver="static-cp", solver_options={"degree": 3})
    for bad in ([("degree", 2)], {"micro_batches": 2}, {"degree": [2]}):
        with pytest.raises(ValueError, match="solver_options"):
            _sampler(lengths, solver="static-cp", solver_options=bad)


def test_truncation_inside_an_image_placeholder_run_is_named_in_a_warning(caplog):
    """Found by a review: ``on_overlong="truncate"`` cut samples inside an image's or video's run of placeholder
    tokens (the model then sees part of the image) with only the generic "truncates" warning. Now one warning counts
    those samples and names the first; a cut at a run's edge, a text sample and a run past the cut are not named.
    Reference: the placeholder positions written out, cut iff tokens n−1 and n are both placeholders."""
    import logging

    from fcp_data.visual_layout import SpanVisualLayout, cut_through_placeholders

    lengths = np.full(40, 100, dtype=np.int64)
    lengths[[1, 2, 3, 4, 5]] = 5000  # capacity 8 · 512 = 4096
    spans = [()] * 40
    spans[1], spans[2], spans[3], spans[5] = [(4000, 200)], [(4096, 100)], [(3996, 100)], [(10, 50), (4090, 20)]
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        _sampler(lengths, visual_layout=SpanVisualLayout(spans), global_batch_size=8)
    cut = [r.getMessage() for r in caplog.records if "placeholder" in r.getMessage()]
    assert len(cut) == 1 and "2 of the 5 truncated sample(s)" in cut[0] and "first: sample 1;" in cut[0], cut
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        _sampler(lengths, global_batch_size=8)  # no layout: nothing to say beyond the truncation itself
    assert not [r for r in caplog.records if "placeholder" in r.getMessage()]
    rng = np.random.default_rng(0)
    for _ in range(300):  # the counting rule against the positions themselves
        runs = [(int(a), int(c)) for a, c in zip(rng.integers(0, 60, 3), rng.integers(0, 8, 3))]
        n = int(rng.integers(1, 70))
        pos = {p for a, c in runs for p in range(a, a + c)}
        want = [0] if (n - 1 >= 1 and n - 1 in pos and n in pos) else []
        assert cut_through_placeholders(SpanVisualLayout([runs]), [0], n) == want, (runs, n)
