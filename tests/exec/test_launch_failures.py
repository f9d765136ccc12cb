"""The launcher's promise "a hanging or dying worker ... never hang", and "workers end with the parent", on real
processes (:mod:`fcp_exec.launch`, :mod:`fcp_exec.launch_procs`); and its arguments refused before anything starts.

Each multi-process case runs a small script in a fresh process under ``tests/_procs.run`` (a hang fails with every
process's stacks instead of hanging the suite): a rank SIGKILLed in the middle of writing its result, and a launcher
SIGKILLed while its ranks run a task. Reference: what the launcher promises — a :class:`WorkerFailure` naming the
rank that "died without reporting", and no rank alive a few seconds after its launcher is gone.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from _procs import run as run_process, running

from fcp_exec.launch import WorkerPool, launch

_WRITE = {"x86_64": 1, "aarch64": 64}.get(platform.machine())  # the write(2) syscall's number


def _syscalls_readable() -> bool:
    """Whether this process may read its threads' current system calls (the test's trigger)."""
    try:
        with open("/proc/self/syscall") as f:
            return f.read().split()[0].lstrip("-").isdigit()
    except (OSError, IndexError):
        return False


_DIES_WRITING = textwrap.dedent("""
    import glob, os, signal, threading, time
    from fcp_exec.launch import WorkerFailure, WorkerPool

    def big_result(rank, write):
        # kill this rank once another of its threads is inside write(2): sending the 200 MB result
        def killer():
            me = threading.get_native_id()
            while True:
                for path in glob.glob("/proc/self/task/*/syscall"):
                    if int(path.split("/")[4]) != me:
                        try:
                            with open(path) as f:
                                if f.read().split()[0] == str(write):
                                    time.sleep(0.01)
                                    os.kill(os.getpid(), signal.SIGKILL)
                        except (OSError, IndexError):
                            pass
                time.sleep(0.001)
        value = bytes(200 << 20)
        threading.Thread(target=killer, daemon=True).start()
        return value

    if __name__ == "__main__":
        with WorkerPool(1, backend="gloo", pg_timeout=60) as pool:
            t0 = time.monotonic()
            try:
                pool.run(big_result, {write}, timeout=40)
            except WorkerFailure as e:
                print("failed", sorted(e.errors), e.errors[0][2], f"{{time.monotonic() - t0:.1f}}", flush=True)
