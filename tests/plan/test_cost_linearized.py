"""The cost model owns its linearisation (issue 12: the ILP uses it): on one node, for random groups, degrees and
v1/v2 coefficients, ``c_d + max(Σ a[k, d], Σ x[k, d])`` equals :meth:`CostModel.time` — and the work proxy equals
its formula written out."""

from __future__ import annotations

import math

import numpy as np

from fcp_data.cost import CostModel


def test_linearized_equals_time_on_one_node():
    rng = np.random.default_rng(7)
    for _ in range(300):
        cm = CostModel(alpha1=float(rng.choice([1e-11, 2e-10, 3e-9])), alpha2=float(rng.choice([1e-8, 5e-7])),
                       alpha3=float(rng.choice([1e3, 2e4, 3e5])), beta1=float(rng.choice([0.0, 1e-3])),
                       beta2=float(rng.choice([0.0, 2e-4])), bandwidth_intra=float(rng.choice([1e10, 2e11])),
                       bandwidth_inter=2.5e9, tokens_per_rank=1 << 20, ranks_per_node=8,
                       gamma=float(rng.choice([0.0, 1e-4, 3e-3])), alpha_blk=float(rng.choice([0.0, 2e-6])),
                       alpha_vis=float(rng.choice([0.0, 1e-5])))
        n = int(rng.integers(1, 6))
        s = rng.integers(1, 50000, size=n).astype(np.float64)
        e = (rng.random(n) < 0.3).astype(np.float64)
        v = np.floor(s * rng.random(n))
        c, a, x = cm.linearized(s, e, v, 8)
        for d in range(1, 9):
            want = cm.time(s.sum(), ((1 + e) * s * s).sum(), d, True, B=((1 + e) * s).sum(), V=v.sum())
            got = c[d - 1] + max(a[:, d - 1].sum(), x[:, d - 1].sum())
            assert math.isclose(got, want, rel_tol=1e-12), (d, got, want)
        w = cm.work(s, e, v)
        ref = cm.alpha1 * (1 + e) * s * s + cm.alpha2 * s + cm.alpha_blk * (1 + e) * s + cm.alpha_vis * v
        assert np.allclose(w, ref, rtol=1e-14, atol=0)
