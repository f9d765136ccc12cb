"""Ascend NPU kernel on ``torch_npu.npu_fusion_attention`` / ``npu_fusion_attention_grad``.

Translation between our contract (:mod:`fcp_exec.kernels.base`) and the documented torch_npu one:

* ``input_layout="TND"``: q ``[T, N1, D]``, k/v ``[T, N2, D]`` (``N1 % N2 == 0``, GQA native),
  ``head_num = N1``.
* ``actual_seq_qlen`` / ``actual_seq_kvlen``: cumulative document *ends* without the leading 0,
  as Python lists of ints (``cu_seqlens[1:]``). Documents with no queries or no keys are dropped
  from the call (their rows are set to ``out = 0``, ``lse = -inf`` by us).
* causal: ``sparse_mode=3`` (rightDownCausal; equal to leftUpCausal=2 here because our contract
  requires equal query/key lengths per causal document) with the optimised
  ``atten_mask = triu(ones(2048, 2048), 1).bool()`` (True = masked); full mask: ``sparse_mode=0``
  and no ``atten_mask``; a causal sliding window ``W`` (``window=W``, ring attention's degree 1):
  ``sparse_mode=4`` (band: query ``i`` sees keys ``i − pre_tockens … i + next_tockens``) with
  ``pre_tockens = W − 1``, ``next_tockens = 0`` and the same optimised mask.
* ``scale`` (forward) / ``scale_value`` (grad), ``keep_prob=1.0`` (no dropout).
* outputs ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)`` with
  ``softmax_max``/``softmax_sum`` float32 ``[T, N1, 8]`` (8 equal copies):
  ``lse = softmax_max + log(softmax_sum)`` → ``[N1, T]``.
* backward: the global ``lse`` is handed over as ``softmax_max = lse`` and ``softmax_sum = 1``
  (the kernel uses ``P = exp(S − max) / sum``, identical to ``exp(S − lse)``), with
  ``attention_in`` = the global ``out``.

* Limits (documented for torch_npu TND): the cumulative ``actual_seq_*`` values of one call may not exceed
  1,000,000 tokens (op_plugin's ``MAX_SEQUENCE_LENGTH``) and a call holds at most 2,048 sequences
  (aclnnFlashAttentionVarLenScore: 1 to 2K), so a block holding more is split into calls over whole documents,
  each within both (one document longer than that is a ``ValueError``); float32 in TND needs a recent
  torch_npu/CANN (older releases document float16/bfloat16 only), so a float32 call that the installed op rejects
  for its dtype is re-raised as a ``ValueError`` saying so (any other error keeps its own message).

It cannot run without an NPU; ``tests/exec/test_npu_contract.py`` checks the translation against a
reference implementation of the documented semantics injected as ``module``.
"""
from __future__ import annotations

import torch

from fcp_exec.kernels.base import AttentionKernel, check_block_inputs, doc_bounds

__all__ = ["NpuKernel", "NPU_BAND_SPARSE_MODE", "NPU_CAUSAL_SPARSE_MODE", "NPU_MASK_SIZE", "NPU_MAX_SEQ_TOKENS",
           "NPU_MAX_SEQS_PER_CALL"]

NPU_CAUSAL_SPARSE_MODE = 3
NPU_BAND_SPARSE_MODE = 4
NPU_MASK_SIZE = 2048
_MAX_TOKENS = 2147483647
# one TND call: torch_npu's op_plugin checks every cumulative end of actual_seq_qlen / actual_seq_kvlen against
# MAX_SEQUENCE_LENGTH = 1000000 ("The sequence length should not greater than 1M"), and aclnnFlashAttentionVarLenScore
# takes 1 to 2K sequences (the length of actualSeqQLen)
NPU_MAX_SEQ_TOKENS = 1_000_000
NPU_MAX_SEQS_PER_CALL = 2048


