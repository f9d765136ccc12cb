"""The forkservers fcp starts freeze their heap (:mod:`fcp_data.frozen_heap`), on real processes.

Reference: the interpreter's own counts in the forked process — ``gc.get_freeze_count()`` (objects in the permanent
generation, left out of every collection) and ``len(gc.get_objects())`` (what a full collection walks). Each case runs
in a fresh interpreter (a process has one forkserver, and one started here would stay for the rest of the suite).
A failure means every process forked from fcp's servers walks (and copies, page by page) the server's whole heap at
each full collection again — 0.3–0.8 s and ~90 MB per rank with transformers preloaded
(``benchmarks/bench_frozen_heap.py``) — or that the server's exit prints "leaked" reports of nanobind libraries.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from _procs import run as run_process

_BARE = textwrap.dedent("""
    import gc, json, multiprocessing as mp, sys
    import fcp_data._freeze_heap as freeze_module
    import fcp_data.frozen_heap as frozen_heap

    def child(q):
        q.put([gc.get_freeze_count(), len(gc.get_objects()), sorted(m for m in ("json", "triton") if m in sys.modules)])

    if __name__ == "__main__":
        assert not freeze_module.frozen and gc.get_freeze_count() == 0, "imported outside a forkserver: no freeze"
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(frozen_heap.preload_with_freeze(["__main__", frozen_heap.MODULE, "json", "triton"]))
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print(json.dumps(q.get(timeout=120)))
        p.join(60)
