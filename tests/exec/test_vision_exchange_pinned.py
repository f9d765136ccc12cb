"""fcp_exec.vision_exchange pinned against a brute-force reference on real gloo processes.

The existing exchange test (tests/exec/test_models.py) always uses the group ``tuple(range(world))``, whose ring order
is ascending. A CP group's ``ranks`` are in *ring order* (DESIGN §7), which need not be ascending (the placement
may give ``(2, 0, 1)``): rows received from peers must then still land at their tokens. The encoder here is a plain
embedding table ``E`` (row r of the group's visual embeddings is ``E[r]``), so the reference is exact and needs no
model: rows ``E[visual_index]`` on each rank, and the gradient of ``Σ_ranks Σ rows·W[idx]`` with respect to ``E``
summed over ranks equals ``index_add(W[idx])`` over every rank's ``idx`` (fp64, exact).
"""

from __future__ import annotations

import pytest
import torch

GRID = [[3, 4, 4], [1, 2, 6], [2, 2, 2]]  # 6 frames, 17 rows with merge 2
HIDDEN = 5


def _tables():
    from fcp_exec.vision_exchange import frame_table

    table = frame_table(torch.tensor(GRID), 2)
    n_rows = int(table[:, 1].sum())
    e = torch.randn(n_rows, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    w = torch.randn(n_rows, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return table, e, w


def _worker(ring, parts):
    import torch.distributed as dist

    from fcp_exec.vision_exchange import exchange_rows

    table, e0, w = _tables()
    e = e0.clone().requires_grad_(True)
    me = dist.get_rank()
    cp_rank = ring.index(me)

    def encode_share(f_lo, f_hi):
        if f_hi <= f_lo:
            return e[:0] * 1.0
        lo = int(table[f_lo, 0])
        hi = int(table[f_hi - 1, 0] + table[f_hi - 1, 1])
        return e[lo:hi] * 1.0

    idx = torch.tensor(parts[cp_rank], dtype=torch.long)
    rows = exchange_rows(encode_share, table, idx, ring, cp_rank, "cpu")
    (rows * w[idx]).sum().backward()
    grad = e.grad.clone() if e.grad is not None else torch.zeros_like(e0)
    dist.all_reduce(grad)
    return rows.detach(), grad


@pytest.mark.parametrize("ring,parts", [
    # ring order not ascending; every cp rank needs rows owned by each of the others
    ((2, 0, 1), [[16, 0, 9, 3], [1, 15, 2, 12, 4], [5, 6, 7, 8, 10, 11, 13, 14]]),
    ((1, 2, 0), [[0, 1, 2, 3, 4, 5, 6, 7, 8], [16, 9, 10], [11, 12, 13, 14, 15]]),
])
def test_rows_and_gradients_match_the_table_for_any_ring_order(ring, parts):
    from fcp_exec.launch import launch

    results = launch(_worker, 3, ring, parts, timeout=120)
    table, e, w = _tables()
    ref_grad = torch.zeros_like(e)
    for part in parts:
        ref_grad.index_add_(0, torch.tensor(part, dtype=torch.long), w[torch.tensor(part, dtype=torch.long)])
    for g, (rows, grad) in enumerate(results):
        part = parts[ring.index(g)]
        torch.testing.assert_close(rows, e[torch.tensor(part, dtype=torch.long)], rtol=0, atol=0)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-15)
