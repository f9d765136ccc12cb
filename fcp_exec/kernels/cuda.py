"""CUDA kernel: flash-attn varlen (>= 2.6) when importable, else torch's own flash varlen, else SDPA per document
with a math-path lse. ``CudaKernel("auto")`` picks in that order and records the choice in ``.backend``.

* ``flash_attn``: ``flash_attn.flash_attn_interface._flash_attn_varlen_forward`` /
  ``_flash_attn_varlen_backward`` (flash-attn >= 2.6). They return the log-sum-exp ``[H, T_q]`` in
  float32 and the backward takes an external ``out``/``softmax_lse``. GQA is native. The keyword
  names changed across releases (``window_size`` tuple before 2.7, ``window_size_left/right``
  after; ``softcap`` from 2.6), so the call is built from the installed function's signature.
  Releases up to 2.5 return the LSE as ``[batch, heads, max_seqlen]`` and need a ``block_table``
  argument, so they are refused (``auto`` falls back) with the reason in :func:`flash_attn_status`.
* ``torch_flash``: ``aten._flash_attention_forward`` / ``_flash_attention_backward`` with cumulative
  sequence bounds (the kernels behind ``torch.nn.attention.varlen.varlen_attn``, which returns the LSE
  ``[H, T_q]``); fp16/bf16 on CUDA, GQA native, no extra package. Chosen by ``auto`` when flash-attn is absent.
* Cumulative bounds go to the device once per distinct document layout (a small per-kernel cache keyed by the
  host lists), not once per ring block and layer.
* ``sdpa``: per document, ``out`` from ``F.scaled_dot_product_attention`` and the lse plus the
  whole backward from a float32 math path, chunked over query rows to bound memory. It has no
  CUDA-specific code, so the tests run it on CPU tensors; on a GPU it is the fallback when
  flash-attn is missing.

Importing this module never imports flash-attn or touches a GPU.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from fcp_exec.kernels.base import (
    AttentionKernel,
    check_block_inputs,
    doc_bounds,
    empty_rows_fixup,
    expand_kv,
    lse_dtype_for,
    reduce_kv,
)

__all__ = ["CudaKernel", "flash_attn_available", "flash_attn_status", "torch_flash_available"]

_CHUNK_ELEMS = 1 << 25  # ≈128 MiB of float32 scores per chunk in the math path


_MIN_FLASH_ATTN = (2, 6)


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in str(text).split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def flash_attn_status() -> tuple[object | None, str]:
    """``(flash_attn_interface module or None, reason)``: usable only from 2.6 (module docstring)."""
    try:
        import flash_attn  # noqa: PLC0415 (optional dependency)
        from flash_attn import flash_attn_interface as fai  # noqa: PLC0415
    except Exception as e:  # ImportError, or a broken CUDA build raising OSError/RuntimeError
        return None, f"flash-attn not importable ({type(e).__name__}: {e})"
    version = getattr(flash_attn, "__version__", "0")
    if _version_tuple(version) < _MIN_FLASH_ATTN:
        return None, (f"flash-attn {version} is older than 2.6 (its varlen LSE is [batch, heads, max_seqlen] and the "
                      "forward needs a block_table): pip install 'flash-attn>=2.6'")
    if not hasattr(fai, "_flash_attn_varlen_forward") or not hasattr(fai, "_flash_attn_varlen_backward"):
        return None, f"flash-attn {version} has no _flash_attn_varlen_forward/_backward"
    return fai, f"flash-attn {version}"


def _load_flash_attn():
    return flash_attn_status()[0]


def flash_attn_available() -> bool:
    """True when a flash-attn >= 2.6 with the varlen forward/backward entry points is importable."""
    return _load_flash_attn() is not None


def torch_flash_available() -> bool:
    """True when this torch has CUDA flash attention with cumulative bounds and a CUDA device is present."""
    return (torch.cuda.is_available() and hasattr(torch.ops.aten, "_flash_attention_forward")
            and hasattr(torch.ops.aten, "_flash_attention_backward"))


def _pad8(x: torch.Tensor) -> torch.Tensor:
    pad = (-x.shape[-1]) % 8
    return F.pad(x, (0, pad)) if pad else x


_FA27_FWD = ("window_size_left", "window_size_right", "softcap", "alibi_slopes", "return_softmax")
_FA27_BWD = ("window_size_left", "window_size_right", "softcap", "alibi_slopes", "deterministic", "rng_state")


def _param_names(fn, fallback) -> tuple:
    """Keyword names of a flash-attn entry point. From 2.7 the functions are wrapped as
    ``torch.library.custom_op`` objects whose visible signature is ``(*args, **kwargs)``; the
    original function is kept as ``_init_fn``. Unknown wrappers fall back to the 2.7+ names."""
    for cand in (getattr(fn, "_init_fn", None), getattr(fn, "__wrapped__", None), fn):
        if cand is None:
            continue
        try:
            params = inspect.signature(cand).parameters
        except (TypeError, ValueError):
            continue
        names = tuple(n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
        if len(names) > 10:
            return names
    return fallback


def _band(window) -> tuple[int, int]:
    """``(left, right)`` of flash's window convention (query ``i`` of ``Sq`` sees keys ``[i + Sk − Sq − left,
    i + Sk − Sq + right]``, -1 unbounded): an int W is the causal sliding window ``(W − 1, 0)``, a pair is taken as
    it is (``fcp_exec.kernels.window_band``), None is no window."""
    if window is None:
        return -1, -1
    if isinstance(window, tuple):
        return int(window[0]), int(window[1])
    return int(window) - 1, 0


def _window_kwargs(params, window=None) -> dict:
    """flash-attn's keyword arguments for :func:`_band` of ``window``."""
    left, right = _band(window)
    if "window_size_left" in params:
        return {"window_size_left": left, "window_size_right": right}
    if "window_size" in params:
        return {"window_size": (left, right)}
    if window is not None:
        raise RuntimeError("this flash-attn has no sliding-window argument; use flash-attn >= 2.6")
    return {}


