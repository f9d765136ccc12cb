"""``fcp train --checkpoint DIR --checkpoint-every N`` / ``--resume DIR/step-K`` (``fcp_exec.checkpoint``).

Reference: the run that never stopped. 2 real gloo processes, DataLoader with 2 workers (which take batches from
the sampler ahead of the loop: a checkpoint of ``sampler.state_dict()`` would skip them), 5 steps with a checkpoint
every 2; a second run resumed from step 2 must train steps 2–4 on the same global batches (sample indices on every
rank), with the same losses and denominators, and end with the same parameters (every rank's checksum) — FSDP2
(sharded parameters and optimizer state) and DDP, tiny-llm; exact (float32, the same operations in the same order:
measured identical). The resumed run at step 4 also equals a run resumed from step 4. And on another world size:
the 2-rank checkpoint resumed on 1 and on 3 ranks (float64; torch.distributed.checkpoint reshards the FSDP2
parameters and optimizer state; the sampler plans the same global batches for the new world) trains the same samples
per step with the same losses and ends with the same parameters, within 1e-9 relative (summation order only;
measured: losses and checksums within 2.5e-16).
"""

from __future__ import annotations

import pytest

from fcp_exec.train import TrainConfig, run_training

pytestmark = pytest.mark.timeout(300)


def _cfg(tmp_path, reducer, **kw) -> TrainConfig:
    return TrainConfig(model="tiny-llm", steps=5, global_batch_size=8, num_workers=2, reducer=reducer, verbose=False,
                       return_grads=True, cache_dir=str(tmp_path / "cache"), **kw)


def _facts(res) -> list[tuple]:
    return [(s["step"], s["loss"], s["num_tokens"], tuple(s["sample_indices"])) for s in res["steps"]]


@pytest.mark.parametrize("reducer", ["fsdp2", "ddp"])
def test_resumed_training_equals_the_run_that_never_stopped(tmp_path, reducer):
    ckpt = tmp_path / "ckpt"
    full = run_training(_cfg(tmp_path, reducer, checkpoint=str(ckpt), checkpoint_every=2), 2)
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-2", "step-4"]
    resumed = run_training(_cfg(tmp_path, reducer, resume=str(ckpt / "step-2")), 2)
    assert [f[0] for f in _facts(resumed)] == [2, 3, 4]
    assert _facts(resumed) == _facts(full)[2:]
    assert resumed["checksums"] == full["checksums"] and len(set(full["checksums"])) == 1
    last = run_training(_cfg(tmp_path, reducer, resume=str(ckpt / "step-4")), 2)
    assert _facts(last) == _facts(full)[4:] and last["checksums"] == full["checksums"]


def test_a_checkpoint_resumes_on_another_number_of_ranks(tmp_path):
    ckpt = tmp_path / "ckpt"
    full = run_training(_cfg(tmp_path, "fsdp2", dtype="float64", checkpoint=str(ckpt), checkpoint_every=2), 2)
    for nproc in (1, 3):
        resumed = run_training(_cfg(tmp_path, "fsdp2", dtype="float64", resume=str(ckpt / "step-2")), nproc,
                               backend="gloo")  # FSDP2 needs a process group, of one rank too
        got, ref = _facts(resumed), _facts(full)[2:]
        assert [(g[0], g[2], g[3]) for g in got] == [(r[0], r[2], r[3]) for r in ref], nproc  # steps, tokens, samples
        for g, r in zip(got, ref):
            assert abs(g[1] - r[1]) <= 1e-9 * abs(r[1]), (nproc, g[1], r[1])
        assert len(set(resumed["checksums"])) == 1
        assert abs(resumed["checksums"][0] - full["checksums"][0]) <= 1e-9 * abs(full["checksums"][0]), nproc
