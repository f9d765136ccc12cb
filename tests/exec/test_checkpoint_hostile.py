"""``save_checkpoint`` / ``load_checkpoint`` (``fcp_exec.checkpoint``) given what they must refuse, in one process on a
tiny module (``tests/exec/test_train_checkpoint.py`` resumes real runs):

- a checkpoint of a model with more layers than this one (``torch.distributed.checkpoint`` reads only the keys asked
  for, so it loaded without a word) is one ``ValueError`` naming the folder and the keys it has that this model lacks;
- a refused load changes nothing: a sampler state of another global batch size, a truncated data file, extra keys
  are found before the model, optimizer or sampler are touched;
- a truncated ``.metadata`` or data file is one ``ValueError`` naming that file, nothing on stderr;
- ``save_checkpoint`` refuses a bad ``step`` / ``sampler`` / ``last`` before anything is written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _pattern_text import LENGTHS, PatternText
from torch.utils.data import DataLoader

from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
from fcp_exec.checkpoint import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.timeout(300)


class _Tiny(torch.nn.Module):
    def __init__(self, layers: int, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(layers))


def _sampler(global_batch_size: int = 4) -> FCPSampler:
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=80)
    return FCPSampler(LENGTHS, num_ranks=1, rank=0, global_batch_size=global_batch_size, seed=0, cost_model=cost)


def _trained(layers: int, seed: int = 0):
    """A model, an AdamW with state (one step), a sampler and the first micro-batch it gave (``last``)."""
    model = _Tiny(layers, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.1 * (seed + 1))
    opt.step()
    opt.zero_grad()
    sampler = _sampler()
    last = next(iter(DataLoader(FCPDataset(PatternText()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))))
    return model, opt, sampler, last


def _snapshot(model, opt, sampler) -> tuple:
    return ([p.detach().clone() for p in model.parameters()],
            [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for s in opt.state.values()],
            sampler.state_dict())


def _same(a: tuple, b: tuple) -> bool:
    (pa, sa, qa), (pb, sb, qb) = a, b
    return (len(pa) == len(pb) and all(torch.equal(x, y) for x, y in zip(pa, pb)) and len(sa) == len(sb)
            and all(x.keys() == y.keys() and all(torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])) for k in x)
                    for x, y in zip(sa, sb)) and qa == qb)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A checkpoint at step 7 of a 2-layer model."""
    path = tmp_path_factory.mktemp("ck") / "step-7"
    save_checkpoint(path, 7, *_trained(2))
    return path


def _copy(saved: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(saved, tmp_path / saved.name))


def test_a_checkpoint_with_more_keys_than_the_model_is_refused(saved):
    """A 2-layer checkpoint into a 1-layer model: refused, naming the folder and layer 1's keys, nothing changed
    (before: step 7 returned, layer 1's weights and optimizer state ignored)."""
    model, opt, sampler, _ = _trained(1, seed=1)
    before = _snapshot(model, opt, sampler)
    with pytest.raises(ValueError, match=r"saved from another model or config\?") as err:
        load_checkpoint(saved, model, opt, sampler)
    msg = str(err.value)
    assert str(saved) in msg and "not in this model and optimizer" in msg and "layers.1.weight" in msg, msg
    assert _same(before, _snapshot(model, opt, sampler))
    # the same model as saved loads, and the refusal above left nothing behind
    model2, opt2, sampler2, _ = _trained(2, seed=1)
    assert load_checkpoint(saved, model2, opt2, sampler2) == 7
    assert all(torch.equal(a, b) for a, b in zip(_trained(2)[0].parameters(), model2.parameters()))


def test_a_sampler_state_the_sampler_refuses_changes_nothing(saved, tmp_path):
    """Another global batch size is refused before the model and optimizer are restored (before: after), naming
    the sampler file; a state with later exclusions (which ``check_state`` alone refuses on a fresh sampler, and
    ``load_state_dict`` takes over) still loads."""
    model, opt, _, _ = _trained(2, seed=1)
    sampler = _sampler(global_batch_size=6)
    before = _snapshot(model, opt, sampler)
    with pytest.raises(ValueError, match=r"sampler-rank0\.json does not fit this sampler: .*global_batch_size"):
        load_checkpoint(saved, model, opt, sampler)
    assert _same(before, _snapshot(model, opt, sampler))
    model, opt, excluding, last = _trained(2)
    excluding.exclude_later([0, 1, 2], 1)
    save_checkpoint(tmp_path / "late", 1, model, opt, excluding, last)
    fresh = _sampler()
    assert load_checkpoint(tmp_path / "late", *_trained(2, seed=1)[:2], fresh) == 1
    assert fresh.state_dict()["excluded_later"] == [[1, [0, 1, 2]]]


@pytest.mark.parametrize("name", ["__0_0.distcp", ".metadata"])
def test_a_truncated_file_is_one_error_naming_it(saved, tmp_path, capfd, name):
    """A truncated data file or ``.metadata``: one ``ValueError`` naming that file, nothing changed, nothing on
    stderr (before: "does not fit this model" naming the folder, or "AssertionError: metadata is None" with torch's
    tracebacks logged)."""
    path = _copy(saved, tmp_path)
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2])
    model, opt, sampler, _ = _trained(2, seed=1)
    before = _snapshot(model, opt, sampler)
    capfd.readouterr()
    with pytest.raises(ValueError, match=f"^checkpoint file {path / name} is damaged or truncated"):
        load_checkpoint(path, model, opt, sampler)
    assert capfd.readouterr().err == ""
    assert _same(before, _snapshot(model, opt, sampler))


