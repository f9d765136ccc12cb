"""CONTRACT test of the NPU kernel's argument and result translation — it does NOT run on an NPU.

``NpuKernel`` is given ``DocumentedNPUFusionAttention`` (``tests/exec/_npu_reference.py``), a CPU
float64 implementation of the documented ``torch_npu.npu_fusion_attention`` /
``npu_fusion_attention_grad`` semantics in TND layout, in place of ``torch_npu``. These tests show
that our translation (cumulative ends without a leading 0, sparse_mode/atten_mask for causal,
``[T, N, 8]`` softmax statistics → ``lse[H, T]`` and back, scale/scale_value, dropped empty
documents) is right *if* torch_npu behaves as documented; only a run on Ascend hardware can show
that it does.
"""
from __future__ import annotations

import pytest
import torch
from _npu_reference import DocumentedNPUFusionAttention

from fcp_exec import ring_attention, zigzag_shard
from fcp_exec.kernels import NpuKernel, ReferenceKernel
from fcp_exec.kernels.npu import NPU_BAND_SPARSE_MODE, NPU_CAUSAL_SPARSE_MODE
from fcp_exec.launch import WorkerPool
from fcp_exec.testing import dense_attention


def _data(cu_q, cu_k, hq, hkv, d, seed):
    gen = torch.Generator().manual_seed(seed)
    mk = (lambda t, h: torch.randn(t, h, d, generator=gen, dtype=torch.float64).float())
    return mk(cu_q[-1], hq), mk(cu_k[-1], hkv), mk(cu_k[-1], hkv), mk(cu_q[-1], hq)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_translation_matches_reference_kernel(causal):
    """out, lse, dq, dk, dv through the documented-semantics fake equal the fp64 reference kernel
    (fp32, 1e-5) for GQA 4/2 and packed docs including an empty one; the recorded calls carry
    TND, head_num, cumulative ends without a leading 0 (empty docs dropped), the causal
    sparse_mode with the 2048x2048 mask (or mode 0 and no mask), scale and [T, N, 8] statistics."""
    fake = DocumentedNPUFusionAttention()
    kernel = NpuKernel(module=fake)
    cu = [0, 6, 6, 16, 19]
    q, k, v, dout = _data(cu, cu, 4, 2, 8, seed=1)
    out, lse = kernel.forward(q, k, v, cu, cu, causal, 0.3)
    ref_out, ref_lse = ReferenceKernel().forward(q.double(), k.double(), v.double(), cu, cu, causal, 0.3)
    assert out.dtype == torch.float32 and lse.shape == (4, 19) and lse.dtype == torch.float32
    assert (out.double() - ref_out).abs().max() <= 1e-5
    assert (lse.double() - ref_lse).abs().max() <= 1e-5
    grads = kernel.backward(dout, q, k, v, out, lse, cu, cu, causal, 0.3)
    ref_grads = ReferenceKernel().backward(dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse,
                                           cu, cu, causal, 0.3)
    for got, want in zip(grads, ref_grads):
        assert got.shape == want.shape and (got.double() - want).abs().max() <= 1e-5
    fwd, grad = fake.calls
    assert fwd["input_layout"] == grad["input_layout"] == "TND" and fwd["head_num"] == 4
    assert fwd["actual_seq_qlen"] == fwd["actual_seq_kvlen"] == [6, 16, 19]
    assert all(type(e) is int for e in fwd["actual_seq_qlen"])
    assert fwd["scale"] == grad["scale_value"] == 0.3 and fwd["keep_prob"] == 1.0
    assert grad["softmax_max"] == (19, 4, 8)
    if causal:
        assert fwd["sparse_mode"] == grad["sparse_mode"] == NPU_CAUSAL_SPARSE_MODE
        assert fwd["atten_mask"] == grad["atten_mask"] == (2048, 2048)
    else:
        assert fwd["sparse_mode"] == 0 and fwd["atten_mask"] is None


