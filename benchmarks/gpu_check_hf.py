"""The Hugging Face half of the GPU check: fcp's attention inside transformers models on the device.

``python benchmarks/gpu_check_hf.py --out DIR [--device cuda|cpu] [--quick]``

Sections, each entry printed as one line and written to ``DIR/results_hf.json`` (same entry format as
``gpu_check.py``):

1. ``hf[family,dtype]``: one packed micro-batch of documents (1, 2, an odd number and a long document: 4,100 tokens
   on a GPU, more than a flash tile) through the stock model on the device (``sdpa``, ``position_ids`` restarting
   per document: transformers' own packed-sequence path) and through ``apply_fcp`` of a copy (``fcp_ring``, degree 1,
   the device's ``auto`` kernel), each compared with the **reference**: the stock model in float64 on the CPU, one
   document per forward. Errors: the loss (relative) and every parameter gradient (relative to that gradient's
   largest reference entry; the worst parameter is reported). ``float32``: fcp must be within
   ``max(3 x stock's error, 1e-5)``; ``bfloat16`` and ``float16`` (autocast over float32 weights, what the Trainer's
   ``bf16=True`` / ``fp16=True`` do; float16's backward on the loss times 1,024, as under a loss scaler): within
   ``2 x stock's error + 1e-3`` (loss) / ``+ 1e-2`` (gradients), i.e. no less accurate than the stock model, up to
   a factor. Families: Qwen3 (QK norm), Llama and Mistral with a 64-token sliding window (the stock
   model's own window mask against fcp's windowed ring attention: on a GPU the fused banded kernel), and gpt-oss
   (attention sinks, the 64-token window on every other layer, 4 experts; its stock model runs ``eager``, one
   document per forward: that path does not unpack ``position_ids``), GQA 8/2, head dim 64.
2. ``hf_router[qwen3_moe]``: an MoE router's load-balancing loss (``output_router_logits=True``) on the device —
   fcp's share on one rank (the whole loss) of the packed micro-batch against the stock model's own ``aux_loss`` of
   the same documents as one right-padded batch, float32, within 1e-5 (``--perturb`` counts the stock side's pads).
3. ``hf_timing``: a Qwen3-shaped model in bfloat16 (4 layers, hidden 2048, heads 16/8, head dim 128) on a packed
   micro-batch of 8 long-tailed documents (16,512 tokens): forward+backward of the stock model (``sdpa``, which on a
   packed batch attends through a dense block-diagonal mask) and of the fcp model (per-document varlen kernel),
   alternating, CUDA events, median of ``--iters``; also their loss difference. Then the same with a Mistral-shaped
   model and a 1,024-token sliding window (the stock model's window mask against fcp's fused banded kernel). On CPU
   a small model stands in (the code path only; CPU numbers are no benchmark).

``--perturb`` scales fcp's attention output by 1.05 (``gpu_check.PerturbedKernel``): the run must then fail, which
``tests/exec/test_gpu_check.py`` checks.

Exit code: 0 all passed, 1 a check failed, 2 the script could not run.
"""
from __future__ import annotations

import copy
import os
import statistics
import sys
import time

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]
from _args import output_dir, parser, positive_int, run  # noqa: E402
from gpu_check import Results, elapsed_ms  # noqa: E402  (benchmarks/ is not a package)

FAMILIES = ("qwen3", "llama", "mistral", "gpt_oss")
WINDOW = 64  # Mistral's sliding window here: shorter than most test documents (fused band on a GPU at degree 1)


def _config(family: str, *, hidden: int, layers: int, heads: tuple, head_dim: int, ffn: int, vocab: int):
    from transformers import AutoConfig

    extra = {"llama": {"attention_bias": False}, "mistral": {"sliding_window": WINDOW},
             # gpt-oss: attention sinks on every layer, the window on every other; eager experts (fp64 reference)
             "gpt_oss": {"sliding_window": WINDOW, "num_local_experts": 4, "num_experts_per_tok": 2,
                         "experts_implementation": "eager"},
             # the router's load-balancing loss on (check_router)
             "qwen3_moe": {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                           "output_router_logits": True, "router_aux_loss_coef": 1.0}}.get(family, {})
    return AutoConfig.for_model(family, vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                                num_hidden_layers=layers, num_attention_heads=heads[0], num_key_value_heads=heads[1],
                                head_dim=head_dim, max_position_embeddings=65536, eos_token_id=0, pad_token_id=1,
                                bos_token_id=None, tie_word_embeddings=False, attention_dropout=0.0, **extra)


