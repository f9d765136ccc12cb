"""The processes under :mod:`fcp_exec.launch`: how a rank leaves with its parent, how its results reach the parent,
and how the parent ends a rank with everything it started.

Results travel on one pipe per rank, read by one daemon thread per rank (:class:`ResultPipes`), and the parent closes
its copy of each pipe's write end once the ranks started. One queue shared by all ranks, as before, hung ``launch``
for good when a rank was killed (OOM killer, preemption) while it wrote its result: the parent was already reading
that message, a read no timeout bounds, and the pipe never reached end-of-file since the parent itself held a write
end. Now a rank's pipe ends when the rank is gone (the parent sees "died without reporting"), and a read stuck on a
message that will never be finished blocks only its reader thread, never the parent's bounded wait.

A rank leads a process group of its own (:func:`lead_group`), so a signal to the launching process's group (a closed
terminal's SIGHUP, a scheduler's group kill) does not reach it; :func:`watch_parent` ends the rank's group as soon
as its parent is gone, also in the middle of a task (checking between tasks, as :func:`next_task` does, let a
killed launcher's ranks run their task to its end: a training run on GPUs nobody would read).
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import threading
import time

__all__ = ["ResultPipes", "report", "start_all", "next_task", "lead_group", "watch_parent", "stop", "check_seconds",
           "check_backend"]

_EXIT_WAIT_S = 2.0  # a rank that ended whose pipe stays open (a child of it holds it): counted dead after this


def check_seconds(name: str, value, *, finite: bool = False) -> float:
    """``value`` as a positive number of seconds, or a TypeError / ValueError naming the argument ``name``: before
    any process starts, not a bare ``float(None)`` or a comparison deep inside the pool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    if not value > 0 or (finite and not math.isfinite(value)):
        raise ValueError(f"{name} must be a positive{' finite' if finite else ''} number of seconds, got {value!r}")
    return float(value)


def check_backend(backend) -> None:
    """Refuse a ``backend`` torch.distributed does not know (``"glo"``) before the ranks start (each rank failed in
    ``init_process_group`` after the start-up, ~5 s later). None is the device's default; ``"cpu:gloo,cuda:nccl"``
    names one backend per device."""
    if backend is None:
        return
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {backend!r}")
    import torch.distributed as dist

    known = sorted(set(dist.Backend.backend_list) - {"undefined"})
    if not all(part.rpartition(":")[2].strip() in known for part in backend.lower().split(",")):
        raise ValueError(f"backend={backend!r} is not a torch.distributed backend here (known: {', '.join(known)})")


class ResultPipes:
    """Every rank's results: one pipe per rank, each read by a daemon thread into one in-process queue that the
    parent waits on with a timeout (module docstring). The ranks get :attr:`writers` (one each)."""

    def __init__(self, ctx, world: int):
        pairs = [ctx.Pipe(duplex=False) for _ in range(world)]
        self.writers = [w for _, w in pairs]
        self._readers = [r for r, _ in pairs]
        self._inbox: queue.Queue = queue.Queue()
        self._ended: dict[int, float] = {}  # rank -> when its process was first seen ended, its pipe still open

    def started(self) -> None:
        """After every rank started: drop this process's write ends (a rank's pipe then ends with the rank) and
        start reading."""
        self._close_writers()
        for rank, conn in enumerate(self._readers):
            threading.Thread(target=_read, args=(rank, conn, self._inbox), name=f"fcp-results-{rank}",
                             daemon=True).start()
        self._readers = []

    def abandon(self) -> None:
        """The ranks did not start: close both ends here."""
        self._close_writers()
        for conn in self._readers:
            conn.close()
        self._readers = []

    def _close_writers(self) -> None:
        for conn in self.writers:
            conn.close()
        self.writers = []

    def get(self, timeout: float) -> tuple:
        """The next ``(rank, task id, status, payload)``; status ``"eof"``: the rank's pipe ended (the rank is gone,
        after everything it sent). Raises queue.Empty after ``timeout`` seconds."""
        return self._inbox.get(timeout=timeout)

    def silent(self, procs, done) -> list[int]:
        """The ranks not in ``done`` whose process ended more than a moment ago while their pipe stays open (a
        process the rank forked holds it; or the rank died in the middle of a message): they will not report."""
        now, out = time.monotonic(), []
        for rank, p in enumerate(procs):
            if rank not in done and not p.is_alive():
                if now - self._ended.setdefault(rank, now) >= _EXIT_WAIT_S:
                    out.append(rank)
        return out


