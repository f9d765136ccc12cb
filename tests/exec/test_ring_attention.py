"""Ring attention across real gloo processes against dense single-process attention.

One pool of 4 workers is spawned per module and runs every case; each case may place several
logical CP groups of different degrees in the world at once and change the grouping between
calls. Every rank builds the same global documents from a seed, shards them with the zigzag
layout, runs ``ring_attention`` forward and backward, and compares its local out/dq/dk/dv with
the matching rows of dense fp64 attention (``fcp_exec.testing.dense_attention``).
"""
from __future__ import annotations

import time

import pytest
import torch

from fcp_exec import ring_attention, zigzag_index, zigzag_shard
from fcp_exec.launch import WorkerFailure, WorkerPool
from fcp_exec.ring_attention import _Plan
from fcp_exec.ring_halo import halo_plan, split_documents
from fcp_exec.testing import dense_attention

# max |ring − dense| allowed, relative to max |dense| of the same tensor (fp64: absolute).
TOL = {"float64": 1e-9, "float32": 5e-6, "bfloat16": 2e-2}


@pytest.fixture(scope="module")
def pool4():
    with WorkerPool(4, backend="gloo", pg_timeout=60) as pool:
        yield pool


def _cumsum(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def _inputs(gen, t, hq, hkv, d, dtype, dv=None):
    mk = (lambda h, dim=d: torch.randn(t, h, dim, generator=gen, dtype=torch.float64).to(dtype))
    dv = d if dv is None else dv
    return mk(hq), mk(hkv), mk(hkv, dv), mk(hq, dv)


def ring_case(rank, groupings, lengths, heads, dtype_name, causal, seed, kernel_name=None, window=None,
              sinks=False, softcap=None):
    """Worker: for each grouping (a list of groups covering the world) run the group containing
    this rank; return max errors per call. ``lengths[c][g]`` are the doc lengths of group g. ``sinks``: with
    attention sinks (per-head logits drawn from the seed, N(0, 2²)); the report then holds this rank's share of
    their gradient and the dense one."""
    dtype = getattr(torch, dtype_name)
    hq, hkv, d, *dv = heads  # a fourth entry: the value head dim (multi-latent attention: smaller than d)
    report = []
    for c, groups in enumerate(groupings):
        g = next(i for i, grp in enumerate(groups) if rank in grp)
        group = groups[g]
        degree, cp_rank = len(group), group.index(rank)
        cu = _cumsum(lengths[c][g])
        gen = torch.Generator().manual_seed(seed + 7919 * c + 31 * g)
        q, k, v, dout = _inputs(gen, cu[-1], hq, hkv, d, dtype, *dv)
        sk = (2 * torch.randn(hq, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_() if sinks else None
        qr, kr, vr = (x.detach().double().clone().requires_grad_() for x in (q, k, v))
        skr = sk.detach().double().clone().requires_grad_() if sinks else None
        ref = dense_attention(qr, kr, vr, cu, causal=causal, window=window, sinks=skr, softcap=softcap)
        ref_grads = torch.autograd.grad(ref, (qr, kr, vr) + ((skr,) if sinks else ()), dout.double())
        ql, cul = zigzag_shard(q, torch.tensor(cu, dtype=torch.int32), degree, cp_rank)
        kl, vl = zigzag_shard(k, cu, degree, cp_rank)[0], zigzag_shard(v, cu, degree, cp_rank)[0]
        ql, kl, vl = (x.detach().clone().requires_grad_() for x in (ql, kl, vl))
        # a kernel name (None: the default for the device), or a function returning a kernel object
        kernel = kernel_name() if callable(kernel_name) else kernel_name
        out = ring_attention(ql, kl, vl, cul, ranks=group, causal=causal, kernel=kernel, timeout=30, window=window,
                             sinks=sk, softcap=softcap)
        assert out.dtype == dtype and out.shape == (*ql.shape[:2], vl.shape[2])
        out.backward(zigzag_shard(dout, cu, degree, cp_rank)[0])
        errs = {"call": c, "group": group}
        if sinks:
            errs["dsinks"], errs["dsinks_dense"] = sk.grad.double(), ref_grads[3]
        for name, got, want in (("out", out, ref), ("dq", ql.grad, ref_grads[0]),
                                ("dk", kl.grad, ref_grads[1]), ("dv", vl.grad, ref_grads[2])):
            want_local = zigzag_shard(want.detach(), cu, degree, cp_rank)[0]
            diff = (got.double() - want_local).abs().max().item() if got.numel() else 0.0
            errs[name] = diff / (1.0 if dtype == torch.float64 else max(want.abs().max().item(), 1e-30))
        report.append(errs)
    return report


def _assert_close(reports, dtype_name):
    tol = TOL[dtype_name]
    for rank, report in enumerate(reports):
        for errs in report:
            for name in ("out", "dq", "dk", "dv"):
                assert errs[name] <= tol, f"rank {rank} {errs}: {name} error {errs[name]:.3g} > {tol}"


def _lengths_for(groups, seed, num_docs=4, max_chunks=3):
    """Docs of different lengths, each a multiple of 2·degree of its group (some empty)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for grp in groups:
        mult = 2 * len(grp)
        out.append([mult * int(torch.randint(0, max_chunks + 1, (1,), generator=gen)) or mult
                    for _ in range(num_docs)] + [0])
    return out


GROUPINGS = {
    1: [(0,), (1,), (2,), (3,)],
    2: [(1, 3), (2, 0)],
    3: [(0, 2, 3), (1,)],
    4: [(3, 1, 0, 2)],
}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_fp64_matches_dense(pool4, degree, causal):
    """fp64 ring attention (CPU flash kernel, GQA 4/2 heads, packed docs of different lengths,
    an empty doc) equals dense attention to 1e-9 in out, dq, dk, dv on every rank. A failure
    means a wrong zigzag visibility rule, a wrong lse merge or dK/dV not returned to the owner."""
    groups = GROUPINGS[degree]
    reports = pool4.run(ring_case, [groups], [_lengths_for(groups, degree)], (4, 2, 8),
                        "float64", causal, 100 + degree)
    _assert_close(reports, "float64")


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_fp64_sliding_window_matches_dense(pool4, degree):
    """A sliding window (query i sees keys j with 0 <= i - j < window: Mistral, Gemma 3, Phi-3) shorter than, as
    long as and longer than the zigzag chunks and the documents (1, 5, 13, 40 tokens; documents up to 12·degree
    tokens, an empty one): out, dq, dk, dv equal dense fp64 windowed attention to 1e-9 on every rank. A failure means
    a wrong position of a zigzag row (a query seeing a key outside its window, or missing one inside)."""
    groups = GROUPINGS[degree]
    for k, window in enumerate((1, 5, 13, 40)):
        reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 40 + degree + k, max_chunks=6)], (4, 2, 8),
                            "float64", True, 200 + degree + k, None, window)
        _assert_close(reports, "float64")


def _assert_sink_grads(reports, groupings, tol):
    """Each group's dsinks (summed over its ranks: each holds its queries' share) against the dense gradient."""
    for c, groups in enumerate(groupings):
        for group in groups:
            mine = [next(e for e in reports[r] if e["call"] == c) for r in group]
            total, dense = sum(e["dsinks"] for e in mine), mine[0]["dsinks_dense"]
            err = (total - dense).abs().max().item() / max(dense.abs().max().item(), 1e-30)
            assert err <= tol, f"group {group}: dsinks {total.tolist()} vs dense {dense.tolist()} ({err:.3g} > {tol})"


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_fp64_attention_sinks_match_dense(pool4, degree):
    """Attention sinks (gpt-oss: a learned logit per head in every query's softmax, with no value), alone and with
    sliding windows of 1 and 5 tokens (gpt-oss alternates windowed and full layers), causal and full masks: out, dq,
    dk, dv on every rank and each group's sink gradient (summed over its ranks) equal dense fp64 attention whose
    softmax has the sink appended as a column (``dense_attention(sinks=...)``, gpt-oss's own eager rule) to 1e-9. A
    failure means a wrong rescaling by the sink or a backward that did not see it."""
    groups = GROUPINGS[degree]
    for k, (causal, window) in enumerate(((True, None), (False, None), (True, 1), (True, 5))):
        reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 60 + degree + k, max_chunks=4)], (4, 2, 8),
                            "float64", causal, 300 + degree + k, None, window, True)
        _assert_close(reports, "float64")
        _assert_sink_grads(reports, [groups], 1e-9)


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_low_precision_attention_sinks_match_dense(pool4, dtype_name):
    """The same on a degree-3 and a degree-1 group in float32 and bfloat16 (the sink's gradient comes back in the
    sink's dtype), to TOL of the largest dense entry (dsinks: 4× TOL, a sum over every query)."""
    groups = GROUPINGS[3]
    reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 77, max_chunks=4)], (4, 2, 8), dtype_name, True,
                        377, None, None, True)
    _assert_close(reports, dtype_name)
    _assert_sink_grads(reports, [groups], 4 * TOL[dtype_name])


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_fp64_values_with_a_smaller_head_dim_match_dense(pool4, degree):
    """Multi-latent attention (DeepSeek-V3: q/k heads of 192, v heads of 128; here 12 and 8): v is zero-padded to
    the q/k head dim inside ``ring_attention`` and the output cut back, causal and full, with attention sinks too:
    out ``[T, H, 8]``, dq, dk and dv (``[T, H, 8]``) equal dense fp64 attention to 1e-9 on every rank."""
    groups = GROUPINGS[degree]
    for k, (causal, sinks) in enumerate(((True, False), (False, False), (True, True))):
        reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 80 + degree + k)], (4, 4, 12, 8), "float64",
                            causal, 400 + degree + k, None, None, sinks)
        _assert_close(reports, "float64")
        if sinks:
            _assert_sink_grads(reports, [groups], 1e-9)


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_fp64_windows_shorter_than_the_chunks_run_as_a_halo_and_match_dense(pool4, degree):
    """Every document's zigzag chunks at least ``window − 1`` rows long (an empty document too): each rank exchanges
    the K/V tails of its chunks with its two neighbours instead of running the ring (``fcp_exec.ring_halo``; the
    plan says so for every group here). Windows 2, 5 and 9 tokens, alone, with sinks and with soft-capping: out, dq,
    dk, dv equal dense fp64 windowed attention to 1e-9 on every rank. A failure means a tail from the wrong chunk or
    neighbour, or its dK/dV not returned to its owner."""
    groups = GROUPINGS[degree]
    for k, (window, sinks, cap) in enumerate(((2, False, None), (5, False, None), (9, True, None), (5, False, 1.5))):
        gen = torch.Generator().manual_seed(600 + degree + k)
        lengths = [[2 * len(g) * (window - 1 + int(torch.randint(0, 3 * window, (1,), generator=gen)))
                    for _ in range(3)] + [0] for g in groups]
        for g, lens in zip(groups, lengths):
            for r in range(len(g) if len(g) > 1 else 0):  # (degree 1 has no ring to replace)
                assert halo_plan(_Plan(_cumsum([n // len(g) for n in lens]), len(g), r, True, "cpu"), window,
                                 "cpu") is not None
        reports = pool4.run(ring_case, [groups], [lengths], (4, 2, 8), "float64", True, 700 + degree + k, None,
                            window, sinks, cap)
        _assert_close(reports, "float64")
        if sinks:
            _assert_sink_grads(reports, [groups], 1e-9)


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_fp64_long_and_short_documents_split_into_a_halo_and_a_ring(pool4, degree):
    """A group holding documents long enough for the halo and shorter ones (chunks of 1..W−2 rows): the long ones'
    rows run as a halo, the short ones' as a ring of their rows only (``split_documents``: two parts for every group
    here). Windows 5 and 9, with sinks: equal to dense fp64 windowed attention to 1e-9."""
    groups = GROUPINGS[degree]
    for k, (window, sinks) in enumerate(((5, False), (9, True))):
        lengths = [[2 * len(g) * h for h in (window + 3, 1, window - 2, 2 * window, 0)] for g in groups]
        for g, lens in zip(groups, lengths):
            if len(g) > 1:
                plan = _Plan(_cumsum([n // len(g) for n in lens]), len(g), 0, True, "cpu")
                assert len(split_documents(plan, window, plan.sub)) == 2
        reports = pool4.run(ring_case, [groups], [lengths], (4, 2, 8), "float64", True, 800 + degree + k, None,
                            window, sinks)
        _assert_close(reports, "float64")
        if sinks:
            _assert_sink_grads(reports, [groups], 1e-9)


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_fp64_logit_softcapping_matches_dense(pool4, degree):
    """Attention logit soft-capping (Gemma 2: scores ``c·tanh(s/c)`` before the mask; c = 1.5 so that it bends most
    scores of these N(0, 1) inputs), alone, with 5- and 40-token windows and with sinks: out, dq, dk, dv equal dense
    fp64 attention with the same cap to 1e-9 on every rank. A failure means a score not capped, or a backward
    without the cap's derivative."""
    groups = GROUPINGS[degree]
    for k, (window, sinks) in enumerate(((None, False), (5, False), (40, False), (None, True))):
        reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 90 + degree + k, max_chunks=5)], (4, 2, 8),
                            "float64", True, 500 + degree + k, None, window, sinks, 1.5)
        _assert_close(reports, "float64")


def test_softcapping_needs_a_positive_cap_and_a_causal_mask():
    q = torch.zeros(4, 2, 8)
    for bad, causal in ((0.0, True), (-1.0, True), (float("inf"), True), (True, True), (30.0, False)):
        with pytest.raises(ValueError, match=r"softcap must be a finite number > 0 with causal=True"):
            ring_attention(q, q, q, [0, 4], softcap=bad, causal=causal)


def test_sinks_of_the_wrong_shape_are_refused():
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match=r"sinks must be a floating \[H_q=2\] tensor"):
        ring_attention(q, q, q, [0, 4], sinks=torch.zeros(3))
    with pytest.raises(ValueError, match=r"sinks must be a floating"):
        ring_attention(q, q, q, [0, 4], sinks=torch.zeros(2, dtype=torch.long))


def test_a_window_without_a_causal_mask_is_refused():
    q = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match=r"window must be an int >= 1 with causal=True"):
        ring_attention(q, q, q, [0, 4], ranks=(0,), causal=False, window=3)
    with pytest.raises(ValueError, match=r"window must be an int >= 1"):
        ring_attention(q, q, q, [0, 4], ranks=(0,), window=0)


def test_fp64_reference_kernel_degree3(pool4):
    """The same check through the fp64 math reference kernel (degree 3, causal)."""
    groups = GROUPINGS[3]
    reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 5)], (2, 1, 4),
                        "float64", True, 7, "reference")
    _assert_close(reports, "float64")


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_low_precision_matches_dense(pool4, dtype_name):
    """fp32 within 5e-6 and bf16 within 2e-2 relative to max |dense| (measured: 3e-7 and 5e-3) at
    degrees 3 and 1 at once; fp32 accumulation keeps the ring as accurate as one process. And a 5-token window over
    documents of both kinds at degree 4 (a halo and a ring of the short ones' rows): the same tolerances, gradients
    in the inputs' dtype."""
    groups = GROUPINGS[3]
    reports = pool4.run(ring_case, [groups], [_lengths_for(groups, 11, max_chunks=6)], (4, 4, 16),
                        dtype_name, True, 13)
    _assert_close(reports, dtype_name)
    lengths = [[8 * h for h in (9, 2, 4, 14)]]
    _assert_close(pool4.run(ring_case, [GROUPINGS[4]], [lengths], (4, 2, 16), dtype_name, True, 17, None, 5),
                  dtype_name)


