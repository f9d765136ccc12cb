"""fcp_exec.checkpoint facts pinned in one process (cheap), each against what the module docstring promises:

* Saving over a folder written by *more* ranks removes their sampler states (``sampler-rank{r}.json`` with
  ``r >= world``), so a later resume on that many ranks cannot read a state of another save: in a world of one,
  every ``sampler-rank{r}.json`` with r ≥ 1 must be gone and rank 0's must be this save's.
* fp16's loss-scaler state (scale, growth tracker) saved by ``save_checkpoint(grad_scaler=)`` comes back in
  ``load_checkpoint(grad_scaler=)``: reference, the saved scaler's own ``state_dict()``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from _pattern_text import PatternText
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
from fcp_exec.checkpoint import checkpoint_step, load_checkpoint, save_checkpoint

LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58]


def _sampler() -> FCPSampler:
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=80)
    return FCPSampler(LENGTHS, num_ranks=1, rank=0, global_batch_size=4, seed=0, cost_model=cost)


def _parts():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = _sampler()
    last = next(iter(DataLoader(FCPDataset(PatternText()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))))
    return model, opt, sampler, last


def test_saving_over_a_folder_of_more_ranks_removes_their_sampler_states(tmp_path):
    path = tmp_path / "step-3"
    path.mkdir()
    stale = {"step": 9, "sampler": {"epoch": 5, "global_batch": 0, "micro_batch": 0}}
    for r in (0, 1, 3):
        (path / f"sampler-rank{r}.json").write_text(json.dumps(stale))
    save_checkpoint(path, 3, *_parts())
    assert sorted(p.name for p in path.glob("sampler-rank*.json")) == ["sampler-rank0.json"]
    assert checkpoint_step(path) == 3


def test_the_loss_scaler_state_round_trips(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 7, growth_interval=3)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler.update(2.0 ** 5)  # a scale other than the initial one
    want = scaler.state_dict()
    path = save_checkpoint(tmp_path / "ck", 1, *_parts(), grad_scaler=scaler)
    fresh = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=3)
    model, opt, sampler, _ = _parts()
    assert load_checkpoint(path, model, opt, sampler, grad_scaler=fresh) == 1
    got = fresh.state_dict()
    assert float(got["scale"]) == float(want["scale"]) == 2.0 ** 5
    assert int(got["_growth_tracker"]) == int(want["_growth_tracker"])


def _save_on_two_ranks(folder):
    """Rank 0 is slow to write its sampler state; rank 1 looks for it as soon as save_checkpoint returns."""
    import time
    import types

    import torch.distributed as dist

    import fcp_exec.checkpoint as ck

    rank = dist.get_rank()
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=80)
    sampler = FCPSampler(LENGTHS, num_ranks=2, rank=rank, global_batch_size=4, seed=0, cost_model=cost)
    last = next(iter(DataLoader(FCPDataset(PatternText()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if rank == 0:
        real = json.dumps
        ck.json = types.SimpleNamespace(dumps=lambda *a, **k: (time.sleep(3), real(*a, **k))[1], loads=json.loads)
    save_checkpoint(Path(folder), 2, model, opt, sampler, last)
    return sorted(p.name for p in Path(folder).glob("sampler-rank*.json"))


def test_save_returns_on_every_rank_only_once_every_ranks_files_are_written(tmp_path):
    """save_checkpoint's contract: "every rank's files are written before any rank goes on (and may be killed)" —
    a rank that returned and was then stopped must leave a complete checkpoint. Reference: both sampler states are
    there on every rank the moment save_checkpoint returns, even when rank 0 writes its own 3 s late."""
    from fcp_exec.launch import launch

    for rank, names in enumerate(launch(_save_on_two_ranks, 2, str(tmp_path / "step-2"), timeout=120)):
        assert names == ["sampler-rank0.json", "sampler-rank1.json"], (rank, names)
