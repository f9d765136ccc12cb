r"""Train a torchtitan decoder (Qwen3, Llama 3 or DeepSeek-V3) with FCP on a text length index: the loop to copy.

    torchrun --standalone --nproc-per-node 2 examples/train_torchtitan.py --steps 5          # CPU, gloo
    torchrun --nproc-per-node 8 examples/train_torchtitan.py --model llama3 --flavor 8B --data my-index \
        --reducer fsdp2 --tokens-per-rank 32768 --cost cost.json                       # GPUs (never run by us)

torchtitan builds the model from its own registry (``torchtitan.models.<model>.model_registry(flavor)``);
``apply_fcp`` puts FCP's ring attention in place of every attention module's inner attention. Everything else is
FCP's: FCPSampler → FCPDataset → FCPCollator for the data, ``train_step`` with a reducer (all-reduce, DDP or FSDP2)
for the step, ``fcp_exec.checkpoint`` for checkpoints (model and optimizer through torch.distributed.checkpoint,
each rank's sampler state): ``--resume DIR/step-K`` continues exactly. torchtitan's ``Trainer`` is not used here;
to train with it and its command line instead, see ``examples/torchtitan_fcp.py`` (``fcp_config``).
The model is randomly initialised (load a checkpoint through torchtitan's state-dict adapter for real weights).
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset, bundled_index
from fcp_data.presets import HARDWARE, ModelConfig
from fcp_data.workers import worker_context
from fcp_exec.checkpoint import load_checkpoint, save_checkpoint
from fcp_exec.integrations.torchtitan import apply_fcp, fcp_loss, model_shape
from fcp_exec.launch import init_distributed, settle_collectives
from fcp_exec.optim import check_finite, clip_grad_norm, lr_at, set_lr
from fcp_exec.script import (ArgumentParser, both_or_neither, count, hardware_or_cost, nonempty, nonnegative_float,
                             output_dir, positive_int, run_main)
from fcp_exec.skips import leave_out_later
from fcp_exec.step import eval_step, make_reducer, train_step


def build_model(model: str, flavor: str, layers: int | None, vocab: int, device: torch.device, mtp: int = 0):
    """torchtitan's ``model`` / ``flavor`` (its first ``layers`` blocks when given; DeepSeek-V3 with ``mtp``
    multi-token-prediction modules), with FCP's attention, and its shape for the cost model (``model_shape``)."""
    from torchtitan.models.common.attention import ScaledDotProductAttention

    family = importlib.import_module(f"torchtitan.models.{model}")
    flavors = getattr(family, f"{model.replace('_', '')}_configs", {})
    if flavor not in flavors:
        raise ValueError(f"torchtitan's {model} has no flavor {flavor!r}; its flavors: {', '.join(flavors)}")
    if mtp and model != "deepseek_v3":
        raise ValueError(f"--mtp-layers is DeepSeek-V3's (torchtitan's {model} has no multi-token prediction)")
    cfg = (family.model_registry(flavor, num_mtp_layers=mtp) if mtp else family.model_registry(flavor)).model
    if vocab > cfg.vocab_size:
        raise ValueError(f"the index's token ids go up to {vocab - 1} but {model} {flavor} has vocab_size "
                         f"{cfg.vocab_size}: index the data with the model's tokenizer")
    if layers:
        if layers > len(cfg.layers):  # a slice would keep all of them without a word
            raise ValueError(f"--layers {layers}: torchtitan's {model} {flavor!r} has {len(cfg.layers)} blocks "
                             f"(give 1 … {len(cfg.layers)}, or 0 for all)")
        cfg.layers = cfg.layers[:layers]
    for layer in cfg.layers + list(getattr(cfg, "mtp_layers", [])):  # the inner attention FCP replaces: SDPA's
        # config builds nothing (flex would compile)
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    with torch.device(device):
        return apply_fcp(cfg.build()), model_shape(cfg)


def forever(loader: DataLoader):
    """The loader's micro-batches across epochs, from the sampler's position (a loaded checkpoint's too)."""
    while True:
        yield from loader


