"""A trainer's own loop around :func:`fcp_exec.step.train_step` (README, "Use with Hugging Face / DDP / FSDP2 /
DeepSpeed"): the mistakes and patterns a review of such a loop found silently wrong or answered with an error from deep
inside. Multi-rank parts run on 2 real gloo processes (one launch, tiny-llm); the rest in one process.

* **Accumulation over steps** (allreduce, ddp, fsdp1, fsdp2; float64): two ``train_step`` calls before one optimizer step
  leave exactly the sum of the two steps' gradients run apart (each from zeroed gradients): 1e-12 relative to the
  largest entry (measured: 0 — the same sums in the same order), also when a sample of the second step fails to read
  (that step's rescale must leave the first step's gradients alone). Before the fix the all-reduce and DDP reducers
  summed the first step's already-reduced gradients over the ranks again (2× them on 2 ranks); FSDP1's skipped-read
  rescale scaled the first step's gradients too (16.6 % off). ``ddp-bucket-view``: a DDP of the user's with
  ``gradient_as_bucket_view=True``, whose next backward writes into the buckets the set-aside gradients view (found
  by mutation testing: without the copy, 84 % off).
* **A step inside ``torch.autocast``** (FSDP2, bf16 over float32 parameters, CPU): the gradients equal the same step
  with autocast around each micro-batch's forward (:func:`~fcp_exec.step.autocast_loss`, which opens a fresh region —
  and cast cache — per micro-batch) within 2e-2 relative per parameter (a few bf16 roundings, 2**-8 each, of the same
  computation; measured below 1e-2). autocast's weight-cast cache outlives a micro-batch: later micro-batches reused
  the casts of the first one's parameters (errors of order 1).
* **The all-reduce reducer starts every rank from rank 0's weights**: ranks initialised from other seeds (and a buffer
  that differs) hold rank 0's values bit for bit after ``make_reducer("allreduce")`` / ``reducer_for(plain model)``.
* **apply_fcp after DDP** names the order to use.
* **A loss_fn that breaks the contract** (a float, a model output, a non-scalar, a loss without gradient, swapped
  arguments, the raw batch into the model, HF ``labels=`` alone) is one clear error naming
  ``loss_fn(model, batch) -> scalar tensor`` / what to call instead.
* **The end of an epoch** is :class:`~fcp_exec.step.EpochEnded` (a RuntimeError) pointing to ``set_epoch`` and
  ``iter(loader)``, not "the micro-batches ended after 0 of 1".
* **An optimizer built before ``make_reducer("fsdp2")``** (it holds the replaced, never-trained parameters) is an
  error at its first ``step()``; one built after steps.
* ``hf_collator`` of a text model is the text collator; the README snippet imports what it calls and builds the
  optimizer after ``make_reducer``.
"""

from __future__ import annotations

import re
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _pattern_text import LENGTHS, PatternText
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
from fcp_exec.compat import CPU_FSDP2_RELEASE, torch_release
from fcp_exec.launch import launch
from fcp_exec.models import build_model
from fcp_exec.train import _forward_loss

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
FSDP2 = torch_release() >= CPU_FSDP2_RELEASE
ACCUM_REDUCERS = ("allreduce", "ddp", "ddp-bucket-view", "fsdp1") + (("fsdp2",) if FSDP2 else ())
TOL = 1e-12
AMP_TOL = 2e-2


def _loss(m, b):
    return _forward_loss(m, b, False)


class _Flaky(PatternText):
    """The pattern text whose sample ``fail`` cannot be read (``FCPDataset`` skips it; the step rescales)."""

    def __init__(self, fail: int) -> None:
        self.fail = fail

    def __getitem__(self, i: int) -> dict:
        if i == self.fail:
            raise OSError(f"sample {i} unreadable")
        return super().__getitem__(i)


