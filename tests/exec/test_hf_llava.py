"""LLaVA-OneVision (transformers' ``llava_onevision``: SigLIP, 2×2-pooled video frames, a learned newline per video)
on the bundled videos: ``fcp train`` on the bundled samples' ``llava-onevision`` index — real frames read, resized to
384 px and normalised by ``IndexedDataset`` — equals the stock model.

The matrix of ``test_hf_train.py`` covers LLaVA-OneVision with every reducer, gradient checkpointing and 2/3
processes on synthetic 56-px frames; here the frames are real (384 px, 196 tokens each + the video's newline) and a
video split over a degree-2 group has its frames encoded on both ranks, its newline row on one, and the rows
exchanged. Reference: the stock model on the same documents (``pixel_values_videos``, its own placeholder count —
it raises if the index counted a different number of tokens). Plus what is refused with one error: images (the
index records them as ``unsupported_media``; a collator refuses a sample holding ``<image>`` tokens), an index of
another token rule, frames of another size.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _requires import transformers_models
import torch

transformers = transformers_models()

from fcp_exec.integrations import hf  # noqa: E402
from fcp_exec.integrations.hf_data import reference_step  # noqa: E402
from fcp_exec.integrations.hf_positions import hf_collator  # noqa: E402
from fcp_exec.integrations.hf_vision import llava_frame_table  # noqa: E402
from fcp_exec.train import TrainConfig, run_training  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "llava_onevision-tiny.json"  # 384-px frames, as LLaVA-OneVision
CONFIG_56 = Path(__file__).resolve().parent / "llava_onevision-tiny.json"  # the same model with 56-px frames


def test_fcp_train_on_real_videos_equals_the_stock_model(tmp_path):
    """2 processes, float64, 2 global batches of 4 bundled videos (393–620 tokens, 2–3 frames at 1 fps) with 400
    tokens per rank, so the longer videos run on degree-2 groups: every step's loss and every gradient to 1e-12, the
    denominator exactly, against the stock model stepping over the same documents (AdamW in between)."""
    kw = dict(model=f"hf:{CONFIG}", dtype="float64", steps=2, global_batch_size=4, max_tokens=800,
              tokens_per_rank=400, prefetch=0, verbose=False, return_grads=True, cache_dir=str(tmp_path / "cache"))
    res = run_training(TrainConfig(**kw), 2)
    assert any(2 in mb for step in res["steps"] for mb in step["degrees"]), [s["degrees"] for s in res["steps"]]
    config = hf.load_config(CONFIG)
    data = load_train_data(f"hf:{CONFIG}", None, max_tokens=800, seed=0, hf_config=config,
                           cache_dir=str(tmp_path / "cache"))
    ref = hf.build_model(config, dtype=torch.float64, seed=0)
    ref.train()
    opt = torch.optim.AdamW(ref.parameters(), lr=TrainConfig().lr, weight_decay=TrainConfig().weight_decay,
                            foreach=False)
    for step in res["steps"]:
        samples = [data.dataset[i] for i in step["sample_indices"]]
        assert all(tuple(s["pixel_values"].shape[1:]) == (3, 384, 384) for s in samples)  # real frames
        opt.zero_grad(set_to_none=True)
        loss, num = reference_step(ref, samples, ignore_ids=(int(config.video_token_id),))
        assert step["num_tokens"] == num
        assert abs(step["loss"] - loss) <= 1e-12 * abs(loss), (step["loss"], loss)
        grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
        top = max(float(g.abs().max()) for g in grads.values())
        worst = max(float((torch.from_numpy(step["grads"][n]) - g).abs().max()) for n, g in grads.items())
        assert worst <= 1e-12 * top, worst / top
        assert "model.image_newline" in grads and any(n.startswith("model.vision_tower") for n in grads)
        opt.step()


def test_frame_table_puts_each_newline_after_its_video():
    """Two videos of 2 and 1 frames, 4 tokens per frame: rows 0–3, 4–7 frames 0, 1; row 8 the first newline;
    rows 9–12 frame 2; row 13 the second newline (what the processor's t·p² + 1 placeholders hold, in order)."""
    table = llava_frame_table(torch.tensor([[2, 2, 2], [1, 2, 2]]))
    assert table.tolist() == [[0, 4, 0, 2, 2], [4, 4, 1, 2, 2], [8, 1, -1, 1, 1], [9, 4, 2, 2, 2], [13, 1, -1, 1, 1]]


def test_images_are_refused_with_one_reason(tmp_path):
    """The bundled images are recorded as unsupported_media by the videos-only spec (not trained as text), and a
    sample holding ``<image>`` tokens is refused by the model's collator before anything runs."""
    from fcp_data import bundled_index
    from fcp_data.slots import SampleSlot

    index = bundled_index("llava-onevision", str(tmp_path / "cache"))
    errors = [json.loads(line) for line in (index / "errors.jsonl").read_text().splitlines()]
    assert errors and {e["reason"] for e in errors} == {"unsupported_media"}
    assert all(e["key"].startswith("img-") for e in errors)
    config = hf.load_config(CONFIG)
    collate = hf_collator(config)
    ids = torch.tensor([20, int(config.image_token_id), 21])
    slot = SampleSlot(index=7, num_tokens=3, length=3, ranks=(0,), cp_rank=0, epoch=0, global_batch=0, micro_batch=0,
                      num_micro_batches=1, num_tokens_global=2)
    with pytest.raises(ValueError, match="sample 7 holds LLaVA-OneVision <image> tokens"):
        collate([({"input_ids": ids}, slot)])


def test_mismatched_data_is_one_error(tmp_path):
    cache = str(tmp_path / "cache")
    from fcp_data import bundled_index

    with pytest.raises(ValueError, match="needs its processor's token rule"):
        load_train_data(f"hf:{CONFIG}", str(bundled_index("llava-video", cache)), hf_config=hf.load_config(CONFIG))
    with pytest.raises(ValueError, match="needs its processor's token rule"):
        load_train_data(f"hf:{CONFIG}", str(bundled_index("qwen2.5-vl", cache)), hf_config=hf.load_config(CONFIG))
    with pytest.raises(ValueError, match=r"384-px frames of 196 tokens but the model's vision tower takes 56-px"):
        load_train_data(f"hf:{CONFIG_56}", None, hf_config=hf.load_config(CONFIG_56), cache_dir=cache)
