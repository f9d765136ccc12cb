"""The launcher's forkserver across launches of one process (:mod:`fcp_exec.forkserver`), on real processes.

A process forked by a forkserver sees the server's preloaded modules in ``sys.modules`` before it runs anything, and
its parent pid is the server's. Reference: which stdlib modules (``tabnanny``, ``sched``, ``pyclbr``, ``netrc``,
imported by nothing fcp, torch or pytest loads) each child finds already imported, and whether the server pid
changed. Most cases drive :func:`fcp_exec.forkserver.set_preload` with a bare forkserver context and a probe that
imports nothing (each server start costs ~0.1 s); one case goes through :class:`WorkerPool`. A failure means a
launch that needs more modules pays their imports in every worker again (3.5 s each for a Hugging Face model's),
or that a forkserver with live workers, or one fcp did not start, was stopped under them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing import forkserver as mp_forkserver

import pytest

from _forkserver_probe import probe, seen, wait
from fcp_exec import forkserver
from fcp_exec.launch import _PRELOAD, WorkerPool

PROBED = ("tabnanny", "sched", "pyclbr", "netrc")
CTX = mp.get_context("forkserver")


@pytest.fixture(autouse=True, scope="module")
def _no_fcp_forkserver_at_the_start():
    """Start from no fcp forkserver: its restarts here then import the probe modules only, not the training stack
    an earlier test of this process preloaded."""
    forkserver.stop()
    yield


def _fork(preload: tuple[str, ...]) -> tuple[dict[str, bool], int]:
    """Start one child the way the launcher does (set_preload, start, note_started); what it saw, its server."""
    wanted, before = forkserver.set_preload(CTX, preload)
    results = CTX.Queue()
    child = CTX.Process(target=probe, args=(results, PROBED))
    child.start()
    forkserver.note_started(wanted, before)
    out = results.get(timeout=60)
    child.join(30)
    return out


def test_an_idle_forkserver_is_restarted_with_the_modules_a_launch_needs():
    seen0, server0 = _fork(())
    assert not any(seen0.values()), seen0
    seen1, server1 = _fork(("tabnanny",))
    assert seen1["tabnanny"], "a launch that needs tabnanny was forked from a server without it"
    assert server1 != server0, "the forkserver was not restarted"
    seen2, server2 = _fork(("sched",))  # restarted again: with the union, tabnanny stays preloaded
    assert server2 != server1 and seen2["sched"] and seen2["tabnanny"], seen2
    seen3, server3 = _fork(("tabnanny",))  # a preload the server already has: kept
    assert server3 == server2 and seen3["sched"], (server2, server3)


def test_a_forkserver_started_ahead_serves_the_launch_that_follows():
    """``start`` (``fcp train`` calls it before its checks and data loading) runs the server with the preload at once;
    the launch that then asks for the same modules forks from that server, which has them, without a restart."""
    forkserver.start(("pyclbr",))
    early = mp_forkserver._forkserver._forkserver_pid
    assert early is not None and forkserver._pid == early and "pyclbr" in forkserver._served
    seen1, server1 = _fork(("pyclbr",))
    assert server1 == early and seen1["pyclbr"], (early, server1, seen1)
    forkserver.start(("pyclbr",))  # already running with it: left alone
    assert mp_forkserver._forkserver._forkserver_pid == early
    assert forkserver.stop()  # the next cases start from a server without pyclbr


def test_a_forkserver_with_a_live_child_is_left_running():
    """A live process the server forked — here one fcp did not start, as a DataLoader's forkserver workers would be
    — keeps the server running: it is never stopped under them, and stop() refuses too."""
    _, server0 = _fork(())
    release = CTX.Queue()
    child = CTX.Process(target=wait, args=(release,))
    child.start()
    try:
        seen, server = _fork(("pyclbr",))
        assert server == server0 and not seen["pyclbr"], (server0, server, seen)
        assert not forkserver.stop() and child.is_alive()
    finally:
        release.put(None)
        child.join(30)
    assert child.exitcode == 0, "the child lost its server"
    seen, server = _fork(("pyclbr",))  # no live child now
    assert server != server0 and seen["pyclbr"]


def test_a_forkserver_started_by_someone_else_is_never_stopped():
    """A forkserver fcp did not start keeps running: fcp's record cleared (as if user code had started the server)
    or naming another server (as if multiprocessing had replaced fcp's); fcp's workers then import what they need
    themselves."""
    _fork(())  # a running server, whichever test ran before this one in this process
    saved = forkserver._served, forkserver._pid
    try:
        for record in (None, -1):
            forkserver._pid = record
            _, server_before = _fork(())
            seen, server_after = _fork(("netrc",))
            assert server_after == server_before and not seen["netrc"], record
            assert not forkserver.stop()
    finally:
        forkserver._served, forkserver._pid = saved


def test_the_environment_adds_modules_to_every_forkserver(monkeypatch):
    forkserver.stop()
    monkeypatch.setenv("FCP_FORKSERVER_PRELOAD", " netrc , ")
    seen, _ = _fork(())
    assert seen["netrc"], "FCP_FORKSERVER_PRELOAD did not reach the forkserver"


def _worker_probe(rank: int) -> tuple[dict[str, bool], int]:
    return seen(PROBED)


def test_worker_pools_restart_an_idle_forkserver_but_not_one_with_live_workers():
    """The launcher's own calls: a pool that needs a module the server lacks restarts it when no pool is open,
    and leaves it running while one is."""
    forkserver.stop()
    with WorkerPool(2, backend="gloo", pg_timeout=60, preload=_PRELOAD) as held:
        (seen, server_held), _ = held.run(_worker_probe, timeout=120)
        assert not seen["sched"]
        with WorkerPool(2, backend="gloo", pg_timeout=60, preload=_PRELOAD + ("sched",)) as other:
            (seen, server), _ = other.run(_worker_probe, timeout=120)
        assert server == server_held and not seen["sched"], "a forkserver with live workers was restarted"
        assert held.run(_worker_probe, timeout=120)[0][1] == server_held  # the held pool still works
    with WorkerPool(2, backend="gloo", pg_timeout=60, preload=_PRELOAD + ("sched",)) as pool:
        (seen, server), _ = pool.run(_worker_probe, timeout=120)
    assert seen["sched"] and server != server_held, "an idle forkserver lacking sched was not restarted"


def test_a_server_whose_socket_file_vanished_is_still_replaced():
    """A cleaned temp dir removes the server's socket file: stopping it must not raise into the launch."""
    _, server0 = _fork(())
    address = mp_forkserver._forkserver._forkserver_address
    if not isinstance(address, str) or not os.path.exists(address):
        pytest.skip("the forkserver listens on an abstract socket (no file to remove)")
    os.unlink(address)
    seen, server = _fork(("pyclbr",))
    assert server != server0 and seen["pyclbr"]


def test_stopping_a_server_that_a_forked_child_keeps_open_is_bounded(monkeypatch):
    """Found in review: a child this process *forked* (a plain DataLoader's worker, torch's default on Linux) holds a
    copy of the server's alive-pipe, so the server never saw it close, and ``stop`` (a launch with a new preload)
    waited for its exit forever. Now it waits a moment, then ends the server itself; the next fork has a new
    server, and the forked child is untouched."""
    import threading
    import time

    monkeypatch.setattr(forkserver, "_STOP_WAIT_S", 0.5, raising=False)
    _, server0 = _fork(("tabnanny",))
    forked_ctx = mp.get_context("fork")
    release = forked_ctx.Queue()
    child = forked_ctx.Process(target=wait, args=(release,))
    child.start()
    done: list = []
    stopper = threading.Thread(target=lambda: done.append(forkserver.stop()), daemon=True)
    start = time.monotonic()
    try:
        stopper.start()
        stopper.join(20)
        assert done == [True], "stop() still waiting for the server after 20 s"
        assert time.monotonic() - start < 10 and child.is_alive()
    finally:
        release.put(None)  # without the fix: the child's end lets the server exit and stop() return
        child.join(30)
        stopper.join(30)
    assert child.exitcode == 0
    seen, server = _fork(("tabnanny",))
    assert server != server0 and seen["tabnanny"]


@pytest.mark.parametrize("failure", ["raise RuntimeError('needs the program to set it up first')",
                                     "import argparse; argparse.ArgumentParser().parse_args(['--no-such-flag'])"],
                         ids=["RuntimeError", "SystemExit"])
def test_a_preloaded_module_that_raises_is_skipped_not_the_end_of_the_server(tmp_path, monkeypatch, failure):
    """Found in review: ``multiprocessing.forkserver.main`` skips a preloaded module that raises ImportError only;
    one raising anything else (RuntimeError; SystemExit from a module that parses ``sys.argv``) ended the server
    during its preload, and the launch failed with "unexpected EOF". Now it is skipped (the workers import it
    themselves) and the modules after it are preloaded all the same."""
    (tmp_path / "fcp_probe_raises.py").write_text(failure + "\n")
    # the server starts with this process's environment (and, from Python 3.12 on, its sys.path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.syspath_prepend(str(tmp_path))
    forkserver.stop()
    seen, server = _fork(("fcp_probe_raises", "sched"))
    assert seen["sched"] and server == mp_forkserver._forkserver._forkserver_pid
