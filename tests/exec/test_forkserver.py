"""The launcher's forkserver across launches of one process (:mod:`fcp_exec.forkserver`), on real processes.

A worker forked by a forkserver sees the server's preloaded modules in ``sys.modules`` before it runs anything, and
its parent pid is the server's. Reference: which stdlib modules (``tabnanny``, ``sched``, ``pyclbr``, imported by
nothing fcp or torch loads) each worker finds already imported, and whether the server pid changed. A failure
means a launch that needs more modules pays their imports in every worker again (3.5 s each for a Hugging Face
model's), or that a forkserver with live workers was stopped under them.
"""

from __future__ import annotations

import os
import sys

import pytest

from fcp_exec import forkserver
from fcp_exec.launch import _PRELOAD, WorkerPool

PROBED = ("tabnanny", "sched", "pyclbr")


@pytest.fixture(autouse=True, scope="module")
def _fresh_forkserver():
    """The module starts and ends without fcp's forkserver: its restarts then import torch only (not the training
    stack an earlier test of this process preloaded), and the probe modules do not reach later launches."""
    forkserver.stop()
    yield
    forkserver.stop()


def _probe(rank: int) -> tuple[dict[str, bool], int]:
    return {m: m in sys.modules for m in PROBED}, os.getppid()


def _run(preload: tuple[str, ...]) -> tuple[dict[str, bool], int]:
    with WorkerPool(2, backend="gloo", pg_timeout=60, preload=_PRELOAD + preload) as pool:
        out = pool.run(_probe, timeout=120)
    assert out[0] == out[1], f"the two ranks were forked differently: {out}"
    return out[0]


def test_an_idle_forkserver_is_restarted_with_the_modules_a_launch_needs_and_a_busy_one_is_not():
    seen0, server0 = _run(())
    assert not seen0["tabnanny"] and not seen0["sched"], seen0
    with WorkerPool(2, backend="gloo", pg_timeout=60) as held:  # workers of the running server stay alive
        seen, server = _run(("sched",))
        assert server == server0 and not seen["sched"], "a forkserver with live workers was restarted"
        assert all(p.is_alive() for p in held._procs)
        assert held.run(_probe, timeout=120)[0][1] == server0  # the held pool still works
    seen1, server1 = _run(("tabnanny",))  # idle now: restarted with tabnanny
    assert seen1["tabnanny"], "the workers of a launch that needs tabnanny were forked without it"
    assert server1 != server0, "the forkserver was not restarted"
    seen2, server2 = _run(())  # a smaller preload: the server (and what it imported) is kept
    assert server2 == server1 and seen2["tabnanny"], (server1, server2, seen2)


def test_a_forkserver_started_by_someone_else_is_never_stopped():
    """A forkserver fcp did not start keeps running (here fcp's record is cleared, as if user code had started the
    server, or names another server, as if multiprocessing had replaced fcp's); fcp's workers then import what
    they need themselves."""
    saved = forkserver._served, forkserver._pid
    try:
        for record in (None, -1):
            forkserver._pid = record
            _, server_before = _run(())
            seen, server_after = _run(("pyclbr",))
            assert server_after == server_before and not seen["pyclbr"], record
            assert not forkserver.stop()
    finally:
        forkserver._served, forkserver._pid = saved


def test_the_environment_adds_modules_to_every_forkserver(monkeypatch):
    monkeypatch.setenv("FCP_FORKSERVER_PRELOAD", " sched , ")
    seen, _ = _run(())
    assert seen["sched"], "FCP_FORKSERVER_PRELOAD did not reach the forkserver"