def _global_batches(nranks: int, rank: int, tpr: int = 64, fail_in: int | None = None) -> list[list[dict]]:
    """This rank's micro-batches of the epoch, one list per global batch (tiny-llm's pattern text); ``fail_in``: the
    first sample of that global batch fails to read."""
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=tpr)
    sampler = FCPSampler(LENGTHS, num_ranks=nranks, rank=rank, global_batch_size=4, seed=0, cost_model=cost)
    data = PatternText() if fail_in is None else _Flaky(int(sampler.global_batch_indices(fail_in, 0)[0]))
    out: list[list[dict]] = []
    for b in DataLoader(FCPDataset(data), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0)):
        if int(b["micro_batch"]) == 0:
            out.append([])
        out[-1].append(b)
    return out


def _flat_grads(model) -> list[np.ndarray]:
    """Every parameter's gradient, whole (FSDP2's DTensors gathered), float64, in parameter order."""
    out = []
    for p in model.parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        g = g.full_tensor() if hasattr(g, "full_tensor") else g
        out.append(g.detach().to(torch.float64).reshape(-1).numpy().copy())
    return out


def _accumulation(reducer: str, fail_in: int | None) -> dict:
    import torch.distributed as dist

    from fcp_exec.step import make_reducer, train_step

    gbs = _global_batches(2, dist.get_rank(), fail_in=fail_in)
    base = build_model("tiny-llm", seed=0, dtype=torch.float64)
    if reducer == "ddp-bucket-view":  # a DDP the user wrapped, its gradients views of its buckets (set_aside copies)
        from torch.nn.parallel import DistributedDataParallel

        from fcp_exec.step import reducer_for

        model = DistributedDataParallel(base, gradient_as_bucket_view=True)
        red = reducer_for(model)
    else:
        model, red = make_reducer(reducer, base)
    apart, skipped = [], 0
    for k in (0, 1):  # each global batch from zeroed gradients
        model.zero_grad(set_to_none=True)
        skipped += train_step(model, list(gbs[k]), _loss, red).num_skipped_global
        apart.append(_flat_grads(model))
    model.zero_grad(set_to_none=True)
    for k in (0, 1):  # one after the other, no zero_grad between: accumulated
        train_step(model, list(gbs[k]), _loss, red)
    return {"sum": [a + b for a, b in zip(*apart)], "accumulated": _flat_grads(model), "first": apart[0],
            "skipped": skipped}


def _autocast() -> dict:
    import torch.distributed as dist

    from fcp_exec.step import autocast_loss, make_reducer, train_step

    gbs = _global_batches(2, dist.get_rank(), tpr=48)
    model, red = make_reducer("fsdp2", build_model("tiny-llm", seed=0, dtype=torch.float32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        train_step(model, list(gbs[0]), _loss, red)
    wrapped = _flat_grads(model)
    model.zero_grad(set_to_none=True)
    train_step(model, list(gbs[0]), autocast_loss(_loss, "cpu", torch.bfloat16), red)
    return {"wrapped": wrapped, "per_forward": _flat_grads(model), "num_mb": len(gbs[0])}


def _states(model) -> np.ndarray:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in list(model.parameters())
                      + list(model.buffers())]).numpy()


def _broadcast() -> dict:
    import torch.distributed as dist

    from fcp_exec.step import make_reducer, reducer_for

    rank, out = dist.get_rank(), {}
    for how in ("make_reducer", "reducer_for"):
        model = build_model("tiny-llm", seed=rank, dtype=torch.float64)  # every rank its own initialisation
        model.register_buffer("probe", torch.full((3,), float(rank + 1)))
        out[how + "_before"] = _states(model)
        model = make_reducer("allreduce", model)[0] if how == "make_reducer" else model
        if how == "reducer_for":
            reducer_for(model)
        out[how] = _states(model)
    return out


def _wrong_order() -> str:
    from torch.nn.parallel import DistributedDataParallel

    from fcp_exec.integrations import hf

    model = hf.build_model(CONFIGS / "qwen3-tiny.json", dtype=torch.float64, seed=0)
    try:
        hf.apply_fcp(DistributedDataParallel(model))
    except Exception as e:  # noqa: BLE001 - the type and message are what is tested
        return f"{type(e).__name__}: {e}"
    return "no error"


