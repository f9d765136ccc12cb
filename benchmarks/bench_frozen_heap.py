"""What freezing the parent's heap at a fork (:mod:`fcp_data.frozen_heap`) buys the processes fcp forks.

Three kinds of forked process: the ranks of :func:`fcp_exec.launch.launch` (``fcp train``, notebooks, tests;
forkserver preload: torch, fcp's training stack, ``transformers.modeling_utils``), a DataLoader's workers from
:func:`fcp_data.workers.worker_context`'s forkserver (an interpreter with CPython's fork deadlock), and a DataLoader's
workers forked from a rank that holds a tiny Hugging Face Qwen3 (``fork``: what ``worker_context`` gives elsewhere,
:func:`fcp_data.frozen_heap.frozen_fork_context`). In each, the probe times a full ``gc.collect()`` (Hugging Face's
``Trainer`` runs one at every ``train()``) and reads the process's private dirty memory (``/proc/self/smaps_rollup``)
before and after it: a collection writes the header of every object it walks, so walking the inherited heap copies
its pages (copy-on-write). Each run is a fresh
interpreter with ``FCP_GC_FREEZE=0`` (CPython's default: nothing frozen) or ``1`` (as shipped), interleaved
``--runs`` times; printed: medians per mode and the ratios measured in the same run.

    .venv/bin/python benchmarks/bench_frozen_heap.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _args import parser, positive_int, run

ROOT = Path(__file__).resolve().parents[1]
MODES = ("0", "1")  # FCP_GC_FREEZE
KEYS = ("first_s", "second_s", "copied_mb", "frozen")
KINDS = ("rank", "worker", "fork")
TITLES = {"rank": "launched rank (forked from fcp's forkserver)",
          "worker": "DataLoader worker (forked from worker_context's forkserver)",
          "fork": "DataLoader worker forked from a rank holding a tiny Qwen3 (frozen_fork_context)"}


def _private_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def probe() -> dict:
    """In a forked process: a full collection, timed, and the private memory it dirtied; then a second one."""
    import gc

    before = _private_mb()
    t = time.perf_counter()
    gc.collect()
    first = time.perf_counter() - t
    after = _private_mb()
    t = time.perf_counter()
    gc.collect()
    return {"first_s": first, "second_s": time.perf_counter() - t, "copied_mb": after - before,
            "frozen": gc.get_freeze_count()}


class ProbeDataset:
    """A map-style dataset whose items are :func:`probe` run in the worker that reads them."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> dict:
        return probe()


def child(kind: str) -> dict:
    if kind == "rank":
        from fcp_exec.launch import launch

        per_rank = launch(probe, 2, preload=("transformers.modeling_utils",))
    else:
        from torch.utils.data import DataLoader

        from fcp_data.frozen_heap import frozen_fork_context
        from fcp_data.workers import worker_context

        dataset, held = ProbeDataset(), []  # held: the rank's model, alive while its workers run
        if kind == "fork":
            from transformers import AutoModelForCausalLM

            from fcp_exec.integrations.hf import load_config

            held.append(AutoModelForCausalLM.from_config(load_config(str(ROOT / "examples/configs/qwen3-tiny.json"))))
            ctx = frozen_fork_context()
        else:
            ctx = worker_context(2, dataset)
            if ctx is None or ctx.get_start_method() != "forkserver":
                raise SystemExit("worker_context returns no forkserver on this interpreter: nothing to measure")
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=ctx, timeout=300)
        per_rank = list(loader)
        held.clear()
    return {k: statistics.median(float(r[k]) for r in per_rank) for k in KEYS}


def run_once(kind: str, mode: str) -> dict:
    env = dict(os.environ, FCP_GC_FREEZE=mode)
    r = subprocess.run([sys.executable, __file__, "--child", kind], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{kind}, FCP_GC_FREEZE={mode}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=positive_int, default=5, help="runs of each mode and kind, interleaved (default 5)")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)  # the probe in a fresh interpreter (run_once)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    print(f"python {sys.version.split()[0]}, {args.runs} runs per mode; load average at start "
          f"{os.getloadavg()[0]:.2f}")
    for kind in KINDS:
        results: dict[str, list[dict]] = {m: [] for m in MODES}
        for i in range(args.runs):
            for mode in MODES:
                results[mode].append(run_once(kind, mode))
            print(f"{kind}: run {i + 1}/{args.runs} done", file=sys.stderr)
        med = {m: {k: statistics.median(r[k] for r in rs) for k in KEYS} for m, rs in results.items()}
        print(f"\n{TITLES[kind]}")
        print(f"{'FCP_GC_FREEZE':<14} {'1st gc.collect':>15} {'2nd gc.collect':>15} {'memory copied':>14} "
              f"{'frozen objects':>15}")
        for m in MODES:
            print(f"{m:<14} {med[m]['first_s'] * 1e3:>13.2f}ms {med[m]['second_s'] * 1e3:>13.2f}ms "
                  f"{med[m]['copied_mb']:>11.1f} MB {med[m]['frozen']:>15,.0f}")
        print(f"frozen / not: 1st collection {med['1']['first_s'] / med['0']['first_s']:.4f}x, 2nd "
              f"{med['1']['second_s'] / med['0']['second_s']:.4f}x, memory copied "
              f"{med['1']['copied_mb']:.1f} vs {med['0']['copied_mb']:.1f} MB")
    return 0


if __name__ == "__main__":
    run(main)
