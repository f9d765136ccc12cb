"""fp16's loss scaler through :func:`fcp_exec.step.train_step` on 2 real gloo processes, every reducer.

* **Scaling is exact.** A power-of-two scale is exact in binary floating point, so in float64 a run whose every
  micro-batch backward is scaled (``grad_scaler=torch.amp.GradScaler``, initial scale 2**12) and stepped through the
  scaler equals the run without one: per step the loss, the unscaled gradients and the parameters after the step
  within 1e-15 relative (summation order is the same on both sides; measured: 0). Reference: the same training
  without a scaler. A backward that forgot the scale would leave the gradients 2**-12 of the reference's after the
  unscale; a loss reported scaled would be 2**12 times it.
* **Every rank skips the same steps.** An overflow on one rank only — rank 1's loss of one micro-batch made ``inf``
  before its backward, or (FSDP2, FSDP1) one entry of rank 1's own gradient shard set to ``inf`` after the reduction — makes
  *every* rank skip that optimizer step (parameters unchanged, bit for bit) and halve its scale, and the next step
  trains again on every rank with identical parameters. The all-reduce and DDP sums carry the ``inf`` to every rank;
  FSDP2's gradient shards are DTensors whose ``inf`` check torch all-reduces over the mesh, FSDP1's are checked by its
  ``ShardedGradScaler`` (``grad_scaler_class``), which all-reduces it (a rank that skipped alone would leave the ranks
  with different parameters: asserted equal).

The Hugging Face Trainer's fp16 (Accelerate's scaler, autocast) against the stock Trainer is in
``test_hf_trainer.py``.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data import CostModel
from fcp_exec.compat import CPU_FSDP2_RELEASE, torch_release
from fcp_exec.launch import launch

LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58]
REDUCERS = ("allreduce", "ddp", "fsdp1") + (("fsdp2",) if torch_release() >= CPU_FSDP2_RELEASE else ())  # FSDP2 on CPU
SHARDED = [r for r in REDUCERS if r.startswith("fsdp")]  # poisoned after the reduction: one entry of one rank's shard
STEPS, SCALE = 3, 2.0 ** 12
TOL = 1e-15


def _setup(reducer: str):
    from torch.utils.data import DataLoader

    import torch.distributed as dist
    from fcp_data import FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.models import build_model
    from fcp_exec.step import make_reducer

    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=64)
    sampler = FCPSampler(LENGTHS, num_ranks=2, rank=dist.get_rank(), global_batch_size=4, seed=0, cost_model=cost)
    data = [{"input_ids": (torch.arange(n) % 40) + 2} for n in LENGTHS]
    loader = DataLoader(FCPDataset(data), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))
    model, red = make_reducer(reducer, build_model("tiny-llm", seed=0, dtype=torch.float64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, foreach=False)
    return model, red, opt, iter(loader)


def _flat(model, what: str) -> torch.Tensor:
    """Every parameter (``what="param"``) or gradient, gathered whole (FSDP2's DTensors, FSDP1's flat shards), as one
    float64 vector."""
    from fcp_exec.compat import dtensor_type
    from fcp_exec.reducers import full_view

    DTensor = dtensor_type()

    out = []
    with full_view(model, grads=what != "param"):
        for p in model.parameters():
            t = p if what == "param" else p.grad
            t = t.full_tensor() if isinstance(t, DTensor) else t
            out.append(t.detach().reshape(-1).to("cpu", torch.float64, copy=True))
    return torch.cat(out)


def _run(reducer: str, scaled: bool, poison: str | None = None) -> list[dict]:
    """STEPS optimizer steps; ``poison``: make step 1 overflow on rank 1 only (``"loss"``: its first micro-batch's loss
    is ``inf``; ``"shard"``: one entry of its local gradient shard after the reduction)."""
    import torch.distributed as dist

    from fcp_exec.step import train_step
    from fcp_exec.train import _forward_loss

    model, red, opt, batches = _setup(reducer)
    from fcp_exec.reducers import grad_scaler_class

    scaler = grad_scaler_class(reducer)("cpu", init_scale=SCALE, growth_interval=1000) if scaled else None  # FSDP1: sharded
    rank, out = dist.get_rank(), []
    for step in range(STEPS):
        calls = []

        def loss_fn(m, b):
            loss = _forward_loss(m, b, False)
            calls.append(1)
            if poison == "loss" and step == 1 and rank == 1 and len(calls) == 1:
                loss = loss * float("inf")
            return loss

        opt.zero_grad(set_to_none=True)
        res = train_step(model, batches, loss_fn, red, grad_scaler=scaler)
        if poison == "shard" and step == 1 and rank == 1:
            grad = next(p for p in model.parameters() if p.grad is not None and p.grad.numel()).grad
            local = grad.to_local() if hasattr(grad, "to_local") else grad
            local.view(-1)[0] = float("inf")
        before = _flat(model, "param")
        if scaler is None:
            grads = _flat(model, "grad")
            opt.step()
        else:
            scaler.unscale_(opt)
            grads = _flat(model, "grad")
            scale = float(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
        after = _flat(model, "param")
        out.append({"loss": res.loss, "grads": grads.numpy(), "params": after.numpy(),
                    "moved": bool((after != before).any()), "scale": None if scaler is None else scale,
                    "next_scale": None if scaler is None else float(scaler.get_scale())})
    return out


def _all() -> dict:
    runs = {}
    for r in REDUCERS:
        runs[(r, "plain")] = _run(r, scaled=False)
        runs[(r, "scaled")] = _run(r, scaled=True)
        runs[(r, "loss")] = _run(r, scaled=True, poison="loss")
    for r in SHARDED:
        runs[(r, "shard")] = _run(r, scaled=True, poison="shard")
    runs["fsdp1-plain-scaler"] = _plain_scaler_under_fsdp1()
    return runs


def _plain_scaler_under_fsdp1() -> str:
    """The error of ``train_step`` given a ``torch.amp.GradScaler`` under FSDP1 (it would check one shard only)."""
    from fcp_exec.step import train_step

    model, red, _, batches = _setup("fsdp1")
    try:
        train_step(model, batches, lambda m, b: None, red, grad_scaler=torch.amp.GradScaler("cpu"))
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.fixture(scope="module")
def runs():
    return launch(_all, 2, timeout=300.0, pg_timeout=120.0)


def _rel(a, b) -> float:
    import numpy as np

    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-300))


@pytest.mark.parametrize("reducer", REDUCERS)
def test_scaled_training_equals_training_without_a_scaler(runs, reducer):
    for rank in (0, 1):
        plain, scaled = runs[rank][(reducer, "plain")], runs[rank][(reducer, "scaled")]
        for k, (p, s) in enumerate(zip(plain, scaled)):
            what = f"{reducer} rank {rank} step {k}"
            assert s["scale"] == SCALE and s["moved"], what  # no overflow here: every step trains
            assert abs(s["loss"] - p["loss"]) <= TOL * abs(p["loss"]), f"{what}: loss {s['loss']!r} vs {p['loss']!r}"
            assert _rel(s["grads"], p["grads"]) <= TOL, f"{what}: unscaled gradients differ"
            assert _rel(s["params"], p["params"]) <= TOL, f"{what}: parameters differ"


@pytest.mark.parametrize("reducer, poison", [(r, "loss") for r in REDUCERS] + [(r, "shard") for r in SHARDED])
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(runs, reducer, poison):
    r0, r1 = runs[0][(reducer, poison)], runs[1][(reducer, poison)]
    for k in range(STEPS):
        what = f"{reducer} poison={poison} step {k}"
        assert (r0[k]["moved"], r1[k]["moved"]) == ((k != 1),) * 2, f"{what}: moved {r0[k]['moved']}/{r1[k]['moved']}"
        want = SCALE / 2 if k >= 1 else SCALE
        assert r0[k]["next_scale"] == r1[k]["next_scale"] == want, (what, r0[k]["next_scale"], r1[k]["next_scale"])
        assert (r0[k]["params"] == r1[k]["params"]).all(), f"{what}: the ranks' parameters differ"
    assert (r0[1]["params"] == r0[0]["params"]).all(), "the skipped step changed the parameters"


def test_fsdp1_refuses_a_scaler_that_sees_one_shard(runs):
    """Under FSDP1 a plain ``GradScaler`` would check only this rank's gradient shard (the ``shard`` poison above
    would then skip the step on rank 1 alone): ``train_step`` refuses it, naming FSDP1's ``ShardedGradScaler``."""
    for rank in (0, 1):
        msg = runs[rank]["fsdp1-plain-scaler"]
        assert msg.startswith("FSDP1 with GradScaler") and "ShardedGradScaler" in msg, msg
