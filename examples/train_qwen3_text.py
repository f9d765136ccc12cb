r"""Train a Qwen3 or Llama model with FCP on a text length index: the pattern to copy into your own trainer.

    torchrun --standalone --nproc-per-node 2 examples/train_qwen3_text.py --steps 5
    torchrun --nproc-per-node 8 examples/train_qwen3_text.py --config llama/config.json --data my-index \
        --reducer fsdp2 --cost cost.json          # index: `fcp index corpus.jsonl --spec text --out my-index`
                                                  # cost:  `fcp profile --model hf:llama/config.json --out cost.json`
    SFT: an index built with `--prompt-field` or `--chat-field` carries labels; the collator trains on them
    (`sample_labels=data.has_labels`) and train_step counts them over the global batch.
    Checkpoints: `--checkpoint DIR --checkpoint-every N` writes DIR/step-K (model and optimizer through
    torch.distributed.checkpoint, and each rank's FCPSampler state), `--resume DIR/step-K` continues at step K
    exactly (same data, same losses as the run that never stopped).

``--config`` is a config.json (random weights) or a checkpoint folder, whose weights are loaded (``load_model``).
Every rank computes the same plan; each micro-batch puts this rank in one CP group (ring attention inside it)
or leaves it idle (train_step then runs a zero-weighted dummy so DDP/FSDP2 collectives stay in lock-step).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset, bundled_index
from fcp_data.presets import HARDWARE
from fcp_data.workers import worker_context
from fcp_exec.checkpoint import load_checkpoint, save_checkpoint, save_hf_model
from fcp_exec.integrations.hf import apply_fcp, fcp_loss, load_config, load_model
from fcp_exec.launch import init_distributed, settle_collectives
from fcp_exec.optim import check_finite, clip_grad_norm, lr_at, set_lr
from fcp_exec.script import (ArgumentParser, both_or_neither, count, hardware_or_cost, nonempty, nonnegative_float,
                             output_dir, positive_int, run_main)
from fcp_exec.skips import leave_out_later
from fcp_exec.step import eval_step, make_reducer, train_step
from fcp_exec.train_data import check_index_fits


def forever(loader: DataLoader):
    """The loader's micro-batches across epochs (a global batch never straddles two), from the sampler's position:
    each iter() continues where the sampler stands (a loaded checkpoint's position too) and, once an epoch is done,
    starts the next one."""
    while True:
        yield from loader


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
    p.add_argument("--reducer", choices=("allreduce", "ddp", "fsdp2", "fsdp1"), default="allreduce",
                   help="how gradients are synchronised: allreduce (fcp's own), ddp, fsdp2 or fsdp1 (default allreduce)")
    p.add_argument("--cost", type=nonempty, default=None,
                   help="cost-model JSON from `fcp profile` (default: this model's own preset on --hardware, "
                        "CostModel.preset(model.config, HW))")
    p.add_argument("--hardware", choices=tuple(HARDWARE), default=None,
                   help="the hardware preset the model's cost model is derived for, without --cost (default h100)")
    p.add_argument("--tokens-per-rank", type=positive_int, default=1024,
                   help="memory budget per rank; longer documents are cut")
    p.add_argument("--global-batch-size", type=positive_int, default=8,
                   help="sequences per optimizer step, over all ranks (default 8)")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="optimizer steps to train, counted from 0 (a resumed run goes on to this step; default 5)")
    p.add_argument("--lr", type=nonnegative_float, default=1e-3,
                   help="peak learning rate (cosine decay to lr/10 after warm-up)")
    p.add_argument("--warmup-steps", type=count, default=1, help="linear learning-rate warm-up steps")
    p.add_argument("--max-grad-norm", type=nonnegative_float, default=1.0,
                   help="clip the global gradient norm (0: off)")
    p.add_argument("--eval-data", type=nonempty, default=None,
                   help="a text length index to validate on (default: the training data)")
    p.add_argument("--eval-batches", type=count, default=1, help="global batches of validation after training")
    p.add_argument("--checkpoint", type=output_dir, default=None,
                   help="folder for checkpoints (DIR/step-K), with --checkpoint-every")
    p.add_argument("--checkpoint-every", type=count, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", type=nonempty, default=None,
                   help="a checkpoint folder (DIR/step-K) to continue from, at step K")
    p.add_argument("--save-model", type=output_dir, default=None,
                   help="after training, the model as a transformers checkpoint "
                   "folder (from_pretrained loads it; FSDP2 shards gathered)")
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

    # data: a length index → FCPSampler (plans CP groups per micro-batch) → FCPCollator (this rank's zigzag shard)
    data = IndexedDataset(args.data or bundled_index("text"))
    config = load_config(args.config)
    check_index_fits(config, data, "the index")  # its vocabulary; images/videos a text model cannot take
    val_data = IndexedDataset(args.eval_data) if args.eval_data else data  # checked now, not after the training
    if args.eval_data:
        check_index_fits(config, val_data, "the --eval-data index")
    cost = CostModel.load(args.cost) if args.cost else CostModel.preset(config, args.hardware)
    sampler = FCPSampler(data.index, cost_model=cost.replace(tokens_per_rank=args.tokens_per_rank),
                         global_batch_size=args.global_batch_size, seed=0, on_overlong="truncate")
    dataset, collate = FCPDataset(data), FCPCollator(pad_token_id=data.pad_token_id, sample_labels=data.has_labels)
    # worker_context: a forkserver where this Python's fork can deadlock a worker of a multi-threaded rank
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=collate,
                        multiprocessing_context=worker_context(2, dataset, collate))

    # model: ring attention through transformers' AttentionInterface, then the reducer's wrapper
    model = apply_fcp(load_model(args.config, config=config, seed=0).to(device))
    model, reducer = make_reducer(args.reducer, model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start = load_checkpoint(Path(args.resume), model, opt, sampler) if args.resume else 0
    if start >= args.steps:  # a run that trains nothing must not end as if it had
        raise ValueError(f"--resume {args.resume} is at step {start}; --steps {args.steps} leaves nothing to train")
    batches = forever(loader)
    for step in range(start, args.steps):
        # one global batch: every micro-batch forward/backward, loss = Σ token losses / num_tokens_global
        res = train_step(model, batches, fcp_loss, reducer, pad_token_id=data.pad_token_id)
        leave_out_later(sampler, res)  # a sample skipped here is not read again in later epochs
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
            # the sampler's state after this step's global batch (sampler.state_after(res)), not state_dict():
            # the DataLoader's workers already hold later batches
            save_checkpoint(Path(args.checkpoint) / f"step-{step + 1}", step + 1, model, opt, sampler, res)
    batches.close()  # stops the DataLoader's workers now, not during interpreter shutdown

    # validation: its own sampler and loader the same way; eval_step = the forwards only, the global-batch mean loss
    val_sampler = FCPSampler(val_data.index, cost_model=cost.replace(tokens_per_rank=args.tokens_per_rank),
                             global_batch_size=args.global_batch_size, seed=1, on_overlong="truncate")
    val_loader = DataLoader(FCPDataset(val_data), batch_sampler=val_sampler,
                            collate_fn=FCPCollator(pad_token_id=val_data.pad_token_id, sample_labels=val_data.has_labels))
    val_batches = iter(val_loader)
    model.eval()
    for k in range(min(args.eval_batches, val_sampler.num_global_batches())):
        res = eval_step(model, val_batches, fcp_loss, pad_token_id=val_data.pad_token_id)
        if rank == 0:
            print(f"eval {k} loss {res.loss:.4f} tokens {res.num_tokens}", flush=True)
    if args.save_model:  # every rank (FSDP2 gathers the shards), rank 0 writes
        save_hf_model(model, args.save_model)
    settle_collectives()  # gloo: no collective's cleanup pending when the DDP model's reference to the group goes
    dist.destroy_process_group()


if __name__ == "__main__":
    run_main(main)  # a bad index, cost file or checkpoint: one line on stderr and exit 2
