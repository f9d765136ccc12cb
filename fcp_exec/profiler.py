"""Measure the real executor for ``fcp profile`` and fit the §4 cost model (:mod:`fcp_exec.profile_fit`).

Measurement (:func:`profile_worker`, on every rank of a real process group): for each point of a grid of
(documents per group ``k``, document length ``s``, degree ``d``), ``world // d`` concurrent CP groups of
degree ``d`` each run forward + backward of the model (tiny-llm, one transformer layer shaped like a
preset model, or a Hugging Face model ``hf:CONFIG.json`` built by :func:`fcp_exec.integrations.hf.build_model`
and :func:`~fcp_exec.integrations.hf.apply_fcp`, whose loss is :func:`~fcp_exec.integrations.hf.fcp_loss`) on
``k`` packed documents of ``s`` tokens, zigzag-sharded, with ring attention. Timing (:func:`sweep_times`):
untimed warm-up sweeps, then every repetition sweeps the whole grid in a shuffled order (load drift on a
shared machine hits all points alike); a point's time is the slowest rank's, and its estimate is the
minimum over the repetitions (contention only adds time), with the spread median/min − 1 reported. The grid
is the single-document lengths ``seq_lens`` plus packed groups of ``packed_docs`` documents of each of
``packed_lens`` tokens (what training feeds a group: many short documents), so the fit also sees the
per-document costs (see :mod:`fcp_exec.profile_fit`). The bandwidth is measured by a P2P ping-pong
between ranks 0 and 1.

An HF model is timed the way ``fcp train`` runs it: the whole model (embedding, decoder, LM head, loss) on text
documents; a Qwen-VL model gets text positions on all three rope axes and, as on a text-only micro-batch in
training, encodes one dummy frame per forward (its vision cost is not part of the fit).

Cost model v2 (DESIGN §4.1): ``gamma`` and ``alpha_blk`` are fitted from the same grid (degrees 1..nproc,
single long and short documents, packed groups of many short documents, every cell at every degree;
``gamma`` needs degrees ≥ 3 to be told from ``beta2``). ``alpha_vis``: with a vision tower (``--model
tiny-mllm``, or a Hugging Face Qwen-VL model) :func:`~fcp_exec.profile_timing.time_vision` times the encoder's
forward + backward on batches of ``VISION_FRAMES`` frames of ``VISION_GRID`` patches and
:func:`~fcp_exec.profile_fit.fit_alpha_vis` takes the slope in visual tokens; other models (tiny-llm,
``--layer-like``, HF text models) get ``alpha_vis = 0``. :func:`run_profile` fits v2 by default (``version=2``)
and keeps the v1 fit of the same points beside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from fcp_exec.profile_fit import (COEFFICIENTS, COEFFICIENTS_V2, FitResult, ProfilePoint, fit_alpha_vis,
                                  fit_cost_model, fit_errors, format_fit, nnls_small, plot_fit, timing_estimate)
from fcp_exec.profile_timing import VISION_FRAMES, VISION_GRID, sweep_times, time_vision, vision_tower

__all__ = ["ProfilePoint", "FitResult", "fit_cost_model", "nnls_small", "format_fit", "plot_fit", "run_profile",
           "profile_worker", "ping_bandwidth", "kv_bytes_per_token", "profile_grid", "fit_errors", "fit_alpha_vis",
           "time_vision", "VISION_FRAMES", "VISION_GRID", "sweep_times", "timing_estimate",
           "PLACEHOLDER_BANDWIDTH"]

_NAMES = COEFFICIENTS


# ---------------------------------------------------------------------------------------- measurement
def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, elem_bytes: int) -> float:
    """Analytic ``alpha3`` of this executor: per layer K and V (``2·H_kv·head_dim`` values) travel the ring
    once in the forward and again in the backward, and dK/dV travel back: 3 transfers."""
    return float(3 * num_layers * 2 * num_kv_heads * head_dim * elem_bytes)


def ping_bandwidth(rank: int, nbytes: int = 1 << 22, iters: int = 8) -> float:
    """Per-direction P2P bandwidth (bytes/s) between ranks 0 and 1 by ping-pong (call on every rank;
    ranks other than 0 and 1 only wait at the barriers). Needs an initialised process group."""
    import torch
    import torch.distributed as dist

    from fcp_exec.launch import current_device

    buf = torch.zeros(nbytes // 4, dtype=torch.float32, device=current_device())
    dist.barrier()
    elapsed = 0.0
    if rank in (0, 1):
        other = 1 - rank
        for i in range(iters + 1):  # first round trip is a warm-up
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, other)
                dist.recv(buf, other)
            else:
                dist.recv(buf, other)
                dist.send(buf, other)
            if i:
                elapsed += time.perf_counter() - t0
    dist.barrier()
    if rank != 0:
        return 0.0
    return 2.0 * buf.numel() * 4 * iters / elapsed


@dataclass(frozen=True, slots=True)
class _Shape:
    """What the profiler needs of a model's text backbone (tiny config or a transformers config)."""

    vocab_size: int
    hidden: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    id_range: tuple[int, int] = (10, 0)  # token ids drawn in [lo, hi) (hi 0: vocab_size); keeps VL specials out