def _optimizer_order() -> dict:
    """An optimizer built before make_reducer('fsdp2') (the parameters it holds were replaced) and one after."""
    import torch.distributed as dist

    from fcp_exec.step import make_reducer, train_step

    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    before = torch.optim.SGD(model.parameters(), lr=0.1)
    model, red = make_reducer("fsdp2", model)
    after = torch.optim.SGD(model.parameters(), lr=0.1)
    train_step(model, list(_global_batches(2, dist.get_rank())[0]), _loss, red)
    out = {}
    for name, opt in (("before", before), ("after", after)):
        try:
            opt.step()
            out[name] = "stepped"
        except Exception as e:  # noqa: BLE001 - the type and message are what is tested
            out[name] = f"{type(e).__name__}: {e}"
    return out


def _guarded(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - one part's failure must not hide the others'
        return {"error": f"{type(e).__name__}: {e}"}


def _all() -> dict:
    out = {f"accum-{r}-{how}": _guarded(_accumulation, r, None if how == "read" else 1)
           for r in ACCUM_REDUCERS for how in ("read", "failed")}
    if FSDP2:
        out["autocast"] = _guarded(_autocast)
        out["optimizer_order"] = _guarded(_optimizer_order)
    out["broadcast"] = _guarded(_broadcast)
    out["wrong_order"] = _guarded(_wrong_order)
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(_all, 2, timeout=300.0, pg_timeout=120.0, preload=("transformers.modeling_utils",))


def _ok(part):
    assert not (isinstance(part, dict) and "error" in part), part.get("error")
    return part


@pytest.mark.parametrize("how", ["read", "failed"])
@pytest.mark.parametrize("reducer", ACCUM_REDUCERS)
def test_two_steps_before_one_optimizer_step_accumulate_the_sum(runs, reducer, how):
    """``failed``: a sample of the second global batch fails to read, whose step rescales its gradients to the mean
    over the labels read — its own, not the first step's (they are set aside then)."""
    for rank in (0, 1):
        got = _ok(runs[rank][f"accum-{reducer}-{how}"])
        assert got["skipped"] == (0 if how == "read" else 1)
        want, acc = np.concatenate(got["sum"]), np.concatenate(got["accumulated"])
        scale = float(np.abs(want).max())
        assert scale > 0 and float(np.abs(np.concatenate(got["first"])).max()) > 0
        err = float(np.abs(acc - want).max()) / scale
        assert err <= TOL, f"{reducer} rank {rank}: accumulated gradients off the sum by {err:.3e} (relative)"


@pytest.mark.skipif(not FSDP2, reason="FSDP2 on the CPU needs a newer torch")
def test_a_step_inside_autocast_under_fsdp2_equals_autocast_per_forward(runs):
    for rank in (0, 1):
        got = _ok(runs[rank]["autocast"])
        assert got["num_mb"] >= 2  # the cache outlived a micro-batch only where there is a second one
        worst = max(float(np.linalg.norm(w - p) / max(np.linalg.norm(p), 1e-30))
                    for w, p in zip(got["wrapped"], got["per_forward"]) if np.abs(p).max() > 0)
        assert worst <= AMP_TOL, f"rank {rank}: a parameter's gradient is {worst:.3e} off (relative)"


@pytest.mark.skipif(not FSDP2, reason="FSDP2 on the CPU needs a newer torch")
def test_an_optimizer_built_before_fsdp2_sharding_is_refused_at_its_first_step(runs):
    for rank in (0, 1):
        got = _ok(runs[rank]["optimizer_order"])
        assert got["after"] == "stepped", got["after"]
        assert got["before"].startswith("ValueError: SGD holds parameters that make_reducer('fsdp2', model) replaced "
                                        "with sharded ones"), got["before"]
        assert "build the optimizer after make_reducer" in got["before"], got["before"]


def test_the_allreduce_reducer_starts_every_rank_from_rank_0s_weights(runs):
    b0, b1 = _ok(runs[0]["broadcast"]), _ok(runs[1]["broadcast"])
    for how in ("make_reducer", "reducer_for"):
        assert not np.array_equal(b0[how + "_before"], b1[how + "_before"])  # the ranks did start apart
        assert np.array_equal(b1[how], b0[how + "_before"]), f"{how}: rank 1 does not hold rank 0's states"
        assert np.array_equal(b0[how], b0[how + "_before"]), f"{how}: rank 0's states changed"


def test_apply_fcp_after_ddp_names_the_order(runs):
    for rank in (0, 1):
        msg = runs[rank]["wrong_order"]
        assert msg.startswith("ValueError: apply_fcp got a model already wrapped in DistributedDataParallel"), msg
        assert "call apply_fcp(model) before make_reducer / DDP / FSDP" in msg, msg


# ------------------------------------------------------------------------------------------ one process

@pytest.fixture(scope="module")
def epoch():
    return _global_batches(1, 0, tpr=80)


def _one_step(batches, loss_fn, fn="train_step"):
    from fcp_exec import step

    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    if fn == "train_step":
        return step.train_step(model, iter(batches), loss_fn, step.AllReduceReducer())
    return step.eval_step(model, iter(batches), loss_fn)


_CONTRACT = re.escape("loss_fn(model, batch) -> scalar tensor")


@pytest.mark.parametrize("loss_fn, error, match", [
    (lambda m, b: _loss(m, b).item(), TypeError, _CONTRACT + r".*returned a Python float \(a number has no gradient"),
    (lambda m, b: types.SimpleNamespace(logits=m(b["input_ids"], b["position_ids"], b["cu_seqlens"], b["ranks"])),
     TypeError, _CONTRACT + r".*returned a SimpleNamespace \(the model's output: return .*model_loss"),
    (lambda m, b: _loss(m, b).reshape(1), TypeError, _CONTRACT + r".*returned a torch.float64 tensor of shape \(1,\)"),
    (lambda m, b: _loss(m, b).detach(), ValueError, _CONTRACT + r": the loss has no gradient"),
    (lambda m, b: None, TypeError, _CONTRACT + r".*returned a NoneType"),
], ids=["python_float", "model_output", "shape_1", "no_gradient", "none"])
def test_a_loss_fn_breaking_the_contract_is_one_clear_error(epoch, loss_fn, error, match):
    with pytest.raises(error, match=match):
        _one_step(epoch[0], loss_fn)


def test_eval_step_checks_the_loss_too(epoch):
    with pytest.raises(TypeError, match=_CONTRACT + r".*returned a Python float"):
        _one_step(epoch[0], lambda m, b: _loss(m, b).item(), fn="eval_step")


def test_the_end_of_an_epoch_says_so_and_is_catchable(epoch):
    from fcp_exec import step

    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    batches, red = iter([b for gb in epoch for b in gb]), step.AllReduceReducer()
    for _ in epoch:
        step.train_step(model, batches, _loss, red)
    with pytest.raises(RuntimeError, match=r"the loader has no global batch left: its epoch ended.*"
                                           r"sampler\.set_epoch\(epoch\) and batches = iter\(loader\)") as info:
        step.train_step(model, batches, _loss, red)
    assert isinstance(info.value, step.EpochEnded)
    with pytest.raises(RuntimeError, match=r"the micro-batches ended after 1 of 2"):  # a cut-short batch: as before
        step.train_step(model, iter(epoch[1][:1]), _loss, red)


# ------------------------------------------------------------------------------------------ Hugging Face

@pytest.fixture(scope="module")
def qwen3():
    from _requires import transformers_models

    transformers_models()
    from fcp_exec.integrations import hf

    model = hf.apply_fcp(hf.build_model(CONFIGS / "qwen3-tiny.json", dtype=torch.float64, seed=0))
    rng = np.random.default_rng(0)
    docs = [{"input_ids": torch.tensor(rng.integers(10, 2000, n), dtype=torch.long)} for n in (37, 20, 5, 44)]
    sampler = FCPSampler([37, 20, 5, 44], num_ranks=1, rank=0, global_batch_size=4, seed=0,
                         cost_model=CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=128))
    batches = list(DataLoader(FCPDataset(docs), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=1)))
    return model, batches


