"""`fcp plan / compare / simulate --index DIR`: a length index as the workload (issue 14).

References: the same commands on ``--lengths FILE --visual FILE`` written from the index's own columns, and
``plan_batch`` called with the index's η. A failure means ``--index`` plans something other than the data it
names (lengths, visual tokens, η, the overlong cap), or a wrong workload option gives a traceback or a code
other than 2.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fcp_data._resources import data_path
from fcp_cli.main import main
from fcp_data.cost import CostModel
from fcp_data.index import LengthIndex, build_index

SAMPLES = data_path("samples")
SHARDS = str(SAMPLES / "wds" / "shard-{000000..000003}.tar")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A qwen2-vl index of the bundled video shards, the same data as lengths/visual files, a v2 cost model."""
    d = tmp_path_factory.mktemp("index_input")
    manifest, rc = build_index([SHARDS], "qwen2-vl", d / "vid", workers=1, progress=False)
    assert rc == 0
    ix = LengthIndex.load(d / "vid")
    s, v = np.asarray(ix.num_tokens), np.asarray(ix.num_visual_tokens)
    assert v.any() and not np.asarray(ix.eta).any()  # causal spec with visual tokens
    (d / "lengths.txt").write_text("\n".join(map(str, s)) + "\n")
    (d / "visual.txt").write_text("\n".join(map(str, v)) + "\n")
    # tokens_per_rank 512: the longest clip (> 2048 tokens) is overlong on 4 ranks; alpha_vis makes v count
    CostModel(alpha1=5e-8, alpha2=7e-5, alpha3=3.6e5, beta1=0.01, beta2=0.008, bandwidth_intra=2.9e9,
              bandwidth_inter=2.9e9, ranks_per_node=8, tokens_per_rank=512, gamma=1e-3, alpha_blk=1e-6,
              alpha_vis=2e-5).save(d / "cost.json")
    return {"dir": d, "index": str(d / "vid"), "lengths": s, "visual": v,
            "as_files": ["--lengths", str(d / "lengths.txt"), "--visual", str(d / "visual.txt")],
            "cost": ["--cost", str(d / "cost.json")]}


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _json(capsys, argv):
    rc, out, err = _run(capsys, argv)
    assert rc == 0, err
    return json.loads(out)


def _strip_ms(d):
    """Plan JSON without the wall-clock solve time (the only field two identical plans may differ in)."""
    if isinstance(d, dict):
        return {k: _strip_ms(v) for k, v in d.items() if k != "solve_ms"}
    if isinstance(d, list):
        return [_strip_ms(v) for v in d]
    return d


@pytest.mark.parametrize("ranks,overlong,mb", [("8", "error", "auto"), ("4", "truncate", "auto"), ("4", "drop", "auto")])
def test_plan_index_equals_lengths_and_visual(capsys, work, ranks, overlong, mb):
    common = ["--ranks", ranks, *work["cost"], "--on-overlong", overlong, "--micro-batches", mb, "--json"]
    by_index = _json(capsys, ["plan", "--index", work["index"], *common])
    by_files = _json(capsys, ["plan", *work["as_files"], *common])
    assert _strip_ms(by_index) == _strip_ms(by_files)
    # and visual tokens are really used: without --visual the plan's times differ
    text_only = _json(capsys, ["plan", "--lengths", work["as_files"][1], *common])
    assert text_only["makespan"] < by_index["makespan"]
    dropped = [int(max(range(len(work["lengths"])), key=lambda i: work["lengths"][i]))] if overlong == "drop" else []
    ids = sorted(i for mb_ in by_index["micro_batches"] for g in mb_["groups"] for i in g["seq_ids"])
    assert ids == [i for i in range(len(work["lengths"])) if i not in dropped]  # the input's indices (DESIGN §6)


def test_compare_index_equals_lengths_and_visual(capsys, work):
    common = ["--ranks", "4", *work["cost"], "--on-overlong", "truncate", "--micro-batches", "auto",
              "--baselines", "static-cp,megatron-dynamic", "--json"]
    by_index = _json(capsys, ["compare", "--index", work["index"], *common])
    by_files = _json(capsys, ["compare", *work["as_files"], *common])
    assert set(by_index) == {"fcp", "fcp-dp", "static-cp", "megatron-dynamic"}
    assert _strip_ms(by_index) == _strip_ms(by_files)