def _batch(lens, vocab: int, seed: int):
    """One packed micro-batch of ``FCPCollator`` (degree 1, this rank alone) and its documents."""
    from fcp_data import FCPCollator
    from fcp_data.slots import SampleSlot

    g = torch.Generator().manual_seed(seed)
    docs = [torch.randint(10, vocab, (n,), generator=g) for n in lens]
    total = sum(n - 1 for n in lens)
    slots = [SampleSlot(index=i, ranks=(0,), cp_rank=0, num_tokens=n, length=n, num_tokens_global=total, epoch=0,
                        global_batch=0, micro_batch=0, num_micro_batches=1) for i, n in enumerate(lens)]
    return FCPCollator(pad_token_id=1)([({"input_ids": d}, s) for d, s in zip(docs, slots)]), docs, total


def _grads(model) -> dict:
    return {n: p.grad.detach().double().cpu() for n, p in model.named_parameters() if p.grad is not None}


def _reference(model, docs, total: int):
    """Loss and gradients of the stock model in float64 on the CPU, one document per forward."""
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    loss = 0.0
    for d in docs:
        if len(d) < 2:
            continue
        logits = model(input_ids=d[None], use_cache=False).logits[0]
        part = F.cross_entropy(logits[:-1], d[1:], reduction="sum") / total
        part.backward()
        loss += float(part.detach())
    return loss, _grads(model)


def _errors(loss, grads, ref_loss, ref_grads) -> tuple[float, float, str]:
    worst, where = 0.0, ""
    for n, r in ref_grads.items():
        e = float((grads[n] - r).abs().max()) / max(float(r.abs().max()), 1e-30)
        if e > worst:
            worst, where = e, n
    return abs(loss - ref_loss) / abs(ref_loss), worst, where


FP16_SCALE = 1024.0  # float16's backward runs on a scaled loss (as under a GradScaler), unscaled after


def _run_model(model, batch, device, dtype, fcp: bool, docs=None, total: int = 0):
    """fcp's loss on the packed micro-batch, or the stock model's: packed (``position_ids`` restarting per document),
    or with ``docs`` one document per forward (a model whose stock attention has no packed path: gpt-oss's eager)."""
    from fcp_exec.integrations import hf

    model.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype in (torch.bfloat16, torch.float16)):
        if fcp:
            loss = hf.fcp_loss(model, batch)
        elif docs is not None:
            import torch.nn.functional as F

            loss = sum(F.cross_entropy(model(input_ids=d[None].to(device), use_cache=False).logits[0, :-1].float(),
                                       d[1:].to(device), reduction="sum") for d in docs if len(d) > 1) / total
        else:
            out = model(input_ids=batch["input_ids"].to(device)[None],
                        position_ids=batch["position_ids"].to(device)[None], use_cache=False)
            loss = hf.lm_loss(out.logits, batch)
    scale = FP16_SCALE if dtype == torch.float16 else 1.0
    (loss * scale).backward()
    if scale != 1.0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(scale)
    return float(loss.detach())


def _kernel(device, perturb: bool):
    from fcp_exec.kernels import default_kernel

    kernel = default_kernel(device)
    if perturb:
        from gpu_check import PerturbedKernel

        kernel = PerturbedKernel(kernel)
    return kernel