""")


def _bare(tmp_path, freeze: str) -> tuple[list, str]:
    script = tmp_path / "bare.py"
    script.write_text(_BARE)
    r = run_process([sys.executable, str(script)], timeout=180, cwd=tmp_path, env=dict(os.environ, FCP_GC_FREEZE=freeze))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_a_preload_ending_in_the_module_freezes_the_server_and_its_exit_reports_no_leak(tmp_path):
    """The module is moved to the end of the preload (after triton, a nanobind library); the child finds the
    server's objects frozen and walks only its own few; the server's exit (the parent's end) prints no nanobind
    "leaked" report, which it does when the heap stays frozen at exit."""
    pytest.importorskip("triton")
    (frozen, tracked, imported), stderr = _bare(tmp_path, "1")
    assert imported == ["json", "triton"], imported
    assert frozen > 20_000 and tracked < frozen / 10, (frozen, tracked)
    assert "leaked" not in stderr, stderr[-3000:]


def test_fcp_gc_freeze_0_leaves_the_heap_as_cpython_does(tmp_path):
    pytest.importorskip("triton")
    (frozen, tracked, _), _ = _bare(tmp_path, "0")
    assert frozen == 0 and tracked > 20_000, (frozen, tracked)


_WIRED = textwrap.dedent("""
    import gc, json, sys
    from torch.utils.data import DataLoader
    from fcp_data.workers import worker_context
    from fcp_exec.launch import launch

    class Counts:
        def __len__(self):
            return 2
        def __getitem__(self, i):
            return gc.get_freeze_count()

    def rank_count():
        return gc.get_freeze_count()

    if __name__ == "__main__":
        if sys.argv[1] == "workers":
            ctx = worker_context(2, Counts())
            if ctx is None:  # an interpreter without the fork deadlock: torch's default (fork), no server
                print(json.dumps(None))
            else:
                loader = DataLoader(Counts(), batch_size=None, num_workers=2, multiprocessing_context=ctx, timeout=120)
                print(json.dumps(list(loader)))
        else:
            print(json.dumps(launch(rank_count, 2, timeout=120.0)))
""")


@pytest.mark.parametrize("who", ["workers", "ranks"])
def test_dataloader_workers_and_launched_ranks_fork_from_a_frozen_server(tmp_path, who):
    """``worker_context``'s server (on an interpreter with the fork deadlock) and the launcher's, each the first
    server of a fresh process: every worker / rank finds at least the server's torch import frozen."""
    script = tmp_path / "wired.py"
    script.write_text(_WIRED)
    r = run_process([sys.executable, str(script), who], timeout=240, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    from fcp_data.workers import fork_may_deadlock

    if who == "workers" and not fork_may_deadlock():
        assert counts is None
        return
    assert len(counts) == 2 and min(counts) > 50_000, counts


_FORKED = textwrap.dedent("""
    import gc, json, os, sys
    import torch
    from torch.utils.data import DataLoader
    from fcp_data.frozen_heap import frozen_fork_context

    class Counts:
        def __len__(self):
            return 4
        def __getitem__(self, i):
            return {"i": i, "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()), "pid": os.getpid()}

    if __name__ == "__main__":
        held = [[str(k)] for k in range(50_000)]  # the rank's own Python objects (a dataset's lists, a model's modules)
        if sys.argv[1] == "prefrozen":
            gc.freeze()  # the process's own freeze: fcp must not undo it
        before = gc.get_freeze_count()
        ctx = frozen_fork_context()
        loader = DataLoader(Counts(), batch_size=None, num_workers=2, multiprocessing_context=ctx, timeout=120)
        items = list(loader)
        plain = list(DataLoader(Counts(), batch_size=None, num_workers=0))
        print(json.dumps({"method": ctx.get_start_method(), "before": before, "after": gc.get_freeze_count(),
                          "tracked": len(gc.get_objects()), "items": items,
                          "same_order": [x["i"] for x in items] == [x["i"] for x in plain], "me": os.getpid()}))
""")


def _forked(tmp_path, mode: str, freeze: str = "1") -> dict:
    script = tmp_path / "forked.py"
    script.write_text(_FORKED)
    r = run_process([sys.executable, str(script), mode], timeout=180, cwd=tmp_path,
                    env=dict(os.environ, FCP_GC_FREEZE=freeze))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_workers_forked_by_the_frozen_fork_context_leave_the_rank_heap_out_of_their_collections(tmp_path):
    """The workers (forked: not the parent's pid) find the parent's heap frozen — its 50,000 lists and torch — and
    track only their own objects; the parent is unfrozen right after each start (freeze count back to 0, its
    objects tracked again) and the items come in the order a loader without workers gives."""
    out = _forked(tmp_path, "plain")
    assert out["method"] == "fork" and out["same_order"] and out["before"] == out["after"] == 0, out
    assert out["tracked"] > 100_000, out["tracked"]
    for item in out["items"]:
        assert item["pid"] != out["me"] and item["frozen"] > 100_000 and item["tracked"] < item["frozen"] / 10, item


def test_a_process_that_froze_its_heap_itself_keeps_it_frozen(tmp_path):
    """(The count drops a little where frozen objects are freed by reference counting: 0.99 of it stays.)"""
    out = _forked(tmp_path, "prefrozen")
    assert out["before"] > 100_000 and out["after"] >= 0.99 * out["before"], ("fcp unfroze a heap the process had "
                                                                              "frozen itself", out["before"], out["after"])
    assert all(item["frozen"] >= 0.99 * out["before"] for item in out["items"]), out["items"]


def test_fcp_gc_freeze_0_forks_the_workers_unfrozen(tmp_path):
    out = _forked(tmp_path, "plain", freeze="0")
    assert out["same_order"] and all(item["frozen"] == 0 and item["tracked"] > 100_000 for item in out["items"]), out


def test_worker_context_is_the_frozen_fork_where_forking_is_safe_and_fork_is_the_default(monkeypatch):
    import fcp_data.workers as workers
    from fcp_data.frozen_heap import frozen_fork_context

    monkeypatch.setattr(workers, "fork_may_deadlock", lambda *a: False)
    monkeypatch.setattr(workers, "_default_start_method", lambda: "fork")
    assert workers.worker_context(2) is frozen_fork_context() is not None
    assert workers.worker_context(0) is None
    monkeypatch.setattr(workers, "_default_start_method", lambda: "spawn")  # macOS; 3.14's forkserver alike
    assert workers.worker_context(2) is None, "another default start method stays torch's"


_NESTED = textwrap.dedent("""
    import gc, json, os
    from fcp_data.frozen_heap import frozen_fork_context

    def grandchild(q):
        q.put(["grandchild", os.getpid(), gc.get_freeze_count()])

    def child(q):
        ctx = frozen_fork_context()  # a worker starting workers of its own (a nested loader, a reader pool)
        p = ctx.Process(target=grandchild, args=(q,))
        p.start()
        p.join(60)
        q.put(["child", os.getpid(), p.exitcode])

    if __name__ == "__main__":
        ctx = frozen_fork_context()
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        got = sorted((q.get(timeout=30) for _ in range(2)), key=lambda x: x[0])
        p.join(60)
        print(json.dumps({"got": got, "exitcode": p.exitcode, "me": os.getpid()}))
""")


def test_a_forked_worker_can_fork_workers_of_its_own(tmp_path):
    """The parent's fork happens under a lock; the child inherits it held by a thread it does not have. Without a
    fresh lock in the child, its own first frozen fork waits forever (this test then fails after 30–60 s)."""
    script = tmp_path / "nested.py"
    script.write_text(_NESTED)
    r = run_process([sys.executable, str(script)], timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    (child, child_pid, grand_exit), (grand, grand_pid, grand_frozen) = out["got"]
    assert out["exitcode"] == 0 and grand_exit == 0, out
    assert len({out["me"], child_pid, grand_pid}) == 3 and grand_frozen > 0, out


@pytest.mark.parametrize("value, enabled", [("0", False), ("false", False), ("no", False), ("off", False),
                                            (" 0 ", False), ("0\n", False), ("1", True), ("", True), ("yes", True)])
def test_fcp_gc_freeze_is_read_as_fcp_jit_is(monkeypatch, value, enabled):
    """Found in review: only the exact string "0" turned the freeze off ("false", "off", " 0" left it on), while
    ``FCP_JIT`` (:mod:`fcp_data.jit`) accepts them all."""
    from fcp_data.frozen_heap import _enabled

    monkeypatch.setenv("FCP_GC_FREEZE", value)
    assert _enabled() is enabled


def test_the_preload_guard_comes_first_and_does_nothing_outside_a_forkserver():
    """The guard (:data:`fcp_data.frozen_heap.GUARD`) leads every preload and the freeze ends it, each once; imported
    outside a forkserver's preload loop (here), it imports nothing."""
    import importlib

    from fcp_data import frozen_heap

    preload = frozen_heap.preload_with_freeze(["__main__", frozen_heap.MODULE, "json", frozen_heap.GUARD])
    assert preload == [frozen_heap.GUARD, "__main__", "json", frozen_heap.MODULE]
    assert frozen_heap.import_guarded() == [] and importlib.import_module(frozen_heap.GUARD).skipped == []
