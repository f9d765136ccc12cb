"""LLaVA-OneVision (transformers' ``llava_onevision``: SigLIP, 2×2-pooled video frames, a learned newline per video)
on the bundled videos: ``fcp train`` on the bundled samples' ``llava-onevision`` index — real frames read, resized to
384 px and normalised by ``IndexedDataset`` — equals the stock model.

The matrix of ``test_hf_train.py`` covers LLaVA-OneVision with every reducer, gradient checkpointing and 2/3
processes on synthetic 56-px frames; here the frames are real (384 px, 196 tokens each + the video's newline) and a
video split over a degree-2 group has its frames encoded on both ranks, its newline row on one, and the rows
exchanged; the bundled images (AnyRes crops, 384 px) too. Reference: the stock model on the same documents (its
processor's inputs, its own placeholder count — it raises if the index counted a different number of tokens). Single
crops (samples of several images) train from a processor's samples (``test_hf_train.py``, ``test_hf_trainer.py``);
here their conversion to fcp's format. Plus what is refused with one error: several images in one indexed sample
(``unsupported_media``), an index of another token rule, frames of another size, malformed grid rows.
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
from fcp_exec.integrations.hf_llava import frame_table as llava_frame_table  # noqa: E402
from fcp_exec.train import TrainConfig, run_training  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "llava_onevision-tiny.json"  # 384-px frames, as LLaVA-OneVision
CONFIG_56 = Path(__file__).resolve().parent / "llava_onevision-tiny.json"  # the same model with 56-px frames


@pytest.mark.parametrize("max_tokens, gbs", [(800, 4), (4000, 8)])
def test_fcp_train_on_real_videos_and_images_equals_the_stock_model(tmp_path, max_tokens, gbs):
    """2 processes, float64, 2 global batches of the bundled samples with max_tokens / 2 tokens per rank, so the
    longer ones run on degree-2 groups: every step's loss and every gradient to 1e-12, the denominator exactly, against
    the stock model stepping over the same documents (AdamW in between). 800 tokens: videos of 393–620 tokens (2–3
    frames at 1 fps); 4,000: the images too (AnyRes, 2–5 crops of 384 px, 958–3,707 tokens: one rank encodes and packs
    an image, its rows go to both)."""
    kw = dict(model=f"hf:{CONFIG}", dtype="float64", steps=2, global_batch_size=gbs, max_tokens=max_tokens,
              tokens_per_rank=max_tokens // 2, prefetch=0, verbose=False, return_grads=True,
              cache_dir=str(tmp_path / "cache"))
    res = run_training(TrainConfig(**kw), 2)
    assert any(2 in mb for step in res["steps"] for mb in step["degrees"]), [s["degrees"] for s in res["steps"]]
    config = hf.load_config(CONFIG)
    data = load_train_data(f"hf:{CONFIG}", None, max_tokens=max_tokens, seed=0, hf_config=config,
                           cache_dir=str(tmp_path / "cache"))
    grids = [data.dataset[i]["grid_thw"] for step in res["steps"] for i in step["sample_indices"]]
    assert any(int(g[0, 0]) < -2 for g in grids) == (max_tokens > 800), grids  # an image of 3+ crops trained
    ref = hf.build_model(config, dtype=torch.float64, seed=0)
    ref.train()
    opt = torch.optim.AdamW(ref.parameters(), lr=TrainConfig().lr, weight_decay=TrainConfig().weight_decay,
                            foreach=False)
    for step in res["steps"]:
        samples = [data.dataset[i] for i in step["sample_indices"]]
        assert all(tuple(s["pixel_values"].shape[1:]) == (3, 384, 384) for s in samples)  # real frames
        opt.zero_grad(set_to_none=True)
        loss, num = reference_step(ref, samples, ignore_ids=(int(config.image_token_id), int(config.video_token_id)))
        assert step["num_tokens"] == num
        assert abs(step["loss"] - loss) <= 1e-12 * abs(loss), (step["loss"], loss)
        grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
        top = max(float(g.abs().max()) for g in grads.values())
        worst = max(float((torch.from_numpy(step["grads"][n]) - g).abs().max()) for n, g in grads.items())
        assert worst <= 1e-12 * top, worst / top
        assert "model.image_newline" in grads and any(n.startswith("model.vision_tower") for n in grads)
        opt.step()


def test_frame_table_puts_each_newline_after_its_video_and_each_image_in_one_row():
    """56-px frames (4 vision patches per side, 2×2 pooled tokens): a video of 2 frames — rows 0–3, 4–7, its newline
    row 8 —, an image of 3 crops and 40 × 90 px — one row of 52 tokens (the model's own packing: 16 base + 4 × 9
    unpadded with a newline per row) starting at pixel row 2 —, a video of 1 frame (pixel row 5) and its newline.
    Weights are the tower's patches (16 per frame or crop, 1 per newline)."""
    table = llava_frame_table(torch.tensor([[2, 2, 2], [-3, 40, 90], [1, 2, 2]]), hf.load_config(CONFIG_56))
    F, N, I = 0, 1, 2
    assert table.tolist() == [[0, 4, 0, 4, 4, F, 1, 0, 0], [4, 4, 1, 4, 4, F, 1, 0, 0], [8, 1, -1, 1, 1, N, 0, 0, 0],
                              [9, 52, 2, 12, 4, I, 3, 40, 90], [61, 4, 5, 4, 4, F, 1, 0, 0],
                              [65, 1, -1, 1, 1, N, 0, 0, 0]]


