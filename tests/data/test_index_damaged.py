"""A damaged or hand-edited length index (manifest.json fields of the wrong type, columns of the wrong dtype,
pointers or references out of range) is one ValueError at load that names what is wrong — found by a fuzz of
every manifest field and every column: before, such an index loaded and failed later as a TypeError/IndexError
deep inside the first read (or read a wrong sample)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from fcp_data._resources import data_path
from fcp_data.index import LengthIndex, build_index
from fcp_data.readers import IndexedDataset


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("ix") / "ix"
    _, rc = build_index([str(data_path("samples") / "text.jsonl")], "text", out, progress=False)
    assert rc == 0
    return out


def _copy(built, tmp_path):
    d = tmp_path / "ix"
    shutil.copytree(built, d)
    return d, json.loads((d / "manifest.json").read_text())


@pytest.mark.parametrize("field, value, says", [
    ("spec", None, "spec must be an object"), ("spec", {"fingerprint": "x"}, "spec must be an object"),
    ("sources", "x", "sources must be a list"), ("sources", [{"path": 3, "kind": "jsonl"}], "sources must be a list"),
    ("exts", None, "exts must be a list"), ("exts", [1], "exts must be a list"),
    ("text_field", [], "text_field must be str"), ("chat_field", {}, "chat_field must be str or null"),
    ("num_samples", "320", "num_samples must be an integer"), ("num_errors", -1, "num_errors must be an integer"),
    ("data", "../elsewhere", "data must be the name"), ("column_bytes", {"num_tokens": "1"}, "column_bytes must be"),
])
def test_manifest_field_of_the_wrong_type(built, tmp_path, field, value, says):
    d, m = _copy(built, tmp_path)
    m[field] = value
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=f"{says}.*damaged"):
        LengthIndex.load(d)
    with pytest.raises(ValueError, match=says):
        IndexedDataset(d)


@pytest.mark.parametrize("column, damage, says", [
    ("num_tokens", lambda a: a.astype(np.float32), "not int64"),
    ("shard", lambda a: a + 1, "shard.npy has values outside \\[0, 1\\)"),
    ("member_ext", lambda a: a + 5, "member_ext.npy has values outside"),
    ("num_tokens", lambda a: -a, "num_tokens.npy has values outside"),
    ("num_visual_tokens", lambda a: a - 1, "num_visual_tokens.npy has values outside"),
    ("key_ptr", lambda a: a[::-1].copy(), "key_ptr.npy is not a pointer array"),
    ("member_ptr", lambda a: a + 1, "member_ptr.npy is not a pointer array"),
    # a 0-token row loaded, then FCPSampler refused the whole dataset over it (a review of the data API)
    ("num_tokens", lambda a: np.where(np.arange(a.size) == 5, 0, a), "holds 0 tokens for sample 5"),
])
def test_damaged_column(built, tmp_path, column, damage, says):
    d, m = _copy(built, tmp_path)
    path = d / m["data"] / f"{column}.npy"
    np.save(path, damage(np.load(path)))
    m.pop("column_bytes")  # the size check would catch a dtype change first; the column check must hold alone
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=f"{says}.*damaged"):
        LengthIndex.load(d)


def test_an_intact_index_still_loads_and_reads(built):
    ix = LengthIndex.load(built)
    ds = IndexedDataset(built)
    assert len(ix) == len(ds) == 320 and int(ds[5]["input_ids"].numel()) == int(ix.num_tokens[5])


def test_a_row_of_0_tokens_is_an_empty_sample_error_at_build():
    """What the index builder would write for a text that tokenizes to nothing is an ``empty_sample`` error, not a
    row the loader refuses (the check beside every row the builder adds)."""
    from fcp_data.index.build import _Rows
    from fcp_data.index.probe import ProbeError

    rows = _Rows()
    with pytest.raises(ProbeError, match="0 tokens"):
        rows.add("k", [("txt", 0, 1)], num_tokens=0)
    rows.add("k", [("txt", 0, 1)], num_tokens=1)
    assert rows.keys == ["k"]
