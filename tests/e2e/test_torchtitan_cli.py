"""torchtitan's own command line trains with FCP: ``torchrun -m torchtitan.train --module examples.torchtitan_fcp
--config qwen3_debug_fcp`` on 2 CPU processes (gloo), no training loop of ours.

Reference: a randomly initialised LM predicts near-uniformly, so the first loss must be within 0.5 of ln(vocab) (the
debug model's 2,048 tokens) and the losses must fall over 4 steps; FCP's step metrics reach TensorBoard's event file
(a degree-2 ring among them); FCP's validator (``--validator.*`` options) logs
at steps 1, 2 and 4; the run with checkpoints every 2 steps, its step-4 checkpoint removed and run again, resumes
from step 2 and logs steps 3 and 4 — training and validation — exactly as the run that did not stop (torchtitan's
printed losses and gradient norm). Exact equivalence to the stock model is
tests/exec/test_torchtitan_trainer.py's; a failure here means the user's command no longer reaches FCP.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
from _procs import run as run_process

pytestmark = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torchtitan", "triton", "tensorboard")),
                                reason="needs torchtitan's Trainer (torchtitan, triton, tensorboard): make test installs "
                                       "them on x86-64 Linux")
pytestmark = [pytestmark, pytest.mark.timeout(900)]  # hang guards: a CI run took 268 of 300 s (gpt-oss, since cut)

ROOT = Path(__file__).resolve().parents[2]
STEP = re.compile(r"step:\s+(\d+)\s+loss:\s+([0-9.]+)\s+grad_norm:\s+([0-9.]+)")
VALIDATE = re.compile(r"validate step:\s+(\d+)\s+loss:\s+([0-9.]+)")


def _titan(tmp_path: Path, *args: str, config: str = "qwen3_debug_fcp") -> tuple[list[tuple[int, str, str]],
                                                                               list[tuple[int, str]]]:
    """Rank 0's logged (step, loss, grad_norm) and (validation step, loss) of one ``torchtitan.train`` run under
    torchrun, with FCP's validator every 2 steps (2 global batches of 4 documents)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun) if torchrun.exists() else sys.executable, *([] if torchrun.exists() else
           ["-m", "torch.distributed.run"]), "--standalone", "--nproc-per-node", "2", "--local-ranks-filter", "0",
           "-m", "torchtitan.train", "--module", "examples.torchtitan_fcp", "--config", config,
           "--dump_folder", str(tmp_path / "out"), "--metrics.disable_color_printing", "--validator.enable",
           "--validator.freq", "2", "--validator.steps", "2", "--validator.dataloader.global_batch_size", "4",
           "--debug.seed", "0", *args]
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = run_process(cmd, timeout=600, cwd=ROOT, env=env)  # a hang fails with every process's stacks
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-30000:]
    assert "FCP: global batches of 8 documents" in out, out[-4000:]
    return [(int(m[1]), m[2], m[3]) for m in STEP.finditer(out)], [(int(m[1]), m[2]) for m in VALIDATE.finditer(out)]


def test_torchtitan_train_with_fcp_config_trains_and_resumes(tmp_path):
    steps, validated = _titan(tmp_path, "--checkpoint.enable", "--checkpoint.interval", "2",
                              "--metrics.enable_tensorboard")
    assert [s for s, _, _ in steps] == [1, 2, 3, 4], steps
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "out" / "tb").rglob("events.out.tfevents.*")  # rank 0 writes TensorBoard's file
    board = EventAccumulator(str(events))
    board.Reload()
    degrees = [e.value for e in board.Scalars("fcp/max_ring_degree")]
    assert [e.step for e in board.Scalars("fcp/micro_batches")] == [1, 2, 3, 4] and max(degrees) == 2, degrees
    assert [s for s, _ in validated] == [1, 2, 4] and all(math.isfinite(float(v)) for _, v in validated), validated
    losses = [float(loss) for _, loss, _ in steps]
    assert all(math.isfinite(v) for v in losses) and abs(losses[0] - math.log(2048)) < 0.5, losses
    assert losses[-1] < losses[0], losses
    ckpt = tmp_path / "out" / "checkpoint"
    assert (ckpt / "step-2").is_dir() and (ckpt / "step-4").is_dir(), sorted(os.listdir(ckpt))
    shutil.rmtree(ckpt / "step-4")
    resumed, revalidated = _titan(tmp_path, "--checkpoint.enable", "--checkpoint.interval", "2")
    assert resumed == steps[2:], (resumed, steps)
    assert revalidated == validated[2:], (revalidated, validated)


# first-step losses measured over unseeded runs; ln(2048) = 7.62 (uniform predictions over the debug vocabulary)
FIRST_LOSS = {"llama3_debug_fcp": (7.62, 1.0),  # its initial output layer is not near-uniform: 7.98–8.17
              "deepseek_v3_debug_mtp_fcp": (1.3 * 7.62, 1.5),  # main + 0.3 · the MTP depth's: 10.58 measured
              "gpt_oss_debug_fcp": (7.62, 1.5)}  # 8.18 measured (bf16, experts 256 wide on a CPU)


@pytest.mark.parametrize("config", sorted(FIRST_LOSS))
def test_torchtitan_train_other_models_with_fcp(tmp_path, config):
    """The same command with torchtitan's Llama 3 debug model (complex RoPE, its own attention config), DeepSeek-V3's
    with a multi-token-prediction module (MLA, MoE, MTPLoss: the look-ahead tokens through the DataLoader's workers)
    and gpt-oss's (sinks, sliding windows, bf16): 4 steps with validation, the first loss near its uniform value, the
    last below it."""
    steps, validated = _titan(tmp_path, config=config)
    losses = [float(loss) for _, loss, _ in steps]
    centre, tol = FIRST_LOSS[config]
    assert [s for s, _, _ in steps] == [1, 2, 3, 4] and abs(losses[0] - centre) < tol, steps
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], steps
    assert [s for s, _ in validated] == [1, 2, 4] and all(math.isfinite(float(v)) for _, v in validated), validated
