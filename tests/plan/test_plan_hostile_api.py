"""Hostile use of the planning API (plan_batch, FCPSampler, simulate, presets): every case either plans or is one
clear error naming the argument. Each test failed on the code before its fix (named in the test's docstring)."""

from __future__ import annotations

import itertools
import logging
import warnings

import numpy as np
import pytest

from fcp_data import CostModel, FCPSampler
from fcp_data.plan import fcp_micro_batch, megatron_dynamic, plan_batch, static_cp
from fcp_data.plan.simulate import simulate
from fcp_data.presets import ModelConfig

CM = CostModel.preset("qwen3-8b", "h100")
E = CM.tokens_per_rank
SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=32000)


def _check(plan, lengths, cm, M=None):
    """Every sequence once, memory and ranks of every micro-batch."""
    lengths = np.asarray(lengths)
    assert sorted(plan.seq_ids) == list(range(lengths.size))
    assert M is None or len(plan.micro_batches) == M
    for mb in plan.micro_batches:
        assert sum(g.degree for g in mb.groups) <= plan.num_ranks
        for g in mb.groups:
            assert lengths[list(g.seq_ids)].sum() <= g.degree * cm.tokens_per_rank


# ---------------------------------------------------------------- 1. a fixed micro-batch count

@pytest.mark.parametrize("lengths, num_ranks, cm", [
    ([304322, 82440, 187982, 275255, 247163, 237803], 8, CM),
    ([5, 5, 4, 3, 3], 1, CM.replace(tokens_per_rank=10)),
])
def test_fixed_micro_batches_find_a_split_the_greedy_one_misses(lengths, num_ranks, cm):
    """Was "does not fit in 2 micro-batch(es)": the work-balanced split fails, a split by tokens fits."""
    plan = plan_batch(lengths, num_ranks=num_ranks, cost_model=cm, micro_batches=2)
    _check(plan, lengths, cm, M=2)


def _split_exists(lengths, M, cap) -> bool:
    """Reference: some split into exactly M non-empty micro-batches of at most ``cap`` tokens each."""
    for labels in itertools.product(range(M), repeat=len(lengths)):
        if len(set(labels)) == M and all(sum(s for s, j in zip(lengths, labels) if j == b) <= cap for b in range(M)):
            return True
    return False