def autocast_case(rank, groups, lengths, seed, kernel=None):
    """Worker: ``ring_attention`` inside ``torch.autocast("cpu", bfloat16)`` with fp32 q/k and a bf16 v (what a
    Hugging Face layer hands over under bf16 autocast), backward inside autocast too. Returns whether out and the
    input gradients are bit-identical to the same call on bf16 inputs without autocast, their dtypes, and the error
    against dense fp64 attention."""
    group = next(grp for grp in groups if rank in grp)
    degree, cp_rank = len(group), group.index(rank)
    cu = _cumsum(lengths[groups.index(group)])
    q, k, v, dout = _inputs(torch.Generator().manual_seed(seed + 31 * groups.index(group)), cu[-1], 4, 2, 16,
                            torch.float32)
    shard = (lambda x: zigzag_shard(x, torch.tensor(cu, dtype=torch.int32), degree, cp_rank))
    (ql, cul), kl, vl, dl = shard(q), shard(k)[0], shard(v)[0].bfloat16(), shard(dout)[0]
    leaves = [x.detach().clone().requires_grad_() for x in (ql, kl, vl)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ring_attention(*leaves, cul, ranks=group, timeout=30, kernel=kernel)
        out.backward(dl.bfloat16())
    plain = [x.detach().bfloat16().requires_grad_() for x in (ql, kl, vl)]
    want = ring_attention(*plain, cul, ranks=group, timeout=30, kernel=kernel)
    want.backward(dl.bfloat16())
    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v.bfloat16()))
    ref = dense_attention(qr, kr, vr, cu, causal=True)
    err = (out.double() - shard(ref.detach())[0]).abs().max().item() / ref.abs().max().item()
    same = torch.equal(out, want) and all(torch.equal(a.grad, b.grad.to(a.dtype)) for a, b in zip(leaves, plain))
    return {"same": same, "dtypes": [str(t.dtype) for t in (out, *(x.grad for x in leaves))], "err": err}


