"""``FCPTrainer`` with ``torch_compile=True`` against eager, side by side on the same 2 gloo processes.

A tiny Qwen3 (``examples/configs/qwen3-tiny.json``, float32) on 12 synthetic documents (global batches of 3, a
micro-batch of 40 tokens per rank: CP rings of 2, single ranks and idle ranks vary from micro-batch to micro-batch)
trains ``--steps`` steps, once eager and once compiled (``--backend``, default inductor), ``--pairs`` times
alternating. Reported per run on rank 0: the whole ``train()`` time (compilation included), the median step time of
the second half (after compilation), Dynamo's compiled graphs (``unique_graphs``) and graph breaks, how often the ring
ran as the op ``torch.ops.fcp.ring_attention`` inside the graph (forward and backward) and eagerly, and the largest
loss difference to the eager run.
On this 2-core CPU a tiny model gains nothing from compiling; what this shows is that compilation happens at the
start and stops (no recompilation per new micro-batch) and that the steps then cost what eager steps cost.

Run: ``python benchmarks/bench_compile.py`` (about a minute on 2 cores).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "exec"))
sys.path.insert(0, str(ROOT / "tests"))  # _requires

from _args import parser, positive_int, run  # noqa: E402


def _run(steps: int, compile_backend: str | None) -> dict:
    import torch
    from accelerate.state import AcceleratorState
    from transformers import TrainerCallback, TrainingArguments

    import test_hf_trainer as T  # the FCPTrainer test's data and cost model
    from fcp_exec.integrations.hf import build_model
    from fcp_exec.integrations.hf_trainer import FCPTrainer

    AcceleratorState._reset_state(reset_partial_state=False)
    torch._dynamo.reset()
    config, data = T._data("qwen3")
    marks: list[float] = []

    class Mark(TrainerCallback):
        def on_step_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_train_end(self, *a, **k):
            marks.append(time.perf_counter())

    kw = dict(T.ARGS, output_dir=tempfile.mkdtemp(prefix="fcp-bench-compile-"), max_steps=steps, logging_steps=steps)
    if compile_backend:
        kw.update(torch_compile=True, torch_compile_backend=compile_backend)
    trainer = FCPTrainer(model=build_model(config, dtype=torch.float32, seed=0), args=TrainingArguments(**kw),
                         train_dataset=data.dataset, train_lengths=data.lengths, cost_model=T._cost(),
                         global_batch_size=T.GBS, pad_token_id=data.pad_token_id, callbacks=[Mark()])
    with T._compile_watched() as seen:  # the ring's runs as the op and eagerly; Dynamo's graphs and breaks
        t0 = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - t0
    step_times = [b - a for a, b in zip(marks, marks[1:])]
    return {"total": total, "steady": statistics.median(step_times[len(step_times) // 2:]), **seen,
            "losses": [r.loss for r in trainer.fcp_steps]}


def _pair(steps: int, backend: str) -> tuple[dict, dict]:
    return _run(steps, None), _run(steps, backend)


BACKENDS = ("inductor", "aot_eager", "eager")  # torch_compile_backend values that run on the CPU


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=positive_int, default=20, help="training steps per run")
    p.add_argument("--pairs", type=positive_int, default=2, help="eager / compiled pairs, run alternating")
    p.add_argument("--backend", choices=BACKENDS, default="inductor", help="torch_compile_backend of the compiled run")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    from fcp_exec.launch import launch

    print(f"load average {os.getloadavg()[0]:.2f}; {opts.steps} steps, backend {opts.backend}")
    for k in range(opts.pairs):
        eager, comp = launch(_pair, 2, opts.steps, opts.backend, timeout=1800.0)[0]
        diff = max(abs(a - b) for a, b in zip(eager["losses"], comp["losses"]))
        for name, r in (("eager", eager), ("compiled", comp)):
            print(f"pair {k} {name:8s} train() {r['total']:6.2f} s  steady step {1e3 * r['steady']:6.1f} ms  "
                  f"graphs {r['graphs']:3d}  graph breaks {r['breaks']:3d}  ring runs: op {r['op']}, eager {r['eager']}")
        print(f"pair {k} largest loss difference compiled - eager: {diff:.2e}")
    return 0


if __name__ == "__main__":
    run(main)
