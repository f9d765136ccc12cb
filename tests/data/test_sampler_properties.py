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


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), num_ranks=st.integers(1, 6), data=st.data(), gbs=st.integers(1, 12),
       micro=st.sampled_from(["auto", 1, 2, 3]), seed=st.integers(0, 3), epoch=st.integers(0, 2),
       drop_last=st.booleans(), prefetch=st.integers(0, 2))
def test_resume_at_any_position_yields_exactly_the_rest(n, num_ranks, data, gbs, micro, seed, epoch, drop_last,
                                                         prefetch):
    rank = data.draw(st.integers(0, num_ranks - 1), label="rank")
    # a fixed micro-batch count must fit: sequences of at most 300 tokens (one per rank at least) and
    # at most micro·num_ranks per global batch; "auto" gets sequences longer than a rank holds too
    assume(micro == "auto" or gbs <= micro * num_ranks)
    lengths = np.random.default_rng(seed).integers(1, 700 if micro == "auto" else 300, size=n)
    drop_last = drop_last and n >= gbs
    kw = dict(num_ranks=num_ranks, rank=rank, cost_model=CM, global_batch_size=gbs, micro_batches=micro, seed=seed,
              drop_last=drop_last, on_overlong="truncate")
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