@pytest.mark.parametrize("kernel", [None, "sdpa"])
def test_inside_autocast_attention_runs_in_the_autocast_dtype(pool4, kernel):
    """Under bf16 autocast ring attention takes q, k, v of mixed dtypes (fp32 q/k, bf16 v) and runs them in bf16,
    as torch's SDPA does there — before, it refused them ("dtypes differ"), which stopped every Hugging Face model
    under the Trainer's ``bf16=True``. Degrees 3 and 1 at once, backward called inside autocast: out is bf16, each
    gradient comes back in its input's dtype, all bit-identical to the same call on bf16 inputs outside autocast
    (the enclosing autocast does not reach the ring's fp32 accumulators: the ``sdpa`` kernel, the GPU fallback, computes
    its lse and backward with fp32 matmuls that autocast would run in bf16), and within bf16's tolerance of dense fp64
    attention. Default CPU kernel and ``sdpa``."""
    groups = GROUPINGS[3]
    reports = pool4.run(autocast_case, groups, _lengths_for(groups, 17, max_chunks=6), 19, kernel)
    for rank, r in enumerate(reports):
        assert r["same"], f"rank {rank}: autocast result differs from the explicit bf16 call"
        assert r["dtypes"] == ["torch.bfloat16", "torch.float32", "torch.float32", "torch.bfloat16"], (rank, r)
        assert r["err"] <= TOL["bfloat16"], (rank, r)