def _read(rank: int, conn, inbox: queue.Queue) -> None:
    """One rank's reader: its messages, then an ``"eof"`` once the pipe ends (or a message cannot be read)."""
    try:
        while True:
            inbox.put((rank, *pickle.loads(conn.recv_bytes())))
    except Exception:  # noqa: BLE001 - EOFError, "got end of file during message" (OSError): the rank is gone
        pass
    finally:
        inbox.put((rank, None, "eof", None))
        conn.close()


def report(conn, task_id: int, status: str, payload) -> None:
    """Send one result (``payload``: pickled bytes, or the failure's strings) to the parent: one message, written by
    this thread (no feeder thread that could be mid-write when the rank ends)."""
    conn.send_bytes(pickle.dumps((task_id, status, payload), protocol=pickle.HIGHEST_PROTOCOL))


def start_all(procs, timeout: float, server_before: int | None) -> None:
    """``p.start()`` for each of ``procs``, within ``timeout`` seconds. A forkserver's first start waits for the
    server's preload imports (``launch(preload=...)``: a module whose import blocks on a lock file or a stuck network
    mount), a wait nothing bounds: the starts run in a thread, and past the deadline a server that these starts
    started (not ``server_before``, which may serve other ranks) is killed (its reply ends, the start fails) and
    TimeoutError raised. multiprocessing starts a new server at the next start."""
    failed: list[BaseException] = []

    def start() -> None:
        try:
            for p in procs:
                p.start()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(e)

    starter = threading.Thread(target=start, name="fcp-start", daemon=True)
    starter.start()
    starter.join(timeout)
    if starter.is_alive():
        from multiprocessing import forkserver

        server = getattr(forkserver._forkserver, "_forkserver_pid", None)
        if server is not None and server != server_before and procs and procs[0]._start_method == "forkserver":
            os.kill(server, signal.SIGKILL)
        starter.join(10.0)
        raise TimeoutError(f"start-up: the ranks did not start within {timeout:g} s (the forkserver was still "
                           "importing its preload; killed)")
    if failed:
        raise failed[0]


def next_task(tasks):
    """The next ``(task id, fn, args)``, or None when told to stop or when the parent process is gone."""
    parent = multiprocessing.parent_process()
    while True:
        try:
            return tasks.get(timeout=5.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return None


def lead_group() -> None:
    """Make this rank the leader of a process group of its own, which its children join: the launcher kills the
    group, not only the rank. A DataLoader's workers of a rank started by the forkserver are forked by a forkserver of
    the rank's own and keep it alive (they hold its alive-pipe), so a killed rank's workers — 300 MB each — would
    otherwise wait forever (torch's watchdog checks their parent: that forkserver, still alive)."""
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted (e.g. a session leader): the rank alone is killed, as before
        pass


def watch_parent() -> None:
    """Start a daemon thread that SIGKILLs this rank with its process group (its DataLoader workers) once the parent
    process is gone (module docstring). Its sentinel ends with the parent, whichever way it ends."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_end_with, args=(parent.sentinel,), name="fcp-parent-watch", daemon=True).start()


def _end_with(sentinel) -> None:
    while not multiprocessing.connection.wait([sentinel], timeout=60.0):
        pass
    if os.getpgid(0) == os.getpid():  # this rank leads its group (lead_group): never its parent's group
        os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def stop(procs) -> None:
    """Kill the ranks still alive, each with everything it started (its process group, :func:`lead_group`), and
    whatever a rank that already ended left in its group."""
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.kill()
        _kill_group(p.pid)
    for p in procs:
        if p.pid is not None:
            p.join(5.0)


def _kill_group(pid: int | None) -> None:
    """SIGKILL the process group a rank leads (nothing when it leads none or the group is empty)."""
    if pid is None or not hasattr(os, "killpg"):
        return
    try:
        if os.getpgid(pid) != pid:
            return
    except ProcessLookupError:  # the rank is gone: its group, if any member is left, still has its id
        pass
    except OSError:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
