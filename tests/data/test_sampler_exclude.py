"""FCPSampler(exclude=...): samples found unreadable in an earlier run (or any chosen ones) are left out of every
epoch. Reference: a sampler over the kept samples only — excluding samples must give exactly its plans, with each
index mapped back to the full dataset (the epoch order is ``kept[permutation(len(kept))]``, so the two agree list
for list, slot for slot). Files: the JSON lines ``FCPDataset(errors_path=...)`` / ``fcp train --read-errors-out``
write (several records per sample: one per rank and epoch) or plain indices; every bad input is one clear error.
"""

from __future__ import annotations

import json
import re

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
    ('{"index": 999}\n', r"x.jsonl, line 1: 999 is not a sample index in \[0, 120\)"),
    ('# two\n3\n\n-4\n', r"x.jsonl, line 4: -4 is not a sample index in \[0, 120\)"),
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


# ---------------------------------------------------------------------------------------------- exclude_later
BAD = [2, 9, 40, 77]  # found unreadable during epoch 0


def _key(lst):
    return [(x.index, x.num_tokens, x.ranks, x.cp_rank, x.num_tokens_global, x.micro_batch) for x in lst]


def _epochs(s, epochs):
    out = {}
    for e in epochs:
        s.set_epoch(e)
        out[e] = [_key(lst) for lst in s]
    return out


def _sampler(rank, prefetch=2, **kw):
    return FCPSampler(_lengths(), num_ranks=4, rank=rank, cost_model=CM, global_batch_size=16, seed=5,
                      on_overlong="truncate", prefetch=prefetch, **kw)


@pytest.mark.parametrize("when", ["epoch end", "mid-epoch"])
def test_exclude_later_plans_later_epochs_as_a_sampler_built_without_them(when):
    """Epoch 0 as without exclusions; epochs 1 and 2 list for list, slot for slot, those of a sampler built with
    ``exclude=BAD`` — on every rank, with the planner thread already holding epoch 1's first plans when the call
    comes (they are dropped and made again: mutation, forget_from a no-op → epoch 1's first lists differ)."""
    for rank in range(4):
        plain, ref = _sampler(rank), _sampler(rank, exclude=BAD)
        want = {0: _epochs(_sampler(rank), [0])[0], **_epochs(ref, [1, 2])}
        s = _sampler(rank)
        it = iter(s)
        got = []
        n = len(plain) if when == "epoch end" else len(plain) // 2
        got += [_key(next(it)) for _ in range(n)]
        if when == "epoch end":
            assert s._window is not None and any(k[0] == 1 for k in s._window._futures), "no plan of epoch 1 ahead"
        assert s.exclude_later(BAD, 1) == len(BAD)
        got += [_key(lst) for lst in it]  # the rest of epoch 0: untouched
        assert got == want[0]
        assert _epochs(s, [1, 2]) == {1: want[1], 2: want[2]}


def test_exclude_later_accumulates_and_resumes_exactly():
    """A second call adds (from its own epoch on); the state carries both (``excluded_later``), and a fresh sampler
    loading a state saved mid-epoch 2 yields the rest of the run exactly; a state of another history is refused."""
    s = _sampler(1)
    s.exclude_later(BAD[:2], 1)
    assert s.exclude_later(BAD, 2) == 2 and s.exclude_later(BAD, 3) == 0  # BAD[:2] from 1, BAD[2:] from 2
    ref1, ref2 = _sampler(1, exclude=BAD[:2]), _sampler(1, exclude=BAD)
    assert _epochs(s, [0, 1]) == {0: _epochs(_sampler(1), [0])[0], 1: _epochs(ref1, [1])[1]}
    s.set_epoch(2)
    it = iter(s)
    head = [_key(next(it)) for _ in range(3)]
    state = s.state_dict()
    assert state["excluded_later"] == [[1, BAD[:2]], [2, BAD[2:]]]
    tail = [_key(lst) for lst in it]
    assert head + tail == _epochs(ref2, [2])[2]
    fresh = _sampler(1)
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert [_key(lst) for lst in fresh] == tail
    assert _epochs(fresh, [3])[3] == _epochs(ref2, [3])[3]
    other = dict(state, excluded_later=[[1, BAD[:2]]])  # epoch 2 with BAD[2:]: other global batches
    with pytest.raises(ValueError, match="had other global batches"):
        _sampler(1).load_state_dict(other)