class NpuKernel(AttentionKernel):
    """``module``: the ``torch_npu`` module (imported lazily when ``None``)."""

    name = "npu"
    max_tokens_per_call = NPU_MAX_SEQ_TOKENS
    max_seqs_per_call = NPU_MAX_SEQS_PER_CALL

    def __init__(self, module=None):
        if module is None:
            try:
                import torch_npu as module  # noqa: PLC0415 (optional dependency, needs CANN)
            except ImportError as exc:
                raise ImportError("NpuKernel needs torch_npu (pip install 'fcp[npu]' on a CANN host)") from exc
        self._npu = module
        self._masks: dict = {}

    def _mask(self, device) -> torch.Tensor:
        key = str(device)
        if key not in self._masks:
            ones = torch.ones(NPU_MASK_SIZE, NPU_MASK_SIZE, dtype=torch.bool, device=device)
            self._masks[key] = torch.triu(ones, diagonal=1)
        return self._masks[key]

    def fused_window(self, q) -> bool:
        """The band mode (``sparse_mode=4``) takes a causal sliding window over whole documents (degree 1); blocks
        of degree > 1 keep the masked path (the band's alignment for unequal query/key lengths in TND is not
        stated in the text of the docs)."""
        return True

    def _sparse_args(self, causal: bool, device, window: int | None = None) -> dict:
        if window is not None:  # band: query i sees keys i - pre_tockens … i + next_tockens
            if not causal or isinstance(window, tuple):
                raise ValueError("NpuKernel takes window=W (a causal sliding window over whole documents) only")
            return {"atten_mask": self._mask(device), "sparse_mode": NPU_BAND_SPARSE_MODE,
                    "pre_tockens": int(window) - 1, "next_tockens": 0}
        if causal:
            return {"atten_mask": self._mask(device), "sparse_mode": NPU_CAUSAL_SPARSE_MODE,
                    "pre_tockens": _MAX_TOKENS, "next_tockens": 0}
        return {"atten_mask": None, "sparse_mode": 0, "pre_tockens": _MAX_TOKENS, "next_tockens": _MAX_TOKENS}

    def _calls(self, cq: list[int], ck: list[int]):
        """Documents with both queries and keys, split into calls whose cumulative lengths stay within
        ``max_tokens_per_call`` and that hold at most ``max_seqs_per_call`` documents: per call ``(q_rows, k_rows, ends_q, ends_k)`` with row indices into the block
        (``None`` = all rows, when one call covers every document) and the cumulative ends without the leading 0."""
        limit, most = int(self.max_tokens_per_call), int(self.max_seqs_per_call)
        keep = [i for i in range(len(cq) - 1) if cq[i + 1] > cq[i] and ck[i + 1] > ck[i]]
        calls, cur, tq, tk = [], [], 0, 0
        for i in keep:
            nq, nk = cq[i + 1] - cq[i], ck[i + 1] - ck[i]
            if nq > limit or nk > limit:
                raise ValueError(f"a document of {max(nq, nk)} tokens in one attention block exceeds npu_fusion_attention's "
                                 f"{limit} cumulative TND tokens per call; use a higher CP degree for it")
            if cur and (tq + nq > limit or tk + nk > limit or len(cur) >= most):
                calls.append(cur)
                cur, tq, tk = [], 0, 0
            cur.append(i)
            tq, tk = tq + nq, tk + nk
        if cur:
            calls.append(cur)
        out = []
        whole = len(calls) == 1 and len(keep) == len(cq) - 1
        for docs in calls:
            ends_q, ends_k, a, b = [], [], 0, 0
            for i in docs:
                a += cq[i + 1] - cq[i]
                b += ck[i + 1] - ck[i]
                ends_q.append(a)
                ends_k.append(b)
            if whole:
                out.append((None, None, ends_q, ends_k))
            else:
                out.append(([j for i in docs for j in range(cq[i], cq[i + 1])],
                            [j for i in docs for j in range(ck[i], ck[i + 1])], ends_q, ends_k))
        return out

    def _run(self, fn, q, *args, **kwargs):
        try:
            return fn(q, *args, **kwargs)
        except RuntimeError as e:
            if q.dtype == torch.float32 and "float" in str(e).lower():  # only an error about the dtype is one
                raise ValueError(f"npu_fusion_attention rejected float32 in TND layout ({e}); this needs a recent "
                                 "torch_npu/CANN — train in bfloat16/float16 or upgrade") from e
            raise

    def forward(self, q, k, v, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None, window=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, _ = check_block_inputs(q, k, v, cq, ck, causal)
        if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"npu_fusion_attention takes float16/bfloat16/float32, got {q.dtype}")
        out = torch.zeros_like(q)
        lse = torch.full((h_q, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
        sel = (lambda x, i: x if i is None else x.index_select(0, i))
        for q_rows, k_rows, ends_q, ends_k in self._calls(cq, ck):
            qi = torch.tensor(q_rows, device=q.device) if q_rows is not None else None
            ki = torch.tensor(k_rows, device=q.device) if k_rows is not None else None
            res = self._run(self._npu.npu_fusion_attention,
                            sel(q, qi), sel(k, ki), sel(v, ki), h_q, "TND", pse=None, padding_mask=None,
                            scale=scale, keep_prob=1.0, inner_precise=0, prefix=None,
                            actual_seq_qlen=ends_q, actual_seq_kvlen=ends_k,
                            **self._sparse_args(causal, q.device, window))
            o, smax, ssum = res[0], res[1], res[2]
            l_live = (smax[..., 0].float() + torch.log(ssum[..., 0].float())).transpose(0, 1)
            if qi is None:
                return o.to(q.dtype), l_live.contiguous()
            out.index_copy_(0, qi, o.to(q.dtype))
            lse.index_copy_(1, qi, l_live)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None, window=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, _ = check_block_inputs(q, k, v, cq, ck, causal)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        sel = (lambda x, i: x if i is None else x.index_select(0, i))
        for q_rows, k_rows, ends_q, ends_k in self._calls(cq, ck):
            qi = torch.tensor(q_rows, device=q.device) if q_rows is not None else None
            ki = torch.tensor(k_rows, device=q.device) if k_rows is not None else None
            lse_t = sel(lse.float().transpose(0, 1), qi)  # [T_call, N1]
            smax = lse_t.unsqueeze(-1).expand(*lse_t.shape, 8).contiguous()
            ssum = torch.ones_like(smax)
            res = self._run(self._npu.npu_fusion_attention_grad,
                            sel(q, qi), sel(k, ki), sel(v, ki), sel(dout, qi), h_q, "TND", pse=None,
                            padding_mask=None, softmax_max=smax, softmax_sum=ssum, softmax_in=None,
                            attention_in=sel(out, qi), scale_value=scale, keep_prob=1.0, inner_precise=0, seed=0,
                            offset=0, numels=0, prefix=None, actual_seq_qlen=ends_q, actual_seq_kvlen=ends_k,
                            **self._sparse_args(causal, q.device, window))
            g_q, g_k, g_v = res[0], res[1], res[2]
            if qi is None and ki is None:
                return g_q.to(q.dtype), g_k.to(k.dtype), g_v.to(v.dtype)
            dq.index_copy_(0, qi, g_q.to(q.dtype))
            dk.index_copy_(0, ki, g_k.to(k.dtype))
            dv.index_copy_(0, ki, g_v.to(v.dtype))
        return dq, dk, dv
