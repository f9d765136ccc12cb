"""How long a DataLoader's workers take to deliver, by start method: what :func:`fcp_data.workers.worker_context`'s
preload buys on an interpreter with CPython's fork deadlock (gh-112275), where it returns a forkserver.

The loader is the video example's (``examples/train_qwen2_5_vl_video.py``): the bundled videos indexed for
Qwen2.5-VL, ``FCPSampler`` on one rank, ``FCPDataset``, the Hugging Face collate function (``hf_collator``: its
3-D rope positions come from the model family's code), 2 workers, new workers every epoch. Each run is a fresh
process (a process has one forkserver), the modes interleaved ``--runs`` times:

- ``fork``: torch's default (what a rank does on an interpreter without the deadlock);
- ``forkserver-types``: a forkserver preloading the main script, torch, fcp's sampler and collator and the modules of
  the dataset's and collate function's own types — ``worker_context`` before it looked inside them;
- ``worker_context``: as shipped (the modules the objects' pickle names, and this process's modules of their
  packages); on an interpreter without the deadlock it is ``fork`` and the row says so.

Printed per mode: the median time from the loader's construction (the forkserver's start included) to the first
batch of epoch 0, the median first batch of epoch 1 (new workers, the server already up) and the median whole
epoch 1; then the ratios to ``fork`` measured in the same run.

    .venv/bin/python benchmarks/bench_worker_start.py --runs 5
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from _args import existing_file, parser, positive_int, run

ROOT = Path(__file__).resolve().parents[1]
MODES = ("fork", "forkserver-types", "worker_context")

CHILD = r"""
import json, multiprocessing, sys, time
from multiprocessing import forkserver
import torch
from torch.utils.data import DataLoader
from fcp_data import CostModel, FCPDataset, FCPSampler, IndexedDataset, bundled_index
from fcp_data.workers import fork_may_deadlock, worker_context
from fcp_exec.integrations.hf import load_config
from fcp_exec.integrations.hf_positions import hf_collator
from fcp_exec.train_data import HF_SPECS

if __name__ == "__main__":
    mode, config_path = sys.argv[1], sys.argv[2]
    config = load_config(config_path)
    data = IndexedDataset(bundled_index(HF_SPECS[config.model_type]))
    cost = CostModel.preset(config, "a100").replace(tokens_per_rank=2048)
    sampler = FCPSampler(data.index, 1, 0, cost_model=cost, global_batch_size=4096, seed=0, on_overlong="drop")
    dataset = FCPDataset(data)
    collate = hf_collator(config, pad_token_id=data.pad_token_id, sample_labels=data.has_labels)
    t0 = time.perf_counter()
    if mode == "fork":
        ctx = multiprocessing.get_context("fork")
    elif mode == "forkserver-types":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["__main__", "torch", "fcp_data.sampler", "fcp_data.collator",
                                    type(dataset).__module__, type(collate).__module__])
        forkserver.ensure_running()
    else:
        ctx = worker_context(2, dataset, collate)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=collate,
                        multiprocessing_context=ctx, timeout=120)
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t0
    for _ in it:
        pass
    t1 = time.perf_counter()
    it = iter(loader)
    next(it)
    second = time.perf_counter() - t1
    for _ in it:
        pass
    epoch = time.perf_counter() - t1
    print(json.dumps({"first": first, "second": second, "epoch": epoch,
                      "method": ctx.get_start_method() if ctx is not None else "default (fork)",
                      "affected": fork_may_deadlock()}))
"""


def run_mode(mode: str, config: str) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, mode, config], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"{mode}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=positive_int, default=5, help="runs of each mode, interleaved (default 5)")
    p.add_argument("--config", type=existing_file, default=str(ROOT / "examples" / "configs" / "qwen2_5_vl-tiny.json"),
                   help="the model config whose collate function the workers run (default "
                        "examples/configs/qwen2_5_vl-tiny.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(args.runs):
        for mode in MODES:
            results[mode].append(run_mode(mode, args.config))
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("first", "second", "epoch")}
           for m, rs in results.items()}
    print(f"python {sys.version.split()[0]}, fork deadlock possible here: {results['worker_context'][0]['affected']}; "
          f"worker_context's method: {results['worker_context'][0]['method']}; {args.runs} runs per mode")
    print(f"{'mode':<18} {'epoch 0 first batch':>20} {'epoch 1 first batch':>20} {'epoch 1':>10}")
    for m in MODES:
        print(f"{m:<18} {med[m]['first']:>19.3f}s {med[m]['second']:>19.3f}s {med[m]['epoch']:>9.3f}s")
    for m in MODES[1:]:
        print(f"{m} / fork: epoch 0 first batch {med[m]['first'] / med['fork']['first']:.2f}x, epoch 1 first batch "
              f"{med[m]['second'] / med['fork']['second']:.2f}x, epoch 1 {med[m]['epoch'] / med['fork']['epoch']:.2f}x")
    return 0


if __name__ == "__main__":
    run(main)
