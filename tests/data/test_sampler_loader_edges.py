"""FCPSampler / FCPDataset under the DataLoader uses that are easy to get wrong: an epoch continued after a ``break``,
torchdata's ``StatefulDataLoader`` with workers and ``exclude_later``, an older iterator whose epoch changed, lengths of
another size than the dataset, bounded bookkeeping over many epochs, tensors as exclusions, ``drop_last``'s report,
``sampler=`` in place of ``batch_sampler=``.

Reference: an uninterrupted run of the same sampler (every list it yields, by position and samples), and what the
epoch's layout says (``global_batch_indices``)."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler

COST = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
                 bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)
LENGTHS = np.clip(np.random.default_rng(1).lognormal(5.0, 1.1, size=120), 2, 3000).astype(np.int64)


class _Text:
    def __init__(self, lengths):
        self.lengths = [int(n) for n in lengths]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"input_ids": (torch.arange(self.lengths[i]) * 31 + i) % 5000}


def _key(b):
    return b["epoch"], b["global_batch"], b["micro_batch"], b["sample_indices"]


def _sampler(lengths=LENGTHS, **kw):
    kw = {"num_ranks": 8, "rank": 2, "cost_model": COST, "global_batch_size": 30, "on_overlong": "truncate", **kw}
    return FCPSampler(lengths, **kw)


def _continued(caplog):
    return [r for r in caplog.records if "continues epoch" in r.getMessage()]


def test_a_new_iterator_continuing_mid_epoch_says_what_workers_took_ahead(caplog):
    """A ``break`` with 2 DataLoader workers: the workers took lists ahead of the loop, so the next ``iter()``
    continues past batches the loop never saw — one warning says so and names the exact way on
    (``load_state_dict(state_after(batch))``), with which the two passes yield the uninterrupted epoch exactly."""
    ds, col = FCPDataset(_Text(LENGTHS)), FCPCollator()
    full = [_key(b) for b in DataLoader(ds, batch_sampler=_sampler(), collate_fn=col)]
    s = _sampler()
    loader = DataLoader(ds, batch_sampler=s, collate_fn=col, num_workers=2)
    got = []
    for b in loader:
        got.append(_key(b))
        last = b
        if len(got) == 3:
            break
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        rest = [_key(b) for b in loader]
    assert len(got) + len(rest) < len(full)  # the lists the workers had taken are not yielded again...
    (msg,) = [r.getMessage() for r in _continued(caplog)]  # ...and the user is told, once
    assert "where the previous one stopped mid-epoch" in msg and "load_state_dict(sampler.state_after(batch))" in msg
    s2 = _sampler()
    loader2 = DataLoader(ds, batch_sampler=s2, collate_fn=col, num_workers=2)
    for i, b in enumerate(loader2):
        if i == 2:
            last = b
            break
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        s2.load_state_dict(s2.state_after(last))
        rest = [_key(b) for b in loader2]
        assert full[:3] + rest == full and not _continued(caplog)
        s2.set_epoch(1)
        assert [_key(b) for b in loader2][0][:3] == (1, 0, 0) and not _continued(caplog)  # a finished epoch: no word


def test_a_stateful_dataloader_checkpoint_keeps_exclusions_made_after_its_snapshot():
    """torchdata takes the sampler iterator's state when it hands a list to a worker — ahead of the loop. An
    ``exclude_later`` call between that moment and the checkpoint was lost: the resumed run read the excluded
    samples again in epoch 1. The iterator's state now carries the sampler's exclusions as they are when saved."""
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    ds, col = FCPDataset(_Text(LENGTHS)), FCPCollator()

    def make():
        s = _sampler()
        return s, stateful.StatefulDataLoader(ds, batch_sampler=s, collate_fn=col, num_workers=2)

    s, loader = make()
    full, saved = [], None
    for epoch in range(2):
        s.set_epoch(epoch)
        for b in loader:
            full.append(_key(b))
            if len(full) == 2:
                s.exclude_later([1, 2, 3, 4, 5], 1)
            if len(full) == 4:
                saved = pickle.loads(pickle.dumps(loader.state_dict()))  # a snapshot, as a checkpoint file holds
    assert not {1, 2, 3, 4, 5} & {i for k in full if k[0] == 1 for i in k[3]}
    s, loader = make()
    loader.load_state_dict(saved)
    got = full[:4]
    for epoch in range(2):
        s.set_epoch(epoch)
        got += [_key(b) for b in loader]
    assert got == full


def test_exclude_later_stops_an_older_iterator_whose_epoch_it_changes():
    """An iterator mid-epoch 2, retired by ``set_epoch(0)``, went on after ``exclude_later(..., 2)`` with a mix of the
    old and the new epoch 2 (samples twice, others never; or an internal error). It now refuses to go on; an
    iterator of an epoch the exclusion does not reach goes on unchanged."""
    for prefetch in (0, 2):
        s = _sampler(num_ranks=1, rank=0, global_batch_size=12, prefetch=prefetch)
        s.set_epoch(2)
        it2 = iter(s)
        [next(it2) for _ in range(3)]
        s.set_epoch(0)
        it0 = iter(s)
        first = next(it0)
        s.exclude_later([5, 6, 7], 2)
        with pytest.raises(RuntimeError, match="exclude_later changed epoch 2 while this iterator was in it"):
            next(it2)
        rest = [first] + list(it0)
        assert sorted(x.index for lst in rest for x in lst) == list(range(LENGTHS.size))  # epoch 0 untouched


def test_lengths_of_another_size_than_the_dataset():
    """Fewer samples in the dataset than lengths: every read past its end failed as "damaged data" — now one error
    naming both sizes. More samples: the rest was never read without a word — now one warning (lengths of a prefix
    may be on purpose), and the planned samples are read as before."""
    col = FCPCollator()
    with pytest.raises(ValueError, match="the sampler plans 120 samples but the dataset has 100"):
        next(iter(DataLoader(FCPDataset(_Text(LENGTHS[:100])), batch_sampler=_sampler(), collate_fn=col)))
    logger = logging.getLogger("fcp_data")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        seen = [b["sample_indices"] for b in DataLoader(FCPDataset(_Text(np.concatenate([LENGTHS, LENGTHS]))),
                                                        batch_sampler=_sampler(rank=0), collate_fn=col)]
    finally:
        logger.removeHandler(handler)
    msgs = [r.getMessage() for r in records if "the sampler plans" in r.getMessage()]
    assert msgs == ["FCPDataset: the sampler plans 120 samples but the dataset has 240: the lengths given to "
                    "FCPSampler must be the dataset's, one per sample in order; samples 120..239 are never read (for "
                    "a subset, pass torch.utils.data.Subset(dataset, indices) with the lengths of those samples)"]
    assert max(i for ids in seen for i in ids) < 120


def test_bookkeeping_stays_bounded_over_many_epochs(monkeypatch):
    """Per-epoch micro-batch counts and per-global-batch planner waits grew for ever (75 B per global batch: 75 MB
    per rank over a million steps); the counts keep the current and previous epoch, the waits the latest ones, and
    ``planner_wait_total`` the whole run's sum."""
    import fcp_data.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "_KEEP_WAITS", 50)
    s = _sampler(LENGTHS[:24], num_ranks=2, rank=0, global_batch_size=12, prefetch=0)
    total = 0
    for epoch in range(40):
        s.set_epoch(epoch)
        total += sum(1 for _ in s)
        assert set(s._counts) <= {epoch - 1, epoch}
    assert len(s.planner_waits) == 50 and total > 50
    assert s.planner_wait_total >= sum(s.planner_waits) > 0


