"""``torch.ops.fcp.ring_attention`` (fcp_exec/ring_op.py), the ring as one opaque op for torch.compile, in one
process (degree 1; degree 2 under torchtitan's compiled blocks is tests/exec/test_torchtitan_trainer.py's).

Reference: :func:`fcp_exec.ring_attention.ring_attention` on the same RingBatch (float64: outputs and gradients
equal to 1e-12). ``torch.library.opcheck`` checks the op's schema, fake (meta) implementation, autograd registration
and AOT dispatch with dynamic shapes — what torch.compile relies on —, with gpt-oss's sliding window and attention
sinks too (their gradient included); a fake output of the wrong shape or a missing
autograd formula fails it. And a compiled function with ``fullgraph=True`` around the op runs without a graph break
over documents of new lengths, equal to eager."""

from __future__ import annotations

import pytest
import torch

from fcp_exec.ring_attention import RingBatch, ring_attention
from fcp_exec.launch import WorkerPool
from fcp_exec.ring_op import register, ring_attention_op


def _inputs(cu: list[int], seed: int = 0, heads: tuple[int, int] = (4, 2), dim: int = 8):
    g = torch.Generator().manual_seed(seed)
    t = cu[-1]
    q, k, v = (torch.randn(t, h, dim, generator=g, dtype=torch.float64, requires_grad=True)
               for h in (heads[0], heads[1], heads[1]))
    return q, k, v


# (causal, window, with sinks): plain, non-causal, gpt-oss's sliding window and sinks, each alone and together; the
# window of 3 is shorter than every document (the windowed path), that of 30 longer than all (the plain causal path)
CASES = [(True, None, False), (False, None, False), (True, 3, False), (True, None, True), (True, 3, True),
         (True, 30, True)]


@pytest.mark.parametrize("causal, window, sunk", CASES)
def test_op_equals_ring_attention(causal, window, sunk):
    cu = [0, 5, 12, 20]
    ring = RingBatch(torch.tensor(cu, dtype=torch.int32), (0,))
    q, k, v = _inputs(cu)
    sinks = torch.linspace(-0.5, 1.5, q.shape[1], dtype=torch.float64).requires_grad_() if sunk else None
    leaves = [t for t in (q, k, v, sinks) if t is not None]
    out = ring_attention_op(q, k, v, ring, causal=causal, softmax_scale=0.3, window=window, sinks=sinks)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum().backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    ref = ring_attention(q, k, v, ring, causal=causal, softmax_scale=0.3, window=window, sinks=sinks)
    (ref * torch.linspace(-1, 1, ref.numel(), dtype=ref.dtype).reshape(ref.shape)).sum().backward()
    assert torch.allclose(out, ref, rtol=0, atol=1e-12)
    for got, want in zip(grads, (t.grad for t in leaves)):
        assert torch.allclose(got, want, rtol=0, atol=1e-12)
    if window == 3 or sunk:  # the options acted: the plain op differs
        plain = ring_attention_op(q, k, v, ring, causal=causal, softmax_scale=0.3)
        assert (plain - out).abs().max() > 1e-3


@pytest.mark.parametrize("window, sunk", [(0, False), (3, True)])
def test_opcheck(window, sunk):
    cu = [0, 6, 10]
    ring = RingBatch(torch.tensor(cu, dtype=torch.int32), (0,))
    q, k, v = _inputs(cu, seed=1)
    sinks = torch.linspace(-0.5, 1.5, q.shape[1], dtype=torch.float64).requires_grad_() if sunk else None
    torch.library.opcheck(torch.ops.fcp.ring_attention.default, (q, k, v, register(ring), True, 0.35, window, sinks))


def test_fullgraph_compile_without_recompiling_per_micro_batch():
    """Three micro-batches of other lengths through one compiled function (fullgraph: a graph break would raise);
    each equals eager; the handle is an input, so new RingBatches do not add graphs beyond dynamic shapes."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # Dynamo's counters are process-wide: an earlier test's graphs would count here

    sinks = torch.linspace(-0.5, 1.5, 4, dtype=torch.float64)

    def attend(q, k, v, ring):  # a plain layer and a gpt-oss one (window, sinks) in one graph
        return ring_attention_op(q * 1.5, k, v, ring).sum(-1) + ring_attention_op(q, k, v, ring, window=3,
                                                                                  sinks=sinks).sum(-1)

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    for seed, cu in enumerate(([0, 4, 10], [0, 6, 14, 16], [0, 12])):
        ring = RingBatch(torch.tensor(cu, dtype=torch.int32), (0,))
        register(ring)
        q, k, v = _inputs(cu, seed=seed)
        got, want = compiled(q, k, v, ring), attend(q, k, v, ring)
        assert torch.allclose(got, want, rtol=0, atol=1e-12), seed
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])  # static first, then dynamic


# Gap found by mutation testing: ``torch.ops.fcp.ring_attention`` (fcp_exec/ring_op.py) with a sliding window at
# ring degree > 1. The op decides per micro-batch whether the window binds (``RingBatch.acting_window``: the longest
# *padded global* document, local length × degree, against the window). tests/exec/test_ring_op.py runs the op at
# degree 1 only, so a rule that compared the *local* length (mutation ``longest // self.degree > window``) dropped
# the window whenever the local shard was no longer than the window but the document was — silently plain causal
# attention. Here: 2 gloo ranks, documents of 24 and 12 tokens (local 12 and 6), window 16 (> 12 local, < 24
# global) and 5; out, dq, dk, dv of each rank equal dense float64 windowed attention's rows to 1e-10.

WINDOW_TOL = 1e-10


def _window_case(rank, window, cu):
    from fcp_exec import zigzag_shard
    from fcp_exec.ring_attention import RingBatch
    from fcp_exec.ring_op import ring_attention_op
    from fcp_exec.testing import dense_attention

    g = torch.Generator().manual_seed(5)
    t = cu[-1]
    q, k, v, dout = (torch.randn(t, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2, 4))
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = dense_attention(qr, kr, vr, cu, causal=True, window=window)
    want = (ref, *torch.autograd.grad(ref, (qr, kr, vr), dout))
    shard = (lambda x: zigzag_shard(x, cu, 2, rank)[0])
    cul = zigzag_shard(q, torch.tensor(cu, dtype=torch.int32), 2, rank)[1]
    ql, kl, vl = (shard(x).clone().requires_grad_() for x in (q, k, v))
    ring = RingBatch(cul, (0, 1), timeout=30)
    out = ring_attention_op(ql, kl, vl, ring, window=window)
    got = (out, *torch.autograd.grad(out, (ql, kl, vl), shard(dout)))
    return [(got_i - shard(w.detach())).abs().max().item() for got_i, w in zip(got, want)]


@pytest.mark.parametrize("window", [16, 5])
def test_op_window_at_degree_2_matches_dense(window):
    with WorkerPool(2, backend="gloo", pg_timeout=60) as pool:
        errs = pool.run(_window_case, window, [0, 24, 36], timeout=120)
    for rank, e in enumerate(errs):
        assert max(e) <= WINDOW_TOL, (rank, dict(zip(("out", "dq", "dk", "dv"), e)))
