"""Gradient accumulation over train_step calls (fcp_exec.grads.set_aside / add_back) when a parameter that had a
gradient from an earlier step gets none in the next one — a vision tower on a text-only global batch, a router
expert no token chose, an extra head used on some batches only. One process (cheap; the all-reduce reducer's
``finish`` returns early in a world of one, so a parameter without gradient keeps ``.grad`` None).

Reference: ``loss.backward()`` per global batch with no zero_grad between (PyTorch's own accumulation), i.e. the sum of
the two steps' gradients computed apart from zeroed gradients; a parameter unused in the second step must keep the
first step's gradient. (tests/exec/test_own_loop.py's accumulation test uses tiny-llm, where every parameter gets a
gradient every step, so dropping the earlier gradient of such a parameter went unnoticed.)
"""

from __future__ import annotations

import pytest
import torch

DOCS = [[[23, 9]], [[17, 12]]]  # global batches -> micro-batches -> document lengths


def _batches(g):
    from fcp_data import FCPCollator
    from fcp_data.slots import SampleSlot

    total = sum(n - 1 for mb in DOCS[g] for n in mb)
    out = []
    for m, mb in enumerate(DOCS[g]):
        pairs = []
        for j, n in enumerate(mb):
            ids = (torch.arange(n) * 7 + 3 * n) % 60 + 2
            slot = SampleSlot(index=j, num_tokens=n, length=n, ranks=(0,), cp_rank=0, epoch=0, global_batch=g,
                              micro_batch=m, num_micro_batches=len(DOCS[g]), num_tokens_global=total)
            pairs.append(({"input_ids": ids}, slot))
        out.append(FCPCollator(pad_token_id=0)(pairs))
    return out


def _model():
    from fcp_exec.models import build_model

    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    model.extra = torch.nn.Parameter(torch.linspace(-1, 1, 6, dtype=torch.float64))  # used in global batch 0 only
    return model


def _loss(model, batch):
    from fcp_exec.train import _forward_loss

    loss = _forward_loss(model, batch, False)
    if int(batch["global_batch"]) == 0:
        loss = loss + (model.extra ** 2).sum() * 0.5
    return loss


def _text_loss(model, batch):
    from fcp_exec.train import _forward_loss

    return _forward_loss(model, batch, False)


def _grads(model):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}


def test_a_parameter_unused_in_a_later_step_keeps_its_earlier_gradient():
    from fcp_exec.reducers import make_reducer
    from fcp_exec.step import train_step

    model, red = make_reducer("allreduce", _model())
    apart = []
    for g in (0, 1):
        model.zero_grad(set_to_none=True)
        train_step(model, _batches(g), _loss, red)
        apart.append(_grads(model))
    model.zero_grad(set_to_none=True)
    for g in (0, 1):
        train_step(model, _batches(g), _loss, red)
    got = _grads(model)
    assert float(apart[0]["extra"].abs().max()) > 0
    for name, g in got.items():
        want = apart[0][name] + apart[1][name]
        torch.testing.assert_close(g, want, rtol=1e-12, atol=0, msg=name)


def _optimizer_with_an_extra_parameter():
    from fcp_exec.models import build_model
    from fcp_exec.reducers import make_reducer
    from fcp_exec.step import train_step

    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    extra = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))  # e.g. a head or temperature kept outside
    before = torch.optim.SGD(list(model.parameters()) + [extra], lr=0.1)
    model, red = make_reducer("fsdp2", model)
    train_step(model, _batches(0), lambda m, b: _text_loss(m, b) + (extra ** 2).sum(), red)
    try:
        before.step()
    except ValueError as e:
        return str(e)
    return "stepped"


def test_an_optimizer_built_before_fsdp2_is_refused_even_with_other_parameters_too():
    """An optimizer built before ``make_reducer('fsdp2')`` holds the replaced parameters and trains none of them; one
    that also holds a parameter of its own (outside the model) must be refused the same (fcp_exec.grads docstring:
    "an optimizer that holds one"). Reference: the refusal the existing test sees for an optimizer of only the
    model's parameters. One rank (a process group of one)."""
    from fcp_exec.compat import CPU_FSDP2_RELEASE, torch_release
    from fcp_exec.launch import launch

    if torch_release() < CPU_FSDP2_RELEASE:
        pytest.skip("FSDP2 does not run on the CPU with this torch")

    (msg,) = launch(_optimizer_with_an_extra_parameter, 1, timeout=120)
    assert "holds parameters that make_reducer('fsdp2', model) replaced" in msg, msg