def test_exclusions_given_as_arrays_or_tensors():
    """``exclude=torch.tensor([7, 9])`` was refused as "tensor(7) is not a sample index" (lengths take tensors)."""
    for value in (torch.tensor([7, 9]), np.array([9, 7]), torch.tensor(7)):
        s = _sampler(exclude=value)
        assert 7 in s.excluded.tolist()
        s.exclude_later(torch.tensor([11, 12]), 1)
        assert s._late[0][1].tolist() == [11, 12]
    with pytest.raises(ValueError, match=r"exclude: 2\.5 is not a sample index"):
        _sampler(exclude=torch.tensor([2.5]))


def test_drop_last_says_how_much_it_leaves_out(caplog):
    """``drop_last=True`` leaves the samples after the last full global batch out of each epoch: said once, with the
    count the epoch's layout gives (120 samples, batches of 50: 20 samples)."""
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        s = _sampler(global_batch_size=50, drop_last=True)
        for epoch in range(3):
            s.set_epoch(epoch)
            list(s)
    msgs = [r.getMessage() for r in caplog.records if "drop_last" in r.getMessage()]
    order, bounds = s._epoch_layout(0)
    left = order[bounds[-1]:]
    assert msgs == [f"FCPSampler(drop_last=True) leaves the last, incomplete global batch out of each epoch: 20 of 120 "
                    f"samples ({int(s.num_tokens[left].sum())} tokens) in epoch 0, other samples in other epochs"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        list(_sampler(global_batch_size=40, drop_last=True))  # 120 = 3 × 40: nothing left out, nothing said
    assert not [r for r in caplog.records if "drop_last" in r.getMessage()]


def test_the_sampler_given_as_sampler_instead_of_batch_sampler_is_named():
    loader = DataLoader(FCPDataset(_Text(LENGTHS)), sampler=_sampler(), collate_fn=FCPCollator())
    with pytest.raises(TypeError, match="pass FCPSampler as the DataLoader's batch_sampler=, not sampler="):
        next(iter(loader))
