"""Sliding-window ring attention (``ring_attention(..., window=W)``) against full causal attention, one process.

One document of ``--tokens`` tokens (8 query heads, 2 key/value heads, head dim 64, float32), forward + backward,
degree 1 (the kernels, no communication), medians of ``--repeats`` alternating runs: the CPU flash kernel with the
causal mask (what a window at least as long as the document runs: ``attention_limits`` then passes no window) and
the shared masked math path of ``fcp_exec.kernels.window`` for each ``--windows`` value (about ``L·2W`` scores, in
unfused matmuls). Also the full causal kernel with attention sinks (gpt-oss: ``ring_attention(..., sinks=s)``, the
result rescaled once and the sinks' gradient, both O(tokens · heads · dim)), and with ``--windows`` each window with
sinks too; and full causal attention with Gemma 2's logit soft-capping (the masked path over whole documents). Run:
``python benchmarks/bench_window.py``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _args import parser, positive_int, positive_int_list, run  # noqa: E402


def _time(tokens: int, window: int | None, gen: torch.Generator, sinks: bool = False,
          softcap: float | None = None) -> float:
    from fcp_exec import ring_attention

    q = torch.randn(tokens, 8, 64, generator=gen).requires_grad_()
    k = torch.randn(tokens, 2, 64, generator=gen).requires_grad_()
    v = torch.randn(tokens, 2, 64, generator=gen).requires_grad_()
    dout = torch.randn(tokens, 8, 64, generator=gen)
    s = torch.randn(8, generator=gen).requires_grad_() if sinks else None
    t0 = time.perf_counter()
    out = ring_attention(q, k, v, [0, tokens], ranks=(0,), window=window, sinks=s, softcap=softcap)
    out.backward(dout)
    return time.perf_counter() - t0


def build_parser():
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=positive_int, default=4096, help="length of the one document")
    p.add_argument("--windows", type=positive_int_list, default="512,4096", help="comma-separated sliding windows")
    p.add_argument("--repeats", type=positive_int, default=5, help="alternating runs of every case (median)")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    windows = list(opts.windows)
    gen = torch.Generator().manual_seed(0)
    cases = [(w, sinks, None) for w in [None, *windows] for sinks in (False, True)] + [(None, False, 50.0)]
    runs: dict = {c: [] for c in cases}
    _time(256, None, gen), _time(256, 64, gen, True), _time(256, None, gen, False, 50.0)  # warm-up
    for _ in range(opts.repeats):
        for c in cases:
            runs[c].append(_time(opts.tokens, *c[:1], gen, *c[1:]))
    print(f"load average {os.getloadavg()[0]:.2f}; {opts.tokens} tokens, fwd+bwd, float32, degree 1")
    full = statistics.median(runs[(None, False, None)])
    for w, sinks, cap in cases:
        m = statistics.median(runs[(w, sinks, cap)])
        what = "full causal (cpu flash kernel)" if w is None else f"window {w:6d} (masked math path)"
        what = f"full causal, logits soft-capped at {cap:g} (masked math path)" if cap else what
        print(f"{what}{' + sinks' if sinks else ''}: {1e3 * m:8.1f} ms  ({m / full:.2f}x the full causal kernel)")
    return 0


if __name__ == "__main__":
    run(main)
