"""Workload loading, overlong handling and batch drawing (fcp_data.workloads).

A failure means `fcp plan/compare/simulate` would read the wrong lengths or silently change them.
"""

from __future__ import annotations

import numpy as np
import pytest

from fcp_data.workloads import apply_cap, draw_batches, load_lengths


def test_load_txt_npy_csv(tmp_path):
    (tmp_path / "a.txt").write_text("# lengths\n10\n\n20  \n30 # trailing comment\n")
    np.save(tmp_path / "a.npy", np.array([10, 20, 30], dtype=np.int32))
    (tmp_path / "a.csv").write_text("id,tokens\n0,10\n1,20\n2,30\n")
    (tmp_path / "b.csv").write_text("10\n20\n30\n")
    expect = np.array([10, 20, 30])
    for got in (load_lengths(tmp_path / "a.txt"), load_lengths(tmp_path / "a.npy"),
                load_lengths(tmp_path / "a.csv", "tokens"), load_lengths(tmp_path / "a.csv", 1),
                load_lengths(tmp_path / "b.csv")):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("content,match", [
    ("", "empty"),
    ("10\nabc\n", r"a.txt:2: 'abc' is not a number"),
    ("10\n0\n", r"a.txt:2: lengths must be > 0, got 0"),
    ("# header\n\n10\n-5\n", r"a.txt:4: lengths must be > 0, got -5"),  # the file's line (was "entry 1")
    ("10\n2.5\n", "not a whole token count"),
])
def test_load_errors(tmp_path, content, match):
    p = tmp_path / "a.txt"
    p.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_lengths(p)


def test_csv_errors_name_the_files_line(tmp_path):
    """Blank rows counted: the error named line 3 for the fifth line of this file (a review of the CLI)."""
    p = tmp_path / "a.csv"
    p.write_text("a\n1000\n\n\n2000x\n")
    with pytest.raises(ValueError, match=r"a.csv:5: '2000x' is not a number"):
        load_lengths(p)
    p.write_text("a\n1000\n\n\n0\n")
    with pytest.raises(ValueError, match=r"a.csv:5: lengths must be > 0, got 0"):
        load_lengths(p)
    np.save(tmp_path / "z.npy", np.array([5, 0]))
    with pytest.raises(ValueError, match=r"z.npy: entry 1: lengths must be > 0, got 0"):  # no lines in a .npy
        load_lengths(tmp_path / "z.npy")


def test_load_csv_errors(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("id,tokens\n0,10\n")
    with pytest.raises(ValueError, match="choose one with --column"):
        load_lengths(p)
    with pytest.raises(ValueError, match="no column named 'len'"):
        load_lengths(p, "len")
    with pytest.raises(FileNotFoundError):
        load_lengths(tmp_path / "missing.txt")


def test_apply_cap_modes():
    L = np.array([5, 50, 7, 60])
    with pytest.raises(ValueError, match=r"sequence 1 has 50 tokens.*--on-overlong truncate"):
        apply_cap(L, 10, "error")
    t, rep = apply_cap(L, 10, "truncate")
    np.testing.assert_array_equal(t, [5, 10, 7, 10])
    assert rep.num_overlong == 2 and rep.overlong == (1, 3)
    d, rep = apply_cap(L, 10, "drop")
    np.testing.assert_array_equal(d, [5, 7])
    np.testing.assert_array_equal(rep.kept, [0, 2])
    same, rep = apply_cap(L, 100, "error")
    np.testing.assert_array_equal(same, L)
    assert rep.num_overlong == 0
    with pytest.raises(ValueError, match="nothing left"):
        apply_cap(L, 1, "drop")


def test_draw_batches_seeded():
    a = draw_batches(1000, 64, 3, seed=5)
    b = draw_batches(1000, 64, 3, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(len(np.unique(x)) == 64 for x in a)
    assert not np.array_equal(a[0], draw_batches(1000, 64, 1, seed=6)[0])
    with pytest.raises(ValueError, match="exceeds"):
        draw_batches(10, 64, 1, seed=0)