def test_concurrent_groups_change_every_call(pool4):
    """Groups (0,2,3)+(1,), then (3,1)+(0,)+(2,), then (2,1,0,3) run back to back in one world
    with no process group per call; every call is exact (fp64, causal)."""
    groupings = [[(0, 2, 3), (1,)], [(3, 1), (0,), (2,)], [(2, 1, 0, 3)]]
    lengths = [_lengths_for(gs, 40 + i) for i, gs in enumerate(groupings)]
    reports = pool4.run(ring_case, groupings, lengths, (2, 2, 8), "float64", True, 21)
    _assert_close(reports, "float64")
    assert [e["group"] for e in reports[3]] == [(0, 2, 3), (3, 1), (2, 1, 0, 3)]


def padded_case(rank, raw_lengths, degree, seed):
    """Worker: odd-length docs padded at their end to a multiple of 2·degree by the caller;
    returns max error of the real rows against dense attention on the *unpadded* docs."""
    ranks = tuple(range(degree))
    if rank not in ranks:
        return 0.0
    mult = 2 * degree
    padded = [n + (-n) % mult for n in raw_lengths]
    cu_raw, cu_pad = _cumsum(raw_lengths), _cumsum(padded)
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = _inputs(gen, cu_pad[-1], 2, 1, 8, torch.float64)
    real = torch.cat([torch.arange(cu_pad[i], cu_pad[i] + n) for i, n in enumerate(raw_lengths)])
    dout[~torch.isin(torch.arange(cu_pad[-1]), real)] = 0.0  # the caller masks padded positions
    qr, kr, vr = (x[real].clone().requires_grad_() for x in (q, k, v))
    ref = dense_attention(qr, kr, vr, cu_raw, causal=True)
    grads = torch.autograd.grad(ref, (qr, kr, vr), dout[real])
    idx = zigzag_index(cu_pad, degree, rank)
    ql, kl, vl = (x[idx].clone().requires_grad_() for x in (q, k, v))
    out = ring_attention(ql, kl, vl, torch.tensor(cu_pad) // degree, ranks=ranks, timeout=30)
    out.backward(dout[idx])
    pos_in_real = torch.full((cu_pad[-1],), -1, dtype=torch.long)
    pos_in_real[real] = torch.arange(real.numel())
    keep = pos_in_real[idx] >= 0
    src = pos_in_real[idx][keep]
    err = 0.0
    for got, want in ((out, ref), (ql.grad, grads[0]), (kl.grad, grads[1]), (vl.grad, grads[2])):
        err = max(err, (got[keep] - want.detach()[src]).abs().max().item())
    return err


def test_many_odd_docs_padded_by_caller(pool4):
    """25 documents of odd lengths 1..31, each padded at its end to a multiple of 2·3: the real
    tokens' out and gradients equal dense attention on the unpadded documents to 1e-9 (causal
    attention never lets a real token see the padding appended after it)."""
    raw = [2 * i + 1 for i in range(1, 16)] + [1, 3, 5, 7, 9, 11, 13, 15, 17, 19]
    errs = pool4.run(padded_case, raw, 3, 5)
    assert max(errs) <= 1e-9, errs


def bad_input_case(rank):
    """Worker: invalid calls must raise ValueError before any communication."""
    q = torch.zeros(8, 2, 4)
    msgs = []
    for kwargs in ({"ranks": [r for r in range(4) if r != rank] or [9]},
                   {"ranks": [rank, rank]},
                   {"ranks": [rank, 7]}):
        try:
            ring_attention(q, q, q, [0, 8], **kwargs)
            msgs.append("no error")
        except ValueError as exc:
            msgs.append(str(exc))
    try:
        ring_attention(q, q, q, [0, 3, 8], ranks=[0, 1, 2, 3])
        msgs.append("no error")
    except ValueError as exc:
        msgs.append(str(exc))
    return msgs


def test_invalid_groups_raise_before_communicating(pool4):
    """A group without this rank, duplicate ranks, ranks outside the world and odd local document
    lengths raise ValueError on every rank without hanging the others."""
    for msgs in pool4.run(bad_input_case, timeout=30):
        assert "not in its CP group" in msgs[0]
        assert "duplicates" in msgs[1]
        assert "outside the world" in msgs[2]
        assert "document 0" in msgs[3] and "not divisible" in msgs[3]


def test_degree_above_one_needs_process_group():
    """Without init_process_group a degree-2 call explains what to do; degree 1 just runs."""
    q = torch.randn(8, 2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="not initialised"):
        ring_attention(q, q, q, [0, 8], ranks=[0, 1])
    out = ring_attention(q, q, q, [0, 8], ranks=[0])
    assert torch.allclose(out, dense_attention(q, q, q, [0, 8]), atol=1e-12)


# ---------------------------------------------------------------- failures: separate small pool
def missing_neighbour_case(rank, timeout):
    """Worker: rank 0 runs a degree-2 ring with rank 1, which never joins."""
    if rank != 0:
        return None
    q = torch.randn(8, 2, 4)
    start = time.monotonic()
    try:
        ring_attention(q, q, q, [0, 8], ranks=[0, 1], timeout=timeout)
    except RuntimeError as exc:
        return str(exc), time.monotonic() - start
    return "no error", time.monotonic() - start


def _rank(rank):
    return rank


def raising_case(rank):
    if rank == 1:
        raise KeyError("boom from rank 1")
    return rank


def hanging_case(rank):
    if rank == 0:
        time.sleep(120)
    return rank


def dying_case(rank):
    if rank == 1:
        import os
        os._exit(3)
    return rank


def test_missing_neighbour_times_out_and_worker_errors_propagate():
    """A rank whose ring neighbour never shows up gets a RuntimeError naming that peer within
    about the timeout instead of hanging; a worker exception reaches the parent with the worker's
    traceback; a hanging worker turns into TimeoutError and a dying one into WorkerFailure, and the
    pool restarts after each. (A separate pool: the aborted ring leaves unmatched messages behind.)"""
    with WorkerPool(2, backend="gloo", pg_timeout=30) as pool:
        msg, elapsed = pool.run(missing_neighbour_case, 1.5, timeout=60)[0]
        assert "peer rank 1" in msg and "ranks=[0, 1]" in msg, msg
        assert elapsed < 20, elapsed
        with pytest.raises(WorkerFailure, match="boom from rank 1") as info:
            pool.run(raising_case, timeout=30)
        kind, _, tb = info.value.errors[1]
        assert kind == "KeyError" and "Traceback" in tb and "raising_case" in tb
        assert pool.run(_rank, timeout=60) == [0, 1]  # the pool restarted after the failure
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"ranks \[0\] did not finish"):
            pool.run(hanging_case, timeout=2)
        assert time.monotonic() - start < 15
        with pytest.raises(WorkerFailure, match="rank 1 exit code 3"):
            pool.run(dying_case, timeout=60)
        assert pool.run(_rank, timeout=60) == [0, 1]


# ---------------------------------------------------------------- degrees 5-8 (slow)
@pytest.mark.slow
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_fp64_degrees_5_to_8(causal):
    """Degrees 5..8 in an 8-process world: (0..4)+(5,6,7), then (7,1,3,5,0,2)+(4,6), then
    (6,5,4,3,2,1,0)+(7,), then all eight; fp64 to 1e-9 against dense attention."""
    groupings = [[(0, 1, 2, 3, 4), (5, 6, 7)], [(7, 1, 3, 5, 0, 2), (4, 6)],
                 [(6, 5, 4, 3, 2, 1, 0), (7,)], [(0, 1, 2, 3, 4, 5, 6, 7)]]
    lengths = [_lengths_for(gs, 60 + i, num_docs=3, max_chunks=2) for i, gs in enumerate(groupings)]
    with WorkerPool(8, backend="gloo", pg_timeout=120) as pool:
        reports = pool.run(ring_case, groupings, lengths, (2, 1, 8), "float64", causal, 3, timeout=600)
    _assert_close(reports, "float64")