def _hf_losses():
    from fcp_exec.integrations import hf

    return {
        "swapped": (lambda batch, model: hf.fcp_loss(model, batch), TypeError,
                    r"fcp_loss\(model, batch\) got the batch \(a dict\) as the model and the model as the batch: the "
                    r"arguments are swapped"),
        "raw_batch": (lambda model, batch: model(**batch).loss, ValueError,
                      r"the model was called with an FCPCollator batch as it is \(model\(\*\*batch\)\): call "
                      r"model\(\*\*fcp_exec.integrations.hf.batch_inputs\(batch, model\)\)"),
        "hf_labels": (lambda model, batch: model(**hf.batch_inputs(batch, model), labels=batch["labels"][None]).loss,
                      ValueError, r"the model was called with labels= but without shift_labels= and "
                                  r"num_items_in_batch=.*hf_loss_kwargs"),
    }


@pytest.mark.parametrize("mode", ["swapped", "raw_batch", "hf_labels"])
def test_hf_loss_fn_mistakes_are_clear_errors(qwen3, mode):
    from fcp_exec.step import AllReduceReducer, train_step

    model, batches = qwen3
    loss_fn, error, match = _hf_losses()[mode]
    with pytest.raises(error, match=match):
        train_step(model, iter(batches), loss_fn, AllReduceReducer())


