"""Timing helpers of ``fcp profile``: interleaved, shuffled sweeps over a grid of steps (:func:`sweep_times`, the
measurement loop of :func:`fcp_exec.profiler.profile_worker`) and the vision-tower timing behind ``alpha_vis``
(:func:`time_vision`: tiny-mllm's tower, or a Hugging Face Qwen-VL model's ``model.visual``).

Why interleaved sweeps and the minimum: on a shared machine other jobs steal time in bursts. Timing all
repetitions of one point back to back lets a burst bias that point alone; sweeping the whole grid once per
repetition, in a fresh shuffled order, spreads load drift over all points alike. Contention only ever adds
time, so the fastest repetition of a point is its least disturbed one
(:func:`fcp_exec.profile_fit.timing_estimate`)."""

from __future__ import annotations

import time

from fcp_exec.profile_fit import timing_estimate

__all__ = ["sweep_times", "time_vision", "vision_tower", "VISION_FRAMES", "VISION_GRID"]


def sweep_times(steps, reps: int, warmup: int, device, seed: int = 0,
                cpu_times: list | None = None) -> list[list[float]]:
    """Time every callable of ``steps`` once per sweep, ``warmup`` untimed sweeps then ``reps`` timed ones; each
    sweep runs the steps in its own shuffled order (seeded: the same on every rank), so load drift on a shared
    machine hits all points alike instead of whichever points ran during a slow phase. A step's time is the
    slowest rank's wall time (all ranks start together after a barrier). Returns, per step, its ``reps`` timings.
    ``cpu_times`` (a list, filled in place the same way): the largest per-rank CPU time of the process
    (``time.process_time``) — blind to time spent descheduled by other jobs, and to waiting for a peer, so a
    diagnostic of the compute terms, not a group time. Every rank of the process group (if any) must call it
    with the same ``steps`` count and seed."""
    import random

    import torch
    import torch.distributed as dist

    from fcp_exec.launch import collective_dtype

    multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    order_rng = random.Random(seed)
    times: list[list[float]] = [[] for _ in steps]
    cpu: list[list[float]] = [[] for _ in steps]
    for r in range(warmup + reps):
        order = list(range(len(steps)))
        order_rng.shuffle(order)
        for i in order:
            if multi:
                dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            steps[i]()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if multi:
                t = torch.tensor([dt, dc], dtype=collective_dtype(torch.float64), device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                dt, dc = float(t[0]), float(t[1])
            if r >= warmup:
                times[i].append(dt)
                cpu[i].append(dc)
    if cpu_times is not None:
        cpu_times[:] = cpu
    return times


class _HFVision:
    """:func:`time_vision`'s view of a Hugging Face Qwen-VL vision tower (``model.model.visual``): ``F`` frames of
    ``h × w`` patches go in as one call with ``F`` rows ``(1, h, w)`` of ``grid_thw``, as fcp's HF integration
    encodes a rank's share of frames."""

    def __init__(self, visual, merge_size: int) -> None:
        from types import SimpleNamespace

        self.visual = visual
        self.cfg = SimpleNamespace(merge_size=int(merge_size), patch_dim=int(visual.patch_embed.proj.weight[0].numel()))

    def encode_frames(self, x, h: int, w: int):
        import torch

        grid = torch.tensor([[1, h, w]] * x.shape[0], dtype=torch.long, device=x.device)
        out = self.visual(x.reshape(-1, x.shape[-1]), grid_thw=grid)
        return getattr(out, "pooler_output", out)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.visual.zero_grad(set_to_none=set_to_none)


class _HFTiles:
    """:func:`time_vision`'s view of an InternVL model — a frame is one tile ``[3, H, W]`` of the vision tower's image
    size, encoded (tower, pixel shuffle, projector) through ``get_image_features`` — or of a LLaVA-OneVision model — a
    frame is one video frame, encoded (tower, projector, 2×2 pooling) through ``get_video_features`` — as fcp's HF
    integration does (:mod:`fcp_exec.integrations.hf_vision`)."""

    def __init__(self, net) -> None:
        from types import SimpleNamespace

        from fcp_exec.integrations.hf_llava import encode_frames, pooled_side
        from fcp_exec.integrations.hf_models import tile_geometry
        from fcp_exec.integrations.hf_vision import encode_tiles

        size = net.config.vision_config.image_size
        self.net, self.size = net, (int(size),) * 2 if isinstance(size, int) else tuple(int(x) for x in size)
        if net.config.model_type == "llava_onevision":
            self.per, self.encode = pooled_side(net.config) ** 2, encode_frames  # visual tokens per frame
        else:
            side, merge = tile_geometry(net.config)
            self.per, self.encode = (side // merge) ** 2, encode_tiles  # visual tokens per tile
        self.cfg = SimpleNamespace(merge_size=1, patch_dim=3)

    def tokens_per_frame(self, h: int, w: int) -> int:
        return self.per

    def random_input(self, frames: int, h: int, w: int, generator):
        import torch

        return torch.randn(frames, 3, *self.size, generator=generator)

    def encode_frames(self, x, h: int, w: int):
        return self.encode(self.net, x)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.net.zero_grad(set_to_none=set_to_none)


def vision_tower(net, model: str, layer_like: str | None):
    """The vision tower :func:`time_vision` times (tiny-mllm's, a Hugging Face Qwen-VL model's, InternVL's tiles,
    LLaVA-OneVision's video frames), or
    None."""
    if layer_like:
        return None
    if model == "tiny-mllm":
        return getattr(net, "vision", None)
    if model.startswith("hf:"):
        from fcp_exec.integrations import hf

        if hf.model_type_of(net) in hf.VL_MODEL_TYPES:
            inner = getattr(net, "model", net)
            return _HFVision(inner.visual, net.config.vision_config.spatial_merge_size)
        if hf.model_type_of(net) in hf.TILE_VL_MODEL_TYPES + hf.FRAME_VL_MODEL_TYPES:
            return _HFTiles(net)
    return None


VISION_FRAMES = (2, 8, 32)  # frames per timed vision batch
VISION_GRID = (8, 8)  # patches per frame (h, w); with merge 2: 16 visual tokens per frame


def time_vision(vision, device, dtype, reps: int = 3, warmup: int = 1, frames=VISION_FRAMES, grid=VISION_GRID,
                seed: int = 0) -> list[tuple[int, float]]:
    """``[(visual_tokens, seconds), ...]``: forward + backward of ``vision.encode_frames`` on ``F`` frames of
    ``grid`` patches for each ``F`` of ``frames`` (every rank at once, slowest rank, minimum over ``reps``
    interleaved sweeps, :func:`sweep_times`). Every rank of the process group (if any) must call it."""
    import torch

    h, w = grid
    per = vision.tokens_per_frame(h, w) if hasattr(vision, "tokens_per_frame") else h * w // vision.cfg.merge_size ** 2
    gen = torch.Generator().manual_seed(seed)
    make = getattr(vision, "random_input", None) or (lambda f, h, w, g: torch.randn(f, h * w, vision.cfg.patch_dim,
                                                                                  generator=g))
    batches = [make(f, h, w, gen).to(device=device, dtype=dtype) for f in frames]

    def step(x):
        vision.encode_frames(x, h, w).float().square().sum().backward()
        vision.zero_grad(set_to_none=True)

    times = sweep_times([lambda x=x: step(x) for x in batches], reps, warmup, device, seed)
    return [(f * per, timing_estimate(ts)[0]) for f, ts in zip(frames, times)]
