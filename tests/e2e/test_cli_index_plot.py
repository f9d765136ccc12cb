"""`fcp index --plot OUT.png`: the length chart of the index just built (fcp_data.commands.plots.plot_lengths).

Reference: the index's own ``num_tokens``/``kind`` columns counted by a plain loop (bisect into the chart's bin
edges) and the longest 1 % of the samples summed by hand. A failure means the chart shows other counts than the
index holds (a sample lost below the first bin or past the last, a kind missing), the printed tail share is not
the data's, or a bad --plot path is found only after the whole dataset was indexed.
"""

from __future__ import annotations

import bisect
import math
import re

import numpy as np
import pytest

from fcp_cli.main import main
from fcp_data._resources import data_path
from fcp_data.commands.plots import KIND_NAMES, length_stats
from fcp_data.index import LengthIndex

pytest.importorskip("matplotlib")


def _loop_counts(n, k, edges) -> dict:
    counts: dict[str, list[int]] = {}
    for length, kind in zip(n.tolist(), k.tolist()):
        row = counts.setdefault(KIND_NAMES[kind], [0] * (len(edges) - 1))
        row[min(max(bisect.bisect_right(edges, max(length, edges[0])) - 1, 0), len(edges) - 2)] += 1
    return counts


def test_index_plot_shows_what_the_index_holds(tmp_path, capsys):
    from matplotlib.image import imread

    out, png = tmp_path / "ix", tmp_path / "lengths.png"
    rc = main(["index", str(data_path("samples") / "text.jsonl"), "--spec", "text", "--out", str(out), "--plot",
               str(png), "--no-progress"])
    stdout = capsys.readouterr().out
    assert rc == 0 and imread(str(png)).shape[:2] == (600, 1560)
    ix = LengthIndex.load(out)
    n, k = np.asarray(ix.num_tokens), np.asarray(ix.kind)
    top = sorted(n.tolist(), reverse=True)[:math.ceil(len(n) / 100)]
    share = float(re.search(r"the longest 1% of the samples hold ([\d.]+)% of the tokens", stdout).group(1))
    assert share == pytest.approx(100 * sum(top) / n.sum(), abs=0.05)
    st = length_stats(n, k)
    assert {name: c.tolist() for name, c in st["counts"].items()} == _loop_counts(n, k, st["edges"].tolist())
    assert f"p50 {st['p50']}  p90 {st['p90']}  p99 {st['p99']}" in stdout  # the chart marks the printed ones


@pytest.mark.parametrize("n, k", [
    ([0, 0, 5, 7], [0, 0, 0, 0]),                    # 0-token samples: in the first bin, not dropped
    ([64] * 9, [2] * 9),                             # every sample the same length: one bin
    ([1], [1]),                                      # one sample
    ([3, 10**9, 40, 2**40, 17, 5], [0, 2, 1, 2, 0, 1]),  # three kinds over twelve decades
])
def test_every_sample_is_counted_once(n, k):
    n, k = np.array(n), np.array(k)
    st = length_stats(n, k)
    assert sum(int(c.sum()) for c in st["counts"].values()) == len(n)
    assert {name: c.tolist() for name, c in st["counts"].items()} == _loop_counts(n, k, st["edges"].tolist())
    assert st["mass"][-1] == pytest.approx(1.0) or n.sum() == 0
    assert 0 < st["top1_share"] <= 1 or n.sum() == 0


def test_a_bad_plot_path_fails_before_indexing(tmp_path, capsys):
    out = tmp_path / "ix"
    rc = main(["index", str(data_path("samples") / "text.jsonl"), "--spec", "text", "--out", str(out), "--plot",
               str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "is a directory" in err and not out.exists()