def test_the_index_counts_every_bundled_image_by_anyres(tmp_path):
    """`fcp index --spec llava-onevision`: every bundled image is indexed with its AnyRes count (no error), and the
    reader gives that many crops of 384 px with the grid row (−crops, H, W)."""
    from fcp_data import bundled_index
    from fcp_data.readers import IndexedDataset

    index = bundled_index("llava-onevision", str(tmp_path / "cache"))
    assert not (index / "errors.jsonl").read_text().strip()
    data = IndexedDataset(index)
    images = [i for i in range(len(data)) if int(data.index.num_frames[i]) == 1 and int(data.index.height[i])]
    assert len(images) >= 5
    for i in images:
        s = data[i]
        crops, h, w = s["grid_thw"][0].tolist()
        assert crops <= -2 and (h, w) == (int(data.index.height[i]), int(data.index.width[i]))
        assert tuple(s["pixel_values"].shape) == (-crops, 3, 384, 384)


def _two_image_chats(root: Path) -> Path:
    """4 conversations of 2 images each (sizes 48–96 px) and a question, as LLaVA's jsonl writes them."""
    from PIL import Image

    lines = []
    for k in range(4):
        names = []
        for j in range(2):
            name = f"im{k}{j}.png"
            Image.new("RGB", (48 + 16 * (k + j), 48 + 8 * k), (40 * k, 90 + 60 * j, 200)).save(root / name)
            names.append(name)
        lines.append({"id": f"two-{k}", "image": names, "messages": [
            {"role": "user", "content": "compare <image> and <image> please"},
            {"role": "assistant", "content": "the second is larger." * (k + 1)}]})
    (root / "chat.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root / "chat.jsonl"


def test_samples_of_several_images_index_and_train_like_the_stock_model(tmp_path):
    """A conversation of two images: its processor makes one square crop of each (padded with the image mean) and
    writes 27² + 1 = 730 tokens per image; the index counts that, the reader gives one crop per image with the grid
    row (−1, H, W), and `fcp train` on 4 such conversations (2 processes, float64, one of them split over a degree-2
    group) equals the stock model fed their processor's inputs (``batch_num_images = [2]``) to 1e-12."""
    from fcp_data.index import build_index
    from fcp_data.readers import IndexedDataset

    chat = _two_image_chats(tmp_path)
    manifest, rc = build_index([str(chat)], "llava-onevision", tmp_path / "idx", progress=False, chat_field="messages")
    assert rc == 0 and manifest["num_samples"] == 4, manifest["errors_by_reason"]
    data = IndexedDataset(tmp_path / "idx")
    s = data[0]
    assert s["grid_thw"][:, 0].tolist() == [-1, -1] and tuple(s["pixel_values"].shape) == (2, 3, 384, 384)
    assert int(data.index.num_visual_tokens[0]) == 2 * 730
    kw = dict(model=f"hf:{CONFIG}", data=str(tmp_path / "idx"), dtype="float64", steps=1, global_batch_size=4,
              max_tokens=2000, tokens_per_rank=1000, prefetch=0, verbose=False, return_grads=True)
    step = run_training(TrainConfig(**kw), 2)["steps"][0]
    assert any(2 in mb for mb in step["degrees"]), step["degrees"]
    config = hf.load_config(CONFIG)
    ref = hf.build_model(config, dtype=torch.float64, seed=0)
    ref.train()
    loss, num = reference_step(ref, [data[i] for i in step["sample_indices"]],
                               ignore_ids=(int(config.image_token_id), int(config.video_token_id)))
    assert step["num_tokens"] == num and abs(step["loss"] - loss) <= 1e-12 * abs(loss), (step["loss"], loss)
    grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    top = max(float(g.abs().max()) for g in grads.values())
    assert max(float((torch.from_numpy(step["grads"][n]) - g).abs().max()) for n, g in grads.items()) <= 1e-12 * top


def test_processor_samples_convert_to_fcps_format_and_back():
    """Every synthetic document (AnyRes images of 2-4 crops, two single-crop images, videos, an image beside a
    video) as LLaVA-OneVision's processor returns it — padded crops, ``image_sizes``, ``batch_num_images``,
    ``pixel_values_videos`` — converts back to fcp's rows and grid rows exactly, in order of appearance; ids that
    hold fewer placeholders than the pixels need are one MalformedSampleError, as is a video without its tokens."""
    from fcp_data.slots import MalformedSampleError
    from fcp_exec.integrations.hf_data import SyntheticHFDocs
    from fcp_exec.integrations.hf_llava import fcp_inputs, processor_inputs

    config = hf.load_config(CONFIG_56)
    docs = SyntheticHFDocs(config, 12, seed=0)
    kinds = set()
    for i in range(len(docs)):
        s = docs[i]
        if "grid_thw" not in s:
            continue
        proc = {"input_ids": s["input_ids"], **processor_inputs(s)}
        back = fcp_inputs(proc, config)
        assert torch.equal(back["grid_thw"], s["grid_thw"]) and torch.equal(back["pixel_values"], s["pixel_values"])
        kinds.add(tuple(sorted({"image" if t < 0 else "video" for t in s["grid_thw"][:, 0].tolist()})))
        kinds.add(("crops", int(-s["grid_thw"][:, 0].min())) if (s["grid_thw"][:, 0] < 0).any() else ())
    assert {("image",), ("video",), ("image", "video"), ("crops", 1), ("crops", 2)} <= kinds, kinds
    s = docs[1]  # two single-crop images
    proc = {"input_ids": s["input_ids"][:-20], **processor_inputs(s)}
    with pytest.raises(MalformedSampleError, match="placeholder tokens in a row|runs"):
        fcp_inputs(proc, config)
    s = docs[2]  # a video
    with pytest.raises(MalformedSampleError, match="0 images and 0 videos"):
        fcp_inputs({"input_ids": s["input_ids"].clamp(max=1), **processor_inputs(s)}, config)


def test_grid_rows_of_images_are_checked():
    """The collator takes LLaVA-OneVision's signed grid rows (an image is ``(−crops, H, W)``) but still refuses a
    row with t = 0 or a size below 1, with one error naming the sample."""
    from fcp_data.slots import SampleSlot

    collate = hf_collator(hf.load_config(CONFIG))
    ids = torch.tensor([20, 21, 22])
    slot = SampleSlot(index=7, num_tokens=3, length=3, ranks=(0,), cp_rank=0, epoch=0, global_batch=0, micro_batch=0,
                      num_micro_batches=1, num_tokens_global=2)
    for bad in ([[0, 2, 2]], [[-2, 0, 30]]):
        with pytest.raises(ValueError, match=r"sample 7: grid_thw needs h, w >= 1 and t != 0"):
            collate([({"input_ids": ids, "grid_thw": torch.tensor(bad)}, slot)])


def test_mismatched_data_is_one_error(tmp_path):
    cache = str(tmp_path / "cache")
    from fcp_data import bundled_index

    with pytest.raises(ValueError, match="needs its processor's token rule"):
        load_train_data(f"hf:{CONFIG}", str(bundled_index("llava-video", cache)), hf_config=hf.load_config(CONFIG))
    with pytest.raises(ValueError, match="needs its processor's token rule"):
        load_train_data(f"hf:{CONFIG}", str(bundled_index("qwen2.5-vl", cache)), hf_config=hf.load_config(CONFIG))
    with pytest.raises(ValueError, match=r"384-px frames of 196 tokens but the model's vision tower takes 56-px"):
        load_train_data(f"hf:{CONFIG_56}", None, hf_config=hf.load_config(CONFIG_56), cache_dir=cache)


@pytest.mark.parametrize("size", [(480, 640), (1080, 1920), (300, 2000), (2000, 300), (384, 384), (50, 60), (777, 333)])
def test_image_tokens_equal_what_the_processor_writes(size):
    """With LLaVA-OneVision-7B's own geometry (SigLIP 384 px / 14, the 36 AnyRes grid pinpoints, anyres_max_9), the
    rows fcp reserves for an image (the model's own packing, run on zeros) equal the ``<image>`` tokens its processor
    writes for it (``LlavaOnevisionProcessor``'s rule, on a stand-in holding what it reads): one image — AnyRes; one
    of several — one crop + a newline. A difference would put rows where the stock model raises."""
    from types import SimpleNamespace

    from transformers import LlavaOnevisionConfig
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    from fcp_exec.integrations.hf_llava import image_tokens, num_crops

    config = LlavaOnevisionConfig()  # its default grid pinpoints are the checkpoints' (384 … 2304 px, 36 of them)
    stand_in = SimpleNamespace(num_image_tokens=729, vision_aspect_ratio="anyres_max_9", image_token="<image>",
                               vision_feature_select_strategy="full",
                               image_processor=SimpleNamespace(image_grid_pinpoints=config.image_grid_pinpoints))
    stand_in._get_number_of_features = LlavaOnevisionProcessor._get_number_of_features.__get__(stand_in)
    stand_in._get_unpadded_features = LlavaOnevisionProcessor._get_unpadded_features.__get__(stand_in)
    pixels = torch.zeros(1, 1, 3, 384, 384)
    for many in (False, True):
        inputs = {"batch_num_images": [2 if many else 1], "image_sizes": [list(size)], "pixel_values": pixels}
        written = LlavaOnevisionProcessor.replace_image_token(stand_in, inputs, 0).count("<image>")
        assert image_tokens(config, num_crops(config, size, single=not many), size) == written, (size, many)
    # the index's own rule (fcp_data.anyres, no transformers): the same count and crops for an image alone
    from fcp_data import anyres

    assert anyres.image_tokens(size, config.image_grid_pinpoints, 384, 14) == written_single(stand_in, size)
    assert anyres.num_crops(size, config.image_grid_pinpoints, 384) == num_crops(config, size)


def written_single(stand_in, size) -> int:
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    inputs = {"batch_num_images": [1], "image_sizes": [list(size)], "pixel_values": torch.zeros(1, 1, 3, 384, 384)}
    return LlavaOnevisionProcessor.replace_image_token(stand_in, inputs, 0).count("<image>")


def test_the_index_rule_equals_the_models_packing_on_random_sizes():
    """fcp_data.anyres (what `fcp index` counts) against the model's own packing run on zeros, 400 random image sizes
    from 1 to 4,000 px a side under LLaVA-OneVision-7B's geometry: the same crops and tokens every time."""
    import numpy as np
    from transformers import LlavaOnevisionConfig

    from fcp_data import anyres
    from fcp_exec.integrations.hf_llava import image_tokens, num_crops

    config = LlavaOnevisionConfig()
    rng = np.random.default_rng(0)
    for h, w in rng.integers(1, 4001, size=(400, 2)).tolist():
        crops = num_crops(config, (h, w))
        assert anyres.num_crops((h, w), config.image_grid_pinpoints, 384) == crops, (h, w)
        assert anyres.image_tokens((h, w), config.image_grid_pinpoints, 384, 14) == image_tokens(config, crops, (h, w))
