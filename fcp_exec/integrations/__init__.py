"""Integrations with the libraries trainers already use. Importing this package imports none of them:
``fcp_exec.integrations.hf`` (Hugging Face transformers) and ``hf_positions`` import transformers lazily;
``hf_trainer`` (``FCPTrainer``, a ``transformers.Trainer``; DDP, FSDP2 and DeepSpeed ZeRO through Accelerate) imports
transformers and accelerate when imported; ``megatron`` (Megatron-core: ``fcp_layer_spec``, ``apply_fcp``,
``forward_step``) imports megatron-core if installed, ``megatron_cpu`` runs Megatron-core on a CPU; ``torchtitan``
(``apply_fcp``, ``batch_inputs``, ``fcp_loss`` for torchtitan's Qwen3 / Llama 3 decoders) imports nothing of torchtitan;
``torchtitan_trainer`` (``fcp_config``, ``FCPTitanTrainer``: torchtitan's own Trainer and command line) and
``torchtitan_data`` import torchtitan's trainer when imported, ``torchtitan_cpu`` runs that trainer on a CPU."""
