"""What splitting a CP group's video frames over its ranks buys (LLaVA-OneVision through ``apply_fcp``).

fcp encodes each video of a CP group once: every rank of the group runs the vision tower (and projector, pooling) on
a contiguous share of whole frames, and the rows travel to the ranks that hold their placeholder tokens
(:mod:`fcp_exec.vision_exchange`). The obvious alternative, what a CP integration that only shards the text does, is
that every rank of the group encodes the whole video and keeps its own rows. This benchmark times one training
micro-batch (forward + backward of the whole model) both ways on 2 gloo processes, one degree-2 group holding one
video of F frames plus 64 text tokens, float32:

* ``split``: ``fcp_loss`` as ``fcp train`` runs it (each rank encodes F/2 frames, rows exchanged both ways);
* ``replicated``: each rank encodes all F frames with the model's own ``get_video_features`` and passes its rows as
  ``mm_encoder_outputs`` (no exchange; the vision gradient summed over the ranks is the same).

The two modes alternate step by step in the same processes; each reports its median, and the loss of both is checked
equal (the same model, the same rows). Model: ``examples/configs/llava_onevision-tiny.json`` (384-px frames, 196
tokens each) with a wider vision tower (``--vision-hidden``, ``--vision-layers``) so that the tower's share of the
step is nearer a real model's (a real SigLIP-400M runs ~0.4 TFLOP per frame, the 0.5B–7B LLM ~1–14 GFLOP per token).

Run: ``python benchmarks/bench_vision_split.py`` (about a minute on 2 cores; prints a Markdown table).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import parser, positive_int, positive_int_list, run  # noqa: E402
CONFIG = ROOT / "examples" / "configs" / "llava_onevision-tiny.json"


def _model(hidden: int, layers: int):
    import torch

    from fcp_exec.integrations.hf import apply_fcp, build_model, load_config

    cfg = load_config(CONFIG)
    v = cfg.vision_config
    v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads = hidden, 4 * hidden, layers, 4
    return apply_fcp(build_model(cfg, dtype=torch.float32, seed=0)), cfg


def _batch(cfg, frames: int, rank: int) -> dict:
    """This rank's collated degree-2 micro-batch of one video document (deterministic pixels and text)."""
    import torch

    from fcp_data.slots import MicroBatchMeta, SampleSlot
    from fcp_exec.integrations.hf_positions import hf_collator
    from fcp_exec.integrations.hf_llava import pooled_side

    g = torch.Generator().manual_seed(frames)
    p, size = pooled_side(cfg), int(cfg.vision_config.image_size)
    ids = torch.cat([torch.randint(20, 1000, (32,), generator=g),
                     torch.full((frames * p * p + 1,), int(cfg.video_token_id)),
                     torch.randint(20, 1000, (32,), generator=g)])
    sample = {"input_ids": ids, "pixel_values": torch.randn(frames, 3, size, size, generator=g),
              "grid_thw": torch.tensor([[frames, p, p]])}
    # label tokens: every next token but the video's (63 text targets)
    meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=len(ids) - 1,
                          num_text_labels_global=63, ranks=(0, 1), cp_rank=rank)
    slot = SampleSlot(index=0, num_tokens=len(ids), length=len(ids), meta=meta)
    return hf_collator(cfg)([(sample, slot)])


def _replicated_loss(model, batch: dict):
    """Every rank encodes the whole video and keeps its rows (no exchange)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    import torch

    from fcp_exec.integrations.hf import batch_inputs, lm_loss
    from fcp_exec.integrations.hf_llava import encode_frames

    kw = batch_inputs(batch, model)
    call = kw.pop("fcp_vision")
    rows = torch.cat([encode_frames(model, call.pixel_values), model.model.image_newline[None]])
    mm = {"video": BaseModelOutputWithPooling(pooler_output=rows.index_select(0, call.visual_index)[None])}
    return lm_loss(model(**kw, mm_encoder_outputs=mm).logits, batch)


def _bench(frames_list: list[int], reps: int, hidden: int, layers: int) -> dict:
    import torch
    import torch.distributed as dist

    from fcp_exec.integrations.hf import fcp_loss

    torch.set_num_threads(1)
    rank = dist.get_rank()
    model, cfg = _model(hidden, layers)
    out = {}
    for frames in frames_list:
        batch = _batch(cfg, frames, rank)
        modes = {"split": lambda: fcp_loss(model, batch), "replicated": lambda: _replicated_loss(model, batch)}
        times, losses = {m: [] for m in modes}, {}
        for k in range(reps + 1):  # the first round warms up
            for name in (list(modes) if k % 2 == 0 else list(modes)[::-1]):
                model.zero_grad(set_to_none=True)
                dist.barrier()
                t0 = time.perf_counter()
                loss = modes[name]()
                loss.backward()
                dist.barrier()
                if k:
                    times[name].append(time.perf_counter() - t0)
                losses[name] = float(loss.detach())
        out[frames] = {m: statistics.median(t) for m, t in times.items()} | {"losses": losses}
    return out


def build_parser():
    ap = parser(__doc__.split("\n")[0], epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--frames", type=positive_int_list, default="4,8,16,32",
                    help="video lengths in frames (comma-separated, each at least 2)")
    ap.add_argument("--reps", type=positive_int, default=7, help="timed steps per mode and length")
    ap.add_argument("--vision-hidden", type=positive_int, default=128,
                    help="vision tower width, a multiple of 4 (the config's is 16)")
    ap.add_argument("--vision-layers", type=positive_int, default=2, help="vision tower depth (the config's is 1)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if min(args.frames) < 2:
        ap.error(f"--frames {','.join(map(str, args.frames))}: each at least 2 (a degree-2 group splits the frames)")
    if args.vision_hidden % 4:
        ap.error(f"--vision-hidden {args.vision_hidden}: a multiple of 4 (4 attention heads)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    frames = args.frames
    from fcp_exec.launch import launch

    load = os.getloadavg()[0]
    res = launch(_bench, 2, frames, args.reps, args.vision_hidden, args.vision_layers, timeout=1200.0,
                 preload=("transformers.modeling_utils",))[0]
    print(f"LLaVA-OneVision tiny LLM, vision tower {args.vision_layers}×{args.vision_hidden}, 384-px frames, one "
          f"degree-2 group, 2 gloo processes, fwd+bwd, median of {args.reps}, load {load:.1f} → "
          f"{os.getloadavg()[0]:.1f}\n")
    print("| frames | visual tokens | split (fcp) | replicated | replicated / split | loss equal |")
    print("|---:|---:|---:|---:|---:|---|")
    for f, r in res.items():
        same = abs(r["losses"]["split"] - r["losses"]["replicated"]) <= 1e-5 * abs(r["losses"]["replicated"])
        print(f"| {f} | {f * 196 + 1:,} | {r['split'] * 1e3:,.1f} ms | {r['replicated'] * 1e3:,.1f} ms | "
              f"{r['replicated'] / r['split']:.2f}× | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    run(main)
