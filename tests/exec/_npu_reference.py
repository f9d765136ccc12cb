"""A CPU reference of the *documented* ``torch_npu`` fusion-attention semantics (not an NPU).

``DocumentedNPUFusionAttention`` stands in for the ``torch_npu`` module in the NPU contract test.
It implements, in float64 math, what the torch_npu / CANN documentation states for
``npu_fusion_attention`` and ``npu_fusion_attention_grad`` in ``input_layout="TND"``, and refuses
what the documentation forbids or what this reference does not model:

* ``actual_seq_qlen`` / ``actual_seq_kvlen``: required for TND; ``int[]`` of cumulative sequence
  ends without a leading 0 (doc example: lengths ``2 2 2 2 2`` → ``2 4 6 8 10``); the last entry
  is ``T``; a sequence may be empty (the docs: "supports the S length of 0 in a batch … [2,2,0,2,2] →
  [2,4,4,6,8]"); every cumulative end is at most 1,000,000 (torch_npu's op_plugin: MAX_SEQUENCE_LENGTH, "The
  sequence length should not greater than 1M") and a call holds 1 to 2K sequences (aclnnFlashAttentionVarLenScore:
  "The length of actualSeqQLenOptional ranges from 1 to 2K").
* ``head_num`` = N1 = ``query.shape[1]``; key/value heads N2 must divide N1 (GQA).
* ``sparse_mode``: 0 = defaultMask (with no ``atten_mask``: no mask), 2 = leftUpCausal,
  3 = rightDownCausal, 4 = band; for 2/3/4 ``atten_mask`` must be the optimised compressed 2048×2048 bool
  upper triangle (True = masked). 2/3 ignore ``pre_tockens``/``next_tockens``; band keeps query ``i``'s keys
  ``i − pre_tockens … i + next_tockens`` of its sequence (the mask ``triu(k=next+1) + tril(k=−pre−1)`` that the
  op's documentation draws and Ascend's own golden reference of the op builds); sequences with unequal query and
  key lengths in band mode are not modelled (their alignment is not stated in the docs' text).
* ``scale`` multiplies ``Q·Kᵀ`` (``scale_value`` in the grad); ``keep_prob`` must be 1 here.
* returns ``(attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)``;
  ``softmax_max``/``softmax_sum`` are float32 ``[T, N1, 8]`` (8 equal copies, the layout stated
  for TND in the ring-attention-update documentation): the row max of the scaled, masked scores
  and the sum of ``exp(score − max)``.
* the grad recomputes ``P = exp(S − softmax_max) / softmax_sum`` and uses ``attention_in`` for
  ``rowsum(dy ∘ out)``; returns ``(dq, dk, dv, dpse)``.

Every call is recorded in ``self.calls`` (non-tensor arguments plus mask/softmax shapes).
"""
from __future__ import annotations

import torch

