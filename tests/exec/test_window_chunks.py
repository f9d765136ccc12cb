"""Found by mutation testing (stop 60) in fcp_exec/kernels/window.py (the masked math path of sliding windows and
logit soft-capping), degree 1, one process, against dense float64 attention (fcp_exec.testing.dense_attention):

* a ONE-token document (legal at degree 1: cu_seqlens lengths need only be multiples of 1) with a sliding window
  or soft-capping: its only query sees its only key (``_docs`` must not skip it: mutation ``q_hi < k_lo`` ->
  ``q_hi <= k_lo`` returns out = 0 for it);
* the query-row chunking of ``windowed_backward`` (``_chunks``; in production a chunk holds
  ``_CHUNK_ELEMS // (H * L_k)`` rows, i.e. several chunks per document once ``H·L² > 2**25``: a 32-head, 1,024-token
  Gemma-2 document) must *accumulate* dK/dV over the chunks: mutation ``dk[ks:ke] += dk_c`` -> ``=`` overwrote the
  earlier chunks' key gradients. ``_CHUNK_ELEMS`` is lowered so that small documents take several chunks.

Tolerance: 1e-10 absolute (float64 throughout)."""
from __future__ import annotations

import pytest
import torch

import fcp_exec.kernels.window as window_mod
from fcp_exec import ring_attention
from fcp_exec.testing import dense_attention

TOL = 1e-10


def _check(cu, window, softcap, heads=(4, 2), d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = cu[-1]
    q = torch.randn(t, heads[0], d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(t, heads[1], d, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(t, heads[1], d, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(t, heads[0], d, generator=g, dtype=torch.float64)
    out = ring_attention(q, k, v, torch.tensor(cu, dtype=torch.int32), ranks=(0,), window=window, softcap=softcap)
    got = torch.autograd.grad(out, (q, k, v), dout)
    ref = dense_attention(q, k, v, cu, causal=True, window=window, softcap=softcap)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    for name, a, b in (("out", out, ref), ("dq", got[0], want[0]), ("dk", got[1], want[1]), ("dv", got[2], want[2])):
        err = (a - b).abs().max().item()
        assert err <= TOL, f"{name}: |ring - dense| = {err:.3g} (cu={cu}, window={window}, softcap={softcap})"


@pytest.mark.parametrize("window, softcap", [(3, None), (1, None), (None, 1.5), (4, 1.5)])
def test_one_token_documents_with_a_window_or_softcap(window, softcap):
    _check([0, 1, 6, 7, 9], window, softcap)


@pytest.mark.parametrize("window, softcap", [(None, 1.5), (5, 1.5), (30, None), (7, None)])
def test_several_query_chunks_per_document_accumulate_dk_dv(monkeypatch, window, softcap):
    monkeypatch.setattr(window_mod, "_CHUNK_ELEMS", 512)  # 512 // (4 heads · ~40 keys) = 3 query rows per chunk
    _check([0, 40, 45, 77], window, softcap)
