"""``train_step``'s stream of micro-batches (one process, tiny-llm, the real sampler/collator): a global batch that is
cut short or entered in its middle is a RuntimeError that says which, never a step over part of a global batch.

The case that motivated the wording: a StopIteration raised inside a DataLoader's collate_fn (transformers 5.3's
Qwen2.5-VL ``get_rope_index``) ended the epoch early, the next epoch began at micro-batch 0, and the step reported
"expected micro-batch 1, got 0; start train_step at a global-batch boundary" — pointing away from the cause.
"""

from __future__ import annotations

import pytest
import torch
from _pattern_text import LENGTHS, PatternText
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
from fcp_exec.models import build_model
from fcp_exec.step import AllReduceReducer, fill_num_tokens_global, train_step
from fcp_exec.train import _forward_loss


@pytest.fixture(scope="module")
def epoch():
    """One rank's micro-batches of an epoch: global batch 0 has 3 micro-batches, 1 and 2 have 2."""
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=80)
    sampler = FCPSampler(LENGTHS, num_ranks=1, rank=0, global_batch_size=4, seed=0, cost_model=cost)
    mbs = list(DataLoader(FCPDataset(PatternText()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0)))
    assert [(int(b["global_batch"]), int(b["micro_batch"]), int(b["num_micro_batches"])) for b in mbs] == \
        [(0, 0, 3), (0, 1, 3), (0, 2, 3), (1, 0, 2), (1, 1, 2), (2, 0, 2), (2, 1, 2)]
    return mbs


def _step(stream):
    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    return model, train_step(model, iter(stream), lambda m, b: _forward_loss(m, b, False), AllReduceReducer())


def test_a_whole_global_batch_steps(epoch):
    model, res = _step(epoch[:3])
    assert res.num_tokens == sum(LENGTHS[i] - 1 for b in epoch[:3] for i in b["sample_indices"])
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("stream, match", [
    ((0, 1, 3, 4), r"micro-batch 2 of 3 never came: the loader went on with micro-batch 0 of the next global batch, "
                   r"so its epoch ended early \(a DataLoader ends an epoch at a StopIteration"),
    ((0, 3, 4), r"micro-batch 1 of 3 never came"),
    ((1, 2, 3), r"expected micro-batch 0 of the global batch, got 1; start train_step at a global-batch boundary"),
    ((0, 1), r"the micro-batches ended after 2 of 3; pass one whole global batch"),
])
def test_a_global_batch_cut_short_or_entered_midway_is_an_error_that_says_which(epoch, stream, match):
    with pytest.raises(RuntimeError, match=match):
        _step([epoch[k] for k in stream])


def _step_list(batches):
    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    return train_step(model, batches, lambda m, b: _forward_loss(m, b, False), AllReduceReducer())


@pytest.mark.parametrize("make, error, match", [
    # found by a review of the executor: each trained part of the list, or an un-normalised loss, without a word
    (lambda e: list(e), ValueError, r"micro_batches holds 7 batches of a global batch of num_micro_batches=3"),
    (lambda e: [dict(b, num_micro_batches=2) for b in e[:3]], ValueError, r"holds 3 batches .*num_micro_batches=2"),
    (lambda e: [dict(b, num_micro_batches=0) for b in e[:1]], ValueError, r"num_micro_batches=0"),
    (lambda e: [dict(b, num_tokens_global=0) for b in e[:3]], ValueError, r"num_tokens_global=0 but micro-batch 0"),
    (lambda e: [dict(b, num_tokens_global=-5) for b in e[:3]], ValueError, r"num_tokens_global=-5"),
    (lambda e: [{k: v for k, v in b.items() if k != "ranks"} for b in e[:3]], ValueError, r"it lacks ranks"),
    (lambda e: [e[0]["input_ids"]], ValueError, r"not an FCPCollator batch .* got a Tensor"),
])
def test_a_list_that_is_not_one_global_batch_is_refused(epoch, make, error, match):
    with pytest.raises(error, match=match):
        _step_list(make(epoch))


def test_an_iterator_is_read_one_global_batch_far(epoch):
    """A DataLoader iterator (it has a len()) is read num_micro_batches batches far, the rest left for the next step."""
    it = iter(epoch)
    res = _step_list(it)
    assert res.num_tokens == sum(LENGTHS[i] - 1 for b in epoch[:3] for i in b["sample_indices"])
    assert int(next(it)["global_batch"]) == 1


# Gaps found by mutation testing in fcp_exec/step.py (one process, tiny-llm, the real sampler/collator):
# 
# * an idle micro-batch (the plan gave this rank no CP group: ``ranks == ()``) runs ``loss_fn`` on the two-token dummy
#   and its loss is multiplied by 0 (train_step's documented contract). With fcp's own losses the dummy's loss is 0
#   anyway (no label token), so ``loss * 0.0`` -> ``loss * 1.0`` passed every fast test; a user loss with a term that
#   does not vanish on a label-free batch (a weight penalty, a z-loss) then trains the idle rank's dummy. Reference:
#   a step whose every micro-batch is idle leaves every gradient exactly 0 and reports loss 0.
# * ``fill_num_tokens_global`` (``FCPCollator(sample_labels=True)``) must sum ``num_label_tokens_local`` over ALL
#   micro-batches of the step (mutation: only the last one's count) — checked directly, world of one.


def _first_global_batch():
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=80)
    sampler = FCPSampler(LENGTHS, num_ranks=1, rank=0, global_batch_size=4, seed=0, cost_model=cost)
    mbs = list(DataLoader(FCPDataset(PatternText()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0)))
    return [b for b in mbs if int(b["global_batch"]) == 0]


def _penalised(model, batch):
    penalty = sum(p.square().sum() for p in model.parameters())
    return _forward_loss(model, batch, False) + 1e-3 * penalty


def test_idle_micro_batches_contribute_nothing_even_with_a_non_vanishing_loss():
    batches = [dict(b, ranks=()) for b in _first_global_batch()]
    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    res = train_step(model, batches, _penalised, AllReduceReducer())
    assert res.num_idle == len(batches) and res.loss == 0.0, (res.num_idle, res.loss)
    worst = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    assert worst == 0.0, worst


def test_fill_num_tokens_global_sums_every_micro_batch():
    batches = [{"num_label_tokens_local": n, "num_tokens_global": None} for n in (3, 5, 0, 7)]
    assert fill_num_tokens_global(batches) == 15
    assert [b["num_tokens_global"] for b in batches] == [15] * 4