def test_hf_losses_of_the_contract_still_train(qwen3):
    """fcp_loss and HF's own loss through hf_loss_kwargs pass the checks and agree (HF's float32 upcast: 1e-6)."""
    from fcp_exec.integrations import hf
    from fcp_exec.step import AllReduceReducer, train_step

    model, batches = qwen3
    ours = train_step(model, iter(batches), hf.fcp_loss, AllReduceReducer()).loss
    theirs = train_step(model, iter(batches), lambda m, b: m(**hf.batch_inputs(b, m), **hf.hf_loss_kwargs(b)).loss,
                        AllReduceReducer()).loss
    model.zero_grad(set_to_none=True)
    assert abs(theirs - ours) <= 1e-6 * abs(ours)


def test_batch_inputs_names_swapped_arguments(qwen3):
    from fcp_exec.integrations import hf

    model, batches = qwen3
    with pytest.raises(TypeError, match=r"batch_inputs\(batch, model\) got the batch .* swapped"):
        hf.batch_inputs(model, batches[0])
    with pytest.raises(TypeError, match=r"the model must be an nn.Module and the batch a dict .* got Qwen3ForCausalLM "
                                        r"and list"):
        hf.batch_inputs(list(batches), model)


def test_hf_collator_of_a_text_model_is_the_text_collator(qwen3):
    from fcp_exec.integrations.hf_positions import hf_collator

    model, batches = qwen3
    for source in (model, model.config):
        collate = hf_collator(source)
        assert type(collate) is FCPCollator and collate.pad_token_id == model.config.pad_token_id
    assert hf_collator(model, pad_token_id=7).pad_token_id == 7


def test_readme_own_loop_imports_what_it_calls_and_builds_the_optimizer_after_the_reducer():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Use with Hugging Face / DDP / FSDP2 / DeepSpeed", 1)[1].split("```", 2)[1]
    assert "from fcp_exec.skips import leave_out_later" in section
    lines = section.splitlines()
    reducer = next(i for i, line in enumerate(lines) if "make_reducer(" in line and "=" in line)
    opt = next(i for i, line in enumerate(lines) if line.startswith("opt = "))
    assert opt > reducer