def _hf_shape(config) -> _Shape:
    tc = getattr(config, "text_config", config)
    heads = int(tc.num_attention_heads)
    vocab = int(tc.vocab_size)
    lo, hi = 10, vocab
    special = sorted(int(v) for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
                     if (v := getattr(config, k, None)) is not None)
    if special:  # Qwen-VL: random text must not contain placeholder/marker ids
        lo, hi = (10, special[0]) if special[0] - 10 >= vocab - special[-1] - 1 else (max(10, special[-1] + 1), vocab)
    if hi - lo < 2:
        raise ValueError(f"vocab_size {vocab} leaves no room for text token ids besides the special ids {special}")
    return _Shape(vocab_size=vocab, hidden=int(tc.hidden_size), num_layers=int(tc.num_hidden_layers),
                  num_heads=heads, num_kv_heads=int(getattr(tc, "num_key_value_heads", None) or heads),
                  head_dim=int(getattr(tc, "head_dim", None) or tc.hidden_size // heads),
                  ffn=int(tc.intermediate_size), id_range=(lo, hi))


def _bytes(shape, elem: int) -> tuple[float, float]:
    """(analytic alpha3, activation bytes per token) of a backbone shaped ``shape`` with ``elem``-byte values."""
    kv = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, elem)
    act = elem * (shape.num_layers * (8 * shape.hidden + 2 * (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
                                      + 4 * shape.ffn) + 3 * shape.vocab_size)
    return kv, act


def _profile_model(model: str, layer_like: str | None, dtype, seed: int):
    """The model to time and its analytic alpha3 (bytes/token) and activation bytes per token."""
    from fcp_exec.models import TinyLLM, TinyLLMConfig, build_model

    if model.startswith("hf:") and not layer_like:
        from fcp_exec.integrations import hf

        config = hf.load_config(model[3:])
        net = hf.apply_fcp(hf.build_model(config, dtype=dtype, seed=seed))
        shape = _hf_shape(config)
        kv, act = _bytes(shape, net.get_input_embeddings().weight.element_size())
        return net, shape, kv, act
    if layer_like:
        from fcp_data.presets import MODELS

        if layer_like not in MODELS:
            raise ValueError(f"unknown preset {layer_like!r}; choose one of {', '.join(MODELS)}")
        m = MODELS[layer_like]
        cfg = TinyLLMConfig(vocab_size=256, hidden=m.hidden, num_layers=1, num_heads=m.heads,
                            num_kv_heads=m.kv_heads, head_dim=m.head_dim, ffn=m.ffn)
        import torch

        torch.manual_seed(seed)
        net = TinyLLM(cfg).to(dtype)
    else:
        net = build_model(model, seed=seed, dtype=dtype)
        cfg = net.cfg if model == "tiny-llm" else net.cfg.llm
    elem = net.llm.embed.weight.element_size() if hasattr(net, "llm") else net.embed.weight.element_size()
    kv, act = _bytes(cfg, elem)
    return net, cfg, kv, act


def _step_fn(net, model: str, layer_like: str | None):
    """``run(ids, pos, labels, cu_seqlens, ranks, cp_rank)``: one forward + backward of this rank's shard."""
    import torch

    if model.startswith("hf:") and not layer_like:
        from fcp_exec.integrations import hf

        is_vl = hf.model_type_of(net) in hf.VL_MODEL_TYPES
        net.train()

        def run_hf(ids, pos, labels, cu, ranks, cp_rank):
            batch = {"input_ids": ids, "position_ids": pos, "labels": labels, "cu_seqlens": cu, "ranks": ranks,
                     "cp_rank": cp_rank, "num_tokens_global": 1}
            if is_vl:  # text documents: the same position on every rope axis, no visual token
                batch.update(mrope_position_ids=pos.expand(3, -1), visual_pos=torch.zeros(0, dtype=torch.long),
                             visual_index=torch.zeros(0, dtype=torch.long))
            hf.fcp_loss(net, batch).backward()

        return run_hf
    lm = net.llm if model == "tiny-mllm" and not layer_like else net

    def run(ids, pos, labels, cu, ranks, cp_rank):
        logits = lm(ids, pos, cu, ranks)
        torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum").backward()

    return run


def _device_memory(device) -> float:
    import os

    import torch

    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / max(local, 1)


DEFAULT_PACKED_DOCS = (1, 4, 16)
DEFAULT_PACKED_LENS = (64, 128, 256)
# written for the bandwidths when one process measured none and the user gave none (fcp profile warns)
PLACEHOLDER_BANDWIDTH = 1e10


def profile_grid(seq_lens, packed_docs=DEFAULT_PACKED_DOCS, packed_lens=DEFAULT_PACKED_LENS) -> list[tuple[int, int]]:
    """``(num_docs, seq_len)`` cells of the grid: one document of each of ``seq_lens``, then ``k``
    documents of each of ``packed_lens`` for every ``k`` of ``packed_docs`` (cells already present are
    not repeated)."""
    cells = [(1, int(s)) for s in seq_lens]
    for k in packed_docs or ():
        for s in packed_lens or ():
            if int(k) < 1 or int(s) < 1:
                raise ValueError(f"packed documents and lengths must be >= 1, got {k}, {s}")
            if (int(k), int(s)) not in cells:
                cells.append((int(k), int(s)))
    return cells


def _grid_shards(cfg, world: int, rank: int, degrees, cells, device, seed: int) -> list[tuple]:
    """``[(num_docs, padded_len, degree, group or None, local tensors or None), ...]``: for each degree and cell,
    random documents (padded to ``2·d`` as the collator does) zigzag-sharded for this rank's group of
    ``world // d`` concurrent groups (a rank outside every group idles)."""
    import torch

    from fcp_data.layout import zigzag_shard

    gen = torch.Generator().manual_seed(seed)
    id_lo, id_hi = getattr(cfg, "id_range", (10, 0))
    id_hi = id_hi or cfg.vocab_size
    grid = []
    for d in degrees:
        groups = [tuple(range(i * d, (i + 1) * d)) for i in range(world // d)]
        mine = next((g for g in groups if rank in g), None)
        for k, s in cells:
            s_pad = -(-int(s) // (2 * d)) * 2 * d
            n = k * s_pad
            ids = torch.randint(id_lo, id_hi, (n,), generator=gen)
            labels = torch.randint(id_lo, id_hi, (n,), generator=gen)
            cu = torch.arange(0, n + 1, s_pad, dtype=torch.int32)
            pos = torch.arange(s_pad).repeat(k)
            local = None
            if mine:
                cp = mine.index(rank)
                shards = [zigzag_shard(x, cu, d, cp)[0].to(device) for x in (ids, pos, labels)]
                local = (*shards, zigzag_shard(ids, cu, d, cp)[1].to(device))
            grid.append((k, s_pad, d, mine, local))
    return grid


def profile_worker(model: str = "tiny-llm", layer_like: str | None = None, seq_lens=(256, 512, 1024, 2048),
                   degrees=None, reps: int = 9, warmup: int = 2, dtype: str = "float32", seed: int = 0,
                   packed_docs=DEFAULT_PACKED_DOCS, packed_lens=DEFAULT_PACKED_LENS) -> dict:
    """Time forward + backward over the (seq_len, degree) grid on this rank (module docstring); every rank
    of the process group must call it. ``warmup`` untimed sweeps, then ``reps`` timed sweeps over the whole grid
    (:func:`sweep_times`); a point's time is the minimum over its repetitions (:func:`timing_estimate`). Returns
    (same on all ranks) ``{"points", "rep_times", "rep_cpu_times", "bandwidth", "alpha3_default",
    "bytes_per_token", "memory_bytes", "world", "layers", "vision"}``; ``rep_times`` holds every point's
    repetitions, ``rep_cpu_times`` their CPU times (a diagnostic, :func:`sweep_times`)."""
    import torch
    import torch.distributed as dist

    from fcp_exec.launch import collective_dtype, current_device, dist_info

    rank, world = dist_info()
    device = current_device()
    tdtype = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}[dtype]
    net, cfg, kv, act = _profile_model(model, layer_like, tdtype, seed)
    net = net.to(device)
    step = _step_fn(net, model, layer_like)
    bandwidth = ping_bandwidth(rank) if world > 1 else 0.0
    if world > 1:
        bw = torch.tensor([bandwidth], dtype=collective_dtype(torch.float64), device=device)
        dist.broadcast(bw, 0)
        bandwidth = float(bw[0])
    degrees = list(degrees or range(1, world + 1))
    if max(degrees) > world or min(degrees) < 1:
        raise ValueError(f"degrees {degrees} must lie in 1..{world} (the number of processes)")
    grid = _grid_shards(cfg, world, rank, degrees, profile_grid(seq_lens, packed_docs, packed_lens), device, seed)

    def run_point(mine, local):
        if mine:
            step(*local, mine, mine.index(rank))
            net.zero_grad(set_to_none=True)

    cpu: list = []
    times = sweep_times([lambda g=g: run_point(g[3], g[4]) for g in grid], reps, warmup, device, seed, cpu)
    points = []
    for (k, s_pad, d, _, _), ts in zip(grid, times):
        best, med, spread = timing_estimate(ts)
        points.append({"seq_len": s_pad, "degree": d, "time_s": best, "eta": 0.0, "num_docs": k})
        if rank == 0:
            print(f"  measured {k:>2} x seq_len {s_pad:>6} degree {d}: {best * 1e3:8.2f} ms (min of {len(ts)}; "
                  f"median {med * 1e3:8.2f} ms, +{spread * 100:.0f}%)", flush=True)
    vision, tower = [], vision_tower(net, model, layer_like)
    if tower is not None:
        vision = time_vision(tower, device, tdtype, reps=reps, warmup=warmup, seed=seed)
        if rank == 0:
            for n, sec in vision:
                print(f"  measured vision tower: {n:>5} visual tokens: {sec * 1e3:8.2f} ms", flush=True)
    return {"points": points, "rep_times": times, "rep_cpu_times": cpu, "bandwidth": bandwidth,
            "alpha3_default": kv, "bytes_per_token": act, "memory_bytes": _device_memory(device), "world": world,
            "layers": getattr(cfg, "num_layers", 1), "vision": vision}


def _scaled(fit: FitResult, layers: int) -> FitResult:
    """``fit`` for ``layers`` layers: per-layer coefficients and times multiplied (alpha_vis, bandwidths and
    memory untouched)."""
    cm = fit.cost_model
    names = COEFFICIENTS_V2 if fit.version == 2 else COEFFICIENTS
    pts = tuple(ProfilePoint(seq_len=p.seq_len, degree=p.degree, time_s=p.time_s * layers, eta=p.eta,
                             num_docs=p.num_docs) for p in fit.points)
    return FitResult(cost_model=cm.replace(**{k: getattr(cm, k) * layers for k in names}), points=pts,
                     predicted=tuple(p * layers for p in fit.predicted), rel_errors=fit.rel_errors,
                     unidentified=fit.unidentified, version=fit.version,
                     v1=_scaled(fit.v1, layers) if fit.v1 is not None else None)


def run_profile(nproc: int, *, model: str = "tiny-llm", layer_like: str | None = None,
                seq_lens=(256, 512, 1024, 2048), degrees=None, reps: int = 9, dtype: str = "float32",
                tokens_per_rank: int | None = None, backend: str | None = None,
                packed_docs=DEFAULT_PACKED_DOCS, packed_lens=DEFAULT_PACKED_LENS,
                version: int = 2, warmup: int = 2, bandwidth: float | None = None,
                bandwidth_inter: float | None = None) -> tuple[FitResult, dict]:
    """Measure on ``nproc`` processes (:func:`fcp_exec.launch.launch`) and fit (``version`` 2: the §4.1 model,
    whose ``.v1`` is the §4 fit of the same points; 1: §4 only). With ``layer_like`` the
    measured layer's coefficients are multiplied by the preset's layer count (the written model is for
    the whole backbone, LM head not included). ``tokens_per_rank`` defaults to half the device memory
    (per process) over the estimated activation bytes per token, rounded down to 64. ``raw["alpha_vis"]`` is
    the vision-tower slope (0 without a timed vision tower). ``bandwidth`` / ``bandwidth_inter`` (bytes/s) are
    written instead of the measured / the intra-node value; ``raw["bandwidth_source"]`` says which was written:
    ``"given"``, ``"measured"`` or ``"placeholder"`` (one process, none given: ``PLACEHOLDER_BANDWIDTH``, which no
    degree-1 plan reads but a plan for more ranks would)."""
    from fcp_exec.launch import launch

    raw = next(r for r in launch(profile_worker, nproc, model, layer_like, tuple(seq_lens), degrees, reps, warmup,
                                 dtype, 0, tuple(packed_docs or ()), tuple(packed_lens or ()), backend=backend)
               if r is not None)
    points = [ProfilePoint(**p) for p in raw["points"]]
    layers = 1
    if layer_like:
        from fcp_data.presets import MODELS

        layers = MODELS[layer_like].layers
    if tokens_per_rank is None:
        tokens_per_rank = max(64, int(0.5 * raw["memory_bytes"] / (raw["bytes_per_token"] * layers)) // 64 * 64)
    raw["bandwidth_source"] = "given" if bandwidth else "measured" if raw["bandwidth"] else "placeholder"
    bandwidth = bandwidth or raw["bandwidth"] or PLACEHOLDER_BANDWIDTH
    raw["alpha_vis"] = fit_alpha_vis(raw.get("vision") or ())
    fit = fit_cost_model(points, bandwidth_intra=bandwidth, bandwidth_inter=bandwidth_inter,
                         ranks_per_node=max(1, raw["world"]),
                         tokens_per_rank=tokens_per_rank, alpha3_default=raw["alpha3_default"], version=version,
                         alpha_vis=raw["alpha_vis"])
    raw["layers_scaled"] = layers
    if layers > 1:
        fit = _scaled(fit, layers)
    return fit, raw
