"""FCPSampler(exclude=...): samples found unreadable in an earlier run (or any chosen ones) are left out of every
epoch. Reference: a sampler over the kept samples only — excluding samples must give exactly its plans, with each
index mapped back to the full dataset (the epoch order is ``kept[permutation(len(kept))]``, so the two agree list
for list, slot for slot). Files: the JSON lines ``FCPDataset(errors_path=...)`` / ``fcp train --read-errors-out``
write (several records per sample: one per rank and epoch) or plain indices; every bad input is one clear error.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.sampler import FCPSampler

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=4, tokens_per_rank=512)
pytestmark = pytest.mark.usefixtures("no_local_search")


def _lengths(n=120, seed=3):
    return np.minimum(np.maximum(1, np.random.default_rng(seed).lognormal(5.0, 1.2, size=n)), 1500).astype(np.int64)


def _lists(lengths, rank, epoch, **kw):
    s = FCPSampler(lengths, num_ranks=4, rank=rank, cost_model=CM, global_batch_size=16, seed=5,
                   on_overlong="truncate", **kw)
    s.set_epoch(epoch)
    return [[(x.index, x.num_tokens, x.ranks, x.cp_rank, x.num_tokens_global, x.micro_batch) for x in lst]
            for lst in s]


@pytest.mark.parametrize("epoch", [0, 1])
def test_excluded_samples_are_planned_out_exactly_as_if_absent(epoch):
    lengths = _lengths()
    excluded = [0, 7, 8, 50, 119]
    kept = np.setdiff1d(np.arange(lengths.size), excluded)
    seen = []
    for rank in range(4):
        got = _lists(lengths, rank, epoch, exclude=excluded)
        want = _lists(lengths[kept], rank, epoch)
        mapped = [[(int(kept[i]), *rest) for i, *rest in lst] for lst in want]
        assert got == mapped
        seen += [x[0] for lst in got for x in lst if x[3] == 0]  # each sample once, on its group's cp_rank 0
    assert sorted(seen) == kept.tolist()


def test_an_errors_file_of_an_earlier_run(tmp_path):
    lengths = _lengths()
    path = tmp_path / "read_errors.jsonl"
    records = [{"index": 9, "key": "a.mp4", "reason": "decode", "epoch": 0, "rank": r} for r in range(2)]
    records += [{"index": 30, "key": "b.mp4", "reason": "gone", "epoch": 1, "rank": 0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + "\n")
    s = FCPSampler(lengths, num_ranks=4, rank=0, cost_model=CM, global_batch_size=16, on_overlong="truncate",
                   exclude=path)
    assert s.excluded.tolist() == [9, 30] and len(s._kept) == lengths.size - 2
    plain = tmp_path / "bad.txt"
    plain.write_text("# found by hand\n9\n30  # twice below\n30\n")
    t = FCPSampler(lengths, num_ranks=4, rank=0, cost_model=CM, global_batch_size=16, on_overlong="truncate",
                   exclude=str(plain))
    assert t.excluded.tolist() == [9, 30] and t.state_dict() == s.state_dict()


@pytest.mark.parametrize("exclude, message", [
    ([5, 500], r"500 is not a sample index in \[0, 120\)"),
    ([-1], r"-1 is not a sample index"),
    ([True], r"True is not a sample index"),
    ([1.5], r"1.5 is not a sample index"),
    (7, r"exclude must be sample indices or a file of them, got int"),
    (list(range(120)), r"no sample is left after dropping over-long and excluded ones"),
])
def test_bad_exclusions_are_one_clear_error(exclude, message):
    with pytest.raises(ValueError, match=message):
        FCPSampler(_lengths(), num_ranks=4, rank=0, cost_model=CM, global_batch_size=16, on_overlong="truncate",
                   exclude=exclude)


@pytest.mark.parametrize("text, message", [
    ("3\nfour\n", r"line 2: neither an integer nor a JSON record: 'four'"),
    ('{"key": "x.mp4"}\n', r'line 1: a JSON record without "index"'),
    ('{"index": 999}\n', r"999 is not a sample index in \[0, 120\)"),
])
def test_bad_exclude_files_are_one_clear_error(tmp_path, text, message):
    path = tmp_path / "x.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        FCPSampler(_lengths(), num_ranks=4, rank=0, cost_model=CM, global_batch_size=16, on_overlong="truncate",
                   exclude=path)
    with pytest.raises(ValueError, match="no such file"):
        FCPSampler(_lengths(), num_ranks=4, rank=0, cost_model=CM, global_batch_size=16, on_overlong="truncate",
                   exclude=tmp_path / "missing.jsonl")


def test_a_state_is_tied_to_its_exclusions():
    lengths = _lengths()

    def sampler(exclude):
        return FCPSampler(lengths, num_ranks=4, rank=0, cost_model=CM, global_batch_size=16, on_overlong="truncate",
                          exclude=exclude)

    a = sampler([3, 4])
    it = iter(a)
    next(it)
    state = a.state_dict()
    b = sampler([4, 3])
    b.load_state_dict(state)  # the same exclusions, in any order
    assert list(b) == list(it)
    with pytest.raises(ValueError, match="exclude= must be the same to resume"):
        sampler([3]).load_state_dict(state)
    plain = sampler(None).state_dict()
    sampler([]).load_state_dict(plain)  # no exclusions: the same data digest as before exclude= existed
