"""The pieces around the e2e runs: training datasets, the built-in cost model, planner parsing, the
process launcher (errors reach the caller), the bundled-sample path of `fcp train`, and a short real
`fcp profile` whose output loads as a CostModel and plans."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from _procs import running

from fcp_data.cost import CostModel
from fcp_exec.launch import WorkerFailure, WorkerPool, _without_rank, launch
from fcp_exec.train import builtin_cost_model, format_degrees, parse_planner
from fcp_exec.train_data import SyntheticText, SyntheticVideo, load_train_data


def test_synthetic_data_is_deterministic_and_consistent():
    """Same seed → same samples in any process; lengths (what the sampler plans with) equal the samples'
    real lengths; placeholders equal grid_thw's token count (what the collator checks)."""
    a, b = SyntheticVideo(12, seed=3), SyntheticVideo(12, seed=3)
    for i in range(len(a)):
        sa, sb = a[i], b[i]
        assert torch.equal(sa["input_ids"], sb["input_ids"])
        assert sa["input_ids"].numel() == a.lengths[i]
        if "grid_thw" in sa:
            assert torch.equal(sa["pixel_values"], sb["pixel_values"])
            assert int((sa["input_ids"] == 5).sum()) == int(sa["grid_thw"].prod()) // 4
    assert any("grid_thw" not in a[i] for i in range(len(a))), "need text-only samples (ranks without visual tokens)"
    t = SyntheticText(lengths=[5, 9, 2])
    assert [t[i]["input_ids"].numel() for i in range(3)] == [5, 9, 2]


def test_capping_truncates_text_and_drops_long_multimodal():
    """max_tokens: text truncated (length == cap), multimodal samples over the cap left out and counted."""
    d = load_train_data("tiny-llm", "synthetic", max_tokens=40, seed=0)
    assert d.lengths.max() == 40 and all(d.dataset[i]["input_ids"].numel() == d.lengths[i] for i in range(len(d.lengths)))
    from fcp_exec.train_data import _cap

    base = SyntheticVideo(16, max_len=160)
    visual = np.array([s[0] > 0 for s in base.samples])
    ds, lengths, dropped = _cap(base, base.lengths, visual, 50)
    assert dropped == int((visual & (base.lengths > 50)).sum()) >= 1
    assert len(ds) == lengths.size == 16 - dropped and all(ds[i]["input_ids"].numel() == lengths[i] for i in range(len(ds)))


def test_bundled_text_index_loads(tmp_path):
    """Default data of tiny-llm: the bundled text indexed with the real `fcp index` code path, then read
    back with the readers; lengths agree with the samples."""
    d = load_train_data("tiny-llm", None, max_tokens=512, cache_dir=str(tmp_path))
    assert len(d.lengths) == 320 and d.lengths.max() == 512 and d.visual_token_ids == ()
    for i in (0, 5, 100):
        assert d.dataset[i]["input_ids"].numel() == d.lengths[i]
    with pytest.raises(ValueError, match="tiny-mllm"):
        load_train_data("tiny-mllm", str(next(tmp_path.glob("index-text-*"))))


def test_builtin_cost_model_makes_mixed_plans():
    """On the synthetic set, the built-in model's plans on 3 ranks hold degree-1 and degree>1 groups."""
    from fcp_data.plan import plan_batch

    data = load_train_data("tiny-llm", "synthetic", max_tokens=160)
    cm = builtin_cost_model(160, 3)
    assert cm.tokens_per_rank == 80 and builtin_cost_model(160, 1).tokens_per_rank == 160
    plan = plan_batch(data.lengths, num_ranks=3, cost_model=cm, micro_batches="auto")
    degs = [g.degree for mb in plan.micro_batches for g in mb.groups]
    assert max(degs) > 1 and min(degs) == 1


def test_parse_planner_and_format():
    assert parse_planner("fcp") == ("fcp", None) and parse_planner("static-cp:2") == ("static-cp", 2)
    for bad in ("nope", "fcp:2", "static-cp:x", "static-cp:0"):
        with pytest.raises(ValueError):
            parse_planner(bad)
    assert format_degrees([[2, 1, 1], [1, 1, 1, 1]]) == "⟨2⟩×1 ⟨1⟩×2 | ⟨1⟩×4"


def _fails_on_rank_1(x):
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ArithmeticError(f"boom {x}")
    return dist.get_rank() * x


def _ok(x):
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return float(t[0]) * x


def _hangs_on_rank_0():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        time.sleep(600)
    return 0