def test_unequal_lengths_and_keyless_documents():
    """Non-causal blocks with unequal q/k lengths (as in ring steps) and a document with queries
    but no keys: that document is left out of the NPU call, its rows get out 0 and lse -inf."""
    fake = DocumentedNPUFusionAttention()
    kernel = NpuKernel(module=fake)
    cu_q, cu_k = [0, 4, 8, 14], [0, 2, 2, 5]
    q, k, v, dout = _data(cu_q, cu_k, 2, 1, 4, seed=2)
    out, lse = kernel.forward(q, k, v, cu_q, cu_k, False, 0.5)
    ref_out, ref_lse = ReferenceKernel().forward(q.double(), k.double(), v.double(), cu_q, cu_k, False, 0.5)
    assert torch.all(out[4:8] == 0) and torch.isneginf(lse[:, 4:8]).all()
    assert (out.double() - ref_out).abs().max() <= 1e-5
    assert fake.calls[0]["actual_seq_qlen"] == [4, 10] and fake.calls[0]["actual_seq_kvlen"] == [2, 5]
    grads = kernel.backward(dout, q, k, v, out, lse, cu_q, cu_k, False, 0.5)
    ref_grads = ReferenceKernel().backward(dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse,
                                           cu_q, cu_k, False, 0.5)
    for got, want in zip(grads, ref_grads):
        assert (got.double() - want).abs().max() <= 1e-5


def test_reference_refuses_what_the_docs_forbid():
    """The fake is strict: cumulative ends that decrease or a causal call without the 2048 mask are refused, so the
    translation tests above cannot pass by accident. (A leading 0 is an empty first sequence, which the docs allow.)"""
    fake = DocumentedNPUFusionAttention()
    q = torch.randn(4, 2, 4)
    with pytest.raises(ValueError, match="must not decrease"):
        fake.npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=[3, 2, 4], actual_seq_kvlen=[3, 2, 4])
    with pytest.raises(ValueError, match="2048x2048"):
        fake.npu_fusion_attention(q, q, q, 2, "TND", actual_seq_qlen=[4], actual_seq_kvlen=[4], sparse_mode=3,
                                  atten_mask=torch.ones(4, 4, dtype=torch.bool).triu(1))
    with pytest.raises(ValueError, match="float16/bfloat16/float32"):
        NpuKernel(module=fake).forward(q.double(), q.double(), q.double(), [0, 4], [0, 4], False, 1.0)


def npu_ring_case(rank, causal):
    """Worker: degree-2 ring attention with the NPU kernel on the documented-semantics fake."""
    cu = [0, 8, 20]
    gen = torch.Generator().manual_seed(9)
    q, k, v, dout = (torch.randn(20, h, 4, generator=gen, dtype=torch.float64) for h in (2, 1, 1, 2))
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    ref = dense_attention(qr, kr, vr, cu, causal=causal)
    ref_grads = torch.autograd.grad(ref, (qr, kr, vr), dout)
    shard = (lambda x: zigzag_shard(x, cu, 2, rank)[0])
    ql, kl, vl = (shard(x).float().requires_grad_() for x in (q, k, v))
    out = ring_attention(ql, kl, vl, torch.tensor(cu) // 2, ranks=[0, 1], causal=causal,
                         kernel=NpuKernel(module=DocumentedNPUFusionAttention()), timeout=30)
    out.backward(shard(dout).float())
    return max((got.double() - shard(want.detach())).abs().max().item()
               for got, want in ((out, ref), (ql.grad, ref_grads[0]), (kl.grad, ref_grads[1]), (vl.grad, ref_grads[2])))


