"""Hostile inputs to ring attention: non-finite values, degenerate shapes, mismatched options between the ranks of a CP
group, huge windows, tensor ``ranks``, a KV cache through the Hugging Face adapter and bad ``cu_seqlens``.

Values are compared with causal dense float64 attention computed per document (so a NaN stays in its document, as
the kernels keep it; not ``fcp_exec.testing.dense_attention``, which maps NaN probabilities to 0): the NaN pattern
of the output must be the dense one, every finite entry within 1e-9 (float64) / 1e-5 (float32) of it; a gradient
row (token, head) that dense attention gives finite must be finite and within the same tolerance.
Two-rank cases run in one pool of real gloo processes.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fcp_data.layout import check_cu_seqlens, zigzag_shard
from fcp_exec.launch import WorkerPool
from fcp_exec.ring_attention import ring_attention
from fcp_exec.step import is_idle

TOL = {torch.float64: 1e-9, torch.float32: 1e-5}
NAN = float("nan")


@pytest.fixture(scope="module")
def pool2():
    with WorkerPool(2, backend="gloo", pg_timeout=60) as pool:
        yield pool


def _dense_doc(q, k, v):
    """Causal dense fp64 attention of one document (GQA), NaN kept (``dense_attention`` zeroes NaN probabilities)."""
    k, v = (x.double().repeat_interleave(q.shape[1] // k.shape[1], 1) for x in (k, v))
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * q.shape[-1] ** -0.5
    keep = torch.ones(q.shape[0], q.shape[0], dtype=torch.bool).tril()
    return torch.einsum("hqk,khd->qhd", torch.softmax(s.masked_fill(~keep, float("-inf")), -1), v)


def _per_doc_dense(q, k, v, cu):
    """Dense fp64 attention of each document alone, packed again (differentiable)."""
    return torch.cat([_dense_doc(q[a:b], k[a:b], v[a:b]) for a, b in zip(cu[:-1], cu[1:])])


def _inputs(cu, dtype, heads=(2, 1), d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = (lambda h: torch.randn(cu[-1], h, d, generator=g, dtype=torch.float64).to(dtype))
    return mk(heads[0]), mk(heads[1]), mk(heads[1]), mk(heads[0])


def _compare(got: dict, want: dict, tol: float) -> list[str]:
    """Problems of ``got`` against ``want`` (tensors by name): ``out`` must have dense's NaN entries exactly; every
    tensor must be finite and close on the (token, head) rows dense gives finite. (A gradient row dense has partly
    NaN is not compared: dense autograd's masked entries pass 0·NaN on per entry, the kernels' NaN probabilities all
    of the row.)"""
    bad = []
    for name, w in want.items():
        x = got[name].double()
        finite = torch.isfinite(w).all(-1, keepdim=True).expand_as(w)
        if name == "out" and not torch.equal(torch.isnan(x), torch.isnan(w)):
            bad.append(f"out NaN rows {torch.isnan(x).any(-1).any(-1).nonzero().flatten().tolist()}, dense "
                       f"{torch.isnan(w).any(-1).any(-1).nonzero().flatten().tolist()}")
        if not torch.isfinite(x[finite]).all():
            bad.append(f"{name}: non-finite where dense is finite")
        elif finite.any() and (x[finite] - w[finite]).abs().max() > tol:
            bad.append(f"{name}: error {(x[finite] - w[finite]).abs().max().item():.3g} > {tol}")
    return bad


def _nan_case(q, k, v, dout, cu, degree, cp_rank, kernel):
    """``(problems, out)`` of ring attention over this rank's zigzag shard against per-document dense attention."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    ref = _per_doc_dense(*leaves, cu)
    ref_grads = torch.autograd.grad(ref, leaves, dout.double())
    shard = (lambda x: x.detach() if degree == 1 else zigzag_shard(x.detach(), cu, degree, cp_rank)[0])
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    cul = [c // degree for c in cu]
    out = ring_attention(ql, kl, vl, cul, ranks=list(range(degree)), kernel=kernel, timeout=30)
    out.backward(shard(dout))
    got = {"out": out, "dq": ql.grad, "dk": kl.grad, "dv": vl.grad}
    want = {n: shard(w) for n, w in zip(("out", "dq", "dk", "dv"), (ref, *ref_grads))}
    return _compare(got, want, TOL[q.dtype]), out


# --- finding 1 and 2: NaN/inf propagate as in dense attention (degree 1) ---------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("where", ["q", "k", "inf_q"])
@pytest.mark.parametrize("kernel", ["cpu", "cpu_block_diag"])
def test_non_finite_values_propagate_like_dense_attention(dtype, where, kernel):
    """A NaN query of a short document (the aten CPU kernel returns out = 0 for it) comes out NaN, a NaN key makes
    NaN exactly the rows that see it — in its document only (the block-diagonal mask spread it to every document) —
    and the gradients stay finite wherever dense attention's are."""
    cu = [0, 5, 12, 20]
    q, k, v, dout = _inputs(cu, dtype)
    x, val = {"q": (q, NAN), "k": (k, NAN), "inf_q": (q, float("inf"))}[where]
    x[3, 0, 0] = val
    bad, out = _nan_case(q, k, v, dout, cu, 1, 0, kernel)
    assert not bad, bad
    if where != "inf_q":
        assert torch.isnan(out).any(-1).any(-1).nonzero().flatten().tolist() == ([3] if where == "q" else [3, 4])


def test_finite_inputs_still_take_the_flash_path(monkeypatch):
    """Finite input never runs the fp64 fallback (the fast path is unchanged)."""
    from fcp_exec.kernels import reference

    def boom(*a, **kw):
        raise AssertionError("the math fallback ran on finite input")

    monkeypatch.setattr(reference.ReferenceKernel, "forward", boom)
    monkeypatch.setattr(reference.ReferenceKernel, "backward", boom)
    cu = [0, 5, 12, 20]
    q, k, v, dout = _inputs(cu, torch.float64)
    bad, _ = _nan_case(q, k, v, dout, cu, 1, 0, "cpu")
    assert not bad, bad


# --- finding 3: zero heads -------------------------------------------------------------------------------------------

_ZERO_HEADS = """
import torch
from fcp_exec.ring_attention import ring_attention
from fcp_exec.kernels import CpuFlashKernel
q = torch.randn(8, 2, 4, dtype=torch.float64)
msgs = []
for hq, hkv in ((0, 2), (0, 0), (2, 0)):
    try:
        ring_attention(q[:, :hq], q[:, :hkv], q[:, :hkv], [0, 8], ranks=[0])
        msgs.append("no error")
    except ValueError as e:
        msgs.append(str(e))
try:
    CpuFlashKernel().forward(q[:, :0], q, q, [0, 8], [0, 8], True, 0.5)
    msgs.append("no error")
except ValueError as e:
    msgs.append(str(e))
print(repr(msgs))
"""


def test_zero_heads_raise_value_error_before_any_kernel():
    """H_q = 0 passed the GQA check (0 % H_kv == 0) and the aten kernel died of SIGFPE: a subprocess, so that the old
    crash fails this test instead of killing the session."""
    run = subprocess.run([sys.executable, "-c", _ZERO_HEADS], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    msgs = eval(run.stdout.strip().splitlines()[-1])  # noqa: S307 - our own repr of a list of str
    assert msgs[0].startswith("q has 0 heads and k/v have 2") and "H_q >= 1" in msgs[0]
    assert msgs[1].startswith("q has 0 heads and k/v have 0") and "multiple" not in msgs[1]
    assert msgs[2].startswith("q has 2 heads and k/v have 0")
    assert msgs[3].startswith("q has 0 heads")


# --- finding 6: ranks as a tensor ------------------------------------------------------------------------------------

def test_is_idle_reads_the_length_of_ranks():
    ids = torch.ones(4, dtype=torch.long)
    assert not is_idle({"input_ids": ids, "ranks": torch.tensor([0])})
    assert not is_idle({"input_ids": ids, "ranks": torch.tensor([0, 1])})
    assert not is_idle({"input_ids": ids, "ranks": (0,)})
    assert is_idle({"input_ids": ids, "ranks": ()})
    assert is_idle({"input_ids": ids, "ranks": torch.zeros(0, dtype=torch.long)})
    assert is_idle({"input_ids": ids})
    assert is_idle({"input_ids": ids[:0], "ranks": (0,)})


# --- finding 7: a KV cache through the Hugging Face adapter ----------------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*past_key_values")
def test_hf_kv_cache_is_refused():
    """transformers 5 hands the cache to the layer, not to attention: ``use_cache=True`` (or the config's default)
    and a ``past_key_values`` cache are refused with the documented one-line error; ``use_cache=False`` runs."""
    transformers = pytest.importorskip("transformers")
    from fcp_exec.integrations.hf import apply_fcp, batch_inputs

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    model = apply_fcp(transformers.LlamaForCausalLM(cfg))
    batch = {"input_ids": torch.randint(0, 64, (16,)), "cu_seqlens": torch.tensor([0, 6, 16]),
             "position_ids": torch.cat([torch.arange(6), torch.arange(10)]), "ranks": (0,)}
    kw = batch_inputs(batch, model)
    assert model(**kw).logits.shape == (1, 16, 64)  # use_cache=False
    default = {n: x for n, x in kw.items() if n != "use_cache"}  # the config's use_cache=True
    for bad in (dict(kw, use_cache=True), default):
        with pytest.raises(ValueError, match="call the model with use_cache=False"):
            model(**bad)
    cache = transformers.DynamicCache(config=cfg)
    model(**dict(kw, past_key_values=cache))  # an empty cache given with use_cache=False: filled, result exact
    with pytest.raises(ValueError, match="use_cache=False"):
        model(**dict(kw, past_key_values=cache))  # its keys now precede the queries


# --- finding 8 and 9: cu_seqlens -------------------------------------------------------------------------------------

def test_meta_cu_seqlens_is_a_value_error():
    q = torch.randn(8, 2, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="cu_seqlens must hold real integers"):
        ring_attention(q, q, q, torch.tensor([0, 8], device="meta"), ranks=[0])
    with pytest.raises(ValueError, match="meta"):
        check_cu_seqlens(torch.tensor([0, 8], device="meta"))


def test_odd_local_length_names_the_local_rule():
    with pytest.raises(ValueError) as err:
        check_cu_seqlens([0, 3, 8], multiple=2, local_degree=4)
    msg = str(err.value)
    assert "local document 0" in msg and "2*degree=8" in msg and "zigzag_shard" in msg and "even" in msg


# --- two ranks -------------------------------------------------------------------------------------------------------

def _try(fn):
    try:
        fn()
        return "no error"
    except ValueError as e:
        return str(e)


def two_rank_case(rank):
    """Worker: every two-rank case; returns a dict of results (errors caught, so every case runs on both ranks)."""
    res = {}
    cu = [0, 8, 16, 28]  # local documents of 4, 4 and 6 rows
    for name, pos, kernel in (("nan_q", 2, "cpu"), ("nan_k", 9, "cpu"), ("nan_k_bd", 17, "cpu_block_diag")):
        q, k, v, dout = _inputs(cu, torch.float64, seed=1)
        (q if name == "nan_q" else k)[pos, 0, 0] = NAN
        res[name] = _nan_case(q, k, v, dout, cu, 2, rank, kernel)[0]
    q, k, v, _ = _inputs(cu, torch.float64, seed=2)
    ql, kl, vl = (zigzag_shard(x, cu, 2, rank)[0] for x in (q, k, v))
    cul = [c // 2 for c in cu]
    want = zigzag_shard(_per_doc_dense(q, k, v, cu), cu, 2, rank)[0]
    for w in (2 ** 62, 10 ** 18, 2 ** 100):
        try:
            out = ring_attention(ql, kl, vl, cul, ranks=[0, 1], window=w, timeout=30)
            res[f"window {w}"] = (out - want).abs().max().item()
        except (ValueError, RuntimeError) as e:
            res[f"window {w}"] = f"{type(e).__name__}: {e}"
    call = (lambda **kw: _try(lambda: ring_attention(ql, kl, vl, cul, ranks=[0, 1], timeout=30, **kw)))
    sinks = torch.zeros(ql.shape[1], dtype=torch.float64)
    res["softcap one side"] = call(softcap=0.5 if rank == 0 else None)
    res["softcap values"] = call(softcap=0.5 if rank == 0 else 0.25)
    res["softcap same"] = call(softcap=0.5)
    res["sinks one side"] = call(sinks=sinks if rank == 0 else None)
    res["sinks values"] = call(sinks=sinks + rank)
    res["sinks same"] = call(sinks=sinks)
    res["odd local length"] = _try(lambda: ring_attention(ql, kl, vl, [0, 3, 8, 14], ranks=[0, 1], timeout=30))
    return res


def test_two_ranks(pool2):
    """At degree 2: NaN forward/backward as dense attention (findings 1, 2); ``window`` up to any int accepted and
    equal to no window (5); ranks with different softcap or sinks refused by the neighbour check (4); an odd local
    document length explained in local terms (8)."""
    for rank, res in enumerate(pool2.run(two_rank_case, timeout=120)):
        for name in ("nan_q", "nan_k", "nan_k_bd"):
            assert res[name] == [], (rank, name, res[name])
        for w in (2 ** 62, 10 ** 18, 2 ** 100):
            assert isinstance(res[f"window {w}"], float) and res[f"window {w}"] < 1e-9, (rank, res[f"window {w}"])
        for what in ("softcap", "sinks"):
            for case in ("one side", "values"):
                msg = res[f"{what} {case}"]
                assert msg.startswith("ring attention: rank") and f"differ in {what}" in msg, (rank, what, case, msg)
            assert res[f"{what} same"] == "no error", (rank, what, res[f"{what} same"])
        msg = res["odd local length"]
        assert "local document 0" in msg and "not divisible" in msg and "2*degree=4" in msg and "zigzag_shard" in msg
