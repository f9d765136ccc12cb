"""Property test of the sampler's resume (issue 13): for random data sizes, world sizes, ranks, batch sizes,
micro-batch settings, seeds and epochs, a sampler that yielded ``k`` lists and saved its state resumes — in a
new sampler — with exactly lists ``k, k+1, …`` of the uninterrupted epoch (reference: a fresh sampler without a
planning thread). ``k`` ranges over every position, 0 and the end of the epoch included."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fcp_data.cost import CostModel
from fcp_data.sampler import FCPSampler

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)


def _key(lst):
    return (lst.epoch, lst.global_batch, lst.micro_batch, lst.num_micro_batches, lst.ranks, lst.cp_rank,
            tuple(s.index for s in lst), tuple(s.num_tokens for s in lst), lst.num_tokens_global)


def _instance(data, n, num_ranks, gbs, micro, seed, drop_last) -> tuple[np.ndarray, dict]:
    """The drawn data and sampler arguments (the rank drawn here)."""
    rank = data.draw(st.integers(0, num_ranks - 1), label="rank")
    # a fixed micro-batch count must fit: sequences of at most 300 tokens (one per rank at least) and
    # at most micro·num_ranks per global batch; "auto" gets sequences longer than a rank holds too
    assume(micro == "auto" or gbs <= micro * num_ranks)
    lengths = np.random.default_rng(seed).integers(1, 700 if micro == "auto" else 300, size=n)
    return lengths, dict(num_ranks=num_ranks, rank=rank, cost_model=CM, global_batch_size=gbs, micro_batches=micro,
                         seed=seed, drop_last=drop_last and n >= gbs, on_overlong="truncate")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), num_ranks=st.integers(1, 6), data=st.data(), gbs=st.integers(1, 12),
       micro=st.sampled_from(["auto", 1, 2, 3]), seed=st.integers(0, 3), epoch=st.integers(0, 2),
       drop_last=st.booleans(), prefetch=st.integers(0, 2))
def test_resume_at_any_position_yields_exactly_the_rest(n, num_ranks, data, gbs, micro, seed, epoch, drop_last,
                                                         prefetch):
    lengths, kw = _instance(data, n, num_ranks, gbs, micro, seed, drop_last)
    ref = FCPSampler(lengths, prefetch=0, **kw)
    ref.set_epoch(epoch)
    full = [_key(x) for x in ref]
    k = data.draw(st.integers(0, len(full)), label="position")
    first = FCPSampler(lengths, prefetch=prefetch, **kw)
    first.set_epoch(epoch)
    it = iter(first)
    head = [_key(next(it)) for _ in range(k)]
    state = first.state_dict()
    resumed = FCPSampler(lengths, prefetch=prefetch, **kw)
    resumed.load_state_dict(state)
    resumed.set_epoch(epoch)
    rest = [_key(x) for x in resumed] if k < len(full) else []
    assert head == full[:k] and rest == full[k:], f"break after {k} of {len(full)} lists"


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), num_ranks=st.integers(1, 6), data=st.data(), gbs=st.integers(1, 12),
       micro=st.sampled_from(["auto", 1, 2, 3]), seed=st.integers(0, 3), drop_last=st.booleans(),
       prefetch=st.integers(0, 2), ahead=st.integers(1, 2))
def test_exclude_later_at_any_position_plans_and_resumes_like_exclude(n, num_ranks, data, gbs, micro, seed, drop_last,
                                                                      prefetch, ahead):
    """``exclude_later(X, ahead)`` called after any list ``j`` of epoch 0 (the planner thread possibly holding plans of
    epoch 1 already): epoch 0 is the plain sampler's, epochs 1 and 2 from ``ahead`` on are those of a sampler built
    with ``exclude=X`` (reference without a planning thread); a state saved after any list ``k`` of epoch ``ahead``
    resumes in a fresh sampler with exactly the rest. An ``X`` that would leave an epoch with no global batch is a
    ValueError and changes nothing."""
    lengths, kw = _instance(data, n, num_ranks, gbs, micro, seed, drop_last)
    excluded = data.draw(st.lists(st.integers(0, n - 1), unique=True, max_size=n), label="excluded")

    def lists(sampler, epoch):
        sampler.set_epoch(epoch)
        return [_key(x) for x in sampler]

    plain = FCPSampler(lengths, prefetch=0, **kw)
    epoch0 = lists(plain, 0)
    s = FCPSampler(lengths, prefetch=prefetch, **kw)
    it = iter(s)
    # at the epoch's end most often: the planner thread then holds the next epoch's first plans (made stale by the call)
    j = data.draw(st.one_of(st.just(len(epoch0)), st.integers(0, len(epoch0))), label="called after list")
    got0 = [_key(next(it)) for _ in range(j)]
    left = n - len(excluded)
    if left == 0 or (kw["drop_last"] and left < gbs):
        try:
            s.exclude_later(excluded, ahead)
            raise AssertionError("an epoch with no global batch was accepted")
        except ValueError as e:
            assert "no global batch" in str(e) or "no sample" in str(e), e
        assert s._late == ()
        return
    s.exclude_later(excluded, ahead)
    assert got0 + [_key(x) for x in it] == epoch0
    ref = FCPSampler(lengths, prefetch=0, exclude=excluded or None, **kw)
    if ahead == 2:
        assert lists(s, 1) == lists(FCPSampler(lengths, prefetch=0, **kw), 1)
    want = lists(ref, ahead)
    s.set_epoch(ahead)
    it = iter(s)
    k = data.draw(st.integers(0, len(want)), label="position")
    head = [_key(next(it)) for _ in range(k)]
    resumed = FCPSampler(lengths, prefetch=prefetch, **kw)
    resumed.load_state_dict(s.state_dict())
    rest = [_key(x) for x in resumed] if k < len(want) else []  # at the epoch's end: it iterates the next one
    assert head == want[:k] and rest == want[k:]
    assert lists(resumed, ahead + 1) == lists(ref, ahead + 1)
