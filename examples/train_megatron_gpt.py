r"""Train a Megatron-core GPT model (Llama-style) with FCP: the pattern to copy into a Megatron-core training loop.

    torchrun --standalone --nproc-per-node 2 examples/train_megatron_gpt.py --steps 5     # CPU, gloo
    torchrun --nproc-per-node 8 examples/train_megatron_gpt.py --data my-index --layers 32 --hidden 4096 \
        --heads 32 --groups 8 --ffn 14336 --tokens-per-rank 32768 --cost cost.json       # GPUs (never run by us)

Megatron sees every rank as data-parallel (tensor/pipeline/context-parallel size 1); FCP forms the context-parallel
groups per micro-batch. What changes in a Megatron-core loop: the layer spec (``fcp_layer_spec``), ``apply_fcp`` on
the model before DDP, ``calculate_per_token_loss=True``, the data (FCPSampler → FCPDataset → FCPCollator), and per
step ``next_global_batch`` + ``forward_step`` in Megatron's own schedule with ``num_microbatches=len(mbs)`` (it can
change from one global batch to the next). Megatron's DDP, ``finalize_model_grads`` and optimizer are used as they
are. On a machine without CUDA, Megatron runs through :mod:`fcp_exec.integrations.megatron_cpu` (float32/float64).

The model is randomly initialised (load a Megatron checkpoint as usual for real weights). The data is a text length
index (default: the bundled text samples, indexed once per node into `$FCP_CACHE` or TMPDIR; the vocabulary is the
index's tokenizer's) or, with
`--data-prefix PREFIX --vocab-size V`, a Megatron indexed dataset as `tools/preprocess_data.py` wrote it (token counts
read from PREFIX.idx, nothing re-tokenized; `fcp simulate --lengths PREFIX.idx` plans on the same counts).
Checkpoints: `--checkpoint DIR --checkpoint-every N` writes DIR/step-K.pt (model, optimizer and the sampler's state
after the global batch the step consumed; rank 0, as every rank holds the same replicas), `--resume DIR/step-K.pt`
continues at step K exactly. With Megatron's distributed optimizer or sharded models use Megatron's own
``dist_checkpointing`` for model and optimizer and store ``sampler.state_after(mbs[-1])`` next to it.
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset, bundled_index
from fcp_data.megatron_indexed import MegatronIndexedDocuments
from fcp_data.presets import HARDWARE, ModelConfig
from fcp_data.workers import worker_context
from fcp_exec.integrations.megatron import apply_fcp, fcp_layer_spec, forward_step, global_loss, next_global_batch
from fcp_exec.launch import init_distributed, settle_collectives
from fcp_exec.script import (ArgumentParser, both_or_neither, count, hardware_or_cost, nonempty, nonnegative_float,
                             output_dir, positive_int, run_main)
from fcp_exec.skips import leave_out_later


def load_data(args, rank: int):
    """``(dataset, lengths for the sampler, vocabulary size, pad id, samples carry labels)``: a Megatron indexed
    dataset (``--data-prefix``: token counts from its .idx, documents from its .bin) or an fcp length index."""
    if args.data_prefix:
        docs = MegatronIndexedDocuments(args.data_prefix)
        return docs, docs, args.vocab_size, 0, False
    data = IndexedDataset(args.data or bundled_index("text"))
    return data, data.index, data.spec.tokenizer().get_vocab_size(), data.pad_token_id, data.has_labels


def build_model(args, vocab_size: int, on_cpu: bool):
    """A Llama-style GPTModel (RoPE, GQA, RMSNorm, SwiGLU) whose core attention is FCP's ring attention."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
        num_query_groups=args.groups, ffn_hidden_size=args.ffn, normalization="RMSNorm", gated_linear_unit=True,
        add_bias_linear=False, attention_dropout=0.0, hidden_dropout=0.0,
        calculate_per_token_loss=True,  # the global-batch mean over tokens, whatever each rank holds
        mtp_num_layers=args.mtp_layers or None, mtp_loss_scaling_factor=0.1,  # DeepSeek-V3's multi-token prediction
        use_cpu_initialization=on_cpu, bf16=args.bf16, fp16=args.fp16,
        params_dtype=torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32,
        # the fused kernels are CUDA-only; on GPUs leave Megatron's defaults (or use the Transformer-Engine spec)
        **({"masked_softmax_fusion": False, "bias_dropout_fusion": False, "apply_rope_fusion": False,
            "bias_activation_fusion": False} if on_cpu else {}))
    spec = fcp_layer_spec(get_gpt_layer_local_spec())
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if args.mtp_layers else None
    torch.manual_seed(0)
    model = GPTModel(config, spec, vocab_size=vocab_size, position_embedding_type="rope", mtp_block_spec=mtp,
                     max_sequence_length=args.tokens_per_rank * dist.get_world_size())
    model = apply_fcp(model.float())  # .float(): Megatron's torch-norm fallback keeps its weights in fp32
    if not on_cpu:  # as Megatron-LM's get_model: the torch-norm fallback's weights are created on the CPU
        model.cuda(torch.cuda.current_device())
    if args.bf16 or args.fp16:  # half weights and activations; fp32 main weights in the optimizer (Megatron-LM's --bf16/--fp16)
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(config, model)
    return model, config


