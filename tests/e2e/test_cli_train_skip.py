"""`fcp train` on data with samples that pass `fcp index` but fail when read (videos whose frame data is zeroed
behind an intact header): the run completes, says what it skipped and writes it to --read-errors-out; with
--on-read-error raise it stops with one line naming the sample (exit 2), never a traceback; the next run given that
file as --exclude leaves those samples out (nothing left to skip). The training maths of a
skip (the step equals training on the rest of the batch) is tests/exec/test_hf_train.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _damaged_data import damaged_video_index

pytest.importorskip("decord")

ROOT = Path(__file__).resolve().parents[2]


def _fcp(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fcp_cli", *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_train_skips_damaged_videos_and_reports_them(tmp_path):
    index, damaged = damaged_video_index(tmp_path / "data", "qwen2-vl")
    out = tmp_path / "skipped.jsonl"
    common = ("train", "--model", "tiny-mllm", "--data", str(index), "--nproc", "1", "--global-batch-size", "4")
    r = _fcp(*common, "--steps", "3", "--read-errors-out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    # 3 steps x 4 of the 11 samples: the epoch wraps, so every damaged video is read at least once
    assert sorted({rec["key"] for rec in lines}) == sorted(damaged)
    assert all(rec["reason"] == "VideoDecodeError" and set(rec) == {"index", "key", "reason", "detail", "epoch",
                                                                     "global_batch", "rank"} for rec in lines)
    assert f"skipped {len(lines)} sample(s) that failed to read" in r.stdout
    assert "Traceback" not in r.stderr and "NAL unit" not in r.stderr  # one warning line per skip, no libav noise
    assert r.stderr.count("fcp: skipped sample") == len(lines)

    # the next run leaves them out (--exclude the errors file): nothing to skip, even with raise on read errors
    r = _fcp(*common, "--steps", "3", "--exclude", str(out), "--on-read-error", "raise")
    assert r.returncode == 0 and "skipped" not in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"leaves out {len(damaged)} excluded sample(s)" in r.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("3\n99\n")
    r = _fcp(*common, "--steps", "1", "--exclude", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1].startswith("fcp train: error:") and "99 is not a sample index" in r.stderr
    other = tmp_path / "other_index.jsonl"  # a record of another index: its sample here has another key
    other.write_text(json.dumps({**lines[0], "key": "not-" + lines[0]["key"]}) + "\n")
    r = _fcp(*common, "--steps", "1", "--exclude", str(other))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "no sample of this data has key 'not-" in r.stderr.strip().splitlines()[-1], r.stderr[-3000:]

    r = _fcp(*common, "--steps", "3", "--on-read-error", "raise")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    [line] = r.stderr.strip().splitlines()
    assert line.startswith("fcp train: error: sample ") and "VideoDecodeError: cannot decode the video's frames" in line
    assert any(f"({k})" in line for k in damaged), line


def test_a_skipped_sample_is_left_out_of_later_epochs_and_the_resume_keeps_that(tmp_path):
    """2 gloo processes, 6 steps (11 samples, global batches of 4: epoch 0 is 3 steps). Every damaged video is skipped
    in epoch 0 and none is read after it: epochs 1 and 2 have exactly the global batches of a run given the damaged
    samples as ``--exclude`` (the same order of the same kept samples). A run resumed from the checkpoint after step 2 (some
    damaged videos already skipped before it) trains steps 2-5 exactly as the run that never stopped: the exclusions
    are in the sampler's state (mutation, state without them: epoch 1 reads the damaged videos again). With
    ``--retry-skipped`` epoch 1 reads and skips them again."""
    from fcp_exec.train import TrainConfig, run_training

    index, _ = damaged_video_index(tmp_path / "data", "qwen2-vl")
    ckpt = tmp_path / "ckpt"

    def cfg(**kw):
        return TrainConfig(model="tiny-mllm", data=str(index), global_batch_size=4, steps=6, verbose=False,
                           return_grads=True, cache_dir=str(tmp_path / "cache"), **kw)

    def epochs(res):  # per step: (global batch's samples, the indices skipped)
        return [(tuple(s["sample_indices"]), sorted(r["index"] for r in s["skipped_samples"])) for s in res["steps"]]

    full = run_training(cfg(checkpoint=str(ckpt), checkpoint_every=2), 2)
    steps = epochs(full)
    bad = sorted({i for _, skipped in steps[:3] for i in skipped})
    assert len(bad) >= 3 and sorted(i for s, _ in steps[:3] for i in s) == list(range(11))  # epoch 0: all 11
    assert all(not skipped for _, skipped in steps[3:]), steps  # epoch 1: nothing skipped ...
    assert not set(bad) & {i for s, _ in steps[3:] for i in s}  # ... nothing damaged read
    assert any(steps[k][1] for k in range(2)), steps  # a skip before the checkpoint of step 2
    errors = tmp_path / "bad.txt"
    errors.write_text("".join(f"{i}\n" for i in bad))
    ref = epochs(run_training(cfg(exclude=str(errors)), 1))
    # epochs 1 and 2 (8 samples: 2 steps each): the global batches of the run that excluded them from the start
    assert [s for s, _ in steps[3:]] == [s for s, _ in ref[2:5]]

    resumed = run_training(cfg(resume=str(ckpt / "step-2")), 2)
    assert [(s["step"], s["loss"], s["num_tokens"]) for s in resumed["steps"]] == \
        [(s["step"], s["loss"], s["num_tokens"]) for s in full["steps"][2:]]
    assert epochs(resumed) == steps[2:]

    retry = epochs(run_training(cfg(retry_skipped=True), 1))
    assert retry[:3] == steps[:3] and sorted(i for _, skipped in retry[3:] for i in skipped) == bad
