"""CPython's fork deadlock (gh-112275) and what :func:`fcp_data.workers.worker_context` does about it.

A training rank is multi-threaded when its DataLoader starts workers. On CPython before 3.12 (and before 3.11.10,
3.10.15, 3.9.20, 3.8.20) a fork while another thread holds the interpreter's thread-list lock — a C thread entering
Python takes it, without the GIL, while it makes its thread state — leaves the child blocked forever in
``PyOS_AfterFork_Child``. Two measurements, each under ``--threads`` C threads that enter Python over and over
(``pthread_create`` of a ctypes callback, what a C++ library's thread calling back into Python does):

1. ``os.fork`` ``--forks`` times per interpreter (this one and each ``--python``): how many children deadlock (a
   child that has not exited after 2 s). Standard library only, so any interpreter runs it.
2. What ``worker_context`` costs, in this interpreter: ``--epochs`` epochs of a DataLoader (FCPSampler,
   FCPDataset, FCPCollator, 2 workers, new workers every epoch) with torch's default ``fork`` and with
   ``worker_context``, interleaved: the first epoch (a forkserver starts and imports torch and fcp) and the median
   of the later ones. (Under the churn of 1, 600 DataLoader forks hung none: a busy main thread holds the GIL that
   the churning threads wait for, so they enter Python far less often than beside ``os.fork`` in a loop.)

    .venv/bin/python benchmarks/fork_deadlock.py
    .venv/bin/python benchmarks/fork_deadlock.py --python /root/.pyenv/versions/3.12.1/bin/python
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from _args import interpreter, parser, positive_int, run

PROBE = r"""
import ctypes, os, signal, sys, threading, time
libc = ctypes.CDLL(None)
entry = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda arg: None)
stop = False
def churn():  # each new C thread entering Python makes (and ends) a thread state
    tid = ctypes.c_ulong()
    while not stop:
        libc.pthread_create(ctypes.byref(tid), None, entry, None)
        libc.pthread_join(tid, None)
for _ in range(int(sys.argv[2])):
    threading.Thread(target=churn, daemon=True).start()
hung = 0
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    t0 = time.monotonic()
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() - t0 > 2:
            hung += 1
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.001)
stop = True
print(sys.version.split()[0], hung)
"""


def probe(python: str, forks: int, threads: int) -> tuple[str, int]:
    """(version, deadlocked children) of ``forks`` forks under ``threads`` churning C threads in ``python``."""
    r = subprocess.run([python, "-W", "ignore", "-c", PROBE, str(forks), str(threads)], capture_output=True,
                       text=True, timeout=forks * 3 + 60)
    if r.returncode:
        raise SystemExit(f"{python}: the probe failed: {r.stderr.strip().splitlines()[-1:]}")
    version, hung = r.stdout.split()
    return version, int(hung)


def loader_cost(epochs: int) -> dict[str, tuple[float, float]]:
    """{method: (seconds of the first epoch, median seconds of the later ones)} of a 2-worker DataLoader over the
    bundled text (new workers every epoch), torch's ``fork`` and ``worker_context`` interleaved epoch by epoch."""
    from torch.utils.data import DataLoader

    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset, bundled_index
    from fcp_data.presets import ModelConfig
    from fcp_data.workers import worker_context

    data = IndexedDataset(bundled_index("text"))
    shape = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=32000)
    cost = CostModel.preset(shape, "a100").replace(tokens_per_rank=1024)
    dataset, collate = FCPDataset(data), FCPCollator(pad_token_id=data.pad_token_id)
    loaders = {}
    for method in ("fork", "worker_context"):
        sampler = FCPSampler(data.index, 2, 0, cost_model=cost, global_batch_size=4096, seed=0,
                             on_overlong="truncate")
        ctx = worker_context(2, dataset, collate) if method == "worker_context" else method
        loaders[method] = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=collate,
                                     multiprocessing_context=ctx, timeout=60)
    times: dict[str, list[float]] = {m: [] for m in loaders}
    for epoch in range(epochs):
        for method in (list(loaders) if epoch % 2 == 0 else list(loaders)[::-1]):
            t0 = time.perf_counter()
            for _batch in loaders[method]:
                pass
            times[method].append(time.perf_counter() - t0)
    return {m: (t[0], statistics.median(t[1:]) if len(t) > 1 else float("nan")) for m, t in times.items()}


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--python", type=interpreter, action="append", default=[],
                   help="another interpreter for measurement 1, a path or a name on PATH (repeat; default: this "
                        "one only)")
    p.add_argument("--forks", type=positive_int, default=3000,
                   help="forks per interpreter in measurement 1 (default 3000)")
    p.add_argument("--threads", type=positive_int, default=4, help="C threads entering Python (default 4)")
    p.add_argument("--epochs", type=positive_int, default=20, help="DataLoader epochs per method in measurement 2")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    print(f"1. os.fork under {args.threads} C threads entering Python, {args.forks} forks each")
    for python in [sys.executable, *args.python]:
        version, hung = probe(python, args.forks, args.threads)
        print(f"   CPython {version:8s} {hung:5d} of {args.forks} children deadlocked", flush=True)

    from fcp_data.workers import fork_may_deadlock

    print(f"2. DataLoader, 2 workers (new ones every epoch), {args.epochs} epochs of the bundled text each, no "
          f"churn, interleaved (this interpreter: fork {'may' if fork_may_deadlock() else 'cannot'} deadlock)")
    for method, (first, later) in loader_cost(args.epochs).items():
        print(f"   {method:15s} first epoch {first:.3f} s, later epochs median {later:.3f} s", flush=True)

if __name__ == "__main__":
    run(main)
