"""Tiny models for exactness tests, the demo and the profiler: ``tiny-llm`` and ``tiny-mllm``.

``build_model(name, seed=0, dtype=torch.float64)`` seeds the global RNG, builds the model and casts it,
so that every rank (and a single-process reference) starts from bit-identical weights.
"""

from __future__ import annotations

from fcp_exec.models.tiny_llm import RMSNorm, TinyLLM, TinyLLMConfig, apply_rope, token_loss_sum
from fcp_exec.models.tiny_mllm import TinyMLLM, TinyMLLMConfig, VisionEncoder
from fcp_exec.vision_exchange import exchange_rows, frame_shares, frame_table

__all__ = ["MODEL_NAMES", "build_model", "TinyLLM", "TinyLLMConfig", "TinyMLLM", "TinyMLLMConfig",
           "VisionEncoder", "RMSNorm", "apply_rope", "frame_table", "frame_shares", "exchange_rows",
           "token_loss_sum"]

MODEL_NAMES = ("tiny-llm", "tiny-mllm")


def build_model(name: str, *, seed: int = 0, dtype=None, llm: TinyLLMConfig | None = None, **mllm_kw):
    """``tiny-llm`` or ``tiny-mllm`` with weights drawn from ``torch.manual_seed(seed)``, cast to ``dtype``."""
    import torch

    torch.manual_seed(int(seed))
    llm = llm or TinyLLMConfig()
    if name == "tiny-llm":
        if mllm_kw:
            raise ValueError(f"tiny-llm takes no vision options, got {sorted(mllm_kw)}")
        model = TinyLLM(llm)
    elif name == "tiny-mllm":
        model = TinyMLLM(TinyMLLMConfig(llm=llm, **mllm_kw))
    else:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    return model.to(dtype or torch.float32)
