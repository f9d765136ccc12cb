"""A CPU rank keeps freed memory (:mod:`fcp_exec.host_memory`), on real processes.

Reference: the kernel's count of minor page faults (``getrusage``). Allocating and filling a 64 MiB tensor that
glibc serves by ``mmap`` faults in every one of its 16,384 pages each time; served from a heap that keeps freed
memory, the pages are faulted in once and reused. The setting is process-global, so it is measured in a fresh
interpreter (never in the test process) and in a rank started by fcp's launcher. A failure means CPU ranks page-fault
every large activation on every step again (16×256 tokens on one rank: 183 ms against 131–155 ms, BENCHMARKS.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fcp_exec.compat import torch_release
from fcp_exec.host_memory import keep_freed_memory
from fcp_exec.launch import WorkerPool

MIB64 = 64 << 20
PAGES = MIB64 // 4096
ROUNDS = 6


def _thp_always() -> bool:
    """Transparent huge pages for every anonymous mapping: glibc's mmapped block then faults in 2 MiB at a time."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[always]" in f.read()
    except OSError:
        return False


# faults per round a mmapped 64 MiB block costs at least (half its pages; 4 KiB pages, or 2 MiB ones under THP)
DEFAULT_FLOOR = (MIB64 // (2 << 20)) // 2 if _thp_always() else PAGES // 2


def _faults_per_round(stat=None) -> float:
    """Minor page faults of an allocate-fill-free round of a 64 MiB tensor: the median (or ``stat``) over ROUNDS rounds
    after two warm-up rounds (steady state: a round in which the heap still grows, e.g. past another allocation,
    faults once)."""
    import resource
    import statistics

    counts = []
    for _ in range(2 + ROUNDS):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.ones(MIB64 // 4).sum()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return float((stat or statistics.median)(counts[2:]))


def _faults_in_a_thread() -> float:
    """:func:`_faults_per_round` in a thread started now (glibc gives it its own arena unless told otherwise), the
    fewest of a round: with the setting, some rounds may still be served elsewhere under load (CI saw half the rounds
    fault, 1 run in 3; the known limit of BENCHMARKS.md), without it every round faults (an arena of its own holds at
    most 64 MiB per sub-heap, so the block is mmapped each time)."""
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(_faults_per_round(min)))
    t.start()
    t.join()
    return out[0]


def _fresh_interpreter(setup: str, call: str, env: dict[str, str]) -> list[str]:
    """In a fresh interpreter (the setting is process-global): faults per round, then ``call``'s value, then faults per
    round again and in a thread started afterwards; ``setup`` imports what ``call`` needs."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
            f"from test_host_memory import _faults_in_a_thread, _faults_per_round\n{setup}\n"
            f"print(_faults_per_round(), repr({call}).replace(' ', ''), _faults_per_round(), _faults_in_a_thread())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FCP_KEEP_FREED_MEMORY": "1", **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")
def test_keep_freed_memory_stops_the_page_faults_of_large_tensors():
    default, applied, kept, thread = _fresh_interpreter("from fcp_exec.host_memory import keep_freed_memory",
                                                        "keep_freed_memory()", {})
    assert applied == "True"
    assert float(default) >= DEFAULT_FLOOR, f"glibc's default should mmap (and fault in) a 64 MiB block: {default} faults"
    assert float(kept) <= PAGES / 20, f"after keep_freed_memory(): {kept} faults per round (default {default})"
    if torch_release() != (2, 5):  # torch 2.5.1: a thread's rounds fault with one arena (benchmarks/torch_compat.py)
        assert float(thread) <= PAGES / 20, f"a thread started afterwards: {thread} faults per round (its own arena?)"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")
def test_a_command_under_torchrun_keeps_freed_memory():
    """`fcp train` / `fcp profile` under torchrun: the command's own process is a CPU rank (torchrun's variables)."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}
    before, _, after, _ = _fresh_interpreter("from fcp_exec.commands import check_launch", "check_launch(None, None)",
                                             env)
    before, after = float(before), float(after)
    assert before >= DEFAULT_FLOOR and after <= PAGES / 20, f"faults per round before {before}, after check_launch {after}"


def test_keep_freed_memory_leaves_accelerators_and_the_opt_out_alone(monkeypatch):
    """Nothing is changed (False, no call reaches glibc) for an accelerator's rank or with FCP_KEEP_FREED_MEMORY=0."""
    assert keep_freed_memory(torch.device("cuda", 0)) is False
    monkeypatch.setenv("FCP_KEEP_FREED_MEMORY", "0")
    assert keep_freed_memory() is False
    assert keep_freed_memory(torch.device("cpu")) is False


def _rank_faults(rank: int) -> float:
    return _faults_per_round(min)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc (Linux)")
@pytest.mark.timeout(300)
def test_launched_cpu_ranks_keep_freed_memory():
    """A CPU rank of fcp's launcher reuses its heap (glibc's default, measured above, faults every page in every
    round). The fewest faults of a round: a rank forked from a forkserver that already holds several glibc arenas may
    see a round served by another arena (a thread there, or the main thread moved under lock contention, still gets
    such blocks mmapped: a known limit, BENCHMARKS.md); without the setting no round is spared."""
    if os.environ.get("FCP_KEEP_FREED_MEMORY") == "0":
        pytest.skip("FCP_KEEP_FREED_MEMORY=0: this session's ranks keep glibc's defaults, as asked")
    with WorkerPool(1, pg_timeout=120) as pool:
        kept = pool.run(_rank_faults, timeout=120)[0]
    assert kept <= PAGES / 20, f"a launched CPU rank faults {kept} pages in each 64 MiB round ({PAGES}: mmap)"
