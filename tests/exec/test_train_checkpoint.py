"""``fcp train --checkpoint DIR --checkpoint-every N`` / ``--resume DIR/step-K`` (``fcp_exec.checkpoint``).

Reference: the run that never stopped. 2 real gloo processes, DataLoader with 2 workers (which take batches from
the sampler ahead of the loop: a checkpoint of ``sampler.state_dict()`` would skip them), 5 steps with a checkpoint
every 2. A run resumed from step 2 must train steps 2–4 on the same global batches (sample indices on every rank)
with the same denominators and losses, and end with the same parameters (every rank's checksum):
- on the same 2 ranks, exactly (the same operations in the same order): FSDP2 and FSDP1 in float64 (sharded
  parameters and optimizer state; a warm-up + cosine learning-rate schedule and gradient clipping, which must continue from the
  saved step) and DDP in float32;
- on 1 and on 3 ranks (torch.distributed.checkpoint reshards the FSDP parameters and optimizer state; the sampler
  plans the same global batches for the new world), within 1e-9 relative in float64 (summation order only;
  measured: within 2.5e-16).
A checkpoint of another model, or a folder mixing two saves' sampler states, is one line from ``fcp train --resume``,
not a traceback or a hang.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _requires import cpu_fsdp2

from fcp_exec.train import TrainConfig, run_training

pytestmark = pytest.mark.timeout(300)


# FSDP2 runs: a warm-up and a cosine schedule, gradients clipped at every step (their norms are 1.3-2.1 here)
OPTIM = dict(max_grad_norm=1.0, warmup_steps=1, lr_schedule="cosine", min_lr=1e-4)


def _cfg(root: Path, reducer: str, **kw) -> TrainConfig:
    kw = {"steps": 5, "num_workers": 2, **kw}
    return TrainConfig(model="tiny-llm", global_batch_size=8, reducer=reducer, verbose=False, return_grads=True,
                       cache_dir=str(root / "cache"), **kw)


def _facts(res) -> list[tuple]:
    return [(s["step"], s["loss"], s["num_tokens"], tuple(s["sample_indices"])) for s in res["steps"]]


_SHARDED: dict = {}


def _sharded_run(reducer: str, tmp_path_factory):
    """5 steps of FSDP2 (or FSDP1) in float64 on 2 ranks with checkpoints after steps 2 and 4 (once per module):
    (its result, the folder, the root)."""
    if reducer == "fsdp2":
        cpu_fsdp2()
    if reducer not in _SHARDED:
        root = tmp_path_factory.mktemp(reducer)
        ckpt = root / "ckpt"
        full = run_training(_cfg(root, reducer, dtype="float64", checkpoint=str(ckpt), checkpoint_every=2, **OPTIM), 2)
        assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-4"]
        _SHARDED[reducer] = full, ckpt, root
    return _SHARDED[reducer]


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory):
    return _sharded_run("fsdp2", tmp_path_factory)


@pytest.mark.parametrize("reducer", ["fsdp2", "fsdp1"])
@pytest.mark.parametrize("nproc", [2, 1, 3])
def test_sharded_resumed_training_equals_the_run_that_never_stopped(tmp_path_factory, reducer, nproc):
    """FSDP2's DTensor shards and FSDP1's flat-parameter shards (torch's ``get_state_dict`` / ``set_state_dict``
    for both, the optimizer state too) resume exactly on 2 ranks and reshard onto 1 and 3."""
    full, ckpt, root = _sharded_run(reducer, tmp_path_factory)
    resumed = run_training(_cfg(root, reducer, dtype="float64", resume=str(ckpt / "step-2"), **OPTIM), nproc,
                           backend="gloo")  # FSDP needs a process group, of one rank too
    got, ref = _facts(resumed), _facts(full)[2:]
    # the schedule continues from the saved step (lr is a function of it) and clipping acted in both runs
    assert [s["lr"] for s in resumed["steps"]] == [s["lr"] for s in full["steps"]][2:]
    assert len({s["lr"] for s in full["steps"]}) == 5
    assert all(s["grad_norm"] > OPTIM["max_grad_norm"] for s in full["steps"] + resumed["steps"])
    assert [(g[0], g[2], g[3]) for g in got] == [(r[0], r[2], r[3]) for r in ref]  # steps, tokens, samples
    assert len(set(resumed["checksums"])) == 1
    if nproc == 2:  # the same world: exactly
        assert got == ref and resumed["checksums"] == full["checksums"]
        return
    for g, r in zip(got, ref):
        assert abs(g[1] - r[1]) <= 1e-9 * abs(r[1]), (nproc, g[1], r[1])
    assert abs(resumed["checksums"][0] - full["checksums"][0]) <= 1e-9 * abs(full["checksums"][0]), nproc


@pytest.mark.parametrize("amp", ["none", "float16"])
def test_ddp_resumed_training_equals_the_run_that_never_stopped(tmp_path, amp):
    """``float16``: ``--amp float16`` with a scale that doubles after every clean step (``--loss-scale-window 1``, from
    2**14), so the resumed run must take the saved scale (2**16 after two steps), not its initial one: every step's
    scale and skip equal the run's that never stopped, and the scale did move."""
    ckpt = tmp_path / "ckpt"
    kw = dict(amp="float16", initial_loss_scale=2.0 ** 14, loss_scale_window=1) if amp == "float16" else {}
    full = run_training(_cfg(tmp_path, "ddp", checkpoint=str(ckpt), checkpoint_every=2, **kw), 2)
    resumed = run_training(_cfg(tmp_path, "ddp", resume=str(ckpt / "step-2"), **kw), 2)
    assert [f[0] for f in _facts(resumed)] == [2, 3, 4]
    assert _facts(resumed) == _facts(full)[2:]
    assert resumed["checksums"] == full["checksums"] and len(set(full["checksums"])) == 1
    if amp == "float16":
        scales = [(s.get("loss_scale"), s.get("skipped_step")) for s in full["steps"]]
        assert [(s["loss_scale"], s["skipped_step"]) for s in resumed["steps"]] == scales[2:], scales
        assert scales[2][0] == 2.0 ** 16, scales


