"""FCPTrainer (a transformers.Trainer) against fcp's own training loop, side by side on the same processes.

Both train the same tiny Qwen3 (``examples/configs/qwen3-tiny.json``, float32) on the bundled text samples' length
index (``fcp index samples/text.jsonl --spec text``; 55 documents of 10–6,570 tokens, cut at 2 × ``--tokens-per-rank``)
and the same global batches, with DDP on ``--nproc`` gloo processes: (A) ``FCPTrainer.train()`` (Accelerate's DDP,
the Trainer's AdamW, clipping at 1.0, constant schedule, logging every ``--logging-steps``); (B) the loop of the
examples: ``make_reducer("ddp")``, ``train_step``, clipping at 1.0, ``AdamW.step()``. Blocks of ``--steps`` steps alternate A, B, A, B ... (``--blocks``
each) so load changes hit both alike; a step's time is the wall time from its start to the next step's start on rank
0 (the Trainer's ``on_step_begin`` callback; the same points in B), the first step of each block left out (DataLoader
start-up, first-touch allocations). Prints the median step time of each and their ratio, and the losses of the first
block of each (they must agree: the same model trained on the same batches).

Run: ``python benchmarks/bench_hf_trainer.py`` (about 20 s on 2 cores).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import parser, positive_int, run  # noqa: E402

CONFIG = ROOT / "examples" / "configs" / "qwen3-tiny.json"


def _data(index: str):
    from fcp_data import IndexedDataset
    from fcp_exec.integrations.hf import load_config

    return load_config(CONFIG), IndexedDataset(index)


def _trainer_block(opts) -> tuple[list[float], list[float]]:
    """(step times, losses) of one FCPTrainer.train() of opts.steps steps on this rank."""
    from accelerate.state import AcceleratorState
    from transformers import TrainerCallback, TrainingArguments

    from fcp_data import CostModel
    from fcp_exec.integrations.hf import build_model
    from fcp_exec.integrations.hf_trainer import FCPTrainer

    AcceleratorState._reset_state(reset_partial_state=False)
    config, data = _data(opts.index)
    marks: list[float] = []

    class Mark(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            marks.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kw):
            marks.append(time.perf_counter())

    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="fcp-bench-"), max_steps=opts.steps, learning_rate=1e-3,
                             lr_scheduler_type="constant", max_grad_norm=1.0, logging_steps=opts.logging_steps, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True, seed=0)
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=opts.tokens_per_rank)
    trainer = FCPTrainer(model=build_model(config, seed=0), args=args, train_dataset=data, cost_model=cost,
                         global_batch_size=opts.gbs, sampler_kwargs={"on_overlong": "truncate"}, callbacks=[Mark()])
    trainer.train()
    return [b - a for a, b in zip(marks, marks[1:])], [r.loss for r in trainer.fcp_steps]


def _loop_block(opts) -> tuple[list[float], list[float]]:
    """(step times, losses) of opts.steps steps of fcp's own loop (the examples') on this rank."""
    import torch
    from torch.utils.data import DataLoader

    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.integrations.hf import apply_fcp, build_model, fcp_loss
    from fcp_exec.step import make_reducer, train_step

    config, data = _data(opts.index)
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=opts.tokens_per_rank)
    sampler = FCPSampler(data, cost_model=cost, global_batch_size=opts.gbs, seed=0, on_overlong="truncate")
    loader = DataLoader(FCPDataset(data), batch_sampler=sampler,
                        collate_fn=FCPCollator(pad_token_id=data.pad_token_id))
    model, reducer = make_reducer("ddp", apply_fcp(build_model(config, seed=0)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    batches, marks, losses = iter(loader), [], []
    for _ in range(opts.steps):
        marks.append(time.perf_counter())
        res = train_step(model, batches, fcp_loss, reducer, pad_token_id=data.pad_token_id)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(res.loss)
    marks.append(time.perf_counter())
    return [b - a for a, b in zip(marks, marks[1:])], losses


def _work(opts) -> dict:
    out = {"trainer": [], "loop": [], "losses": {}}
    for _ in range(opts.blocks):
        for name, block in (("trainer", _trainer_block), ("loop", _loop_block)):
            times, losses = block(opts)
            out[name] += times[1:]
            out["losses"].setdefault(name, losses)
    return out


def build_parser():
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--nproc", type=positive_int, default=2, help="gloo processes (default 2)")
    p.add_argument("--steps", type=positive_int, default=12, help="steps per block (default 12)")
    p.add_argument("--blocks", type=positive_int, default=5, help="blocks of each, alternating (default 5)")
    p.add_argument("--tokens-per-rank", type=positive_int, default=1024,
                   help="planner memory budget per rank (default 1024)")
    p.add_argument("--gbs", type=positive_int, default=8, help="global batch size (default 8; 6 steps per epoch)")
    p.add_argument("--logging-steps", type=positive_int, default=10, help="the Trainer logs every N steps (default 10)")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    from fcp_data import bundled_path
    from fcp_data.index import build_index
    from fcp_exec.launch import launch

    opts.index = str(Path(tempfile.mkdtemp(prefix="fcp-bench-index-")) / "text")
    build_index([str(bundled_path("samples") / "text.jsonl")], "text", opts.index, progress=False)

    res = launch(_work, opts.nproc, opts, backend="gloo", timeout=1800.0, preload=("transformers.modeling_utils",))[0]
    t, l = statistics.median(res["trainer"]), statistics.median(res["loop"])
    a, b = res["losses"]["trainer"], res["losses"]["loop"]
    gap = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    print(f"| runner | median step [ms] | steps timed |\n|---|---:|---:|\n"
          f"| FCPTrainer (transformers.Trainer, Accelerate DDP) | {1e3 * t:.1f} | {len(res['trainer'])} |\n"
          f"| fcp loop (make_reducer('ddp') + train_step) | {1e3 * l:.1f} | {len(res['loop'])} |\n\n"
          f"ratio FCPTrainer / loop: {t / l:.3f}; losses of the first block agree within {gap:.1e} (relative); "
          f"logging every {opts.logging_steps} steps")
    return 0


if __name__ == "__main__":
    run(main)