def test_a_data_file_damaged_inside_at_its_full_size_is_a_value_error_that_says_so(saved, tmp_path):
    """A ``.distcp`` of the right size with garbage in its middle half passes the size check and is found only by
    the read: a ``ValueError`` that names the damage as a cause (before: only "another model or config?"). Measured
    on this checkpoint, one flipped bit at 39 positions: 12 loads refused, 27 loaded exactly the saved values (zip
    padding and headers), none loaded wrong values."""
    path = _copy(saved, tmp_path)
    f = path / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    n = len(data)
    data[n // 4: 3 * n // 4] = np.random.default_rng(0).integers(0, 256, 3 * n // 4 - n // 4, dtype=np.uint8).tobytes()
    f.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"checkpoint {path} does not fit .* or a data file of it is damaged inside"):
        load_checkpoint(path, *_trained(2, seed=1)[:3])


def test_a_missing_data_file_is_one_error_naming_it(saved, tmp_path):
    path = _copy(saved, tmp_path)
    (path / "__0_0.distcp").unlink()
    with pytest.raises(ValueError, match=f"checkpoint file {path / '__0_0.distcp'} is damaged or truncated .*missing"):
        load_checkpoint(path, *_trained(2, seed=1)[:3])


@pytest.mark.parametrize("bad, error, match", [
    (dict(step="abc"), TypeError, r"save_checkpoint: step must be an int"),
    (dict(step=True), TypeError, r"save_checkpoint: step must be an int"),
    (dict(step=2.0), TypeError, r"save_checkpoint: step must be an int"),
    (dict(step=-3), ValueError, r"save_checkpoint: step must be >= 0"),
    (dict(sampler=None), TypeError, r"save_checkpoint: sampler must be the run's FCPSampler"),
    (dict(last=None), TypeError, r"state_after: pass the last batch"),
    (dict(grad_scaler=object()), TypeError, r"save_checkpoint: grad_scaler must be"),
])
def test_save_refuses_bad_arguments_before_writing(tmp_path, bad, error, match):
    """Before: step='abc' was "invalid literal for int()", sampler=None an AttributeError, each after the model
    files were written (a half checkpoint); step=-3 was saved."""
    model, opt, sampler, last = _trained(1)
    args = {"step": 3, "sampler": sampler, "last": last, **bad}
    path = tmp_path / "ck"
    with pytest.raises(error, match=match):
        save_checkpoint(path, args.pop("step"), model, opt, args.pop("sampler"), args.pop("last"), **args)
    assert not path.exists()


def _refused_on_one_rank(folder: str) -> dict:
    """On 2 ranks: a save whose ``step`` rank 1 alone refuses, then a good save, then a load whose sampler state only
    rank 1's file spoils; each refusal caught (a trainer that goes on after it), then one all-reduce that must still
    meet its peer."""
    import json

    import torch.distributed as dist

    rank, out = dist.get_rank(), {}
    model, opt, sampler, last = _trained(2)
    try:
        save_checkpoint(Path(folder) / "bad", 3 if rank == 0 else -3, model, opt, sampler, last)
    except (TypeError, ValueError) as e:
        out["save"] = f"{type(e).__name__}: {e}"
    good = save_checkpoint(Path(folder) / "step-3", 3, model, opt, sampler, last)
    if rank == 1:  # rank 1's sampler state of another save (a node that kept an older copy)
        f = good / "sampler-rank1.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), "step": 5}))
    dist.barrier()
    try:
        load_checkpoint(good, *_trained(2, seed=1)[:3])
    except ValueError as e:
        out["load"] = str(e)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    out["all_reduce"] = float(total)
    return out


def test_a_refusal_on_one_rank_is_a_refusal_on_every_rank(tmp_path):
    """When one rank refuses a save or a load (its own arguments, its own sampler file), every rank raises before
    ``torch.distributed.checkpoint``'s collectives, the others naming that rank (before: rank 0 went into DCP's
    collective save or load alone, to wait for a peer that had left — a hang, or collectives paired out of order)."""
    from fcp_exec.launch import launch

    r0, r1 = launch(_refused_on_one_rank, 2, str(tmp_path), backend="gloo", timeout=240.0, pg_timeout=60.0)
    assert r1["save"].startswith("ValueError: save_checkpoint: step must be >= 0"), r1
    assert r0["save"].startswith(f"ValueError: checkpoint {tmp_path / 'bad'} was not written: rank 1 refused it: "
                                 "ValueError: save_checkpoint: step must be >= 0"), r0
    assert "sampler-rank1.json is at step 5" in r1["load"], r1
    assert r0["load"].startswith(f"checkpoint {tmp_path / 'step-3'} was not loaded: rank 1 refused it: ValueError: "), r0
    assert "sampler-rank1.json is at step 5" in r0["load"], r0
    assert r0["all_reduce"] == r1["all_reduce"] == 3.0
    assert not (tmp_path / "bad").exists()