def check_family(family: str, dtype_name: str, device, lens, perturb: bool = False) -> dict:
    from fcp_exec.integrations import hf

    cfg = _config(family, hidden=256, layers=2, heads=(8, 2), head_dim=64, ffn=512, vocab=2000)
    base = hf.build_model(cfg, dtype=torch.float64, seed=0)
    batch, docs, total = _batch(lens, 2000, seed=1)
    ref_loss, ref_grads = _reference(base, docs, total)
    dtype = getattr(torch, dtype_name)
    stock = copy.deepcopy(base).to(device, torch.float32)
    fcp = hf.apply_fcp(copy.deepcopy(stock), kernel=_kernel(device, perturb))
    per_doc = getattr(stock.config, "_attn_implementation", "sdpa") == "eager"  # its eager path does not unpack
    s_loss = _run_model(stock, batch, device, dtype, fcp=False, docs=docs if per_doc else None, total=total)
    f_loss = _run_model(fcp, batch, device, dtype, fcp=True)
    s_l, s_g, _ = _errors(s_loss, _grads(stock), ref_loss, ref_grads)
    f_l, f_g, where = _errors(f_loss, _grads(fcp), ref_loss, ref_grads)
    if dtype == torch.float32:
        tols = {"loss": max(3 * s_l, 1e-5), "grad": max(3 * s_g, 1e-5)}
    else:
        tols = {"loss": 2 * s_l + 1e-3, "grad": 2 * s_g + 1e-2}
    return {"errors": {"loss": f_l, "grad": f_g}, "tolerances": tols, "worst_grad_param": where,
            "stock_errors": {"loss": s_l, "grad": s_g}, "tokens": sum(lens), "kernel": repr(fcp._fcp_state.kernel)}


