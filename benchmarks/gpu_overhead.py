"""Where a small micro-batch's time goes on a GPU: the host-side floor of one layer's forward+backward.

``python benchmarks/gpu_overhead.py [--device cuda|cpu] [--preset Qwen3-1.7B] [--out FILE]``

``fcp profile --layer-like PRESET`` times one transformer layer shaped like a preset (fcp's own ``TinyLLM`` layer
with ring attention, degree 1). On an H200 a Qwen3-1.7B-shaped layer took 4.4 ms for 256 tokens — about 40 times
its arithmetic — and the same for 4 × 256 tokens, so the small points measure the host, not the GPU. This script
shows where that floor comes from, for the same layer and inputs as the profiler:

1. per cell (documents × tokens): median wall ms of forward+backward (``torch.cuda.synchronize`` after each), the
   sum of the GPU kernels' own time in one step (``torch.profiler``), the number of kernels launched, and the host
   syncs one step makes (``torch.cuda.set_sync_debug_mode("warn")``);
2. for the smallest cell, the operators that took the most host time (``torch.profiler`` key averages).

A wall time far above the kernel time with few syncs means launch overhead (many small kernels, Python); many
syncs mean the host waits on the GPU inside the step. Prints a report; ``--out`` also writes it as JSON.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]
from _args import output_file, parser, positive_int, run  # noqa: E402
from gpu_check import _count_host_syncs  # noqa: E402  (benchmarks/ is not a package)


def _cells(device, preset: str, dtype, cells):
    from fcp_exec.profiler import _grid_shards, _profile_model, _step_fn

    net, cfg, _, _ = _profile_model("tiny-llm", preset, dtype, 0)
    net = net.to(device)
    step = _step_fn(net, "tiny-llm", preset)
    grid = _grid_shards(cfg, 1, 0, [1], cells, device, 0)
    out = []
    for k, s_pad, _, group, local in grid:
        ids, pos, labels, cu = local
        out.append(((k, s_pad), lambda ids=ids, pos=pos, labels=labels, cu=cu: step(ids, pos, labels, cu, group, 0)))
    return net, out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _syncs(fn, device) -> int:
    return _count_host_syncs(fn)[0] if device.type == "cuda" else 0


def _kernel_time(fn, device) -> tuple[float, int, list]:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        _sync(device)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    ms = sum(e.device_time for e in kernels) / 1e3  # microseconds -> ms
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
    return ms, len(kernels), table


def build_parser():
    from fcp_data.presets import MODELS

    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the layer runs (default cuda when torch sees a GPU, else cpu)")
    ap.add_argument("--preset", choices=tuple(MODELS), default="Qwen3-1.7B", metavar="PRESET",
                    help=f"layer shape: a model preset of `fcp presets` ({', '.join(MODELS)})")
    ap.add_argument("--iters", type=positive_int, default=10, help="timed steps per cell (median), after 3 warm-up")
    ap.add_argument("--out", type=output_file, default=None, help="also write the report as JSON (default: print only)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    cells = [(1, 256), (4, 256), (16, 256), (1, 4096)] if cuda else [(1, 64), (4, 64)]
    net, steps = _cells(device, args.preset, dtype, cells)
    rows, report = [], {"device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
                        "preset": args.preset, "dtype": str(dtype)}
    for (k, s), fn in steps:
        for _ in range(3):
            fn()
        _sync(device)
        walls = []
        for _ in range(args.iters):
            t = time.perf_counter()
            fn()
            _sync(device)
            walls.append(1e3 * (time.perf_counter() - t))
        kms, nk, table = _kernel_time(fn, device)
        row = {"docs": k, "tokens_per_doc": s, "wall_ms": statistics.median(walls), "kernel_ms": kms,
               "kernels": nk, "host_syncs": _syncs(fn, device)}
        rows.append(row)
        print(f"{k:3d} x {s:5d} tokens: wall {row['wall_ms']:8.2f} ms, GPU kernels {kms:8.2f} ms in {nk} launches, "
              f"host syncs {row['host_syncs']}", flush=True)
        if len(rows) == 1:
            report["top_host_ops_smallest_cell"] = table
    report["cells"] = rows
    print(report["top_host_ops_smallest_cell"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    run(main)
