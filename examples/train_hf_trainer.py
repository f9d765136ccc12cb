r"""Train with the Hugging Face Trainer and FCP: your Trainer script with ``Trainer`` replaced by ``FCPTrainer``.

    torchrun --standalone --nproc-per-node 2 examples/train_hf_trainer.py --max-steps 4
    torchrun --nproc-per-node 8 examples/train_hf_trainer.py --config qwen3/config.json --data my-index \
        --cost cost.json --bf16            # index: `fcp index corpus.jsonl --spec text --out my-index`
    Resume: `--save-steps N` writes OUTPUT/checkpoint-K (the Trainer's own checkpoints), `--resume OUTPUT/checkpoint-K`
    continues at global batch K (the sampler moves there; the same data and losses as the run that never stopped).

One optimizer step is one FCP global batch (``--global-batch-size`` sequences): the sampler plans each of its
micro-batches into CP groups, ring attention runs inside each group, idle ranks run a zero-weighted dummy, and the
gradients are summed once per step by the DDP model Accelerate builds. The optimizer, schedule, clipping, logging
and checkpoints are the Trainer's. ``--config``: a config.json (random weights) or a checkpoint folder (its weights).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch.distributed as dist
from transformers import TrainingArguments

from fcp_data import CostModel, IndexedDataset, bundled_index
from fcp_data.presets import HARDWARE
from fcp_exec.integrations.hf import load_config, load_model
from fcp_exec.integrations.hf_trainer import FCPTrainer
from fcp_exec.launch import init_distributed
from fcp_exec.script import (ArgumentParser, count, hardware_or_cost, nonempty, nonnegative_float, output_dir,
                              positive_int, run_main)


def build_parser() -> ArgumentParser:
    """The options (a bad value is one line on stderr and exit 2, before any work starts)."""
    p = ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # --help: how to run it, what it does
    p.add_argument("--config", type=nonempty, default=str(Path(__file__).parent / "configs" / "qwen3-tiny.json"),
                   help="a config.json (random weights) or checkpoint folder (its weights) of a text model type fcp "
                        "is tested with (qwen3, llama, mistral, gemma2, gpt_oss, deepseek_v3, ...: examples/configs; "
                        "default: a tiny Qwen3)")
    p.add_argument("--data", type=nonempty, default=None,
                   help="a text length index (default: the bundled text samples)")
    p.add_argument("--cost", type=nonempty, default=None,
                   help="cost-model JSON from `fcp profile` (default: this model's own preset on --hardware, "
                        "CostModel.preset(model.config, HW))")
    p.add_argument("--hardware", choices=tuple(HARDWARE), default=None,
                   help="the hardware preset the model's cost model is derived for, without --cost "
                        "(default h100; `fcp presets --model hf:CONFIG` lists the coefficients)")
    p.add_argument("--tokens-per-rank", type=positive_int, default=1024,
                   help="memory budget per rank; longer documents are cut")
    p.add_argument("--global-batch-size", type=positive_int, default=8, help="sequences per optimizer step")
    p.add_argument("--max-steps", type=positive_int, default=4,
                   help="optimizer steps to train (TrainingArguments.max_steps; default 4)")
    p.add_argument("--lr", type=nonnegative_float, default=1e-3, help="peak learning rate (default 1e-3)")
    half = p.add_mutually_exclusive_group()
    half.add_argument("--bf16", action="store_true", help="bf16 autocast (on a GPU or NPU)")
    half.add_argument("--fp16", action="store_true",
                      help="fp16 autocast with Accelerate's loss scaler (on a GPU without bf16; CPU: fp32)")
    p.add_argument("--torch-compile", action="store_true",
                   help="torch.compile the model (the ring attention runs eagerly outside the graph)")
    p.add_argument("--output-dir", type=output_dir, default=None,
                   help="the Trainer's output_dir (default: a temporary folder)")
    p.add_argument("--save-steps", type=count, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", type=nonempty, default=None,
                   help="a checkpoint folder (OUTPUT/checkpoint-K) to continue from")
    p.add_argument("--eval-batches", type=count, default=1, help="global batches of validation after training")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the checks that involve two options."""
    p = build_parser()
    args = p.parse_args(argv)
    hardware_or_cost(p, args)  # --hardware beside --cost would be dropped without a word
    if args.save_steps and not args.output_dir:  # checkpoints in a temporary folder nobody knows of
        p.error("--save-steps needs --output-dir (where the checkpoints go)")
    return args


def resumed_step(folder: str) -> int:
    """The step a Trainer checkpoint folder was saved at (its ``trainer_state.json``); one clear error otherwise."""
    f = Path(folder) / "trainer_state.json"
    try:
        step = json.loads(f.read_text())["global_step"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--resume {folder} is not a Trainer checkpoint (OUTPUT/checkpoint-K): {f.name} cannot be "
                         f"read ({type(e).__name__})") from None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"--resume {folder}: {f.name} has global_step {step!r}, not a step count")
    return step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # the stock Trainer resumed at max_steps trains one more step at learning rate 0: refused, like every example
    if args.resume and (start := resumed_step(args.resume)) >= args.max_steps:
        raise ValueError(f"--resume {args.resume} is at step {start}; --max-steps {args.max_steps} leaves nothing "
                         "to train")

    device = init_distributed()  # the process group first (NCCL/HCCL/gloo by device): Accelerate joins it
    rank = dist.get_rank()
    data = IndexedDataset(args.data or bundled_index("text"))
    config = load_config(args.config)  # FCPTrainer checks that the index fits it (vocabulary, ids, patches)
    cost = CostModel.load(args.cost) if args.cost else CostModel.preset(config, args.hardware)

    targs = TrainingArguments(
        output_dir=args.output_dir or tempfile.mkdtemp(prefix="fcp-trainer-"), max_steps=args.max_steps,
        learning_rate=args.lr, logging_steps=1, report_to=[], seed=0, bf16=args.bf16, fp16=args.fp16, torch_compile=args.torch_compile,
        use_cpu=device.type == "cpu", save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500, disable_tqdm=True)
    model = load_model(args.config, config=config, seed=0)  # a checkpoint folder's weights, or random ones
    trainer = FCPTrainer(model=model, args=targs, train_dataset=data, eval_dataset=data,
                         cost_model=cost.replace(tokens_per_rank=args.tokens_per_rank),
                         global_batch_size=args.global_batch_size, sampler_kwargs={"on_overlong": "truncate"},
                         eval_batches=args.eval_batches)
    trainer.train(resume_from_checkpoint=args.resume)

    first = trainer.state.global_step - len(trainer.fcp_steps)
    for k, res in enumerate(trainer.fcp_steps, start=first):  # trainer.fcp_steps: this run's StepResults
        if rank == 0:
            print(f"step {k} loss {res.loss:.6f} tokens {res.num_tokens} micro-batches {len(res.groups)} "
                  f"idle on rank 0: {res.num_idle}", flush=True)
    if args.eval_batches:
        metrics = trainer.evaluate()
        if rank == 0:
            print(f"eval loss {metrics['eval_loss']:.4f} tokens {metrics['eval_num_tokens']}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    run_main(main)  # a bad index, cost file or checkpoint: one line on stderr and exit 2
