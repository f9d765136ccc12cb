"""Exclude files and ``exclude=`` values: behaviours of ``fcp_data.sampler_inputs`` (``_read_exclusions``,
``resolve_exclusions``, ``_key_at``, ``load_exclusions``) that no other test pinned, found by mutation review.

Reference: the documented file format and rules (``_read_exclusions`` / ``resolve_exclusions`` /
``load_exclusions`` docstrings) and hand-computed expectations from the index's own keys: a JSON record is read
whole (a ``#`` inside it is no comment), a record's ``"key"`` is compared as text, a record index that is no sample
index (negative, a JSON ``true``, past int64) never matches a key by Python's or numpy's indexing rules — its key
decides — and sample indices lie in ``[0, num_samples)``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fcp_data.sampler_inputs import load_exclusions


def _index(tmp_path, n=12):
    """A LengthIndex of ``n`` text lines keyed ``"0"`` .. ``str(n - 1)`` and its keys in row order."""
    from fcp_data import LengthIndex
    from fcp_data.index import build_index

    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": str(i), "text": "word " * (5 + i)}) + "\n" for i in range(n)))
    build_index([str(docs)], "text", tmp_path / "ix", progress=False)
    index = LengthIndex.load(tmp_path / "ix")
    return index, [index.keys[i] for i in range(len(index.keys))]


def _excluded(index, path) -> list[int]:
    from fcp_data.sampler import FCPSampler
    from test_sampler_exclude import CM

    return FCPSampler(index, num_ranks=2, rank=0, cost_model=CM.replace(tokens_per_rank=4096), global_batch_size=4,
                      exclude=path).excluded.tolist()


def test_a_hash_inside_a_json_record_is_not_a_comment(tmp_path):
    """A read-errors record's text fields (``reason``, the error message, a key) may hold ``#``: a line starting
    with ``{`` is one JSON record, not cut at ``#`` as a plain-integer line's comment is (which would make it
    "neither an integer nor a JSON record"). Kills: splitting every line at ``#``."""
    path = tmp_path / "errors.jsonl"
    path.write_text(json.dumps({"index": 3, "key": "clip#3.mp4", "reason": "decode error # frame 7"}) + "\n"
                    "5  # a plain index with a comment\n")
    assert load_exclusions(str(path), 10).tolist() == [3, 5]


def test_a_records_key_is_compared_as_text(tmp_path):
    """A hand-written record may give the key as a JSON number (``"key": 4``); sample keys are strings, and the
    record's key is read as ``str(value)`` (the docstring's "the record's key"): ``{"index": 4, "key": 4}`` names
    sample 4 and ``{"index": 9, "key": 4}`` is moved to sample 4. Kills: keeping the key's JSON type (an int never
    equals the index's ``"4"``; the lookup then fails with "no sample of this data has key 4")."""
    index, keys = _index(tmp_path)
    assert keys[4] == "4" and keys[9] == "9"
    same = tmp_path / "same.jsonl"
    same.write_text(json.dumps({"index": 4, "key": 4}) + "\n")
    assert _excluded(index, same) == [4]
    moved = tmp_path / "moved.jsonl"
    moved.write_text(json.dumps({"index": 9, "key": 4}) + "\n")
    assert _excluded(index, moved) == [4]


def test_a_negative_record_index_is_resolved_by_its_key(tmp_path):
    """A record index of -1 is no sample index; Python's negative indexing would read it as the last sample, whose
    key the record names, so the record would "keep its index" and be refused as -1. The key decides: the last
    sample (hand-computed: row 11 of 12). Kills: dropping ``value < 0`` from ``_key_at``."""
    index, keys = _index(tmp_path)
    path = tmp_path / "neg.jsonl"
    path.write_text(json.dumps({"index": -1, "key": keys[11]}) + "\n")
    assert _excluded(index, path) == [11]


def test_a_boolean_record_index_is_resolved_by_its_key(tmp_path):
    """``{"index": true}`` is no sample index (``load_exclusions`` refuses a bool), yet ``keys[True]`` is sample 1's
    key: the record's key decides (sample 1) rather than the record keeping ``True`` and failing with "True is not
    a sample index". Kills: dropping the bool check of ``_key_at``."""
    index, keys = _index(tmp_path)
    path = tmp_path / "bool.jsonl"
    path.write_text(json.dumps({"index": True, "key": keys[1]}) + "\n")
    assert _excluded(index, path) == [1]


def test_a_record_index_past_int64_in_a_max_tokens_view_is_resolved_by_its_key(tmp_path):
    """In ``fcp train``'s ``--max-tokens`` view a sample's key is read through numpy (``keep[i]``), which raises
    OverflowError (not IndexError) for an index of 2**63: that record is no sample of the view, and its key decides
    (row 6 is view position 4 when rows 2 and 5 are out). Kills: catching only IndexError/KeyError in ``_key_at``
    (the OverflowError escaped)."""
    from types import SimpleNamespace

    from fcp_data import IndexedDataset
    from fcp_exec.train_data import CappedDataset, view_exclusions

    _index(tmp_path, 8)
    base = IndexedDataset(tmp_path / "ix")
    view = SimpleNamespace(dataset=CappedDataset(base, np.array([0, 1, 3, 4, 6, 7]), 10_000))
    path = tmp_path / "huge.jsonl"
    path.write_text(json.dumps({"index": 2**63, "key": base.sample_key(6)}) + "\n")
    assert view_exclusions(view, str(path)) == [4]


def test_sample_indices_stop_before_num_samples():
    """``[0, num_samples)``: the last sample can be excluded, ``num_samples`` itself is no sample (one ValueError
    naming it). Kills: ``<=`` for ``<`` in the range check."""
    assert load_exclusions([0, 11], 12).tolist() == [0, 11]
    with pytest.raises(ValueError, match=r"^exclude: 12 is not a sample index in \[0, 12\)$"):
        load_exclusions([12], 12)


def test_a_zero_dimensional_array_is_one_index():
    """A numpy array or torch tensor is read by ``tolist()``; a 0-d one (``np.array(3)``, ``torch.tensor(3)``)
    gives a bare int, which is one index, not "got int". Kills: dropping the wrap of that int into a list."""
    torch = pytest.importorskip("torch")
    assert load_exclusions(np.array(3), 10).tolist() == [3]
    assert load_exclusions(torch.tensor(7), 10).tolist() == [7]
    with pytest.raises(ValueError, match="exclude must be sample indices or a file of them, got int"):
        load_exclusions(3, 10)  # a plain int stays refused, as documented


def test_a_directory_is_named_as_one(tmp_path):
    """``exclude=`` a folder: the error says it is a directory, not a missing file (the user gave the wrong path
    kind, not a wrong name). Kills: one "no such file" message for both."""
    with pytest.raises(ValueError, match=r"exclude file .*: a directory, not a file$"):
        load_exclusions(tmp_path, 10)
    with pytest.raises(ValueError, match=r"exclude file .*missing\.jsonl: no such file$"):
        load_exclusions(tmp_path / "missing.jsonl", 10)