def test_fixed_micro_batches_fit_exactly_when_a_token_split_exists():
    """Against exhaustive enumeration: fcp plans any micro-batch of at most N·E tokens, so ``micro_batches=M``
    must plan exactly when some split into M fits memory (before: refused whenever LPT by work missed one)."""
    rng = np.random.default_rng(7)
    refused_before = 0
    for _ in range(60):
        n, N, M = int(rng.integers(3, 7)), int(rng.integers(1, 3)), int(rng.integers(2, 4))
        cm = CM.replace(tokens_per_rank=20)
        lengths = rng.integers(1, 2 * 20 * N // 2 + 1, n).tolist()
        if M > n:
            continue
        want = _split_exists(lengths, M, N * 20)
        try:
            plan = plan_batch(lengths, num_ranks=N, cost_model=cm, micro_batches=M)
        except ValueError as e:
            assert not want, (lengths, N, M, str(e))
            assert "does not fit in" in str(e) and "first-fit decreasing" in str(e), str(e)
            continue
        assert want
        _check(plan, lengths, cm, M=M)
        refused_before += 1
    assert refused_before > 10


def test_fixed_micro_batches_say_which_splits_were_tried():
    cm = CM.replace(tokens_per_rank=10)
    with pytest.raises(ValueError, match=r"does not fit in 2 micro-batch.*tried splits: work-balanced \(LPT\), "
                                         r"token-balanced, first-fit decreasing"):
        plan_batch([9, 9, 9], num_ranks=1, cost_model=cm, micro_batches=2)


def test_sampler_fixed_micro_batches_benefit():
    """FCPSampler(micro_batches=2) plans what plan_batch(micro_batches=2) now plans (it raised at iteration)."""
    cm = CM.replace(tokens_per_rank=10)
    s = FCPSampler([5, 5, 4, 3, 3], num_ranks=1, rank=0, cost_model=cm, global_batch_size=5, prefetch=0,
                   micro_batches=2)
    batches = list(s)
    assert len(batches) == 2 and sorted(x.index for b in batches for x in b) == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- 2./3. the sampler's over-long policy

@pytest.mark.parametrize("solver, num_ranks, options, degree", [
    ("ulysses", 6, None, 2),  # powers of two dividing 6 and 32 heads
    ("megatron-dynamic", 6, None, 4),
    ("fcp-pow2", 6, None, 4),
    ("ulysses", 8, {"num_heads": 4, "num_kv_heads": 4}, 4),  # head-limited
    ("static-cp", 6, {"degree": None}, 6),  # None: no fixed degree (was a raw TypeError from int(None))
    ("fcp", 6, None, 6),
])
def test_sampler_truncates_to_the_largest_group_the_solver_forms(solver, num_ranks, options, degree):
    """Was: built, then iteration raised "no split of the batch ... fits" (capacity num_ranks·E)."""
    lengths = [100] * 7 + [7 * E]
    s = FCPSampler(lengths, num_ranks=num_ranks, rank=0, cost_model=CM, global_batch_size=4, prefetch=0,
                   solver=solver, solver_options=options, on_overlong="truncate")
    assert s.capacity == degree * E and s.num_truncated == 1
    assert sum(len(b) for b in s) > 0


def test_sampler_overlong_error_names_the_solver_degree():
    with pytest.raises(ValueError, match=r"longer than D·tokens_per_rank = 4·86016.*fcp-pow2.*on 6 ranks"):
        FCPSampler([100, 5 * E], num_ranks=6, rank=0, cost_model=CM, global_batch_size=2, prefetch=0,
                   solver="fcp-pow2")


# ---------------------------------------------------------------- 4./11. lengths and η

@pytest.mark.parametrize("etas, bad", [([0, 1e12], 1), ([1e300, 0], 0), ([0, 1.5], 1), ([0, float("nan")], 1)])
def test_eta_is_bounded_to_its_meaning(etas, bad):
    """η is 0 (causal) … 1 (full attention): 1e12 used to plan a 2.2e12 s makespan, 1e300 an error without η."""
    with pytest.raises(ValueError, match=rf"etas must be .* at most 1 .*sequence {bad} has η="):
        plan_batch([1000, 2000], num_ranks=2, cost_model=CM, etas=etas)
    plan_batch([1000, 2000], num_ranks=2, cost_model=CM, etas=[0.5, 1.0])


@pytest.mark.parametrize("lengths, phrase", [
    ([True, 1], "sequence 0 is True"),
    ([5, 2 ** 70], "sequence 1 has 1180591620717411303424 tokens, more than any real sequence"),
    ([5, -2 ** 70], "lengths must be > 0; sequence 1"),
])
def test_lengths_bool_and_huge_python_ints(lengths, phrase):
    with pytest.raises(ValueError, match=phrase):
        plan_batch(lengths, num_ranks=2, cost_model=CM)


# ---------------------------------------------------------------- 5./11. solver options

@pytest.mark.parametrize("solver", ["exhaustive", "ilp"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), "7", None, True, 0, -1, 2.0])
@pytest.mark.parametrize("micro_batches", [1, "auto"])
def test_max_sequences_is_a_positive_int(solver, value, micro_batches):
    """inf/NaN removed the cap (11 sequences: 47 s), "7"/None were raw TypeErrors, True was accepted; with
    ``auto`` the error is the option's, not "no split fits"."""
    with pytest.raises(ValueError, match=r"^max_sequences must be an int"):
        plan_batch([100, 200], num_ranks=2, cost_model=CM, solver=solver, max_sequences=value,
                   micro_batches=micro_batches)


def test_max_sequences_exhaustive_cap_and_numpy_ints():
    with pytest.raises(ValueError, match=r"max_sequences must be an int from 1 to 7 .*got 8"):
        plan_batch([100, 200], num_ranks=2, cost_model=CM, solver="exhaustive", max_sequences=8)
    plan = plan_batch([100, 200], num_ranks=2, cost_model=CM, solver="exhaustive", max_sequences=np.int64(3))
    assert plan.optimal


def test_ilp_time_limit_takes_numpy_numbers():
    """np.int64(5) was refused while np.float64(5) was accepted."""
    for limit in (np.int64(5), np.float64(5.0), 5):
        plan_batch([100, 200], num_ranks=2, cost_model=CM, solver="ilp", time_limit=limit)
    with pytest.raises(ValueError, match="time_limit must be a positive number of seconds"):
        plan_batch([100, 200], num_ranks=2, cost_model=CM, solver="ilp", time_limit=True)


# ---------------------------------------------------------------- 6. messages

def test_fcp_pow2_names_the_power_of_two_restriction():
    """Was "its groups need 5 ranks" on 6 ranks: the power-of-two group needs 8."""
    with pytest.raises(ValueError, match=r"alone needs a power-of-two group of 8 ranks.*at most 4") as err:
        plan_batch([5 * E], num_ranks=6, cost_model=CM, solver="fcp-pow2")
    assert "groups need 5 ranks" not in str(err.value)


@pytest.mark.parametrize("solver, options, top", [("ulysses", {}, 2), ("megatron-dynamic", {}, 4),
                                                  ("static-cp", {"degree": 3}, 3)])
