"""``fcp_data.bundled_index``: the bundled samples' index, built once per cache folder by whichever rank gets there
first, every rank (real processes, started together) handed the same complete index."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fcp_data import LengthIndex, bundled_index, bundled_path
from fcp_data.index import build_index

_CHILD = "import sys; from fcp_data import bundled_index; print(bundled_index(sys.argv[1], sys.argv[2]))"


@pytest.mark.parametrize("spec", ["text", "qwen2.5-vl"])
def test_racing_processes_get_one_complete_index_equal_to_fcp_index(tmp_path, spec):
    cache = tmp_path / "cache"
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, spec, str(cache)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1
    got = Path(paths.pop())
    assert got.parent == cache and got.name.startswith(f"index-{spec}-")
    assert [p.name for p in cache.iterdir()] == [got.name]  # the losers' private copies are gone
    samples = bundled_path("samples")
    inputs = [samples / "text.jsonl"] if spec == "text" else sorted((samples / "wds").glob("*.tar"))
    ref_dir = tmp_path / "ref"
    build_index([str(p) for p in inputs], spec, ref_dir, progress=False)
    got_idx, ref = LengthIndex.load(got), LengthIndex.load(ref_dir)
    assert len(got_idx) == len(ref) > 0
    np.testing.assert_array_equal(got_idx.num_visual_tokens, ref.num_visual_tokens)
    np.testing.assert_array_equal(got_idx.num_tokens, ref.num_tokens)
    assert bundled_index(spec, cache) == got  # reused, not rebuilt


def test_spec_and_cache_env_choose_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FCP_CACHE", str(tmp_path / "env"))
    text, video = bundled_index("text"), bundled_index("qwen2-vl")
    assert text.parent == video.parent == tmp_path / "env" and text != video
    assert bundled_index("text", tmp_path / "arg").parent == tmp_path / "arg"


def test_a_foreign_folder_in_the_index_place_is_one_clear_error(tmp_path):
    out = bundled_index("text", tmp_path)
    (out / "manifest.json").unlink()
    with pytest.raises(RuntimeError, match="holds no fcp index"):
        bundled_index("text", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]


def test_a_removed_copy_of_the_samples_does_not_break_another_copys_index(tmp_path, monkeypatch):
    """Two copies of fcp (two clones or venvs) share the default cache, and the index records where its samples are:
    the index built from a copy that is later removed is not the one another copy gets (before: both got one folder,
    named by the samples' names and sizes only, and after ``rm -rf`` of the first clone every read of the second
    failed — "8 samples in a row failed to read" in ``make demo``)."""
    import shutil

    import fcp_data._resources as resources

    cache, real = tmp_path / "cache", resources.data_path("samples")
    copy = tmp_path / "other-clone" / "samples"
    shutil.copytree(real, copy)
    monkeypatch.setattr(resources, "data_path", lambda name: copy if name == "samples" else real)
    theirs = bundled_index("text", cache)
    shutil.rmtree(copy.parent)
    monkeypatch.undo()
    ours = bundled_index("text", cache)
    assert ours != theirs
    from fcp_data import IndexedDataset

    data = IndexedDataset(ours)
    assert len(data) > 0 and len(data[0]["input_ids"]) == int(LengthIndex.load(ours).num_tokens[0])  # reads here
