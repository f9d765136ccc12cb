"""The executor's option names that the command line offers as choices, without importing torch (``fcp train
--help`` and its argument errors answer in 0.3 s instead of 3 s). Their modules re-export them."""

from __future__ import annotations

__all__ = ["LR_SCHEDULES", "REDUCER_NAMES", "SUPPORTED_MODEL_TYPES"]

LR_SCHEDULES = ("constant", "linear", "cosine")  # fcp_exec.optim.lr_at
REDUCER_NAMES = ("allreduce", "ddp", "fsdp2", "fsdp1")  # fcp_exec.reducers.make_reducer
# tested against the stock model (tests/exec/test_hf_train.py, test_hf_families.py, test_hf_router_loss.py)
SUPPORTED_MODEL_TYPES = ("qwen3", "llama", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen2", "mistral", "phi3", "olmo2",
                         "granite", "glm4", "smollm3", "gemma", "gemma3_text", "cohere", "qwen3_moe", "internvl",
                         "llava_onevision", "gpt_oss", "deepseek_v3", "gemma2", "mixtral", "qwen2_moe", "glm4_moe",
                         "exaone4", "seed_oss", "olmoe", "qwen3_vl_moe", "phimoe", "granitemoe",
                         "ernie4_5_moe", "flex_olmo")