MASK_SIZE = 2048
MAX_SEQ_LEN = 1_000_000  # torch_npu op_plugin (FlashAttention): MAX_SEQUENCE_LENGTH, checked per cumulative end
MAX_SEQS = 2048  # aclnnFlashAttentionVarLenScore: actualSeqQLen holds 1 to 2K entries
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class DocumentedNPUFusionAttention:
    """Fake ``torch_npu`` module exposing the two fusion-attention entry points (CPU, float64)."""

    def __init__(self):
        self.calls: list[dict] = []

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _ends(name, ends, total):
        if not isinstance(ends, (list, tuple)) or not all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
            raise TypeError(f"{name} must be a list of Python ints (int[]), got {type(ends).__name__}")
        if not ends or ends[-1] != total:
            raise ValueError(f"{name} must end at T={total}, got {list(ends)[-3:]}")
        if len(ends) > MAX_SEQS:
            raise ValueError(f"{name}: {len(ends)} sequences in one call, the documented range is 1 to 2K")
        prev = 0
        lengths = []
        for e in ends:
            if e < prev:
                raise ValueError(f"{name}: cumulative ends must not decrease, got ends {list(ends)}")
            if e > MAX_SEQ_LEN:
                raise RuntimeError("The sequence length should not greater than 1M")  # op_plugin's TORCH_CHECK
            lengths.append(e - prev)
            prev = e
        return lengths

    def _common(self, query, key, value, head_num, input_layout, atten_mask, keep_prob,
                actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse, padding_mask, prefix):
        if input_layout != "TND":
            raise NotImplementedError(f"this reference models input_layout='TND' only, got {input_layout!r}")
        if actual_seq_qlen is None or actual_seq_kvlen is None:
            raise ValueError("TND requires actual_seq_qlen and actual_seq_kvlen")
        if pse is not None or padding_mask is not None or prefix is not None:
            raise NotImplementedError("pse / padding_mask / prefix are not modelled")
        if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
            raise TypeError(f"query/key/value must share one of {_DTYPES}, got {query.dtype}")
        if query.dim() != 3 or key.dim() != 3 or key.shape != value.shape:
            raise ValueError("TND tensors are [T, N, D]")
        if head_num != query.shape[1] or query.shape[1] % key.shape[1]:
            raise ValueError(f"head_num={head_num} must equal N1={query.shape[1]} and be a multiple of N2={key.shape[1]}")
        if keep_prob != 1.0:
            raise NotImplementedError("dropout (keep_prob < 1) is not modelled")
        lq = self._ends("actual_seq_qlen", actual_seq_qlen, query.shape[0])
        lk = self._ends("actual_seq_kvlen", actual_seq_kvlen, key.shape[0])
        if len(lq) != len(lk):
            raise ValueError(f"batch mismatch: {len(lq)} query sequences, {len(lk)} key sequences")
        if sparse_mode == 0:
            if atten_mask is not None:
                raise NotImplementedError("sparse_mode=0 with an explicit atten_mask is not modelled")
        elif sparse_mode in (2, 3, 4):
            expected = torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool), diagonal=1)
            if (atten_mask is None or atten_mask.dtype != torch.bool or tuple(atten_mask.shape) != (MASK_SIZE, MASK_SIZE)
                    or not torch.equal(atten_mask.cpu(), expected)):
                raise ValueError("sparse_mode 2/3/4 needs the compressed 2048x2048 bool upper-triangle atten_mask")
            if sparse_mode == 4 and lq != lk:
                raise NotImplementedError("band mode with unequal query/key sequence lengths is not modelled")
        else:
            raise NotImplementedError(f"sparse_mode={sparse_mode} is not modelled")
        return lq, lk

    @staticmethod
    def _scores(q, k, lq_i, lk_i, sparse_mode, scale, pre=2147483647, nxt=2147483647):
        s = torch.einsum("qnd,knd->nqk", q.double(), k.double()) * scale
        rows = torch.arange(lq_i)[:, None]
        cols = torch.arange(lk_i)[None, :]
        if sparse_mode in (2, 3):
            offset = 0 if sparse_mode == 2 else lk_i - lq_i
            s = s.masked_fill(cols > rows + offset, float("-inf"))
        elif sparse_mode == 4:
            s = s.masked_fill((cols > rows + nxt) | (cols < rows - pre), float("-inf"))
        if torch.isneginf(s).all(dim=-1).any():
            raise NotImplementedError("rows with no visible key (invalid rows) are not modelled")
        return s

    # ------------------------------------------------------------------ forward
    def npu_fusion_attention(self, query, key, value, head_num, input_layout, pse=None, padding_mask=None,
                             atten_mask=None, scale=1.0, keep_prob=1.0, pre_tockens=2147483647,
                             next_tockens=2147483647, inner_precise=0, prefix=None, actual_seq_qlen=None,
                             actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False):
        lq, lk = self._common(query, key, value, head_num, input_layout, atten_mask, keep_prob,
                              actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse, padding_mask, prefix)
        self.calls.append({"op": "forward", "head_num": head_num, "input_layout": input_layout,
                           "actual_seq_qlen": actual_seq_qlen, "actual_seq_kvlen": actual_seq_kvlen,
                           "sparse_mode": sparse_mode, "scale": scale, "keep_prob": keep_prob,
                           "pre_tockens": pre_tockens, "next_tockens": next_tockens,
                           "atten_mask": None if atten_mask is None else tuple(atten_mask.shape)})
        groups = query.shape[1] // key.shape[1]
        out = torch.zeros(query.shape, dtype=torch.float64)
        smax = torch.zeros(query.shape[0], query.shape[1], dtype=torch.float64)
        ssum = torch.zeros_like(smax)
        qs = ks = 0
        for lq_i, lk_i in zip(lq, lk):
            k_i = key[ks:ks + lk_i].repeat_interleave(groups, 1)
            v_i = value[ks:ks + lk_i].repeat_interleave(groups, 1).double()
            s = self._scores(query[qs:qs + lq_i], k_i, lq_i, lk_i, sparse_mode, scale, pre_tockens, next_tockens)
            m = s.max(dim=-1).values
            e = torch.exp(s - m.unsqueeze(-1))
            total = e.sum(-1)
            out[qs:qs + lq_i] = torch.einsum("nqk,knd->qnd", e / total.unsqueeze(-1), v_i)
            smax[qs:qs + lq_i] = m.t()
            ssum[qs:qs + lq_i] = total.t()
            qs, ks = qs + lq_i, ks + lk_i
        eight = (lambda x: x.float().unsqueeze(-1).expand(*x.shape, 8).contiguous())
        return out.to(query.dtype), eight(smax), eight(ssum), torch.empty(0, dtype=query.dtype), 0, 0, 0

    # ------------------------------------------------------------------ backward
    def npu_fusion_attention_grad(self, query, key, value, dy, head_num, input_layout, *, pse=None,
                                  padding_mask=None, atten_mask=None, softmax_max=None, softmax_sum=None,
                                  softmax_in=None, attention_in=None, scale_value=1.0, keep_prob=1.0,
                                  pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0, seed=0,
                                  offset=0, numels=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None,
                                  sparse_mode=0, gen_mask_parallel=True, sync=False):
        lq, lk = self._common(query, key, value, head_num, input_layout, atten_mask, keep_prob,
                              actual_seq_qlen, actual_seq_kvlen, sparse_mode, pse, padding_mask, prefix)
        t, n1 = query.shape[0], query.shape[1]
        for name, x in (("softmax_max", softmax_max), ("softmax_sum", softmax_sum)):
            if x is None or tuple(x.shape) != (t, n1, 8) or x.dtype != torch.float32:
                raise ValueError(f"{name} must be float32 [T, N1, 8], got {None if x is None else (x.dtype, tuple(x.shape))}")
        if attention_in is None or attention_in.shape != query.shape:
            raise ValueError("attention_in (the forward output) is required, shaped like query")
        self.calls.append({"op": "grad", "head_num": head_num, "input_layout": input_layout,
                           "actual_seq_qlen": actual_seq_qlen, "actual_seq_kvlen": actual_seq_kvlen,
                           "sparse_mode": sparse_mode, "scale_value": scale_value,
                           "pre_tockens": pre_tockens, "next_tockens": next_tockens,
                           "softmax_max": tuple(softmax_max.shape),
                           "atten_mask": None if atten_mask is None else tuple(atten_mask.shape)})
        groups = n1 // key.shape[1]
        dq = torch.zeros(query.shape, dtype=torch.float64)
        dk = torch.zeros(key.shape[0], n1, key.shape[2], dtype=torch.float64)
        dv = torch.zeros_like(dk)
        qs = ks = 0
        for lq_i, lk_i in zip(lq, lk):
            q_i = query[qs:qs + lq_i].double()
            k_i = key[ks:ks + lk_i].repeat_interleave(groups, 1).double()
            v_i = value[ks:ks + lk_i].repeat_interleave(groups, 1).double()
            do = dy[qs:qs + lq_i].double()
            s = self._scores(q_i, k_i, lq_i, lk_i, sparse_mode, scale_value, pre_tockens, next_tockens)
            m = softmax_max[qs:qs + lq_i, :, 0].double().t().unsqueeze(-1)
            z = softmax_sum[qs:qs + lq_i, :, 0].double().t().unsqueeze(-1)
            p = torch.exp(s - m) / z
            dv[ks:ks + lk_i] = torch.einsum("nqk,qnd->knd", p, do)
            delta = (do * attention_in[qs:qs + lq_i].double()).sum(-1).t().unsqueeze(-1)
            ds = p * (torch.einsum("qnd,knd->nqk", do, v_i) - delta)
            dq[qs:qs + lq_i] = torch.einsum("nqk,knd->qnd", ds, k_i) * scale_value
            dk[ks:ks + lk_i] = torch.einsum("nqk,qnd->knd", ds, q_i) * scale_value
            qs, ks = qs + lq_i, ks + lk_i
        fold = (lambda x: x.view(x.shape[0], key.shape[1], groups, x.shape[2]).sum(2))
        return (dq.to(query.dtype), fold(dk).to(key.dtype), fold(dv).to(value.dtype),
                torch.empty(0, dtype=query.dtype))
