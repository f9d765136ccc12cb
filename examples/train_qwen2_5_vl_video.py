r"""Train a Qwen2.5-VL model with FCP on videos and images: the pattern to copy into your own trainer.

    torchrun --standalone --nproc-per-node 2 examples/train_qwen2_5_vl_video.py --steps 5
    torchrun --nproc-per-node 8 examples/train_qwen2_5_vl_video.py --config qwen2.5-vl/config.json \
        --data my-index --reducer fsdp2     # index: `fcp index shards/*.tar --spec qwen2.5-vl --out my-index`
    # video SFT (LLaVA lines {"video": "a.mp4", "conversations": [...]}): labels on the assistant turns
    fcp index llava.jsonl --spec qwen2.5-vl --chat-field conversations --media-root videos/ --out sft-index
    Checkpoints: `--checkpoint DIR --checkpoint-every N`, then `--resume DIR/step-K` (fcp_exec.checkpoint).
    Damaged videos: each one that fails to read is skipped (the run goes on) and left out of the later epochs;
    `--read-errors-out bad.jsonl` records them, and a next run with `--exclude bad.jsonl` leaves them out at once.

``--config`` is a config.json (random weights) or a checkpoint folder, whose weights are loaded (``load_model``).
InternVL works the same way (``--config examples/configs/internvl-tiny.json``, an index built with ``--spec internvl3``),
and LLaVA-OneVision videos (``--config examples/configs/llava_onevision-tiny.json``, ``--spec llava-onevision``);
Qwen3-VL and Qwen3-VL-MoE with ``--spec qwen3-vl`` (``examples/configs/qwen3_vl_moe-tiny.json``; with
``output_router_logits`` in its text config the router's load-balancing loss is trained too, over the global batch).
A CP group's frames are encoded once, split over its ranks by whole frames, and every visual row is sent to the
rank that holds its placeholder token; 3-D rope positions come from the installed transformers' own
``get_rope_index`` (hf_collator). Labels whose target is a visual placeholder are left out of the loss.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPDataset, FCPSampler, IndexedDataset, bundled_index
from fcp_data.presets import HARDWARE
from fcp_data.workers import worker_context
from fcp_exec.checkpoint import load_checkpoint, save_checkpoint, save_hf_model
from fcp_exec.integrations.hf import apply_fcp, fcp_loss, load_config, load_model
from fcp_exec.integrations.hf_positions import hf_collator
from fcp_exec.launch import init_distributed, settle_collectives
from fcp_exec.optim import check_finite, clip_grad_norm, lr_at, set_lr
from fcp_exec.script import (ArgumentParser, both_or_neither, count, hardware_or_cost, nonempty, nonnegative_float,
                             output_dir, positive_int, run_main)
from fcp_exec.skips import leave_out_later
from fcp_exec.step import make_reducer, train_step
from fcp_exec.train_data import HF_SPECS, check_index_fits


def forever(loader: DataLoader):
    """The loader's micro-batches across epochs (a global batch never straddles two), from the sampler's position
    (a loaded checkpoint's too); once an epoch is done, the next iter() starts the next one."""
    while True:
        yield from loader


def build_parser() -> ArgumentParser:
    """The options (a bad value is one line on stderr and exit 2, before any work starts)."""
    p = ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # --help: how to run it, what it does
    p.add_argument("--config", type=nonempty, default=str(Path(__file__).parent / "configs" / "qwen2_5_vl-tiny.json"),
                   help="a qwen2_5_vl (or qwen2_vl / qwen3_vl / internvl / llava_onevision) config.json (random "
                   "weights) or checkpoint folder (its weights)")
    p.add_argument("--data", type=nonempty, default=None,
                   help="a length index built with the model's spec (default: bundled samples)")
    p.add_argument("--reducer", choices=("allreduce", "ddp", "fsdp2", "fsdp1"), default="allreduce",
                   help="how gradients are synchronised: allreduce (fcp's own), ddp, fsdp2 or fsdp1 (default allreduce)")
    p.add_argument("--cost", type=nonempty, default=None,
                   help="cost-model JSON from `fcp profile` (default: this model's own preset on --hardware, "
                        "CostModel.preset(model.config, HW))")
    p.add_argument("--hardware", choices=tuple(HARDWARE), default=None,
                   help="the hardware preset the model's cost model is derived for, without --cost "
                        "(default h100; `fcp presets --model hf:CONFIG` lists the coefficients)")
    p.add_argument("--tokens-per-rank", type=positive_int, default=1152,
                   help="memory budget per rank; a video longer than all ranks together is skipped (it cannot be cut)")
    p.add_argument("--global-batch-size", type=positive_int, default=8,
                   help="sequences per optimizer step, over all ranks (default 8)")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="optimizer steps to train, counted from 0 (a resumed run goes on to this step; default 5)")
    p.add_argument("--lr", type=nonnegative_float, default=1e-3,
                   help="peak learning rate (cosine decay to lr/10 after warm-up)")
    p.add_argument("--warmup-steps", type=count, default=1, help="linear learning-rate warm-up steps")
    p.add_argument("--max-grad-norm", type=nonnegative_float, default=1.0,
                   help="clip the global gradient norm (0: off)")
    p.add_argument("--checkpoint", type=output_dir, default=None,
                   help="folder for checkpoints (DIR/step-K), with --checkpoint-every")
    p.add_argument("--checkpoint-every", type=count, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", type=nonempty, default=None,
                   help="a checkpoint folder (DIR/step-K) to continue from, at step K")
    p.add_argument("--save-model", type=output_dir, default=None,
                   help="after training, the model as a transformers checkpoint "
                   "folder (from_pretrained loads it; FSDP2 shards gathered)")
    p.add_argument("--read-errors-out", type=nonempty, default=None,
                   help="append a JSON line per video that fails to read (recorded and skipped, never the end of the run)")
    p.add_argument("--exclude", type=nonempty, default=None,
                   help="leave out the videos listed in FILE (an earlier --read-errors-out)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the checks that involve two options."""
    p = build_parser()
    args = p.parse_args(argv)
    hardware_or_cost(p, args)  # --hardware beside --cost would be dropped without a word
    both_or_neither(p, args, "checkpoint", "checkpoint_every")  # one without the other would save nothing
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    device = init_distributed()  # set_device, NCCL/HCCL/gloo by device, eager init + a warm-up barrier
    rank = dist.get_rank()

    config = load_config(args.config)
    if config.model_type not in HF_SPECS:  # the bundled videos are indexed with each family's own token rule
        raise ValueError(f"--config: a {config.model_type} model has no video spec; use one of {', '.join(HF_SPECS)}")
    spec = HF_SPECS[config.model_type]
    data = IndexedDataset(args.data or bundled_index(spec))  # input_ids with placeholders, pixel patches (tiles), grids
    check_index_fits(config, data, args.data or "the bundled samples")  # another family's spec: one line, not a worker's
    cost = CostModel.load(args.cost) if args.cost else CostModel.preset(config, args.hardware)
    # the sampler counts label tokens exactly, visual placeholders excluded, from the index (no data is read)
    sampler = FCPSampler(data.index, cost_model=cost.replace(tokens_per_rank=args.tokens_per_rank),
                         global_batch_size=args.global_batch_size, seed=0, on_overlong="drop", exclude=args.exclude)
    dataset = FCPDataset(data, errors_path=args.read_errors_out)
    collate = hf_collator(config, pad_token_id=data.pad_token_id, sample_labels=data.has_labels)
    # worker_context: a forkserver where this Python's fork can deadlock a worker of a multi-threaded rank
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=collate,
                        multiprocessing_context=worker_context(2, dataset, collate))

    model = apply_fcp(load_model(args.config, config=config, seed=0).to(device))
    model, reducer = make_reducer(args.reducer, model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start = load_checkpoint(Path(args.resume), model, opt, sampler) if args.resume else 0
    if start >= args.steps:  # a run that trains nothing must not end as if it had
        raise ValueError(f"--resume {args.resume} is at step {start}; --steps {args.steps} leaves nothing to train")
    batches = forever(loader)
    for step in range(start, args.steps):
        res = train_step(model, batches, fcp_loss, reducer, pad_token_id=data.pad_token_id)
        leave_out_later(sampler, res)  # a video skipped here is not read (nor planned) again in later epochs
        grad_norm = clip_grad_norm(model, args.max_grad_norm)  # after the reducer: the global norm, on every rank
        lr = lr_at(step, lr=args.lr, steps=args.steps, warmup_steps=args.warmup_steps, schedule="cosine",
                   min_lr=args.lr / 10)  # a function of the step: a resumed run continues the schedule
        check_finite(step, res.loss, grad_norm, lr)  # a NaN/inf loss stops the run before opt.step
        set_lr(opt, lr)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            print(f"step {step} loss {res.loss:.6f} tokens {res.num_tokens} micro-batches {len(res.groups)} "
                  f"idle on rank 0: {res.num_idle} lr {lr:.2e} grad norm {grad_norm:.4f}", flush=True)
        if args.checkpoint and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0:
            # the sampler's state after this global batch (state_after), not state_dict(): the workers are ahead
            save_checkpoint(Path(args.checkpoint) / f"step-{step + 1}", step + 1, model, opt, sampler, res)
    batches.close()  # stops the DataLoader's workers now, not during interpreter shutdown
    if args.save_model:  # every rank (FSDP2 gathers the shards), rank 0 writes
        save_hf_model(model, args.save_model)
    settle_collectives()  # gloo: no collective's cleanup pending when the DDP model's reference to the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    run_main(main)  # a bad index, cost file or checkpoint: one line on stderr and exit 2
