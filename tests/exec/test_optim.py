"""``fcp_exec.optim``: the learning rate of every step against values computed by hand, and gradient clipping
against torch's own ``clip_grad_norm_`` (the reference), on one process. The multi-rank behaviour (FSDP2's sharded
norm, DDP, the all-reduce) is tested against the stock model in ``test_hf_train.py`` (``…clipping_and_lr_schedule…``)
and across a resume in ``test_train_checkpoint.py``."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from fcp_exec.optim import TrainingDiverged, check_finite, clip_grad_norm, lr_at, set_lr


@pytest.mark.parametrize("schedule, warmup, steps, min_lr, want", [
    ("constant", 0, 4, 0.0, [1.0, 1.0, 1.0, 1.0]),
    ("constant", 3, 5, 0.0, [0.25, 0.5, 0.75, 1.0, 1.0]),                 # lr·(k+1)/(W+1): step 0 already trains
    ("linear", 0, 5, 0.0, [1.0, 0.75, 0.5, 0.25, 0.0]),
    ("linear", 1, 3, 0.1, [0.5, 1.0, 0.1]),                              # warm-up, peak, min_lr at the last step
    ("cosine", 0, 5, 0.0, [1.0, (1 + math.sqrt(0.5)) / 2, 0.5, (1 - math.sqrt(0.5)) / 2, 0.0]),
    ("cosine", 2, 5, 0.2, [1 / 3, 2 / 3, 1.0, 0.6, 0.2]),
    ("cosine", 0, 1, 0.2, [1.0]),                                        # one step: the peak
])
def test_lr_at_matches_hand_computed_values(schedule, warmup, steps, min_lr, want):
    got = [lr_at(k, lr=1.0, steps=steps, warmup_steps=warmup, schedule=schedule, min_lr=min_lr) for k in range(steps)]
    assert got == pytest.approx(want, rel=1e-15, abs=1e-15)
    assert got[-1] == want[-1]  # the last step lands on min_lr (or lr) exactly, not 1 ulp beside it
    if schedule != "constant":  # past the last step (a resumed run given more --steps is another schedule)
        assert lr_at(steps + 3, lr=1.0, steps=steps, warmup_steps=warmup, schedule=schedule, min_lr=min_lr) == min_lr


def test_lr_at_refuses_an_unknown_schedule():
    with pytest.raises(ValueError, match="schedule must be one of constant, linear, cosine"):
        lr_at(0, lr=1.0, steps=3, schedule="step")


def _model_with_grads(seed: int, scale: float = 1.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3), torch.nn.Linear(3, 3))
    for p in m.parameters():
        p.grad = torch.randn_like(p) * scale
    m[2].bias.grad = None  # a parameter without a gradient is left out, as torch does
    return m


@pytest.mark.parametrize("max_norm", [0.3, 2.0, 100.0, 0.0, None])
def test_clip_grad_norm_equals_torch(max_norm):
    ours, ref = _model_with_grads(0), _model_with_grads(0)
    got = clip_grad_norm(ours, max_norm)
    want = torch.nn.utils.clip_grad_norm_([p for p in ref.parameters() if p.grad is not None],
                                          max_norm if max_norm else math.inf)
    assert got == pytest.approx(float(want), rel=1e-6)
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    clipped = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ours.parameters() if p.grad is not None))
    assert clipped == pytest.approx(min(got, max_norm) if max_norm else got, rel=1e-5)


def test_clip_grad_norm_leaves_an_overflow_to_the_scaler_and_counts_no_gradients_as_zero():
    m = _model_with_grads(1)
    m[0].weight.grad[0, 0] = math.inf
    before = copy.deepcopy([p.grad for p in m.parameters()])
    assert clip_grad_norm(m.parameters(), 0.5) == math.inf
    for a, b in zip(m.parameters(), before):  # not multiplied by 0 (inf·0 = NaN): the scaler skips this step anyway
        assert (a.grad is None and b is None) or torch.equal(a.grad, b)
    assert clip_grad_norm(torch.nn.Linear(2, 2), 1.0) == 0.0


def test_set_lr_sets_every_group():
    m = _model_with_grads(2)
    opt = torch.optim.AdamW([{"params": m[0].parameters()}, {"params": m[1].parameters(), "lr": 5.0}], lr=1.0)
    set_lr(opt, 0.125)
    assert [g["lr"] for g in opt.param_groups] == [0.125, 0.125]


def test_mixed_precision_policy_and_its_misuse():
    from fcp_exec.compat import fsdp2_api

    MixedPrecisionPolicy = fsdp2_api()[2]

    from fcp_exec.step import make_reducer, mixed_precision

    assert mixed_precision("none") is None and mixed_precision(None) is None
    assert mixed_precision("bfloat16") == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert mixed_precision(torch.float16).param_dtype == torch.float16
    with pytest.raises(ValueError, match="mp_policy is FSDP2's mixed precision: it needs reducer 'fsdp2'"):
        make_reducer("allreduce", torch.nn.Linear(2, 2), mp_policy=mixed_precision("bfloat16"))
    with pytest.raises(ValueError, match="mesh is FSDP2's device mesh: it needs reducer 'fsdp2', got 'ddp'"):
        make_reducer("ddp", torch.nn.Linear(2, 2), mesh=object())  # refused before any process group is needed


def test_clip_grad_norm_refuses_a_deepspeed_engine():
    """DeepSpeed keeps gradients in its partitions (``.grad`` is empty): measuring ``.grad`` would return 0 and clip
    nothing, silently. The guard is a type check, so an engine object that was never initialised (no process group
    needed) is enough to reach it."""
    deepspeed = pytest.importorskip("deepspeed")
    engine = object.__new__(deepspeed.DeepSpeedEngine)
    with pytest.raises(TypeError, match="set \"gradient_clipping\" in its config"):
        clip_grad_norm(engine, 1.0)


def test_check_finite_stops_a_diverged_step_and_leaves_an_overflow_to_the_scaler():
    check_finite(3, 2.5, 1.0, 1e-3)
    check_finite(3, 2.5, math.inf, 1e-3, loss_scaler=True)  # an fp16 overflow: the scaler skips the step
    for loss, norm, scaler in ((math.nan, 1.0, False), (math.inf, 1.0, True), (2.5, math.nan, False),
                               (2.5, math.inf, False)):
        with pytest.raises(TrainingDiverged, match="step 3: the loss is .* training diverged"):
            check_finite(3, loss, norm, 1e-3, loss_scaler=scaler)


def test_fcp_train_stops_a_diverged_run_with_one_line_before_applying_the_step(tmp_path, capsys, monkeypatch):
    """Found by reading the fuzz's accepted cases: ``fcp train --lr 1e20`` trained on with a NaN loss (and wrote
    ``NaN`` into its --json lines, which is not JSON). It now stops at the first non-finite loss, before that step's
    optimizer step and checkpoint, with one line and exit 2 — on 2 real processes, and in one process."""
    import subprocess
    import sys
    from pathlib import Path

    from fcp_cli.main import main

    ck = tmp_path / "ck"
    r = subprocess.run([sys.executable, "-m", "fcp_cli", "train", "--steps", "3", "--nproc", "2", "--lr", "1e20",
                        "--checkpoint", str(ck), "--checkpoint-every", "1"], capture_output=True, text=True,
                       timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("fcp train: error: step 1: the loss is nan") and "training diverged" in last, last
    assert sorted(p.name for p in ck.iterdir()) == ["step-1"]  # step 0's checkpoint; step 1 was not applied

    import fcp_exec.train

    def diverge(cfg, nproc, backend=None):  # the one-process path: the error is raised in this process
        raise TrainingDiverged("step 0: the loss is nan ... training diverged")

    monkeypatch.setattr(fcp_exec.train, "run_training", diverge)
    assert main(["train", "--steps", "1", "--nproc", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fcp train: error: step 0: the loss is nan"), err


def test_a_skipped_fp16_step_is_valid_json():
    """An fp16 overflow step has an infinite gradient norm; ``fcp train --json`` wrote it as ``Infinity``, which
    strict JSON readers (jq, most languages) refuse. It is null now, and the line parses without NaN/Infinity."""
    import json

    from fcp_exec.train_config import format_step

    rec = {"step": 4, "loss": 2.5, "num_tokens": 100, "lr": 1e-3, "grad_norm": math.inf, "degrees": [[2]],
           "step_time_s": 0.1, "skipped_samples": [], "loss_scale": 65536.0, "skipped_step": True}

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    doc = json.loads(format_step(rec, json_lines=True), parse_constant=refuse)
    assert doc["grad_norm"] is None and doc["skipped_step"] is True and doc["loss"] == 2.5
    assert "grad norm inf" in format_step({**rec, "planner_wait_s": 0.0})  # the text line keeps saying inf