def test_a_checkpoint_of_another_model_is_one_line(fsdp2_run, capsys):
    """`fcp train --resume` with a checkpoint of another model: one line naming the checkpoint and the first missing
    key (torch.distributed.checkpoint raises a BaseException listing every rank's traceback), exit 2."""
    from fcp_cli.main import main

    _, ckpt, _ = fsdp2_run
    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "qwen3-tiny.json"
    rc = main(["train", "--model", f"hf:{config}", "--nproc", "2", "--steps", "3", "--resume", str(ckpt / "step-2")])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1, err
    assert "does not fit this model and optimizer" in err and "Missing key in checkpoint state_dict" in err, err


def test_sampler_files_of_two_saves_are_one_line(fsdp2_run, capsys, tmp_path):
    """A checkpoint folder whose rank-1 sampler state comes from another save (files copied together by hand) would
    let the ranks plan different global batches: one line naming the file, exit 2, instead of a hang."""
    import shutil

    from fcp_cli.main import main

    _, ckpt, _ = fsdp2_run
    mixed = tmp_path / "mixed"
    shutil.copytree(ckpt / "step-2", mixed)
    shutil.copy(ckpt / "step-4" / "sampler-rank1.json", mixed / "sampler-rank1.json")
    rc = main(["train", "--reducer", "fsdp2", "--dtype", "float64", "--nproc", "2", "--steps", "5", "--num-workers", "2",
               "--resume", str(mixed)])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1, err
    assert "sampler-rank1.json is at step 4" in err and "files of two different saves" in err, err


def test_a_checkpoint_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """A --checkpoint path that is a file (or lies under one) is refused before the run starts (before: a traceback
    from torch.distributed.checkpoint at the first save); a save that fails later (the folder replaced by a file
    mid-run, a full disk) is an OSError naming the checkpoint, which the CLI and fcp_exec.script.run_main print as
    one line."""
    import torch

    from fcp_cli.main import main
    from fcp_exec.checkpoint import save_checkpoint

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for bad in (blocker, blocker / "ckpt"):
        rc = main(["train", "--steps", "1", "--nproc", "1", "--checkpoint", str(bad), "--checkpoint-every", "1"])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and err.count("\n") == 1 and str(bad) in err and "--checkpoint" in err, err
    model = torch.nn.Linear(3, 2)
    with pytest.raises(OSError, match=f"checkpoint {blocker / 'step-1'} could not be written: .*Not a directory"):
        save_checkpoint(blocker / "step-1", 1, model, torch.optim.AdamW(model.parameters()), None, None)