def build_parser() -> ArgumentParser:
    """The options (a bad value is one line on stderr and exit 2, before any work starts)."""
    p = ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # --help: how to run it, what it does
    p.add_argument("--model", choices=("qwen3", "llama3", "deepseek_v3"), default="qwen3",
                   help="a torchtitan model family (DeepSeek-V3: multi-latent attention, MoE; with --mtp-layers)")
    p.add_argument("--mtp-layers", type=count, default=0,
                   help="DeepSeek-V3's multi-token-prediction modules (each token's look-ahead tokens come from the "
                        "collator; the loss adds torchtitan's MTPLoss terms, mtp_scale 0.3)")
    p.add_argument("--flavor", type=nonempty, default="debugmodel",
                   help="its registry flavor (debugmodel, 0.6B, 8B, ...)")
    p.add_argument("--layers", type=count, default=2, help="keep the first N blocks (0: all; the CPU default is 2)")
    p.add_argument("--data", type=nonempty, default=None,
                   help="a text length index (default: the bundled text samples)")
    p.add_argument("--reducer", choices=("allreduce", "ddp", "fsdp2"), default="fsdp2",
                   help="how gradients are synchronised: allreduce (fcp's own), ddp or fsdp2 (default fsdp2)")
    p.add_argument("--cost", type=nonempty, default=None,
                   help="cost-model JSON from `fcp profile` (default: this model's own preset on --hardware)")
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
    p.add_argument("--eval-batches", type=count, default=1, help="global batches of validation after training")
    p.add_argument("--checkpoint", type=output_dir, default=None,
                   help="folder for checkpoints (DIR/step-K), with --checkpoint-every")
    p.add_argument("--checkpoint-every", type=count, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", type=nonempty, default=None,
                   help="a checkpoint folder (DIR/step-K) to continue from, at step K")
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
    data = IndexedDataset(args.data or bundled_index("text"))
    def loader_of(seed: int, workers: int) -> tuple[FCPSampler, DataLoader]:
        sampler = FCPSampler(data.index, cost_model=cost, global_batch_size=args.global_batch_size, seed=seed,
                             on_overlong="truncate")
        dataset = FCPDataset(data)
        collate = FCPCollator(pad_token_id=data.pad_token_id, sample_labels=data.has_labels,
                              future_tokens=args.mtp_layers)
        return sampler, DataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate,
                                   multiprocessing_context=worker_context(workers, dataset, collate))

    model, shape = build_model(args.model, args.flavor, args.layers, data.spec.tokenizer().get_vocab_size(), device,
                               args.mtp_layers)
    cost = (CostModel.load(args.cost) if args.cost else CostModel.preset(ModelConfig(**shape), args.hardware)).replace(
        tokens_per_rank=args.tokens_per_rank)
    sampler, loader = loader_of(0, 2)
    model, reducer = make_reducer(args.reducer, model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    start = load_checkpoint(Path(args.resume), model, opt, sampler) if args.resume else 0
    if start >= args.steps:  # a run that trains nothing must not end as if it had
        raise ValueError(f"--resume {args.resume} is at step {start}; --steps {args.steps} leaves nothing to train")
    batches = forever(loader)
    for step in range(start, args.steps):
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
            save_checkpoint(Path(args.checkpoint) / f"step-{step + 1}", step + 1, model, opt, sampler, res)
    batches.close()  # stops the DataLoader's workers now

    val_sampler, val_loader = loader_of(1, 0)  # validation: its own sampler (seed 1), forwards only
    val_batches = iter(val_loader)
    model.eval()
    for k in range(min(args.eval_batches, val_sampler.num_global_batches())):
        res = eval_step(model, val_batches, fcp_loss, pad_token_id=data.pad_token_id)
        if rank == 0:
            print(f"eval {k} loss {res.loss:.4f} tokens {res.num_tokens}", flush=True)
    settle_collectives()
    dist.destroy_process_group()


if __name__ == "__main__":
    run_main(main)  # a bad index, cost file or checkpoint: one line on stderr and exit 2