def test_baselines_name_a_sequence_no_degree_holds(solver, options, top):
    """Was "use more micro-batches" for a single sequence that no split can hold."""
    with pytest.raises(ValueError, match=rf"sequence 0 .* alone needs 5 ranks.* is {top} ") as err:
        plan_batch([5 * E], num_ranks=6, cost_model=CM, solver=solver, **options)
    assert "use more micro-batches" not in str(err.value)


# ---------------------------------------------------------------- 7. presets

@pytest.mark.parametrize("kw, phrase", [
    (dict(shard_weights="no"), "shard_weights must be True or False"),
    (dict(recompute="no"), "recompute must be True or False"),
    (dict(v2="False"), "v2 must be True or False"),
    (dict(frozen_vision=1), "frozen_vision must be True or False"),
    (dict(dp_shards=float("nan")), "dp_shards must be an int >= 1"),
    (dict(dp_shards="64"), "dp_shards must be an int >= 1"),
    (dict(dp_shards=True), "dp_shards must be an int >= 1"),
    (dict(dp_shards=2.5), "dp_shards must be an int >= 1"),
])
def test_preset_flags_and_numbers(kw, phrase):
    """shard_weights="no" silently gave tokens_per_rank 156672; "no"/"False" read as True; NaN/"64" raw errors."""
    with pytest.raises(ValueError, match=phrase):
        CostModel.preset("qwen3-8b", "h100", **kw)
    assert CostModel.preset("qwen3-8b", "h100", dp_shards=np.int64(64), v2=np.bool_(True)) == CM


@pytest.mark.parametrize("field, value", [("layers", 2.5), ("heads", "4"), ("vocab", None), ("layers", True),
                                          ("window", 1.5), ("vision_params", float("nan"))])
def test_model_config_numbers(field, value):
    with pytest.raises(ValueError, match=rf"ModelConfig.{field} must be"):
        ModelConfig(**{**SMALL, field: value})
    assert ModelConfig(**{**SMALL, "layers": np.int32(2)}).layers == 2


# ---------------------------------------------------------------- 8. simulate

def test_simulate_honours_a_given_degree_and_takes_lists():
    """{"degree": 2} was overridden by the sweep (reported 8), degree 3 ignored; a list was a numpy TypeError."""
    lengths = [1000, 50000, 3000, 20000, 7000, 100]
    kw = dict(num_ranks=8, cost_model=CM, global_batch_size=3, steps=2, seed=0)
    _, _, fixed = simulate(lengths, solvers=["static-cp"], options={"static-cp": {"degree": 2}}, **kw)
    assert fixed == {"static-cp": 2}
    _, _, fixed = simulate(lengths, solvers=["static-cp"], **kw)
    assert fixed["static-cp"] in (1, 2, 4, 8)
    with pytest.raises(ValueError, match=r"degree'\] = 3 is not a degree static-cp uses on 8 ranks"):
        simulate(lengths, solvers=["static-cp"], options={"static-cp": {"degree": 3}}, **kw)


# ---------------------------------------------------------------- 9. robust mode

def test_robust_mode_never_fails_on_its_own_perturbation():
    """A valid model near the range limit: the +20 % scenarios used to fail the range check."""
    cm = CM.replace(beta1=9e11)
    plan = plan_batch([1000, 2000, 3000, 500, 40000], num_ranks=8, cost_model=cm, robust_tol=0.01)
    _check(plan, [1000, 2000, 3000, 500, 40000], cm)


def test_robust_mode_all_zero_model_warns_nothing():
    zero = CM.replace(alpha1=0, alpha2=0, alpha3=0, beta1=0, beta2=0, gamma=0, alpha_blk=0, alpha_vis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plan_batch([1000, 2000, 3000], num_ranks=4, cost_model=zero, robust_tol=0.01)
    assert plan.makespan == 0.0


# ---------------------------------------------------------------- 10. exported one-micro-batch solvers

@pytest.mark.parametrize("fn", [fcp_micro_batch, static_cp, megatron_dynamic])
def test_one_micro_batch_solvers_refuse_raw_input(fn):
    """Was an AttributeError deep inside (``None.shape``)."""
    with pytest.raises(TypeError, match="for raw input call plan_batch"):
        fn([100, 200], None, 4, CM)
    fn(np.array([100, 200]), np.zeros(2), 4, CM)


def test_no_log_noise(caplog):
    """The over-long policy logs one warning, nothing else, for a solver-limited capacity."""
    with caplog.at_level(logging.WARNING, logger="fcp_data"):
        FCPSampler([100, 3 * E], num_ranks=6, rank=0, cost_model=CM, global_batch_size=2, prefetch=0,
                   solver="ulysses", on_overlong="drop")
    assert len(caplog.records) == 1 and "drops 1 sample" in caplog.records[0].getMessage()