def test_exclude_later_refuses_what_would_change_the_past_or_empty_an_epoch():
    s = _sampler(0, prefetch=0)
    it = iter(s)
    next(it)
    with pytest.raises(ValueError, match="epoch 0 is not after the sampler's position"):
        s.exclude_later([1], 0)
    with pytest.raises(ValueError, match=r"500 is not a sample index in \[0, 120\)"):
        s.exclude_later([500], 1)
    with pytest.raises(ValueError, match="epoch 1 would have no global batch left"):
        s.exclude_later(range(120), 1)
    assert s._late == () and s.state_dict()["excluded_later"] == []  # nothing changed
    with pytest.raises(TypeError, match="epoch must be an int"):
        s.exclude_later([1], 1.0)
    with pytest.raises(ValueError, match=r"epoch must be < 2\*\*62"):  # an epoch set_epoch cannot reach
        s.exclude_later([1], 2**70)
    fresh = _sampler(0, prefetch=0)
    with pytest.raises(ValueError, match=r"from the start: FCPSampler\(exclude=...\)"):
        fresh.exclude_later([1], 0)  # the position's epoch, even before its first list
    with pytest.raises(ValueError, match="excluded_later"):
        fresh.load_state_dict(dict(fresh.state_dict(), excluded_later=[[1, [3]], [0, [4]]]))


@pytest.mark.parametrize("drop_last", [False, True])
def test_same_num_global_batches_refuses_exactly_what_would_change_an_epochs_length(drop_last):
    """``same_num_global_batches`` (FCPTrainer: the Hugging Face Trainer's steps per epoch are fixed) against the
    count itself: 120 samples in global batches of 16 are 8 batches (the last of 8 samples) without drop_last and 7
    with it (8 dropped). Without drop_last up to 7 exclusions keep 8 batches, the 8th would make it 7; with it up to
    8 keep 7 batches and the 9th would make it 6. A refusal changes nothing; the same call without the flag goes."""
    free = 8 if drop_last else 7
    s = _sampler(0, prefetch=0, drop_last=drop_last)
    next(iter(s))
    n = s.num_global_batches(1)
    assert n == (7 if drop_last else 8)
    assert s.exclude_later(range(free), 1, same_num_global_batches=True) == free
    assert s.num_global_batches(1) == s.num_global_batches(2) == n
    with pytest.raises(ValueError, match=f"epoch 1 would have {n - 1} global batches instead of {n}"):
        s.exclude_later([free], 1, same_num_global_batches=True)
    assert s.state_dict()["excluded_later"] == [[1, list(range(free))]]  # unchanged by the refusal
    assert s.exclude_later([free], 2) == 1 and s.num_global_batches(2) == n - 1
    with pytest.raises(TypeError, match="same_num_global_batches must be True or False"):
        s.exclude_later([free + 1], 3, same_num_global_batches="yes")


def test_records_are_resolved_by_their_keys_in_an_index(tmp_path, caplog):
    """A read-errors file names each sample by index and key. Given an index whose sample at a record's index has
    another key (the file was written against another numbering of the same samples: ``fcp train``'s
    ``--max-tokens`` view, a filtered dataset, a reordered index), the record's index would leave out another sample,
    silently: the key decides (one warning); a key the index does not hold is one error naming the line. Reference:
    the index's own keys."""
    from fcp_data import LengthIndex
    from fcp_data.index import build_index

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": "word " * (5 + 3 * i)}) + "\n" for i in range(12)))
    build_index([str(docs)], "text", tmp_path / "ix", progress=False)
    index = LengthIndex.load(tmp_path / "ix")
    keys = [index.keys[i] for i in range(len(index.keys))]
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps({"index": i, "key": keys[i], "reason": "X"}) + "\n" for i in (2, 5))
                    + json.dumps({"index": 7, "key": None}) + "\n3\n")
    cm = CM.replace(tokens_per_rank=4096)
    s = FCPSampler(index, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4, exclude=good)
    assert s.excluded.tolist() == [2, 3, 5, 7]
    moved = tmp_path / "moved.jsonl"  # sample 4's key recorded at index 9 (another numbering), sample 2's as it is
    moved.write_text(json.dumps({"index": 2, "key": keys[2]}) + "\n" + json.dumps({"index": 9, "key": keys[4]}) + "\n")
    with caplog.at_level("WARNING", logger="fcp_data"):
        t = FCPSampler(index, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4, exclude=moved)
    assert t.excluded.tolist() == [2, 4]
    assert "1 record(s) name samples whose key is at another index here" in caplog.text
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"index": 2, "key": keys[2]}) + "\n" + json.dumps({"index": 5, "key": "elsewhere"})
                     + "\n")
    with pytest.raises(ValueError, match=r"line 2: no sample of this data has key 'elsewhere' \(the record's index "
                                         r"is 5\): the file was written for another data set"):
        FCPSampler(index, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4, exclude=other)
    bad = tmp_path / "bad.jsonl"  # resolved by key, then a bad plain line: its file and line are still named
    bad.write_text(moved.read_text() + "# by hand\n500\n")
    with pytest.raises(ValueError, match=r"bad.jsonl, line 4: 500 is not a sample index in \[0, 12\)"):
        FCPSampler(index, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4, exclude=bad)
    # plain lengths name no sample: the same file is taken as indices (nothing to resolve against)
    u = FCPSampler(index.num_tokens, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4, exclude=moved)
    assert u.excluded.tolist() == [2, 9]