def _softcap_kwargs(params, softcap) -> dict:
    """flash-attn's ``softcap`` (0: none); a cap on a flash-attn without the argument (< 2.6) is an error."""
    if "softcap" in params:
        return {"softcap": float(softcap or 0.0)}
    if softcap:
        raise RuntimeError("this flash-attn has no softcap argument; use flash-attn >= 2.6")
    return {}


def _tf_window(window) -> dict:
    """torch's flash varlen ops take the window as keyword arguments (:func:`_band`); none: omitted."""
    if window is None:
        return {}
    left, right = _band(window)
    return {"window_size_left": left, "window_size_right": right}


_BOUNDS_CACHE = 32


class CudaKernel(AttentionKernel):
    """``backend``: ``"auto"`` (flash-attn >= 2.6, else torch's flash varlen on a CUDA device, else SDPA),
    ``"flash_attn"``, ``"torch_flash"`` or ``"sdpa"``. ``flash_attn_module``: an object with flash-attn's
    ``_flash_attn_varlen_forward``/``_flash_attn_varlen_backward`` to call instead of the installed flash-attn (a
    patched build, or a stand-in that checks the call plumbing on CPU); implies ``backend="flash_attn"``."""

    name = "cuda"

    def __init__(self, backend: str = "auto", *, flash_attn_module=None):
        if backend not in ("auto", "flash_attn", "torch_flash", "sdpa"):
            raise ValueError(f"backend must be 'auto', 'flash_attn', 'torch_flash' or 'sdpa', got {backend!r}")
        self._injected = flash_attn_module is not None
        if flash_attn_module is not None:
            backend = "flash_attn"
            self._fa, reason = flash_attn_module, ""
        else:
            self._fa, reason = flash_attn_status() if backend in ("auto", "flash_attn") else (None, "")
        if backend == "flash_attn" and self._fa is None:
            raise ImportError(f"backend='flash_attn': {reason}")
        if backend == "torch_flash" and not torch_flash_available():
            raise ImportError("backend='torch_flash' needs a CUDA device and a torch with aten._flash_attention_forward")
        if self._fa is not None:
            self.backend = "flash_attn"
        elif backend in ("auto", "torch_flash") and torch_flash_available():
            self.backend = "torch_flash"
        else:
            self.backend = "sdpa"
        self.reason = reason
        self._bounds: dict = {}

    def _fa_bounds(self, cq: list[int], ck: list[int], max_q, max_k, device):
        """varlen arguments: int32 cumulative bounds on ``device`` (cached per layout, so the host→device copy
        happens once per micro-batch, not per ring block and layer) and the longest document each side."""
        max_q = max_q if max_q is not None else max(b - a for a, b in zip(cq[:-1], cq[1:]))
        max_k = max_k if max_k is not None else max(b - a for a, b in zip(ck[:-1], ck[1:]))
        out = []
        for c in (cq, ck):
            key = (tuple(c), str(device))
            t = self._bounds.get(key)
            if t is None:
                if len(self._bounds) >= _BOUNDS_CACHE:
                    self._bounds.clear()
                t = self._bounds[key] = torch.tensor(c, dtype=torch.int32).to(device, non_blocking=True)
            out.append(t)
        return out[0], out[1], max_q, max_k

    def __repr__(self) -> str:
        return f"CudaKernel(backend={self.backend!r})"

    # ------------------------------------------------------------------ flash-attn
    def _fa_forward(self, q, k, v, cu_q, cu_k, cq, ck, causal, scale, max_q, max_k, window=None, softcap=None):
        fn = self._fa._flash_attn_varlen_forward
        params = _param_names(fn, _FA27_FWD)
        kwargs = {"dropout_p": 0.0, "softmax_scale": scale, "causal": causal, **_window_kwargs(params, window),
                  **_softcap_kwargs(params, softcap)}
        for name, value in (("alibi_slopes", None), ("return_softmax", False)):
            if name in params:
                kwargs[name] = value
        d = q.shape[-1]
        res = fn(_pad8(q), _pad8(k), _pad8(v), cu_q, cu_k, max_q, max_k, **kwargs)
        out, lse = (res[0], res[1]) if len(res) == 4 else (res[0], res[5])
        if tuple(lse.shape) != (q.shape[1], q.shape[0]):
            raise RuntimeError(f"flash-attn returned softmax_lse of shape {tuple(lse.shape)}, expected "
                               f"[H, T] = {(q.shape[1], q.shape[0])}; use flash-attn >= 2.6 or CudaKernel('sdpa')")
        out = out[..., :d].contiguous()
        lse = lse.float().contiguous()
        empty_rows_fixup(out, lse, cq, ck)
        return out, lse

    def _fa_backward(self, dout, q, k, v, out, lse, cu_q, cu_k, cq, ck, causal, scale, max_q, max_k, window=None,
                     softcap=None):
        fn = self._fa._flash_attn_varlen_backward
        params = _param_names(fn, _FA27_BWD)
        d = q.shape[-1]
        qp, kp, vp = _pad8(q), _pad8(k), _pad8(v)
        dq, dk, dv = torch.empty_like(qp), torch.empty_like(kp), torch.empty_like(vp)
        kwargs = {**_window_kwargs(params, window), **_softcap_kwargs(params, softcap)}
        for name, value in (("alibi_slopes", None), ("deterministic", False), ("rng_state", None)):
            if name in params:
                kwargs[name] = value
        fn(_pad8(dout), qp, kp, vp, _pad8(out), lse.float().contiguous(), dq, dk, dv,
           cu_q, cu_k, max_q, max_k, 0.0, scale, causal, **kwargs)
        return dq[..., :d], dk[..., :d], dv[..., :d]

    # ------------------------------------------------------------------ torch's own flash varlen
    def _tf_forward(self, q, k, v, cu_q, cu_k, cq, ck, causal, scale, max_q, max_k, window=None):
        out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, return_debug_mask=False, scale=scale,
            **_tf_window(window))
        if tuple(lse.shape) != (q.shape[1], q.shape[0]):
            raise RuntimeError(f"aten._flash_attention_forward returned an LSE of shape {tuple(lse.shape)}, expected "
                               f"[H, T] = {(q.shape[1], q.shape[0])}; use CudaKernel('sdpa')")
        lse = lse.float().contiguous()
        empty_rows_fixup(out, lse, cq, ck)
        return out, lse

    def _tf_backward(self, dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, max_q, max_k, window=None):
        rng = torch.zeros((2,), dtype=torch.uint64, device=q.device)  # dropout is 0: never read
        unused = torch.empty(0, device=q.device)
        return torch.ops.aten._flash_attention_backward(
            dout.contiguous(), q, k, v, out, lse.float().contiguous(), cu_q, cu_k, max_q, max_k, 0.0, causal, rng,
            unused, scale=scale, **_tf_window(window))

    # ------------------------------------------------------------------ SDPA + math
    @staticmethod
    def _chunk(h: int, lk: int) -> int:
        return max(1, _CHUNK_ELEMS // max(1, h * lk))

    def _sdpa_forward(self, q, k, v, cq, ck, causal, scale, h_q):
        out = torch.zeros_like(q)
        lse = torch.full((h_q, q.shape[0]), float("-inf"), dtype=lse_dtype_for(q.dtype), device=q.device)
        acc = lse.dtype
        for i in range(len(cq) - 1):
            qs, qe, ks, ke = cq[i], cq[i + 1], ck[i], ck[i + 1]
            if qe == qs or ke == ks:
                continue
            qd, kd, vd = q[qs:qe].transpose(0, 1), expand_kv(k[ks:ke], h_q).transpose(0, 1), \
                expand_kv(v[ks:ke], h_q).transpose(0, 1)
            o = F.scaled_dot_product_attention(qd.unsqueeze(0), kd.unsqueeze(0), vd.unsqueeze(0),
                                               is_causal=causal, scale=scale)
            out[qs:qe] = o[0].transpose(0, 1)
            step = self._chunk(h_q, ke - ks)
            for a in range(0, qe - qs, step):
                b = min(qe - qs, a + step)
                s = torch.matmul(qd[:, a:b].to(acc), kd.to(acc).transpose(1, 2)) * scale
                if causal:
                    rows = torch.arange(a, b, device=q.device)[:, None]
                    cols = torch.arange(ke - ks, device=q.device)[None, :]
                    s = s.masked_fill(cols > rows, float("-inf"))
                lse[:, qs + a:qs + b] = torch.logsumexp(s, dim=-1)
        return out, lse

    def _math_backward(self, dout, q, k, v, out, lse, cq, ck, causal, scale, h_q, h_kv):
        acc = lse_dtype_for(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros((k.shape[0], h_q, k.shape[2]), dtype=acc, device=q.device)
        dv = torch.zeros_like(dk)
        for i in range(len(cq) - 1):
            qs, qe, ks, ke = cq[i], cq[i + 1], ck[i], ck[i + 1]
            if qe == qs or ke == ks:
                continue
            kd = expand_kv(k[ks:ke], h_q).transpose(0, 1).to(acc)  # [H, Lk, D]
            vd = expand_kv(v[ks:ke], h_q).transpose(0, 1).to(acc)
            step = self._chunk(h_q, ke - ks)
            for a in range(qs, qe, step):
                b = min(qe, a + step)
                qd = q[a:b].transpose(0, 1).to(acc)
                do = dout[a:b].transpose(0, 1).to(acc)
                s = torch.matmul(qd, kd.transpose(1, 2)) * scale
                if causal:
                    rows = torch.arange(a - qs, b - qs, device=q.device)[:, None]
                    cols = torch.arange(ke - ks, device=q.device)[None, :]
                    s = s.masked_fill(cols > rows, float("-inf"))
                p = torch.exp(s - lse[:, a:b].to(acc).unsqueeze(-1))
                delta = (do * out[a:b].transpose(0, 1).to(acc)).sum(-1, keepdim=True)
                ds = p * (torch.matmul(do, vd.transpose(1, 2)) - delta)
                dq[a:b] = (torch.matmul(ds, kd) * scale).transpose(0, 1)
                dk[ks:ke] += (torch.matmul(ds.transpose(1, 2), qd) * scale).transpose(0, 1)
                dv[ks:ke] += torch.matmul(p.transpose(1, 2), do).transpose(0, 1)
        return dq.to(q.dtype), reduce_kv(dk, h_kv).to(k.dtype), reduce_kv(dv, h_kv).to(v.dtype)

    # ------------------------------------------------------------------ interface
    def _fused(self, q, k) -> str | None:
        """The fused backend for these tensors: flash kernels take fp16/bf16 CUDA tensors only; anything else
        (and empty blocks) goes the SDPA/math way. An injected ``flash_attn_module`` takes every non-empty block
        (a stand-in on CPU tensors decides for itself)."""
        if q.shape[0] == 0 or k.shape[0] == 0:
            return None
        if self._injected:
            return "flash_attn"
        if self.backend in ("flash_attn", "torch_flash") and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
            return self.backend
        return None

    def fused_window(self, q) -> bool:
        """flash-attn and torch's flash varlen kernels take a sliding window (``window_size_left = W - 1``,
        right 0) for the blocks they run (fp16/bf16 CUDA tensors)."""
        return self._fused(q, q) is not None

    def fused_band(self, q) -> bool:
        """... and a band ``window=(left, right)`` in their own convention."""
        return self._fused(q, q) is not None

    def fused_softcap(self, q) -> bool:
        """flash-attn (>= 2.6) soft-caps logits itself (``softcap``); torch's flash varlen kernels do not."""
        return self._fused(q, q) == "flash_attn"

    def forward(self, q, k, v, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None, window=None, softcap=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, _ = check_block_inputs(q, k, v, cq, ck, causal)
        fused = self._fused(q, k)
        if softcap and fused != "flash_attn" and q.shape[0] and k.shape[0]:  # an empty block has nothing to cap
            raise ValueError("CudaKernel: softcap= needs a flash-attn block (see fused_softcap)")
        if fused == "flash_attn":
            cu_q_t, cu_k_t, max_q, max_k = self._fa_bounds(cq, ck, max_q, max_k, q.device)
            return self._fa_forward(q, k, v, cu_q_t, cu_k_t, cq, ck, causal, scale, max_q, max_k, window, softcap)
        if fused:
            cu_q_t, cu_k_t, max_q, max_k = self._fa_bounds(cq, ck, max_q, max_k, q.device)
            return self._tf_forward(q, k, v, cu_q_t, cu_k_t, cq, ck, causal, scale, max_q, max_k, window)
        if window is not None:
            raise ValueError("CudaKernel: window= needs a fused block (fp16/bf16 CUDA tensors; see fused_window)")
        return self._sdpa_forward(q, k, v, cq, ck, causal, scale, h_q)

    def backward(self, dout, q, k, v, out, lse, cu_q, cu_k, causal, scale, *, max_q=None, max_k=None, window=None,
                 softcap=None):
        cq, ck = doc_bounds(cu_q), doc_bounds(cu_k)
        h_q, h_kv = check_block_inputs(q, k, v, cq, ck, causal)
        fused = self._fused(q, k)
        if softcap and fused != "flash_attn" and q.shape[0] and k.shape[0]:  # an empty block has nothing to cap
            raise ValueError("CudaKernel: softcap= needs a flash-attn block (see fused_softcap)")
        if fused == "flash_attn":
            cu_q_t, cu_k_t, max_q, max_k = self._fa_bounds(cq, ck, max_q, max_k, q.device)
            return self._fa_backward(dout, q, k, v, out, lse, cu_q_t, cu_k_t, cq, ck, causal, scale,
                                     max_q, max_k, window, softcap)
        if fused == "torch_flash":
            cu_q_t, cu_k_t, max_q, max_k = self._fa_bounds(cq, ck, max_q, max_k, q.device)
            return self._tf_backward(dout, q, k, v, out, lse, cu_q_t, cu_k_t, causal, scale, max_q, max_k, window)
        if window is not None:
            raise ValueError("CudaKernel: window= needs a fused block (fp16/bf16 CUDA tensors; see fused_window)")
        return self._math_backward(dout, q, k, v, out, lse, cq, ck, causal, scale, h_q, h_kv)
