"""The sampler's configuration is one frozen dataclass and the resume fingerprint is derived from its fields:
every field but ``prefetch`` is in ``state_dict()["config"]``, and a mid-global-batch state saved under any other
value of any of them is refused by ``load_state_dict`` naming that field (at a global-batch boundary, exactly those
that change the epoch's global batches are)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fcp_data.cost import CostModel
from fcp_data.sampler import FCPSampler
from fcp_data.sampler_config import SamplerConfig

CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, tokens_per_rank=4096, ranks_per_node=8)
LENGTHS = np.random.default_rng(0).integers(50, 3000, size=64)
BASE = dict(num_ranks=4, rank=1, cost_model=CM, global_batch_size=16)
# another valid value for every field (the test fails if a field is added without one here)
OTHER = dict(num_ranks=8, rank=2, cost_model=CM.replace(alpha2=6e-7), global_batch_size=8, global_batch_tokens=None,
             seed=3, drop_last=True, on_overlong="truncate", solver="fcp-pow2", micro_batches=2,
             solver_options={"robust_tol": 0.0}, prefetch=0)


def test_every_field_has_a_changed_value_and_fingerprint_excludes_only_prefetch():
    names = [f.name for f in dataclasses.fields(SamplerConfig)]
    assert sorted(OTHER) == sorted(names)
    assert set(SamplerConfig.fingerprint_fields()) == set(names) - {"prefetch"}
    state = FCPSampler(LENGTHS, **BASE).state_dict()
    assert set(state["config"]) == set(SamplerConfig.fingerprint_fields()) | {"num_samples", "data_digest"}


@pytest.mark.parametrize("name", sorted(OTHER))
def test_a_state_saved_with_another_value_of_a_field_is_refused(name):
    """Mid-global-batch, any other value is refused naming the field. At a global-batch boundary a state resumes under
    another value exactly when the two samplers' epochs hold the same global batches (reference: their
    ``global_batch_indices``, compared directly) — world size, rank, cost model, solver — and is refused, naming
    the field, when they differ (seed, batch size)."""
    kw = dict(BASE)
    kw[name] = OTHER[name]
    if name == "global_batch_tokens":  # exactly one of the two batch sizes
        kw.update(global_batch_size=None, global_batch_tokens=20000)
    src = FCPSampler(LENGTHS, **kw)
    saved = src.state_dict()
    fresh = FCPSampler(LENGTHS, **BASE)
    if name == "prefetch":  # planning ahead does not change the lists: the state loads
        fresh.load_state_dict(saved)
        return
    with pytest.raises(ValueError, match=name):
        fresh.load_state_dict({**saved, "micro_batch": 1})
    same = src.num_global_batches(0) == fresh.num_global_batches(0) and all(
        np.array_equal(src.global_batch_indices(g, 0), fresh.global_batch_indices(g, 0))
        for g in range(src.num_global_batches(0)))
    if same:
        fresh.load_state_dict(saved)
        assert fresh.state_dict()["global_batch"] == 0
    else:
        with pytest.raises(ValueError, match=name):
            fresh.load_state_dict(saved)


def test_the_batch_digest_separates_the_fields_that_change_an_epoch():
    """Which fields of OTHER change epoch 0's global batches here (the reference above decides per field): the seed
    and the batch sizes must; the planning fields must not."""
    changed = set()
    for name in sorted(OTHER):
        kw = {**BASE, name: OTHER[name]}
        if name == "global_batch_tokens":
            kw.update(global_batch_size=None, global_batch_tokens=20000)
        a, b = FCPSampler(LENGTHS, **kw), FCPSampler(LENGTHS, **BASE)
        if a.state_dict()["batches"] != b.state_dict()["batches"]:
            changed.add(name)
    assert {"seed", "global_batch_size", "global_batch_tokens"} <= changed
    assert not changed & {"num_ranks", "rank", "cost_model", "solver", "micro_batches", "solver_options", "prefetch"}


def test_config_is_frozen_and_read_through_the_sampler():
    s = FCPSampler(LENGTHS, **BASE, seed=5)
    assert (s.num_ranks, s.rank, s.seed, s.solver, s.prefetch) == (4, 1, 5, "fcp", 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.config.seed = 6
    with pytest.raises(AttributeError):
        s.not_an_option  # noqa: B018


@pytest.mark.parametrize("call, match", [
    # found by a review of the data API: a bare pathlib TypeError, "file . is a directory", a self-contradicting
    # "degree 2 is not allowed; valid degrees: [1, 2]" (the str "2"), "got shape ()", and durations taken as lengths
    (lambda: CostModel.load(None), "CostModel.load needs the path of a cost JSON, got None"),
    (lambda: CostModel.load(""), "CostModel.load needs the path of a cost JSON, got ''"),
    (lambda: __import__("fcp_data").IndexedDataset(None), "a length index is the path of the folder"),
    (lambda: FCPSampler(LENGTHS, **BASE, solver="static-cp", solver_options={"degree": "2"}),
     "degree must be an int .* got '2'"),
    (lambda: FCPSampler((int(x) for x in LENGTHS), **BASE), "a list or an array\\), got generator"),
    (lambda: FCPSampler(LENGTHS.astype("timedelta64[s]"), **BASE), "lengths must be integers, got dtype timedelta64"),
    (lambda: FCPSampler(LENGTHS, **BASE, exclude="/"), "exclude file /: a directory, not a file"),  # was "no such file"
])
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_micro_batches_takes_a_numpy_int_as_the_other_counts_do():
    s = FCPSampler(LENGTHS, num_ranks=np.int64(4), rank=np.int64(1), cost_model=CM,
                   global_batch_size=np.int64(16), micro_batches=np.int64(2))
    assert type(s.micro_batches) is int and s.micro_batches == 2 and len(s) == len(list(s))
