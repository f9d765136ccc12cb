"""Run a command (``torchrun``, an example, the CLI) the way ``subprocess.run(..., capture_output=True, text=True,
timeout=...)`` does, except that a hang is not a bare ``TimeoutExpired``: every Python process under the command
(the ranks, their DataLoader workers, torchrun itself — each in a session of its own, so found through ``/proc``) is
sent SIGABRT, on which ``PYTHONFAULTHANDLER`` makes it print all its threads' Python stacks to its stderr, and the
test fails with those stacks. This is how the CI's hang of the Megatron example was first read (a worker forked
while another thread held CPython's thread-list lock, :mod:`fcp_data.workers`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid``, parents before children (Linux /proc; nothing elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

def running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie may wait for a reaper in a container; Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def run(cmd: list[str], *, timeout: float, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, **kwargs)``; on a timeout,
    the stacks of every Python process under it, then a test failure."""
    env = {**(os.environ if env is None else env), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        tree = [*reversed(_descendants(proc.pid)), proc.pid]  # children first
        _signal(tree, signal.SIGSTOP)  # frozen, so that none reacts to another's end (torchrun stops the ranks)
        for pid in tree:  # one at a time, so that the stacks they print on the shared stderr do not interleave
            _signal([pid], signal.SIGABRT)  # faulthandler: all threads' stacks on its stderr, then it ends
            _signal([pid], signal.SIGCONT)
            time.sleep(0.3)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            _signal([proc.pid, *_descendants(proc.pid)], signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"hung: {' '.join(map(str, cmd))} did not finish within {timeout:g} s; the stacks of its processes "
                    f"(SIGABRT):\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-30000:]}", pytrace=False)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