def forever(loader: DataLoader):
    """The loader's micro-batches across epochs, from the sampler's position (a loaded checkpoint's too)."""
    while True:
        yield from loader


def read_checkpoint(path: str, device: torch.device) -> dict:
    """A file --checkpoint wrote (``weights_only``: tensors and plain containers, no code runs); anything else is
    a ValueError naming it."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError):  # OSError (missing, a folder) is already one line
        raise ValueError(f"--resume {path} is not a checkpoint this example wrote (not a torch.save file of tensors "
                         "and plain containers)") from None
    if not isinstance(state, dict) or not {"step", "model", "optimizer", "sampler"} <= set(state):
        raise ValueError(f"--resume {path} is not a checkpoint this example wrote (no step/model/optimizer/sampler)")
    return state


def build_parser() -> ArgumentParser:
    """The options (a bad value is one line on stderr and exit 2, before any work starts)."""
    p = ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # --help: how to run it, what it does
    p.add_argument("--data", type=nonempty, default=None,
                   help="a text length index (default: the bundled text samples)")
    p.add_argument("--data-prefix", type=nonempty, default=None,
                   help="a Megatron indexed dataset instead (PREFIX.bin/.idx of tools/preprocess_data.py); needs "
                        "--vocab-size")
    p.add_argument("--vocab-size", type=positive_int, default=None, help="the model's vocabulary with --data-prefix")
    p.add_argument("--cost", type=nonempty, default=None,
                   help="cost-model JSON from `fcp profile` (default: the preset of the model below on --hardware)")
    p.add_argument("--hardware", choices=tuple(HARDWARE), default=None,
                   help="the hardware preset the model's cost model is derived for, without --cost (default h100)")
    p.add_argument("--tokens-per-rank", type=positive_int, default=1024,
                   help="memory budget per rank; longer documents are cut")
    p.add_argument("--global-batch-size", type=positive_int, default=8,
                   help="sequences per optimizer step, over all ranks (default 8)")
    p.add_argument("--steps", type=positive_int, default=5,
                   help="optimizer steps to train, counted from 0 (a resumed run goes on to this step; default 5)")
    p.add_argument("--lr", type=nonnegative_float, default=1e-3, help="peak learning rate (default 1e-3)")
    p.add_argument("--layers", type=positive_int, default=2, help="transformer layers of the GPT model (default 2)")
    p.add_argument("--hidden", type=positive_int, default=64, help="hidden size, a multiple of --heads (default 64)")
    p.add_argument("--heads", type=positive_int, default=4, help="attention heads, a multiple of --groups (default 4)")
    p.add_argument("--groups", type=positive_int, default=2, help="key/value heads (GQA)")
    p.add_argument("--ffn", type=positive_int, default=128, help="feed-forward hidden size (default 128)")
    p.add_argument("--mtp-layers", type=count, default=0,
                   help="multi-token prediction modules (DeepSeek-V3's; the collator hands each token the tokens ahead)")
    half = p.add_mutually_exclusive_group()
    half.add_argument("--bf16", action="store_true", help="bf16 weights and activations, fp32 main weights in the "
                      "optimizer (Megatron's Float16Module and mixed-precision optimizer; needs CUDA)")
    half.add_argument("--fp16", action="store_true", help="fp16 weights and activations with Megatron's dynamic loss "
                      "scaler (its schedule scales every micro-batch's loss, its optimizer skips steps that overflow; "
                      "needs CUDA)")
    p.add_argument("--distributed-optimizer", action="store_true",
                   help="Megatron's distributed optimizer (optimizer state sharded over the ranks; needs CUDA)")
    p.add_argument("--eval-batches", type=count, default=1, help="global batches of validation after training")
    p.add_argument("--checkpoint", type=output_dir, default=None,
                   help="folder for checkpoints (DIR/step-K.pt), with --checkpoint-every")
    p.add_argument("--checkpoint-every", type=count, default=0, help="save a checkpoint every N steps (0: never)")
    p.add_argument("--resume", type=nonempty, default=None,
                   help="a checkpoint file (DIR/step-K.pt) to continue from, at step K")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the checks that involve two options."""
    p = build_parser()
    args = p.parse_args(argv)
    hardware_or_cost(p, args)  # --hardware beside --cost would be dropped without a word
    both_or_neither(p, args, "checkpoint", "checkpoint_every")  # one without the other would save nothing
    if args.data_prefix and (args.data or not args.vocab_size):
        p.error("--data-prefix takes --vocab-size (the token ids' range) and excludes --data")
    if args.vocab_size and not args.data_prefix:  # the bundled index's tokenizer sets the vocabulary otherwise
        p.error("--vocab-size is the vocabulary of --data-prefix data; without --data-prefix it would be ignored")
    if args.hidden % args.heads or args.heads % args.groups:  # else a shape error deep inside the attention
        p.error(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}, and --heads a multiple of "
                f"--groups {args.groups}")

    if args.distributed_optimizer and (args.checkpoint or args.resume):
        p.error("--distributed-optimizer with --checkpoint/--resume: this example saves optimizer.state_dict(), which "
                "for Megatron's distributed optimizer leaves out the Adam moments (save_parameter_state); use "
                "Megatron-LM's checkpointing for that optimizer")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = init_distributed()  # set_device, NCCL/HCCL/gloo by device, eager init + a warm-up barrier
    rank, on_cpu = dist.get_rank(), device.type == "cpu"
    if on_cpu and (args.bf16 or args.fp16 or args.distributed_optimizer):
        raise ValueError("--bf16, --fp16 and --distributed-optimizer need CUDA: Megatron's Float16Module and its "
                         "mixed-precision and distributed optimizers assert CUDA tensors")
    if on_cpu:
        from fcp_exec.integrations.megatron_cpu import megatron_on_cpu

        megatron_on_cpu()
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    parallel_state.initialize_model_parallel(1, 1)  # every rank data-parallel: FCP forms the CP groups
    if not on_cpu:
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)

    # data: a length index → FCPSampler (plans CP groups per micro-batch) → FCPCollator (this rank's zigzag shard)
    data, lengths, vocab_size, pad, labels = load_data(args, rank)
    shape = ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.groups,
                        head_dim=args.hidden // args.heads, ffn=args.ffn, vocab=vocab_size)
    cost = CostModel.load(args.cost) if args.cost else CostModel.preset(shape, args.hardware)
    cost = cost.replace(tokens_per_rank=args.tokens_per_rank)
    sampler = FCPSampler(lengths, cost_model=cost, global_batch_size=args.global_batch_size, seed=0,
                         on_overlong="truncate")
    # vocab_size: a sample with an id the model has no row for is recorded and skipped, not an embedding error
    dataset = FCPDataset(data, vocab_size=vocab_size)
    collate = FCPCollator(pad_token_id=pad, sample_labels=labels, future_tokens=args.mtp_layers)  # MTP: tokens ahead
    # worker_context: a forkserver where this Python's fork can deadlock a worker of a multi-threaded rank
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=collate,
                        multiprocessing_context=worker_context(2, dataset, collate))

    # model: FCP's core attention in the layer spec, then Megatron's own DDP, finalize and optimizer
    model, config = build_model(args, vocab_size, on_cpu)
    dist_opt = args.distributed_optimizer  # Megatron's ZeRO-1: optimizer state sharded over the data-parallel ranks
    model = DistributedDataParallel(config, DistributedDataParallelConfig(use_distributed_optimizer=dist_opt), model)
    config.no_sync_func, config.finalize_model_grads_func = model.no_sync, finalize_model_grads
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=args.lr, weight_decay=0.01,
                                                       clip_grad=0.0 if on_cpu else 1.0, bf16=args.bf16, fp16=args.fp16,
                                                       use_distributed_optimizer=dist_opt,
                                                       params_dtype=config.params_dtype), [model])
    if args.fp16:  # as Megatron-LM's setup: the schedule multiplies each micro-batch's loss by the current scale
        config.grad_scale_func = optimizer.scale_loss
    schedule = get_forward_backward_func()

    start = 0
    if args.resume:
        state = read_checkpoint(args.resume, device)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as e:  # another --hidden/--layers: one line, not torch's traceback
            raise ValueError(f"--resume {args.resume} does not fit this model and optimizer (other --hidden, --layers, "
                             f"...?): {str(e).strip().splitlines()[0][:300]}") from None
        sampler.load_state_dict(state["sampler"])
        start = int(state["step"])
    if start >= args.steps:  # a run that trains nothing must not end as if it had
        raise ValueError(f"--resume {args.resume} is at step {start}; --steps {args.steps} leaves nothing to train")
    batches = forever(loader)
    for step in range(start, args.steps):
        mbs = next_global_batch(batches, model, pad_token_id=pad)  # this rank's micro-batches
        model.zero_grad_buffer()
        optimizer.zero_grad()
        reports = schedule(forward_step_func=forward_step, data_iterator=iter(mbs), model=[model],
                           num_microbatches=len(mbs), seq_length=args.tokens_per_rank, micro_batch_size=1)
        updated, grad_norm, _ = optimizer.step()  # fp16: not updated (skipped on every rank) when gradients overflow
        leave_out_later(sampler, mbs)  # a sample skipped in this step is not read again in later epochs
        loss, tokens = global_loss(reports)
        if rank == 0:
            scale = f" loss-scale {optimizer.get_loss_scale().item():g}" if args.fp16 else ""
            print(f"step {step} loss {loss:.6f} tokens {tokens} micro-batches {len(mbs)} "
                  + (f"grad-norm {grad_norm:.4f}" if updated else "overflow: step skipped") + scale, flush=True)
        if args.checkpoint and args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and rank == 0:
            # the sampler's state after this step's last micro-batch, not state_dict(): the DataLoader's workers
            # already hold later batches
            Path(args.checkpoint).mkdir(parents=True, exist_ok=True)
            torch.save({"step": step + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "sampler": sampler.state_after(mbs[-1])}, Path(args.checkpoint) / f"step-{step + 1}.pt")
    batches.close()  # stops the DataLoader's workers now

    # validation: its own sampler; the same schedule with forward_only=True
    val_sampler = FCPSampler(lengths, cost_model=cost, global_batch_size=args.global_batch_size, seed=1,
                             on_overlong="truncate")
    val_batches = iter(DataLoader(FCPDataset(data, vocab_size=vocab_size), batch_sampler=val_sampler,
                                  collate_fn=collate))
    model.eval()
    for k in range(min(args.eval_batches, val_sampler.num_global_batches())):
        mbs = next_global_batch(val_batches, model, pad_token_id=pad)
        with torch.no_grad():
            reports = schedule(forward_step_func=forward_step, data_iterator=iter(mbs), model=[model],
                               num_microbatches=len(mbs), seq_length=args.tokens_per_rank, micro_batch_size=1,
                               forward_only=True)
        loss, tokens = global_loss(reports)
        if rank == 0:
            print(f"eval {k} loss {loss:.4f} tokens {tokens}", flush=True)
    settle_collectives()
    dist.destroy_process_group()


if __name__ == "__main__":
    run_main(main)  # a bad index, cost file or checkpoint: one line on stderr and exit 2
