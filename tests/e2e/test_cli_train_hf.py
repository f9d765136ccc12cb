"""`fcp train --model hf:CONFIG.json` and the torchrun examples on 2 CPU processes (gloo), 2 steps each.

Reference: a randomly initialised LM predicts near-uniformly, so the first losses must be finite and within 0.5
of ln(vocab_size) (7.60 for the tiny configs' 2000 tokens); every rank must end with identical weights, and
the plan of every micro-batch uses at most the 2 ranks. A failure means the CLI no longer reaches the HF
training stack (model type, reducer, gradient checkpointing, VL data), or the examples drifted from the API.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _procs import run as run_process
from _requires import CPU_FSDP2, needs_cpu_fsdp2, transformers_models

transformers_models()

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
LN_VOCAB = math.log(2000)


def _fcp(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_process([sys.executable, "-m", "fcp_cli", *argv], timeout=timeout, cwd=ROOT)


def _check_losses(losses: list[float]) -> None:
    assert losses and all(math.isfinite(v) and abs(v - LN_VOCAB) < 0.5 for v in losses), losses


@pytest.mark.parametrize("config, extra", [
    ("qwen3-tiny.json", []),
    # llama + ddp + checkpointing: the options reaching TrainConfig are tests/e2e/test_cli_train_config.py's, that
    # training's equivalence to the stock model is tests/exec/test_hf_train.py's; the CLI run itself is slow-only
    pytest.param("llama-tiny.json", ["--reducer", "ddp", "--grad-checkpointing"], marks=pytest.mark.slow),
    pytest.param("qwen2_5_vl-tiny.json", ["--reducer", "fsdp2"], marks=needs_cpu_fsdp2),
    pytest.param("qwen2_vl-tiny.json", ["--reducer", "ddp"], marks=pytest.mark.slow),
    pytest.param("qwen3_vl-tiny.json", ["--grad-checkpointing"], marks=pytest.mark.slow),
])
def test_train_hf_config_json_lines(config, extra):
    """--json: exactly one object per step on stdout with step, loss, num_tokens, degrees (Σ d ≤ nproc per
    micro-batch; fewer means idle ranks), step_time_s. VL configs train on the bundled videos/images."""
    r = _fcp("train", "--model", f"hf:{CONFIGS / config}", "--nproc", "2", "--steps", "2", "--json", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(line) for line in r.stdout.strip().splitlines()]
    assert [rec["step"] for rec in recs] == [0, 1]
    assert all({"step", "loss", "num_tokens", "degrees", "step_time_s"} <= set(rec) for rec in recs)
    assert all(rec["num_tokens"] > 0 and all(1 <= sum(mb) <= 2 for mb in rec["degrees"]) for rec in recs)
    _check_losses([rec["loss"] for rec in recs])


@pytest.mark.slow
def test_train_hf_human_output_reports_reducer_and_agreement():
    """The header names the model type's config, the reducer and the data; the summary checks that all ranks'
    parameters agree (here DDP on the bundled text)."""
    r = _fcp("train", "--model", f"hf:{CONFIGS / 'qwen3-tiny.json'}", "--nproc", "2", "--steps", "1",
             "--reducer", "ddp")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "reducer ddp" in r.stdout and "qwen3-tiny.json" in r.stdout and "bundled samples" in r.stdout
    assert "parameters identical on all 2 ranks: yes" in r.stdout


def _torchrun(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun) if torchrun.exists() else sys.executable, *([] if torchrun.exists() else
           ["-m", "torch.distributed.run"]), "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / script), *args]
    env = {**os.environ, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    r = run_process(cmd, timeout=180, cwd=tmp_path, env=env)  # a hang fails with every process's stacks
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def _lines(r: subprocess.CompletedProcess, head: str) -> list[str]:
    return [ln for ln in r.stdout.splitlines() if ln.startswith(head)]


def test_video_example_runs_and_resumes_under_torchrun(tmp_path):
    """The video example, copied as is, trains 2 steps under `torchrun --nproc-per-node 2` on CPU and prints finite
    losses (its bundled-sample index goes to TMPDIR), with a checkpoint after each; resumed from the first, it prints
    step 1 exactly as the run that never stopped (Qwen2.5-VL's vision tower and the sampler's visual layout
    included)."""
    ckpt = tmp_path / "ckpt"
    steps = _lines(_torchrun(tmp_path, "train_qwen2_5_vl_video.py", "--steps", "2", "--checkpoint", str(ckpt),
                             "--checkpoint-every", "1"), "step ")
    assert len(steps) == 2, steps
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in steps])
    resumed = _torchrun(tmp_path, "train_qwen2_5_vl_video.py", "--steps", "2", "--resume", str(ckpt / "step-1"))
    assert _lines(resumed, "step ") == steps[1:], (resumed.stdout, steps)


def test_video_example_trains_internvl_on_its_bundled_tiles(tmp_path):
    """The same example with the InternVL config: it picks the bundled samples' internvl3 index (448-px tiles, 256
    tokens each; the 8.5K-token videos do not fit 2·1152 tokens and are dropped with a warning) and trains."""
    r = _torchrun(tmp_path, "train_qwen2_5_vl_video.py", "--config", str(CONFIGS / "internvl-tiny.json"), "--steps", "2")
    steps = _lines(r, "step ")
    assert len(steps) == 2, r.stdout
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in steps])


def test_text_example_trains_validates_and_resumes_exactly(tmp_path):
    """The text example (Llama, FSDP2) under torchrun: 4 steps with a checkpoint after step 2 and 4, finite losses, one
    validation batch, the trained model saved for ``from_pretrained`` (``--save-model``); then a second run resumed
    from the step-2 checkpoint prints steps 2 and 3 exactly as the run that never stopped (model and optimizer
    through torch.distributed.checkpoint, the sampler's state after the consumed global batch: the DataLoader's 2
    workers hold later batches, and a state_dict() checkpoint would skip them — measured on this example: different
    losses at steps 2 and 3)."""
    ckpt = tmp_path / "ckpt"
    reducer = "fsdp2" if CPU_FSDP2 else "ddp"  # FSDP2 runs on the CPU from torch 2.7
    common = ["--config", str(CONFIGS / "llama-tiny.json"), "--reducer", reducer, "--steps", "4"]
    first = _torchrun(tmp_path, "train_qwen3_text.py", *common, "--checkpoint", str(ckpt), "--checkpoint-every", "2",
                      "--save-model", str(tmp_path / "final"))
    steps = _lines(first, "step ")
    assert [ln.split()[1] for ln in steps] == ["0", "1", "2", "3"], first.stdout
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in steps])
    evals = _lines(first, "eval ")
    assert len(evals) == 1, first.stdout
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in evals])
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-4"]
    resumed = _torchrun(tmp_path, "train_qwen3_text.py", *common, "--resume", str(ckpt / "step-2"), "--eval-batches", "0")
    assert _lines(resumed, "step ") == steps[2:], (resumed.stdout, steps)
    # --save-model: the trained FSDP2 model, gathered, as a folder the stock from_pretrained loads
    import torch
    from transformers import AutoModelForCausalLM

    from fcp_exec.integrations.hf import build_model, load_config

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "final", local_files_only=True)
    untrained = build_model(load_config(CONFIGS / "llama-tiny.json"), seed=0)
    assert trained.state_dict().keys() == untrained.state_dict().keys()
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), untrained.state_dict().values()))


def test_trainer_example_trains_and_resumes_under_torchrun(tmp_path):
    """The Hugging Face Trainer example (FCPTrainer) under torchrun: 4 steps with the Trainer's own checkpoints every
    2, finite losses, one validation batch; resumed from checkpoint-2 it prints steps 2 and 3 exactly as the run that
    never stopped (the Trainer restores model, optimizer and schedule; FCPTrainer moves the sampler to global batch 2)."""
    out = tmp_path / "out"
    first = _torchrun(tmp_path, "train_hf_trainer.py", "--max-steps", "4", "--save-steps", "2", "--output-dir", str(out))
    steps = _lines(first, "step ")
    assert [ln.split()[1] for ln in steps] == ["0", "1", "2", "3"], first.stdout
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in steps])
    assert len(_lines(first, "eval loss ")) == 1, first.stdout
    assert (out / "checkpoint-2").is_dir() and (out / "checkpoint-4").is_dir()
    resumed = _torchrun(tmp_path, "train_hf_trainer.py", "--max-steps", "4", "--resume", str(out / "checkpoint-2"),
                        "--output-dir", str(tmp_path / "out2"), "--eval-batches", "0")
    assert _lines(resumed, "step ") == steps[2:], (resumed.stdout, steps)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
def test_megatron_example_trains_validates_and_resumes_exactly(tmp_path):
    """The Megatron-core example (GPTModel with FCP's core attention, Megatron's DDP, schedule, finalize and
    optimizer; on CPU through fcp_exec.integrations.megatron_cpu) under torchrun: 4 steps with a checkpoint every 2,
    finite losses near ln(vocab), one validation batch; resumed from step-2.pt it prints steps 2 and 3 exactly as
    the run that never stopped (model, Megatron's optimizer state and the sampler's state after the step)."""
    ckpt = tmp_path / "ckpt"
    first = _torchrun(tmp_path, "train_megatron_gpt.py", "--steps", "4", "--checkpoint", str(ckpt),
                      "--checkpoint-every", "2")
    steps = _lines(first, "step ")
    assert [ln.split()[1] for ln in steps] == ["0", "1", "2", "3"], first.stdout
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in steps])
    assert len(_lines(first, "eval ")) == 1, first.stdout
    resumed = _torchrun(tmp_path, "train_megatron_gpt.py", "--steps", "4", "--resume", str(ckpt / "step-2.pt"),
                        "--eval-batches", "0")
    assert _lines(resumed, "step ") == steps[2:], (resumed.stdout, steps)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
def test_megatron_example_trains_on_a_megatron_indexed_dataset(tmp_path):
    """`--data-prefix`: the Megatron example on a .bin/.idx written by megatron-core's own IndexedDatasetBuilder
    (what tools/preprocess_data.py writes; 40 documents of 20–1,500 tokens, one of 3 sequences, one holding a token id
    past the model's vocabulary), 2 steps, finite losses near ln(vocab), the bad document skipped with its reason, not
    an embedding error inside Megatron; and `fcp simulate --lengths PREFIX.idx` plans on the same documents. With one
    multi-token-prediction module (`--mtp-layers 1`: the collator's look-ahead, fcp_exec/integrations/megatron_mtp)."""
    import numpy as np
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(0)
    prefix = tmp_path / "corpus_text_document"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for d in range(40):
        n = int(rng.integers(20, 1500))
        lengths = [n] if d else [n // 3, n // 3, n - 2 * (n // 3)]
        ids = rng.integers(1, 2000, n)
        ids[n // 2] = 2500 if d in range(0, 40, 4) else ids[n // 2]  # past the vocabulary: every 4th document
        builder.add_document(torch.tensor(ids), lengths)
    builder.finalize(f"{prefix}.idx")
    run = _torchrun(tmp_path, "train_megatron_gpt.py", "--data-prefix", str(prefix), "--vocab-size", "2000",
                    "--steps", "7", "--eval-batches", "0", "--tokens-per-rank", "512", "--mtp-layers", "1")
    steps = _lines(run, "step ")
    assert [ln.split()[1] for ln in steps] == [str(k) for k in range(7)], run.stdout
    _check_losses([float(ln.split(" loss ")[1].split()[0]) for ln in steps])
    assert "fcp: skipped sample" in run.stderr and "vocab" in run.stderr, run.stderr[-2000:]
    # 7 steps of 8 documents cross into the second epoch: a document skipped in the first is left out of it
    # (leave_out_later), so no rank reads and skips one twice (measured without it: 8 of 15 (document, rank) pairs
    # skipped twice)
    skips = collections.Counter((ln.split("fcp: skipped sample ")[1].split()[0].rstrip(":"), ln.split(" rank ")[-1])
                                for ln in run.stderr.splitlines() if "fcp: skipped sample" in ln)
    assert skips and max(skips.values()) == 1, skips
    sim = _fcp("simulate", "--lengths", f"{prefix}.idx", "--ranks", "8", "--global-batch-size", "8", "--steps", "3",
               "--preset", "qwen3-1.7b", "--hardware", "h100", "--json", "--no-progress")
    assert sim.returncode == 0, sim.stderr[-2000:]
    fcp_steps = json.loads(sim.stdout)["fcp"]["steps"]
    assert len(fcp_steps) == 3 and all(t > 0 for t in fcp_steps), sim.stdout


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torchtitan", "triton")),
                    reason="needs torchtitan and triton (make test installs both on x86-64 Linux: see the Makefile)")
def test_torchtitan_example_trains_validates_and_resumes_exactly(tmp_path):
    """The torchtitan example (its Qwen3 debugmodel cut to 2 layers, fused QKV, FSDP2) under torchrun: 4 steps with a
    checkpoint every 2, finite losses (the first near ln(vocab 2048): random weights), one validation batch; resumed
    from step-2 it prints steps 2 and 3 exactly as the run that never stopped (the model through its own state_dict:
    torchtitan's fused QKV saves wq/wk/wv, which torch's canonical-name mapping cannot follow)."""
    ckpt = tmp_path / "ckpt"
    first = _torchrun(tmp_path, "train_torchtitan.py", "--steps", "4", "--checkpoint", str(ckpt), "--checkpoint-every", "2")
    steps = _lines(first, "step ")
    assert [ln.split()[1] for ln in steps] == ["0", "1", "2", "3"], first.stdout
    losses = [float(ln.split(" loss ")[1].split()[0]) for ln in steps]
    assert all(math.isfinite(v) for v in losses) and abs(losses[0] - math.log(2048)) < 0.5, losses
    assert len(_lines(first, "eval ")) == 1, first.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-4"]
    resumed = _torchrun(tmp_path, "train_torchtitan.py", "--steps", "4", "--resume", str(ckpt / "step-2"),
                        "--eval-batches", "0")
    assert _lines(resumed, "step ") == steps[2:], (resumed.stdout, steps)