def test_ring_attention_through_npu_translation():
    """Two gloo processes run ring attention (causal, then full) with the NPU kernel over the fake:
    fp32 results match dense fp64 attention within 1e-5 (the ring's half-block calls translate)."""
    with WorkerPool(2, backend="gloo", pg_timeout=60) as pool:
        for causal in (True, False):
            errs = pool.run(npu_ring_case, causal, timeout=120)
            assert max(errs) <= 1e-5, (causal, errs)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_blocks_over_the_tnd_token_limit_are_split_into_calls(causal):
    """CONTRACT: torch_npu's TND cumulative actual_seq_* may not exceed 1M tokens per call. With the limit
    lowered to 12 tokens, a block of documents 6, 0, 10, 3, 9 is cut into calls over whole documents, each
    within the limit, and out/lse/grads still equal the fp64 reference (1e-5); a document over the limit is a
    ValueError, never a silent truncation."""
    fake = DocumentedNPUFusionAttention()
    kernel = NpuKernel(module=fake)
    kernel.max_tokens_per_call = 12
    cu = [0, 6, 6, 16, 19, 28]
    q, k, v, dout = _data(cu, cu, 4, 2, 8, seed=3)
    out, lse = kernel.forward(q, k, v, cu, cu, causal, 0.3)
    ref_out, ref_lse = ReferenceKernel().forward(q.double(), k.double(), v.double(), cu, cu, causal, 0.3)
    assert (out.double() - ref_out).abs().max() <= 1e-5 and (lse.double() - ref_lse).abs().max() <= 1e-5
    grads = kernel.backward(dout, q, k, v, out, lse, cu, cu, causal, 0.3)
    ref_grads = ReferenceKernel().backward(dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse,
                                           cu, cu, causal, 0.3)
    for got, want in zip(grads, ref_grads):
        assert (got.double() - want).abs().max() <= 1e-5
    assert len(fake.calls) > 2 and all(c["actual_seq_qlen"][-1] <= 12 for c in fake.calls)
    kernel.max_tokens_per_call = 8
    with pytest.raises(ValueError, match="exceeds"):
        kernel.forward(q, k, v, cu, cu, causal, 0.3)


def test_calls_keep_the_documented_limits_of_one_call():
    """CONTRACT (found by a review): one TND call takes cumulative ends up to 1,000,000 (torch_npu's op_plugin, not
    2**20 as fcp had) and 1 to 2K sequences (aclnnFlashAttentionVarLenScore; fcp had no such cut). With the kernel's
    own limits, a block of two 520,000-token documents and one of 3,000 two-token documents are cut into calls
    within both (the documented-semantics fake refuses either limit: checked too); the calls cover every document."""
    from fcp_exec.kernels.npu import NPU_MAX_SEQ_TOKENS, NPU_MAX_SEQS_PER_CALL

    assert (NPU_MAX_SEQ_TOKENS, NPU_MAX_SEQS_PER_CALL) == (1_000_000, 2048)
    kernel = NpuKernel(module=DocumentedNPUFusionAttention())
    for cu in ([0, 520_000, 1_040_000], list(range(0, 6001, 2)), [0, 999_999, 1_000_001, 1_999_999]):
        calls = kernel._calls(cu, cu)
        assert sum(len(ends) for _, _, ends, _ in calls) == len(cu) - 1
        assert all(ends[-1] <= 1_000_000 and len(ends) <= 2048 for _, _, ends, _ in calls), [c[2][-1] for c in calls]
    fake = DocumentedNPUFusionAttention()
    with pytest.raises(RuntimeError, match="should not greater than 1M"):
        fake._ends("actual_seq_qlen", [520_000, 1_040_000], 1_040_000)
    with pytest.raises(ValueError, match="1 to 2K"):
        fake._ends("actual_seq_qlen", list(range(2, 6001, 2)), 6000)
    assert fake._ends("actual_seq_qlen", [2, 4, 4, 6, 8], 8) == [2, 2, 0, 2, 2]  # the docs' empty sequence


def test_an_op_error_on_float32_is_not_called_a_dtype_problem():
    """A review found every RuntimeError of a float32 call re-labelled "rejected float32 in TND layout"; an error that
    is not about the dtype (the 1M length check) keeps its own message."""
    class _Raises(DocumentedNPUFusionAttention):
        def npu_fusion_attention(self, *a, **k):
            raise RuntimeError("The sequence length should not greater than 1M")

    kernel = NpuKernel(module=_Raises())
    q, k, v, _ = _data([0, 4], [0, 4], 2, 1, 8, seed=0)
    with pytest.raises(RuntimeError, match="should not greater than 1M"):
        kernel.forward(q.float(), k.float(), v.float(), [0, 4], [0, 4], True, 0.3)