""")


@pytest.mark.skipif(_WRITE is None or not sys.platform.startswith("linux"), reason="reads /proc (x86-64, aarch64)")
def test_a_rank_killed_while_writing_its_result_is_a_failure_not_a_hang(tmp_path):
    """Found in review: all ranks shared one result queue whose write end the parent held too; a rank killed (OOM
    killer, preemption) while it wrote its result left the parent reading that message forever, far past ``timeout``
    (``recv_bytes`` of a pipe that never ends). Now each rank has its own pipe, which ends with the rank: the run
    fails at once with a WorkerFailure naming the rank (without the fix: hung until this test's limit)."""
    if not _syscalls_readable():
        pytest.skip("/proc/self/task/*/syscall is not readable here")
    script = tmp_path / "dies_writing.py"
    script.write_text(_DIES_WRITING.format(write=_WRITE))
    r = run_process([sys.executable, str(script)], timeout=90, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("failed [0]"), r.stdout[-2000:] + r.stderr[-4000:]
    assert "rank 0 exit code -9 (died without reporting)" in r.stdout, r.stdout
    assert float(r.stdout.split()[-1]) < 20, r.stdout  # well within the run's 40 s timeout


_KILLED_LAUNCHER = textwrap.dedent("""
    import multiprocessing, time
    from fcp_exec.launch import WorkerPool, _without_rank

    if __name__ == "__main__":
        pool = WorkerPool(2, backend="gloo", pg_timeout=60).start()
        print(*[p.pid for p in multiprocessing.active_children()], flush=True)
        pool.run(_without_rank, time.sleep, 120, timeout=300)  # the ranks are busy when this process is killed
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_busy_with_a_task_end_with_their_killed_launcher(tmp_path):
    """Found in review: each rank leads a process group of its own (so that the launcher can kill it with its
    DataLoader workers), so a signal to the launching process's group (a closed terminal's SIGHUP) does not reach it,
    and a rank looked for its parent only between tasks: a launcher killed mid-task left its ranks running the task to
    its end (here 120 s). Now each rank ends with its parent within seconds, also in the middle of a task."""
    script = tmp_path / "killed_launcher.py"
    script.write_text(_KILLED_LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    pids: list[int] = []
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]  # printed once both ranks joined the group
        assert len(pids) == 2, proc.stderr.read()[-4000:] if proc.poll() is not None else pids
        time.sleep(1.0)  # the task is running
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(running(p) for p in pids):
            time.sleep(0.2)
        assert not [p for p in pids if running(p)], "ranks outlived their killed launcher"
    finally:
        for pid in [proc.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate(timeout=30)


def _one() -> int:
    return 1


@pytest.mark.parametrize("call, error, match", [
    (lambda: launch(_one, 1, timeout=None), TypeError, "timeout must be a number of seconds, got None"),
    (lambda: launch(_one, 1, timeout=-1), ValueError, "timeout must be a positive number of seconds, got -1"),
    (lambda: launch(_one, 1, pg_timeout=float("inf")), ValueError, "pg_timeout must be a positive finite"),
    (lambda: WorkerPool(1, pg_timeout=None), TypeError, "pg_timeout must be a number of seconds, got None"),
    (lambda: WorkerPool(1, start_timeout="60"), TypeError, "start_timeout must be a number of seconds"),
    (lambda: launch(_one, 1, backend="glo", timeout=60), ValueError,
     "backend='glo' is not a torch.distributed backend here"),
    (lambda: WorkerPool(1, backend=["gloo"]), TypeError, "backend must be a str or None"),
])
def test_bad_arguments_are_refused_before_any_process_starts(call, error, match):
    """Found in review: ``timeout=None`` and ``pg_timeout=None`` failed with bare TypeErrors from inside the pool
    (``float()``, a comparison), and the typo ``backend="glo"`` only in each rank, after its start-up (~5 s). Now one
    error naming the argument, at once, with no process started."""
    start = time.monotonic()
    with pytest.raises(error, match=match):
        call()
    assert time.monotonic() - start < 2.0
    assert multiprocessing.active_children() == []


_SLOW_PRELOAD = textwrap.dedent("""
    import time
    from fcp_exec.launch import _PRELOAD, WorkerPool, _without_rank

    if __name__ == "__main__":
        t0 = time.monotonic()
        try:
            WorkerPool(1, backend="gloo", pg_timeout=60, start_timeout=5, preload=_PRELOAD + ("fcp_slow_import",)).start()
        except TimeoutError as e:
            print("timeout", f"{time.monotonic() - t0:.1f}", e, flush=True)
        with WorkerPool(1, backend="gloo", pg_timeout=60, start_timeout=60) as pool:  # a new server, without it
            print("then", pool.run(_without_rank, sum, [1, 2], timeout=60), flush=True)
""")


def test_the_start_up_timeout_bounds_the_forkservers_preload(tmp_path):
    """Found in review: ``launch(timeout=...)`` / ``start_timeout`` did not bound the first start while the
    forkserver imported its preload (a module whose import blocks: a lock file, a stuck network mount); the start
    waited for the server's reply as long as that took (here 60 s). Now: a TimeoutError at the limit, and the
    next pool starts a new server."""
    (tmp_path / "fcp_slow_import.py").write_text("import time\ntime.sleep(60)\n")
    script = tmp_path / "slow_preload.py"
    script.write_text(_SLOW_PRELOAD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    r = run_process([sys.executable, str(script)], timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("timeout") and float(lines[0].split()[1]) < 15, r.stdout
    assert "did not start within 5 s" in lines[0] and lines[1] == "then [3]", r.stdout
