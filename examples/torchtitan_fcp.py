r"""torchtitan's own trainer and command line, trained with FCP: a config registry for ``torchtitan.train``.

    torchrun --standalone --nproc-per-node 2 -m torchtitan.train \
        --module examples.torchtitan_fcp --config qwen3_debug_fcp                  # CPU (gloo), the bundled text
                 # (llama3_debug_fcp: Llama 3's debug model; deepseek_v3_debug_mtp_fcp: DeepSeek-V3 with multi-token
                 # prediction; gpt_oss_debug_fcp: gpt-oss's sinks and sliding windows)
    torchrun --nproc-per-node 8 -m torchtitan.train --module examples.torchtitan_fcp --config llama3_8b_fcp \
        --dataloader.dataset_path my-index --dataloader.cost_model cost.json      # GPUs (never run by us)

Each function is one of torchtitan's own configs passed through
:func:`fcp_exec.integrations.torchtitan_trainer.fcp_config`: torchtitan's ``Trainer`` (as ``FCPTitanTrainer``)
builds the model, FSDP2, optimizer, schedule, checkpointer and metrics as it always does; FCP supplies the data
(``FCPSampler`` → ``FCPDataset`` → ``FCPCollator`` over an fcp length index or a Megatron ``PREFIX``) and the ring
attention over each micro-batch's CP group. Every field stays a command-line option (``--dataloader.global_batch_size
64``, ``--training.steps 1000``, ``--checkpoint.enable``; resuming is torchtitan's: run again with the same
``--dump_folder``). ``training.seq_len`` is the longest document (the model's RoPE length; longer ones are cut),
``--dataloader.tokens_per_rank`` what one rank holds per micro-batch (default: ``training.seq_len``).

Copy a function into your own registry module to train another of torchtitan's Qwen3 / Llama 3 / DeepSeek-V3 /
gpt-oss configs. Without a GPU
the functions point torchtitan at the CPU first (:func:`fcp_exec.integrations.torchtitan_cpu.torchtitan_on_cpu`).
"""

from __future__ import annotations

import dataclasses

import torch

from fcp_data import bundled_index
from fcp_exec.integrations.torchtitan_trainer import fcp_config


def _cpu_if_no_gpu() -> bool:
    """True (and torchtitan pointed at the CPU) when no GPU is there."""
    if torch.cuda.is_available():
        return False
    from fcp_exec.integrations.torchtitan_cpu import torchtitan_on_cpu

    torchtitan_on_cpu()
    return True


def _debug_on_bundled_text(cfg, float32: bool):
    """A debug config cut to its first 2 layers, on the bundled text index: 256-token context, 128 tokens per rank (a
    document over 128 tokens needs a degree-2 ring), global batches of 8 documents, 4 steps (``float32``: float32
    parameters in FSDP2 instead of torchtitan's bf16, for a CPU)."""
    cfg.model_spec.model.layers = cfg.model_spec.model.layers[:2]
    cfg.training = dataclasses.replace(cfg.training, seq_len=256, steps=4, **(
        {"mixed_precision_param": "float32"} if float32 else {}))
    cfg.lr_scheduler = dataclasses.replace(cfg.lr_scheduler, warmup_steps=1)
    return fcp_config(cfg, dataset_path=str(bundled_index("text")), tokens_per_rank=128, global_batch_size=8)


def qwen3_debug_fcp():
    """torchtitan's Qwen3 debug model (2 layers) on the bundled text index (_debug_on_bundled_text)."""
    from torchtitan.models.qwen3.config_registry import qwen3_debugmodel

    return _debug_on_bundled_text(qwen3_debugmodel(), _cpu_if_no_gpu())


def llama3_debug_fcp():
    """torchtitan's Llama 3 debug model (2 layers) on the bundled text index, as :func:`qwen3_debug_fcp`."""
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    return _debug_on_bundled_text(llama3_debugmodel(), _cpu_if_no_gpu())


def deepseek_v3_debug_mtp_fcp():
    """torchtitan's DeepSeek-V3 debug model with one multi-token-prediction module (``deepseek_v3_debugmodel_mtp``:
    multi-latent attention, a dense and a MoE layer, ``MTPLoss``), as :func:`qwen3_debug_fcp`: each token's look-ahead
    token comes from the collator (torchtitan's own CP refuses MTP)."""
    from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel_mtp

    return _debug_on_bundled_text(deepseek_v3_debugmodel_mtp(), _cpu_if_no_gpu())


def gpt_oss_debug_fcp():
    """torchtitan's gpt-oss debug model (attention sinks, 128-token sliding windows on its even layers; 2 layers), as
    :func:`qwen3_debug_fcp` but in torchtitan's bf16 precision on a CPU too (its experts compute and return bf16); on a
    CPU its experts are 256 wide instead of 2,880."""
    from torchtitan.models.gpt_oss.config_registry import gpt_oss_debugmodel

    cfg = gpt_oss_debugmodel()
    if _cpu_if_no_gpu():  # bf16 matrix products without AVX512-BF16/AMX run unvectorised: 25-35 s a step at 2,880
        for layer in cfg.model_spec.model.layers:
            layer.moe.routed_experts.inner_experts.hidden_dim = 256  # the experts' width (the debug model's 2,880)
    return _debug_on_bundled_text(cfg, False)


def llama3_8b_fcp():
    """torchtitan's Llama 3 8B config (8,192-token context; raise ``--training.seq_len`` for longer documents) with
    FCP: pass ``--dataloader.dataset_path`` (an fcp length index built with Llama 3's tokenizer, or a Megatron PREFIX)
    and your cost model (``fcp profile``); 8,192 tokens per rank, global batches of 256 documents."""
    from torchtitan.models.llama3.config_registry import llama3_8b

    _cpu_if_no_gpu()
    return fcp_config(llama3_8b(), global_batch_size=256, tokens_per_rank=8192)