def test_launcher_results_and_errors():
    """launch() returns per-rank values of a collective; a worker exception reaches the caller as WorkerFailure
    with its type and traceback; a hanging rank is a TimeoutError after ``timeout``, never a hang; after either
    failure no worker process is left behind."""
    assert launch(_ok, 2, 10.0, timeout=120) == [30.0, 30.0]
    with pytest.raises(WorkerFailure, match="boom 7") as info:
        launch(_fails_on_rank_1, 2, 7, timeout=120)
    assert sorted(info.value.errors) == [1] and info.value.errors[1][0] == "ArithmeticError"
    assert "_fails_on_rank_1" in info.value.errors[1][2]
    assert multiprocessing.active_children() == []
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0(, 1)?\] did not finish within"):  # [0, 1]: a slow start-up
        launch(_hangs_on_rank_0, 2, timeout=3)
    assert time.monotonic() - start < 15
    assert multiprocessing.active_children() == []


_HELD: list = []  # what a failed rank still holds when the pool kills it (a trainer whose loader has workers)


def _loader_workers_then_fail(folder: str, fcp_context: bool):
    """Start a persistent 2-worker DataLoader, write its worker pids, raise (the pool is then killed).
    ``fcp_context``: the context fcp's own loaders use in a launched rank (:func:`fcp_exec.launch.dataloader_context`:
    "fork", or a forkserver where this Python's fork can deadlock a worker)."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from fcp_data.workers import fork_may_deadlock
    from fcp_exec.launch import dataloader_context

    ctx = dataloader_context(2) if fcp_context else None
    if fcp_context:
        assert ctx.get_start_method() == ("forkserver" if fork_may_deadlock() else "fork"), ctx
    assert dataloader_context(0) is None
    it = iter(DataLoader(list(range(16)), batch_size=2, num_workers=2, persistent_workers=True,
                         multiprocessing_context=ctx))
    next(it)
    _HELD.append(it)
    with open(f"{folder}/rank-{dist.get_rank()}.txt", "w") as f:
        f.write(" ".join(str(w.pid) for w in it._workers))
    raise RuntimeError("failed with DataLoader workers running")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("fcp_context", [False, True])
def test_a_failed_launch_leaves_no_dataloader_worker_behind(tmp_path, fcp_context):
    """Found in this suite: a rank that failed while its DataLoader had workers was killed with them running; its
    workers (forked by the rank's own forkserver, which they keep alive) waited forever, 300 MB each, and every
    later launch added more. Each rank now leads a process group that the launcher kills whole — with the default
    context and with the context fcp's own loaders use in a launched rank (outside one, worker_context's)."""
    from fcp_data.workers import fork_may_deadlock, worker_context
    from fcp_exec.launch import dataloader_context

    if not fork_may_deadlock():  # else it is worker_context's forkserver (and would start one in this process)
        assert dataloader_context(2) is worker_context(2)  # this process is no launched rank
    with pytest.raises(WorkerFailure, match="failed with DataLoader workers running"):
        launch(_loader_workers_then_fail, 2, str(tmp_path), fcp_context, timeout=120)
    pids = [int(x) for r in (0, 1) for x in (tmp_path / f"rank-{r}.txt").read_text().split()]
    assert len(pids) == 4
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if running(p)], "DataLoader workers outlived their killed rank"


def _returns_a_lambda():
    return lambda: 0


def test_launcher_refuses_what_cannot_cross_processes():
    """Found by fuzzing: a lambda as ``fn`` was dropped by the task queue's feeder thread (it only printed the
    pickling error), so ``launch`` waited its whole timeout (30 min by default); an unpicklable return value did the
    same on the way back; ``nproc=10**9`` started processes until "Too many open files". Now: a TypeError before any
    process starts, a WorkerFailure naming the result, a ValueError. Each within seconds, nothing left running;
    the pool still runs the next task (reference: the collective's value)."""
    start = time.monotonic()
    with pytest.raises(TypeError, match="cannot be pickled to cross processes .*module-level function"):
        launch(lambda: 0, 2, timeout=120)
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="nproc=1000000000 is more processes than this machine can run"):
        launch(_ok, 10**9, 1.0)
    with pytest.raises(WorkerFailure, match="the value _returns_a_lambda returned cannot be pickled"):
        launch(_returns_a_lambda, 2, timeout=120)
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == []
    with WorkerPool(2, pg_timeout=60) as pool:
        with pytest.raises(TypeError, match="cannot be pickled"):
            pool.run(lambda rank: rank, timeout=60)
        assert pool.run(_without_rank, _ok, 2.0, timeout=60) == [6.0, 6.0]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_pool_workers_leave_when_their_parent_is_killed():
    """A process holding a WorkerPool is SIGKILLed (no cleanup runs): its idle workers notice the parent is gone
    and exit within seconds instead of waiting for a task forever."""
    code = ("import multiprocessing, os, signal; from fcp_exec.launch import WorkerPool; "
            "WorkerPool(2, backend='gloo').start(); print(*[c.pid for c in multiprocessing.active_children()], "
            "flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    pids = [int(x) for x in r.stdout.split()]
    assert r.returncode == -9 and len(pids) == 2, r.stderr[-2000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(running(p) for p in pids):
        time.sleep(0.5)
    assert not any(running(p) for p in pids)


def test_short_real_profile_gives_loadable_cost_model(tmp_path):
    """`fcp profile` on 2 processes (tiny grid): measured vs predicted table, a JSON that CostModel.load and
    `fcp plan --cost` accept, and a plot. Measured times are noisy; the fit must still be well-formed."""
    out, png = tmp_path / "cost.json", tmp_path / "fit.png"
    cmd = [sys.executable, "-m", "fcp_cli", "profile", "--nproc", "2", "--seq-lens", "64,128,256",
           "--reps", "1", "--out", str(out), "--plot", str(png), "--tokens-per-rank", "256", "--packed-docs", "4",
           "--packed-lens", "32"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mean error" in r.stdout and "P2P bandwidth" in r.stdout and "packed points" in r.stdout
    assert r.stdout.count(" 4 x seq_len ") == 2  # the packed cell at degrees 1 and 2
    cm = CostModel.load(out)
    assert cm.tokens_per_rank == 256 and cm.ranks_per_node == 2 and cm.bandwidth_intra > 0
    assert png.stat().st_size > 1000
    from fcp_data import FCPSampler

    sampler = FCPSampler(np.array([300, 20, 40, 120]), num_ranks=2, rank=0, cost_model=cm, global_batch_size=4)
    assert sum(len(slots) for slots in sampler) >= 1  # the fitted model drives real plans
    lengths = tmp_path / "l.txt"
    lengths.write_text("300\n20\n40\n")
    p = subprocess.run([sys.executable, "-m", "fcp_cli", "plan", "--lengths", str(lengths), "--ranks", "2",
                        "--cost", str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert sorted(json.loads(p.stdout)["micro_batches"][0]["groups"][0]["seq_ids"] +
                  [s for g in json.loads(p.stdout)["micro_batches"][0]["groups"][1:] for s in g["seq_ids"]]) == [0, 1, 2]


@pytest.mark.slow
def test_demo_runs(tmp_path):
    """`python -m fcp_exec.demo` end to end (what `make demo` runs) writes the Gantt chart, indexes and the text
    index's length chart."""
    r = subprocess.run([sys.executable, "-m", "fcp_exec.demo", "--out", str(tmp_path / "d"), "--steps", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "d" / "gantt.png").stat().st_size > 1000
    assert (tmp_path / "d" / "index_text_lengths.png").stat().st_size > 1000
    assert "step   1" in r.stdout and "parameters identical on all 2 ranks: yes" in r.stdout


def test_train_cli_bundled_text_human_output(tmp_path):
    """`fcp train` on the bundled text (default data) prints one line per step with the plan and ends with
    the agreement check of all ranks' weights."""
    env = {**__import__("os").environ, "FCP_CACHE": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "fcp_cli", "train", "--nproc", "2", "--steps", "2",
                        "--max-tokens", "256", "--global-batch-size", "6"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("step ")]
    assert len(lines) == 2 and all("plan ⟨" in ln and "planner wait" in ln for ln in lines)
    assert "parameters identical on all 2 ranks: yes" in r.stdout
    assert np.isfinite(float(lines[0].split("loss")[1].split()[0]))


def test_eval_data_is_what_eval_steps_evaluate(tmp_path):
    """``eval_data`` (``--eval-data``): the evaluated global batches come from that index (a second sampler), and
    each one's denominator is exactly its samples' label tokens there (capped lengths − 1); training data stays the
    bundled text. The loss of eval_step itself is checked against the stock models in tests/exec/test_hf_train.py."""
    import math

    from _damaged_data import edited_text_index

    from fcp_data import LengthIndex
    from fcp_exec.train import TrainConfig, train

    index, _ = edited_text_index(tmp_path / "val", lines=16, edit=())
    cfg = TrainConfig(model="tiny-llm", steps=1, global_batch_size=4, max_tokens=96, prefetch=0, verbose=False,
                      cache_dir=str(tmp_path / "cache"), eval_steps=3, eval_data=str(index))
    res = train(cfg)
    lengths = np.minimum(np.asarray(LengthIndex.load(index).num_tokens), 96)
    assert len(res["eval"]) == 3
    seen = [i for ev in res["eval"] for i in ev["sample_indices"]]
    assert len(seen) == 12 and len(set(seen)) == 12 and max(seen) < 16  # 3 disjoint batches of 4 of the 16
    for ev in res["eval"]:
        assert ev["num_tokens"] == int(sum(lengths[i] - 1 for i in ev["sample_indices"]))
        assert math.isfinite(ev["loss"]) and ev["skipped_samples"] == []
