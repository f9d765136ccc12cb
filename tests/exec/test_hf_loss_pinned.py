"""``fcp_exec.integrations.hf.lm_loss`` on half-precision logits (bf16 / fp16 models): the docstring promises the
logits are upcast to float32 before the cross-entropy. Reference: the same (already rounded) logits in float64,
``Σ CE / num_tokens_global``; a float32 computation is within ~1e-6 relative of it, a bf16 one is off by ~1e-3
(every log-probability rounded to 8 bits). The existing HF tests use float64 models (and bf16 runs only with a loose
bound), so dropping the upcast went unnoticed. One process, no model.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

pytest.importorskip("transformers")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits_are_upcast_before_the_cross_entropy(dtype):
    from fcp_exec.integrations.hf import lm_loss

    g = torch.Generator().manual_seed(0)
    length, vocab = 777, 300
    logits = (torch.randn(1, length, vocab, generator=g) * 3).to(dtype)
    labels = torch.randint(0, vocab, (length,), generator=g)
    labels[::5] = -100  # document ends, pads, prompts
    batch = {"labels": labels, "num_tokens_global": 2 * int((labels != -100).sum())}  # other ranks hold the rest
    got = lm_loss(logits, batch)
    want = F.cross_entropy(logits.reshape(-1, vocab).double(), labels, ignore_index=-100, reduction="sum") / \
        batch["num_tokens_global"]
    assert got.dtype == torch.float32
    assert abs(float(got) - float(want)) <= 1e-6 * abs(float(want)), (float(got), float(want))


@pytest.mark.parametrize("given", [("shift_labels",), ("num_items_in_batch",), ()])
def test_hf_labels_without_both_shift_labels_and_the_global_count_are_flagged(given):
    """HF's own loss equals fcp's only with *both* ``shift_labels`` (else HF shifts the already-shifted labels
    again) and ``num_items_in_batch`` (else HF averages over this rank's tokens): ``labels=`` with either one missing
    is the wrong loss the forward pre-hook names (hf_checks module docstring; a warning outside ``train_step``).
    Reference: ``hf_loss_kwargs(batch)`` itself (both given) passes silently."""
    import warnings

    from fcp_exec.integrations.hf import hf_loss_kwargs
    from fcp_exec.integrations.hf_checks import check_call

    batch = {"labels": torch.tensor([3, 4, -100]), "num_tokens_global": 2}
    full = {"fcp_context": object(), **hf_loss_kwargs(batch)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_call(torch.nn.Linear(1, 1), (), full)
    partial = {"fcp_context": object(), "labels": full["labels"], **{k: full[k] for k in given}}
    with pytest.warns(UserWarning, match="shift_labels= and num_items_in_batch="):
        check_call(torch.nn.Linear(1, 1), (), partial)


def _apply_fcp_after_fsdp1():
    from pathlib import Path

    from torch.distributed.fsdp import FullyShardedDataParallel

    from fcp_exec.integrations import hf

    cfg = Path(__file__).resolve().parents[2] / "examples" / "configs" / "qwen3-tiny.json"
    model = FullyShardedDataParallel(hf.build_model(cfg, dtype=torch.float64, seed=0), device_id=torch.device("cpu"))
    try:
        hf.apply_fcp(model)
    except Exception as e:  # noqa: BLE001 - the type and message are what is tested
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_apply_fcp_after_fsdp1_names_the_order():
    """hf_checks.refuse_wrapped: ``apply_fcp`` on an FSDP1 wrapper (it changes the model inside) is one ValueError naming
    FullyShardedDataParallel and the order to use — as the existing test checks for DDP. One rank."""
    from fcp_exec.launch import launch

    (msg,) = launch(_apply_fcp_after_fsdp1, 1, timeout=120, preload=("transformers.modeling_utils",))
    assert msg.startswith("ValueError: apply_fcp got a model already wrapped in FullyShardedDataParallel (FSDP1)"), msg


def test_another_ignore_index_is_one_clear_error():
    """lm_loss ignores -100 only (transformers' convention; HF's own loss the same): labels of a collator built with
    another ``ignore_index`` were an IndexError from deep inside the cross-entropy ("Target -1 is out of bounds");
    now one ValueError naming the fix (found by the mutation review). -100 still ignored: the loss equals the fp64
    cross-entropy over the other labels."""
    from fcp_exec.integrations.hf import lm_loss

    logits = torch.randn(1, 3, 5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"labels hold -1: .*ignore_index=-100"):
        lm_loss(logits, {"labels": torch.tensor([1, -1, 2]), "num_tokens_global": 2})
    got = lm_loss(logits, {"labels": torch.tensor([1, -100, 2]), "num_tokens_global": 2})
    want = torch.nn.functional.cross_entropy(logits[0, [0, 2]], torch.tensor([1, 2]), reduction="sum") / 2
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