def check_router(device, lens, perturb: bool = False) -> dict:
    """An MoE router's load-balancing loss on this device (``fcp_exec.integrations.hf_router``: top-k, bincount and
    sums where the model runs): fcp's share on one rank — the whole loss — of a packed micro-batch against the stock
    model's own ``aux_loss`` of the same documents as one right-padded batch with its attention mask, float32 both.
    ``perturb``: the pads counted too (must fail)."""
    from fcp_exec.integrations import hf
    from fcp_exec.integrations.hf_router import router_loss

    cfg = _config("qwen3_moe", hidden=256, layers=2, heads=(8, 2), head_dim=64, ffn=512, vocab=2000)
    stock = hf.build_model(cfg, dtype=torch.float32, seed=0).to(device)
    fcp = hf.apply_fcp(copy.deepcopy(stock), kernel=_kernel(device, False))
    batch, docs, _ = _batch(lens, 2000, seed=3)
    ids = torch.ones((len(docs), max(lens)), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, d in enumerate(docs):
        ids[b, :len(d)], mask[b, :len(d)] = d, 1
    with torch.no_grad():
        want = float(stock(input_ids=ids.to(device), attention_mask=(mask if not perturb else torch.ones_like(mask))
                           .to(device), use_cache=False).aux_loss)
        out = fcp(**hf.batch_inputs(batch, fcp))
        got = float(router_loss(out.router_logits, batch, fcp._fcp_state.router)) / cfg.router_aux_loss_coef
    return {"errors": {"aux": abs(got - want) / abs(want)}, "tolerances": {"aux": 1e-5}, "fcp": got, "stock": want,
            "tokens": sum(lens)}


def timing(device, lens, dims, iters: int, family: str = "qwen3", window: int | None = None) -> dict:
    from fcp_exec.integrations import hf

    cfg = _config(family, **dims)
    if window is not None:
        cfg.sliding_window = window
    stock = hf.build_model(cfg, dtype=torch.bfloat16, seed=0).to(device)
    fcp = hf.apply_fcp(copy.deepcopy(stock))
    batch, _, _ = _batch(lens, dims["vocab"], seed=2)
    times, losses = {"stock_sdpa_packed": [], "fcp_ring_degree1": []}, {}
    for r in range(iters + 1):
        for name, model, is_fcp in (("stock_sdpa_packed", stock, False), ("fcp_ring_degree1", fcp, True)):
            ms = elapsed_ms(lambda: losses.__setitem__(name, _run_model(model, batch, device, torch.float32, is_fcp)),
                          device)
            if r:
                times[name].append(ms)
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = abs(losses["fcp_ring_degree1"] - losses["stock_sdpa_packed"]) / abs(losses["stock_sdpa_packed"])
    ok = diff <= 2e-2  # both bfloat16; the same loss up to bf16 rounding
    return {"passed": ok, "max_error": diff, "tolerance": 2e-2, "median_ms_by_model": med,
            "fcp_over_stock": med["fcp_ring_degree1"] / med["stock_sdpa_packed"], "tokens": sum(lens),
            "documents": list(lens), "iters": iters, "kernel": repr(fcp._fcp_state.kernel),
            "reason": None if ok else f"fcp and stock losses {diff:.2e} apart (relative)"}


def build_parser():
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--out", type=output_dir, required=True, help="folder for results_hf.json")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the checks run (default cuda when torch sees a GPU, else cpu)")
    ap.add_argument("--quick", action="store_true", help="float32 and one family only, no timing")
    ap.add_argument("--iters", type=positive_int, help="timed iterations (default: GPU 5, CPU 1)")
    ap.add_argument("--perturb", action="store_true", help="scale fcp's attention output by 1.05 (must fail)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check_hf: --device cuda but torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    try:
        import transformers
    except ImportError:
        print("gpu_check_hf: needs transformers (pip install 'fcp[hf]')", file=sys.stderr)
        return 2
    t0, device, cuda = time.monotonic(), torch.device(args.device), args.device == "cuda"
    if not cuda:
        torch.set_num_threads(min(4, os.cpu_count() or 1))
    res = Results(args.out, {"script": "benchmarks/gpu_check_hf.py", "device": args.device, "torch": torch.__version__,
                             "transformers": transformers.__version__,
                             "device_name": torch.cuda.get_device_name(device) if cuda else "cpu"},
                  file_name="results_hf.json")
    print(f"gpu_check_hf: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{res.meta['device_name']}", flush=True)
    lens = (1, 2, 333, 4100, 700) if cuda else (1, 2, 33, 150, 70)
    for family in FAMILIES[:1] if args.quick else FAMILIES:
        for dtype_name in ("float32",) if args.quick else ("float32", "bfloat16", "float16"):
            res.run(f"hf[{family},{dtype_name}] fcp vs stock vs fp64 reference, documents {list(lens)}", "hf",
                    check_family, family, dtype_name, device, lens, args.perturb)
    res.run(f"hf_router[qwen3_moe] fcp's load-balancing loss vs the stock model's, documents {list(lens)}",
            "hf_router", check_router, device, lens, args.perturb)
    if not args.quick:
        if cuda:
            dims = dict(hidden=2048, layers=4, heads=(16, 8), head_dim=128, ffn=6144, vocab=32000)
            tlens = (8192, 4096, 2048, 1024, 512, 256, 256, 128)
        else:
            dims = dict(hidden=64, layers=2, heads=(4, 2), head_dim=16, ffn=128, vocab=500)
            tlens = (256, 128, 64, 32)
        for family, window in (("qwen3", None), ("mistral", 1024 if cuda else 64)):
            what = f"{family}{'' if window is None else f' window {window}'}"
            res.run(f"hf_timing {what} bf16 fwd+bwd {sum(tlens)} tokens in {len(tlens)} documents", "hf_timing",
                    timing, device, tlens, dims, args.iters or (5 if cuda else 1), family, window)
            print(f"  hf_timing {what}: median ms {res.checks[-1].get('median_ms_by_model')}, fcp/stock "
                  f"{res.checks[-1].get('fcp_over_stock')}", flush=True)
    res.meta["wall_s"] = round(time.monotonic() - t0, 1)
    res.write()
    failed = res.failed()
    print(f"gpu_check_hf: {len(res.checks)} checks, {len(failed)} failed; {res.meta['wall_s']} s; results in "
          f"{os.path.join(args.out, 'results_hf.json')}")
    for c in failed:
        print(f"  FAILED {c['name']}: {c.get('reason') or c.get('worst')}")
    return 1 if failed else 0


if __name__ == "__main__":
    run(main, bug_status=2)  # exit 1 is a failed check; a bug of this script is its traceback and exit 2