@pytest.mark.parametrize("window", [1, 4, 11, 50])
def test_degree1_sliding_window_takes_the_band_mode(window):
    """``ring_attention(..., window=W)`` at degree 1 through ``NpuKernel`` hands the window to the op as its band
    mode (``sparse_mode=4``, ``pre_tockens=W−1``, ``next_tockens=0``, the compressed mask) instead of the masked
    path: out and gradients equal dense fp64 windowed attention (fp32 inputs, 1e-5) through the documented-semantics
    fake. A window passed as W (not W−1) or a right window would change the result."""
    fake = DocumentedNPUFusionAttention()
    cu = [0, 1, 1, 23, 60]
    q, k, v, dout = _data(cu, cu, 4, 2, 8, seed=window)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = ring_attention(*leaves, cu, ranks=(0,), kernel=NpuKernel(module=fake), window=window)
    out.backward(dout)
    ref_leaves = [x.double().requires_grad_() for x in (q, k, v)]
    ref = dense_attention(*ref_leaves, cu, window=window)
    ref.backward(dout.double())
    for got, want in [(out, ref)] + [(a.grad, b.grad) for a, b in zip(leaves, ref_leaves)]:
        assert (got.detach().double() - want.detach()).abs().max() <= 1e-5
    assert [(c["op"], c["sparse_mode"], c["pre_tockens"], c["next_tockens"], c["atten_mask"]) for c in fake.calls] == \
        [(op, NPU_BAND_SPARSE_MODE, window - 1, 0, (2048, 2048)) for op in ("forward", "grad")]
    with pytest.raises(ValueError, match="window=W"):
        NpuKernel(module=fake).forward(q, k, v, cu, cu, False, 0.3, window=3)


# Gap found by mutation testing in fcp_exec/kernels/npu.py ``_calls``: the per-call TND limit (cumulative
# ``actual_seq_*`` <= max_tokens_per_call) must hold for the KEY side too. tests/exec/test_npu_contract.py checks it
# only with equal query and key lengths (and asserts only ``actual_seq_qlen``), so dropping ``tk + nk > limit`` from
# the split condition passed. A ring block of degree > 1 has unequal sides (the second halves of the queries against
# all keys: keys = 2 × queries). Here: limit lowered to 12, non-causal block with 2-row query documents against 6-row
# key documents (24 keys in all): every recorded call keeps both sides within 12, and out/lse/dq/dk/dv still equal
# the float64 reference kernel to 1e-5 (float32 through the documented-semantics fake); and with the real limit a
# block of 2 queries against two 600,000-key documents is split (``_calls`` only, no compute).


def test_key_side_of_a_call_stays_within_the_limit():
    fake = DocumentedNPUFusionAttention()
    kernel = NpuKernel(module=fake)
    kernel.max_tokens_per_call = 12
    cu_q, cu_k = [0, 2, 4, 6, 8], [0, 6, 12, 18, 24]
    g = torch.Generator().manual_seed(0)
    q, dout = (torch.randn(8, 4, 8, generator=g, dtype=torch.float64).float() for _ in range(2))
    k, v = (torch.randn(24, 2, 8, generator=g, dtype=torch.float64).float() for _ in range(2))
    out, lse = kernel.forward(q, k, v, cu_q, cu_k, False, 0.3)
    ref_out, ref_lse = ReferenceKernel().forward(q.double(), k.double(), v.double(), cu_q, cu_k, False, 0.3)
    assert (out.double() - ref_out).abs().max() <= 1e-5 and (lse.double() - ref_lse).abs().max() <= 1e-5
    grads = kernel.backward(dout, q, k, v, out, lse, cu_q, cu_k, False, 0.3)
    ref_grads = ReferenceKernel().backward(dout.double(), q.double(), k.double(), v.double(), ref_out, ref_lse,
                                           cu_q, cu_k, False, 0.3)
    for got, want in zip(grads, ref_grads):
        assert (got.double() - want).abs().max() <= 1e-5
    ends = [(c["actual_seq_qlen"][-1], c["actual_seq_kvlen"][-1]) for c in fake.calls]
    assert len(ends) >= 4 and all(eq <= 12 and ek <= 12 for eq, ek in ends), ends


def test_real_limit_splits_on_keys():
    calls = NpuKernel(module=DocumentedNPUFusionAttention())._calls([0, 1, 2], [0, 600_000, 1_200_000])
    assert [c[3][-1] for c in calls] == [600_000, 600_000], [c[3] for c in calls]
