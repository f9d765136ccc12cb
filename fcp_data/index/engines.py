"""Execution engines for the per-shard function: a local process pool and Ray tasks.

Both call :func:`fcp_data.index.build.index_task` once per task and report each finished task through
``on_done(result)``; results may arrive in any order (the merge orders parts by task id, so the index
does not depend on the engine or on completion order).
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Callable

from fcp_data.index.build import index_task

__all__ = ["run_local", "run_ray", "ENGINES"]

ENGINES = ("local", "ray")


def run_local(tasks: list[dict], cfg: dict, workers: int, on_done: Callable[[dict], None]) -> None:
    """Run tasks in this process (``workers <= 1``) or in a pool of ``workers`` processes.

    A crashed worker surfaces as ``concurrent.futures.process.BrokenProcessPool`` in the caller; parts
    already written stay on disk for ``--resume``.
    """
    if workers <= 1:
        for t in tasks:
            on_done(index_task(t, cfg))
        return
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        pending = {pool.submit(index_task, t, cfg) for t in tasks}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                on_done(fut.result())


def run_ray(tasks: list[dict], cfg: dict, on_done: Callable[[dict], None], address: str | None = None,
            max_in_flight: int = 256) -> None:
    """Run tasks as Ray tasks (one CPU each) on the cluster at ``address``, or on an already-initialised Ray.

    With no ``address`` and no running Ray, a local Ray is started (``ray.init()``). At most
    ``max_in_flight`` tasks are submitted at once, so millions of shards do not flood the scheduler.
    """
    try:
        import ray
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'fcp[ray]'") from None
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, include_dashboard=False)
    remote = ray.remote(num_cpus=1, max_retries=0)(index_task)
    cfg_ref = ray.put(cfg)
    queue = list(tasks)
    in_flight = []
    while queue or in_flight:
        while queue and len(in_flight) < max_in_flight:
            in_flight.append(remote.remote(queue.pop(0), cfg_ref))
        done, in_flight = ray.wait(in_flight, num_returns=1)
        for ref in done:
            on_done(ray.get(ref))
