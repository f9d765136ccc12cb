"""FCP's megatron-dynamic candidate is skipped only when it cannot win: ``megatron_dynamic(..., below=x)`` returns None
only if the plan it would build has a makespan of at least ``x`` (its configuration's time with small groups inside a
node is a lower bound of the placed makespan when the inter-node bandwidth does not exceed the intra-node one), and
otherwise the very plan. Random v1/v2 models, stranding placements (node sizes that do not divide the degrees), and
models whose inter-node bandwidth exceeds the intra-node one (where the bound does not hold: never skipped)."""

from __future__ import annotations

import numpy as np

from fcp_data.plan.baselines import megatron_dynamic
from fcp_data.presets import preset_cost_model


def test_skipped_only_when_it_cannot_be_below():
    rng = np.random.default_rng(17)
    skipped = kept = 0
    for _ in range(250):
        cm = preset_cost_model("Qwen3-8B", str(rng.choice(["ascend-910c", "h100"])), v2=bool(rng.random() < 0.6))
        fast_inter = rng.random() < 0.2
        cm = cm.replace(tokens_per_rank=int(rng.choice([2048, 8192, 32768])), ranks_per_node=int(rng.choice([3, 4, 6, 8])),
                        bandwidth_inter=cm.bandwidth_intra * (rng.uniform(1.1, 4) if fast_inter else rng.uniform(0.05, 1)))
        n, N = int(rng.integers(2, 120)), int(rng.integers(2, 48))
        L = np.minimum(rng.lognormal(7.5, 1.6, n).astype(np.int64) + 1, N * cm.tokens_per_rank // 2)
        etas = (rng.random(n) < 0.3).astype(np.float64)
        try:
            plan = megatron_dynamic(L, etas, N, cm)
        except ValueError:
            continue
        for x in (plan.makespan * 0.97, plan.makespan, plan.makespan * (1 + 1e-9), plan.makespan * 1.2):
            got = megatron_dynamic(L, etas, N, cm, below=x)
            if got is None:
                skipped += 1
                assert plan.makespan >= x and not fast_inter, (plan.makespan, x)
            else:
                kept += 1
                assert got == plan
    assert skipped > 100 and kept > 100