def test_simulate_index_equals_lengths_and_visual(capsys, work):
    common = ["--ranks", "8", *work["cost"], "--global-batch-size", "16", "--steps", "2", "--cap", "1024",
              "--baselines", "static-cp", "--no-progress", "--json"]
    by_index = _json(capsys, ["simulate", "--index", work["index"], *common])
    by_files = _json(capsys, ["simulate", *work["as_files"], *common])
    assert by_index == by_files and set(by_index) == {"fcp", "static-cp"}
    drop = _json(capsys, ["simulate", "--index", work["index"], *common, "--on-overlong", "drop"])
    drop_files = _json(capsys, ["simulate", *work["as_files"], *common, "--on-overlong", "drop"])
    assert drop == drop_files


def test_simulate_index_table_and_plot(capsys, work):
    pytest.importorskip("matplotlib")
    png = work["dir"] / "sim.png"
    rc, out, err = _run(capsys, ["simulate", "--index", work["index"], "--ranks", "8", *work["cost"],
                                 "--global-batch-size", "16", "--steps", "2", "--plot", str(png), "--no-progress"])
    assert rc == 0, err
    n = len(work["lengths"])
    assert f"{n} samples (spec qwen2-vl), {int(np.count_nonzero(work['visual']))} with visual tokens" in out
    assert "fcp" in out and "static-cp" in out and "plot written to" in out
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_index_eta_is_used(capsys, tmp_path):
    """A full-attention spec (η = 1): --index plans with η from the index, as plan_batch(etas=1) does."""
    from fcp_data.plan import plan_batch

    build_index([str(SAMPLES / "text.jsonl")], "text-bidirectional", tmp_path / "tb", progress=False)
    ix = LengthIndex.load(tmp_path / "tb")
    s = np.asarray(ix.num_tokens)
    assert np.asarray(ix.eta).all()
    cost = CostModel.preset("Qwen3-8B", "h100").replace(tokens_per_rank=4096)
    cost.save(tmp_path / "cost.json")
    common = ["--ranks", "4", "--cost", str(tmp_path / "cost.json"), "--micro-batches", "auto", "--json"]
    got = _json(capsys, ["plan", "--index", str(tmp_path / "tb"), *common])
    want = plan_batch(s, num_ranks=4, cost_model=cost, etas=np.ones(s.size), micro_batches="auto").to_dict()
    assert _strip_ms(got) == _strip_ms(want)
    (tmp_path / "l.txt").write_text("\n".join(map(str, s)) + "\n")
    causal = _json(capsys, ["plan", "--lengths", str(tmp_path / "l.txt"), *common])
    assert got["makespan"] > causal["makespan"]


@pytest.mark.parametrize("cmd", ["plan", "compare", "simulate"])
@pytest.mark.parametrize("case,expect", [
    ("neither", "--lengths FILE (token counts) or --index DIR"),
    ("both", "either --lengths FILE or --index DIR, not both"),
    ("visual", "--visual applies to --lengths only"),
    ("column", "--column applies to --lengths only"),
    ("missing", "no such folder"),
    ("file", "is a file, not a length index folder"),
    ("empty-dir", "is not a length index (no manifest.json)"),
    ("bad-manifest", "is not valid JSON"),
])
def test_workload_errors_one_line_exit_2(capsys, work, tmp_path, cmd, case, expect):
    idx = work["index"]
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    src = {"neither": [], "both": ["--index", idx, "--lengths", work["as_files"][1]],
           "visual": ["--index", idx, "--visual", work["as_files"][3]],
           "column": ["--index", idx, "--column", "0"],
           "missing": ["--index", str(tmp_path / "nope")],
           "file": ["--index", work["as_files"][1]],
           "empty-dir": ["--index", str(tmp_path / "empty")],
           "bad-manifest": ["--index", str(tmp_path / "bad")]}[case]
    extra = ["--global-batch-size", "4", "--steps", "1", "--no-progress"] if cmd == "simulate" else []
    rc, out, err = _run(capsys, [cmd, *src, "--ranks", "8", *work["cost"], *extra])
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert expect in err, err


def test_visual_column_rejected_with_index(capsys, work):
    rc, _, err = _run(capsys, ["plan", "--index", work["index"], "--visual-column", "1", "--ranks", "8", *work["cost"]])
    assert rc == 2 and "--visual-column applies to --lengths only" in err


def test_help_mentions_index(capsys):
    for cmd in ("plan", "compare", "simulate"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and "--index DIR" in out and "fcp index" in out
