"""A Parquet index reads its rows from its own copies (``OUT/records/``): a rebuild that does not replace the index
(rejected for its error rate, refused as having nothing to index, interrupted) must leave those copies as they were.

Reference: every sample (key and token ids) of the committed index read right after it was built, and, for a
rebuild that is committed, an index of the same new rows built into a fresh folder. A failure means a kept index
trains on another run's rows (or on rows the Parquet file no longer has) while its lengths are the old ones.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_index_sft import WORDS

from fcp_data import IndexedDataset
from fcp_data.index import build_index
from fcp_data.index.merge import NothingToIndex

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _rows(seed: int, n: int = 30) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"id": f"r{i}", "text": " ".join(rng.choice(WORDS, int(rng.integers(2, 40))))} for i in range(n)]


def _write(path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.string()), ("text", pa.string())])),
                   path, row_group_size=4)


def _read_all(out) -> list[tuple[str, list[int]]]:
    ds = IndexedDataset(out)
    return [(ds.index.keys[i], ds[i]["input_ids"].tolist()) for i in range(len(ds))]


def _build(src, out, **kw):
    return build_index([str(src)], "text", out, progress=False, **kw)


@pytest.fixture
def small_tasks(monkeypatch):
    import fcp_data.index.parquet as pqmod

    monkeypatch.setattr(pqmod, "TASK_ROWS", 8)  # 30 rows in row groups of 4: tasks of 8 rows, 4 copies per index


def test_a_kept_index_reads_its_own_rows_after_failed_rebuilds(tmp_path, small_tasks, monkeypatch):
    src, out = tmp_path / "a.parquet", tmp_path / "ix"
    _write(src, _rows(1))
    manifest, rc = _build(src, out)
    assert rc == 0 and manifest["num_samples"] == 30 and manifest["num_tasks"] == 4
    reference = _read_all(out)
    new_rows = _rows(2)
    _write(src, new_rows)  # the file changes: the index holds the snapshot it counted

    manifest, rc = _build(src, out, text_field="nope")  # every sample an error: rejected, the index kept
    assert rc == 1 and manifest.get("kept_previous") and manifest["num_errors"] == 30
    assert _read_all(out) == reference
    assert not (out / "records.run").exists()

    _write(src, [])  # no rows at all: the run is refused
    with pytest.raises(NothingToIndex):
        _build(src, out)
    assert _read_all(out) == reference
    assert not (out / "records.run").exists()

    _write(src, new_rows)
    import fcp_data.index.engines as engines

    real = engines.run_local

    def interrupted(todo, cfg, workers, on_done):  # two of the four tasks finish, then Ctrl-C
        real(todo[:2], cfg, workers, on_done)
        raise KeyboardInterrupt

    monkeypatch.setattr(engines, "run_local", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _build(src, out)
    assert _read_all(out) == reference
    monkeypatch.setattr(engines, "run_local", real)

    _write(tmp_path / "b.parquet", new_rows)
    _build(tmp_path / "b.parquet", tmp_path / "fresh")
    expected = _read_all(tmp_path / "fresh")
    assert expected != reference
    done = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.npz")}
    manifest, rc = _build(src, out, resume=True)  # the interrupted run goes on: its two finished tasks are reused
    assert rc == 0 and not manifest.get("kept_previous")
    assert {n: (out / "parts" / n).stat().st_mtime_ns for n in done} == done
    assert _read_all(out) == expected
    assert not (out / "records.run").exists() and not (out / "records.old").exists()


def test_committed_rebuilds_read_the_new_rows(tmp_path, small_tasks):
    """A successful rebuild reads its new rows, from its copies (the Parquet file gone), after a --resume of the
    finished index too."""
    src, out = tmp_path / "a.parquet", tmp_path / "ix"
    _write(src, _rows(1))
    _build(src, out)
    _write(src, _rows(3, n=21))
    _write(tmp_path / "b.parquet", _rows(3, n=21))
    _build(tmp_path / "b.parquet", tmp_path / "fresh")
    expected = _read_all(tmp_path / "fresh")
    manifest, rc = _build(src, out)
    assert rc == 0 and manifest["num_samples"] == 21
    assert _read_all(out) == expected
    parts = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.npz")}
    manifest, rc = _build(src, out, resume=True)  # every task reused, with the committed copies
    assert rc == 0 and _read_all(out) == expected
    assert {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.npz")} == parts
    src.rename(tmp_path / "gone.parquet")  # the copies alone: the Parquet file is not read again
    assert _read_all(out) == expected


def _build_then_exit(src, out, point):
    import os

    from fcp_data.index.store import KILL_AT_ENV

    os.environ[KILL_AT_ENV] = point
    _build(src, out)
    os._exit(0)  # the point was never reached


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["renamed", "records", "committed", "cleanup"])
def test_a_rebuild_killed_while_committing_leaves_the_rows_of_its_manifest(tmp_path, point):
    """Killed before its manifest is written (``records``: the copies already swapped in), the next build puts the
    old index's copies back; killed after it, the new ones stay. A rejected rebuild then keeps that index, reading
    exactly its rows."""
    import multiprocessing as mp

    src, out = tmp_path / "a.parquet", tmp_path / "ix"
    _write(src, _rows(1))
    _build(src, out)
    reference = _read_all(out)
    _write(src, _rows(2, n=17))
    _write(tmp_path / "b.parquet", _rows(2, n=17))
    _build(tmp_path / "b.parquet", tmp_path / "fresh")
    proc = mp.get_context("fork").Process(target=_build_then_exit, args=(src, out, point))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 137, proc.exitcode
    committed = point in ("committed", "cleanup")
    _write(src, _rows(5, n=9))  # what the next run copies: read by neither index
    manifest, rc = _build(src, out, text_field="nope")
    assert rc == 1 and manifest.get("kept_previous")
    assert _read_all(out) == (_read_all(tmp_path / "fresh") if committed else reference)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("records")) == ["records"]