def test_fcp_train_resolves_records_in_its_max_tokens_view(tmp_path, caplog):
    """``fcp train`` numbers samples in the view ``--max-tokens`` keeps (an image/video sample longer than it is left
    out, so later samples move down): records it wrote under one ``--max-tokens`` name rows of another view, and
    records of the full index (``FCPDataset(errors_path=)``, the example scripts) name rows of none. Reference: the
    view's own keys — each record leaves out the sample of its key, wherever the view puts it."""
    from types import SimpleNamespace

    from fcp_data import IndexedDataset
    from fcp_data.index import build_index
    from fcp_exec.train_data import CappedDataset, view_exclusions

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": "word " * (5 + i)}) + "\n" for i in range(8)))
    build_index([str(docs)], "text", tmp_path / "ix", progress=False)
    base = IndexedDataset(tmp_path / "ix")
    keys = [base.sample_key(i) for i in range(8)]
    view = SimpleNamespace(dataset=CappedDataset(base, np.array([0, 1, 3, 4, 6, 7]), 10_000))  # rows 2 and 5 out
    rec = tmp_path / "rec.jsonl"  # rows 4 and 5 (full numbering) and view position 4 (row 6) of another run
    rec.write_text("".join(json.dumps({"index": i, "key": keys[r]}) + "\n" for i, r in ((4, 4), (5, 5), (4, 6))))
    with caplog.at_level("WARNING", logger="fcp_data"):
        assert view_exclusions(view, str(rec)) == [3, 4]  # row 4 is view 3, row 5 is out of the view, row 6 is view 4
    # one record moved (row 4), one outside the view (row 5: not "their keys were used" — nothing is left out for it)
    assert "1 record(s) name samples whose key is at another index here" in caplog.text
    assert "1 record(s) name samples this data leaves out already" in caplog.text
    caplog.clear()
    out = tmp_path / "out.jsonl"  # only a record outside the view: one warning, nothing left out
    out.write_text(json.dumps({"index": 5, "key": keys[5]}) + "\n")
    with caplog.at_level("WARNING", logger="fcp_data"):
        assert view_exclusions(view, str(out)) == []
    assert "another index" not in caplog.text and "1 record(s) name samples this data leaves out" in caplog.text
    plain = tmp_path / "plain.txt"
    plain.write_text("1\n")
    assert view_exclusions(view, str(plain)) == str(plain)  # nothing keyed: the file as it is
    assert view_exclusions(SimpleNamespace(dataset=base), str(rec)) == [4, 5, 6]  # the full index: its rows


def test_a_record_whose_key_names_several_samples_is_refused(tmp_path):
    """Keys are the data's own: two jsonl files that both number their lines from 0 give every key twice. A record
    whose index holds its key still names its sample; one written against another numbering whose key several
    samples hold cannot be told apart — before, the first sample with the key was left out (a healthy sample, the
    failing one trained again) under the generic warning; now one error naming the line. A record index past int64
    is a sample index out of range (was an OverflowError). Reference: the index's own keys."""
    from fcp_data import LengthIndex
    from fcp_data.index import build_index
    from fcp_exec.train_data import view_exclusions

    for part in ("a", "b"):
        (tmp_path / f"{part}.jsonl").write_text("".join(json.dumps({"id": str(i), "text": "word " * (5 + i)}) + "\n"
                                                        for i in range(4)))
    build_index([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")], "text", tmp_path / "ix", progress=False)
    index = LengthIndex.load(tmp_path / "ix")
    keys = [index.keys[i] for i in range(len(index.keys))]
    assert sorted(keys) == sorted([str(i) for i in range(4)] * 2)
    cm = CM.replace(tokens_per_rank=4096)
    at_own = tmp_path / "own.jsonl"  # the record's index holds its key: that sample, whatever other rows hold
    row = next(i for i in range(8) if i >= 4 and keys.count(keys[i]) == 2)
    at_own.write_text(json.dumps({"index": row, "key": keys[row]}) + "\n")
    assert FCPSampler(index, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4,
                      exclude=at_own).excluded.tolist() == [row]
    other = next(i for i in range(8) if keys[i] != keys[row])
    moved = tmp_path / "moved.jsonl"
    moved.write_text(json.dumps({"index": other, "key": keys[row]}) + "\n")
    with pytest.raises(ValueError, match=rf"moved.jsonl, line 1: key '{keys[row]}' names several samples of this "
                                         rf"data, and the record's index {other} holds another"):
        FCPSampler(index, num_ranks=2, rank=0, cost_model=cm, global_batch_size=4, exclude=moved)
    from fcp_data import IndexedDataset

    view = type("V", (), {"dataset": IndexedDataset(tmp_path / "ix")})()
    with pytest.raises(ValueError, match="names several samples"):
        view_exclusions(view, str(moved))
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"index": 2**63, "key": "zz"}) + "\n")
    with pytest.raises(ValueError, match="no sample of this data has key 'zz'"):
        view_exclusions(view, str(huge))
