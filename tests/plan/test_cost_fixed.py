"""``CostModel.time_fixed`` (the local searches' evaluator for groups whose degrees and placement are fixed) gives
bit-for-bit the floats of :meth:`CostModel.time`: refinement compares times with ``<`` and ties pick the first
move, so a last-bit difference would change plans."""

from __future__ import annotations

import numpy as np

from fcp_data.cost import COST_KEYS_V2, CostModel


def _model(rng: np.random.Generator, v2: bool) -> CostModel:
    kw = dict(alpha1=10 ** rng.uniform(-12, -8), alpha2=10 ** rng.uniform(-7, -4), alpha3=float(rng.uniform(0, 5e5)),
              beta1=float(rng.choice([0.0, rng.uniform(0, 1e-2)])), beta2=float(rng.choice([0.0, rng.uniform(0, 1e-2)])),
              bandwidth_intra=10 ** rng.uniform(9, 11.3), bandwidth_inter=10 ** rng.uniform(8, 10.5),
              ranks_per_node=int(rng.choice([1, 8, 16])), tokens_per_rank=1 << 16)
    if v2:  # every §4.1 key, so that a term added later is drawn here too
        kw.update({k: float(rng.choice([0.0, 10 ** rng.uniform(-9, -4)])) for k in COST_KEYS_V2})
    return CostModel(**kw)


def test_time_fixed_is_bit_identical_to_time():
    rng = np.random.default_rng(3)
    for trial in range(400):
        cm = _model(rng, v2=trial % 2 == 1)
        K, m = int(rng.integers(1, 40)), int(rng.integers(1, 33))
        d = rng.integers(1, 65, size=K).astype(np.float64)
        d[rng.random(K) < 0.3] = 1.0  # many single-rank groups: their ring terms must be exact zeros
        intra = rng.random(K) < 0.5
        S = rng.integers(0, 1 << 20, size=(m, K)).astype(np.float64)
        Q = S * S * rng.uniform(0.0, 2.0, size=(m, K))  # Σ(1+η)s² is at most 2·S²
        B = S * rng.uniform(1.0, 2.0, size=(m, K))
        V = np.floor(S * rng.random((m, K))) if rng.random() < 0.5 else None
        want = cm.time(S, Q, d[None, :], intra[None, :], B=B, V=V)
        got = cm.time_fixed(S, Q, B, V, cm.fixed_columns(d, intra))
        assert got.shape == want.shape
        assert np.array_equal(got, want), (trial, float(np.abs(got - want).max()))


def test_time_fixed_without_visual_tokens_equals_zero_visual_tokens():
    """Refinement leaves the V row out on text batches: ``V=None`` must equal ``V=0`` exactly."""
    rng = np.random.default_rng(4)
    cm = _model(rng, v2=True).replace(alpha_vis=2e-6)
    d = np.array([1.0, 2.0, 8.0, 24.0])
    cols = cm.fixed_columns(d, np.array([True, True, False, False]))
    S = rng.integers(1, 1 << 18, size=(5, 4)).astype(np.float64)
    Q, B = S * S, S
    assert np.array_equal(cm.time_fixed(S, Q, B, None, cols), cm.time_fixed(S, Q, B, np.zeros_like(S), cols))
