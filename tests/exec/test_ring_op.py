"""``torch.ops.fcp.ring_attention`` (fcp_exec/ring_op.py), the ring as one opaque op for torch.compile, in one
process (degree 1; degree 2 under torchtitan's compiled blocks is tests/exec/test_torchtitan_trainer.py's).

Reference: :func:`fcp_exec.ring_attention.ring_attention` on the same RingBatch (float64: outputs and gradients
equal to 1e-12). ``torch.library.opcheck`` checks the op's schema, fake (meta) implementation, autograd registration
and AOT dispatch with dynamic shapes — what torch.compile relies on; a fake output of the wrong shape or a missing
autograd formula fails it. And a compiled function with ``fullgraph=True`` around the op runs without a graph break
over documents of new lengths, equal to eager."""

from __future__ import annotations

import pytest
import torch

from fcp_exec.ring_attention import RingBatch, ring_attention
from fcp_exec.ring_op import register, ring_attention_op


def _inputs(cu: list[int], seed: int = 0, heads: tuple[int, int] = (4, 2), dim: int = 8):
    g = torch.Generator().manual_seed(seed)
    t = cu[-1]
    q, k, v = (torch.randn(t, h, dim, generator=g, dtype=torch.float64, requires_grad=True)
               for h in (heads[0], heads[1], heads[1]))
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
def test_op_equals_ring_attention(causal):
    cu = [0, 5, 12, 20]
    ring = RingBatch(torch.tensor(cu, dtype=torch.int32), (0,))
    q, k, v = _inputs(cu)
    out = ring_attention_op(q, k, v, ring, causal=causal, softmax_scale=0.3)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    ref = ring_attention(q, k, v, ring, causal=causal, softmax_scale=0.3)
    (ref * torch.linspace(-1, 1, ref.numel(), dtype=ref.dtype).reshape(ref.shape)).sum().backward()
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)


def test_opcheck():
    cu = [0, 6, 10]
    ring = RingBatch(torch.tensor(cu, dtype=torch.int32), (0,))
    q, k, v = _inputs(cu, seed=1)
    torch.library.opcheck(torch.ops.fcp.ring_attention.default, (q, k, v, register(ring), True, 0.35))


def test_fullgraph_compile_without_recompiling_per_micro_batch():
    """Three micro-batches of other lengths through one compiled function (fullgraph: a graph break would raise);
    each equals eager; the handle is an input, so new RingBatches do not add graphs beyond dynamic shapes."""
    torch._dynamo.reset()

    def attend(q, k, v, ring):
        return ring_attention_op(q * 1.5, k, v, ring).sum(-1)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    for seed, cu in enumerate(([0, 4, 10], [0, 6, 14, 16], [0, 12])):
        ring = RingBatch(torch.tensor(cu, dtype=torch.int32), (0,))
        register(ring)
        q, k, v = _inputs(cu, seed=seed)
        got, want = compiled(q, k, v, ring), attend(q, k, v, ring)
        assert torch.allclose(got, want, rtol=0, atol=1e-12), seed
    from torch._dynamo.utils import counters

    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])  # static first, then dynamic
