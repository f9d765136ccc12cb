"""TRL's vision prompt-completion lines (``{"images": [...], "prompt": [messages], "completion": [messages]}``, ``fcp
index --spec qwen2.5-vl --prompt-field prompt --chat-field completion``): indexed, read and labelled as TRL's vision
collator (``DataCollatorForVisionLanguageModeling``, ``completion_only_loss``) makes them. Before, every such line was
``unsupported_media``.

Reference, built without fcp's splice code: TRL's own ``prepare_multimodal_messages`` (the images into the prompt's
parts) and ``apply_chat_template`` (the prompt text — the common prefix of the prompt with its generation prompt and
of prompt + completion — and the completion text after it) on Qwen2.5-VL's template as TRL stores it; then what the
Qwen2.5-VL processor does with them in that collator: each ``<|image_pad|>`` of the prompt repeated grid/4 times
(the grid of transformers' ``Qwen2VLImageProcessorPil``) and the prompt tokenised whole, the completion tokenised
apart; labels the completion's tokens. (The processor itself is not built here: it needs torchvision.) A failure means
a vision SFT run trains on other tokens than TRL's, or plans with lengths that are not the samples'.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from test_chat_media import _images
from test_chat_trl_images import write_trl_rows
from test_index_sft import _write

from fcp_data import IndexedDataset
from fcp_data.index import build_index

pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")


def _rows(imgs: list[str]) -> list[dict]:
    """Placeholder parts; string contents (the image goes before the first user turn's text); two images; a system
    prompt and a few-shot turn in the prompt; a completion of two turns."""
    text = lambda s: {"type": "text", "text": s}  # noqa: E731
    user = lambda *parts: {"role": "user", "content": list(parts)}  # noqa: E731
    bot = lambda s: {"role": "assistant", "content": [text(s)]}  # noqa: E731
    return [
        {"id": "parts", "images": [f"media/{imgs[0]}"], "prompt": [user({"type": "image"}, text("What is it?"))],
         "completion": [bot("A cat.")]},
        {"id": "strings", "images": [f"media/{imgs[1]}"], "prompt": [{"role": "user", "content": "Describe it."}],
         "completion": [{"role": "assistant", "content": "Noise, mostly."}]},
        {"id": "two", "images": [f"media/{imgs[0]}", f"media/{imgs[2]}"],
         "prompt": [{"role": "system", "content": [text("Be brief.")]}, user(text("Compare "), {"type": "image"}),
                    bot("Grey."), user({"type": "image"}, text("and this?"))],
         "completion": [bot("Brighter."), user(text("Sure?")), bot("Yes.")]},
        # the prompt ends with the assistant's words, which the completion continues (continue_final_message)
        {"id": "continued", "images": [f"media/{imgs[1]}"], "prompt": [user({"type": "image"}, text("What?")),
                                                                    bot("It is")],
         "completion": [bot(" a cat.")]},
        # tools: TRL's SFTTrainer drops the column from vision data, so no template sees them (chatml would refuse)
        {"id": "tools", "images": [f"media/{imgs[2]}"], "prompt": [user({"type": "image"}, text("Use a tool?"))],
         "completion": [bot("No.")], "tools": [{"type": "function", "function": {"name": "f"}}]},
    ]


def _model(tmp_path):
    """A Qwen2.5-VL folder: the spec's tokenizer with the template's turn markers as tokens (as Qwen's has them),
    the template as Qwen2.5-VL ships it (TRL's stored copy)."""
    import trl.chat_template_utils as t
    from tokenizers import AddedToken, Tokenizer

    from fcp_data.specs import load_spec

    model = tmp_path / "vl"
    model.mkdir()
    tok = Tokenizer.from_file(load_spec("qwen2.5-vl").tokenizer_path)
    tok.add_special_tokens([AddedToken(m, special=True) for m in ("<|im_start|>", "<|im_end|>")])
    tok.save(str(model / "tokenizer.json"))
    (model / "chat_template.jinja").write_text(t.qwen2_5_vl_chat_template)
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    return model


def _trl(hf, proc, row: dict, root) -> tuple[list[int], list[int], list[list[int]]]:
    """``(input_ids, labels, grids)`` as TRL's vision collator makes them for one prompt-completion line."""
    from PIL import Image
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    images = [Image.open(root / p).convert("RGB") for p in row["images"]]
    example = {"prompt": prepare_multimodal_messages(copy.deepcopy(row["prompt"]), images=images),
               "completion": prepare_multimodal_messages(copy.deepcopy(row["completion"]))}
    texts = apply_chat_template(example, hf)
    grids = [proc(images=im, return_tensors="np")["image_grid_thw"][0].tolist() for im in images]
    prompt, k = texts["prompt"], 0
    pieces = prompt.split("<|image_pad|>")
    assert len(pieces) == len(grids) + 1
    prompt = pieces[0] + "".join("<|image_pad|>" * (int(np.prod(g)) // 4) + p for g, p in zip(grids, pieces[1:]))
    head = hf(prompt, add_special_tokens=False)["input_ids"]
    tail = hf(texts["completion"], add_special_tokens=False)["input_ids"]
    k = len(head)
    return head + tail, [-100] * k + tail, grids


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_vision_prompt_completion_lines_equal_trls_collator(tmp_path, ext):
    """Ids, labels, grids and the index's counts equal the reference line by line; the visual layout the sampler
    plans with equals the reader's placeholders at every cut; the pixel values are those of the same image read
    as a plain image sample."""
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessorPil

    from fcp_data.visual_layout import IndexVisualLayout

    imgs = _images(tmp_path, [(60, 90), (112, 84), (56, 112)])
    model = _model(tmp_path)
    rows = write_trl_rows(tmp_path, _rows(imgs), f"pc.{ext}")  # Parquet: Image cells, parts as structs
    manifest, rc = build_index([str(tmp_path / f"pc.{ext}")], "qwen2.5-vl", tmp_path / "idx", prompt_field="prompt",
                               chat_field="completion", chat_template=str(model), progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    data = IndexedDataset(tmp_path / "idx")
    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    img = data.spec.vision["image"]
    proc = Qwen2VLImageProcessorPil(min_pixels=img["min_pixels"], max_pixels=img["max_pixels"])
    build_index([str(tmp_path / "media")], "qwen2.5-vl", tmp_path / "plain", progress=False)
    plain = IndexedDataset(tmp_path / "plain")
    layout, vis = IndexVisualLayout(data.index), torch.tensor(data.placeholder_ids)
    for r in rows:
        ids, labels, grids = _trl(hf, proc, r, tmp_path)
        i = list(data.index.keys).index(r["id"])
        s = data[i]
        assert s["input_ids"].tolist() == ids and int(data.index.num_tokens[i]) == len(ids), r["id"]
        assert s["labels"].tolist() == labels, r["id"]
        assert s["grid_thw"].tolist() == grids, r["id"]
        pixels = [plain[list(plain.index.keys).index(p.split("/")[-1][:-4])]["pixel_values"] for p in r["images"]]
        assert torch.equal(s["pixel_values"], torch.cat(pixels)), r["id"]
        n = len(ids)
        assert all(layout(i, c) == int(torch.isin(s["input_ids"][1:c], vis).sum()) for c in range(1, n + 1, 7))
    two = data[list(data.index.keys).index("two")]
    trained = hf.decode([t for t in two["labels"].tolist() if t != -100])
    assert "Brighter." in trained and "Sure?" in trained and "Grey." not in trained  # the prompt's answer: context


def test_vision_prompt_completion_lines_that_are_no_samples_are_recorded(tmp_path):
    """An image in the completion (TRL's collator takes images in the prompt only): ``unsupported_media``; a prompt
    ending with a system turn (TRL: "Invalid role in the last message"): ``bad_messages``; with
    ``--assistant-only-loss`` (TRL's vision collator refuses it on prompt-completion lines): ``unsupported_media``;
    a count of images that does not match the placeholders: ``media_tag_mismatch``. A line's tools are not read
    (TRL's SFTTrainer drops the column from vision data): the built-in chatml, which refuses tools, takes it."""
    imgs = _images(tmp_path, [(60, 90)])
    text = lambda s: {"type": "text", "text": s}  # noqa: E731
    ok = {"id": "ok", "images": [f"media/{imgs[0]}"],
          "prompt": [{"role": "user", "content": [{"type": "image"}, text("What?")]}],
          "completion": [{"role": "assistant", "content": [text("A cat.")]}]}
    rows = [ok, dict(ok, id="late", prompt=[{"role": "user", "content": [text("What?")]}],
                     completion=[{"role": "assistant", "content": [{"type": "image"}, text("This.")]}]),
            dict(ok, id="count", images=[f"media/{imgs[0]}"] * 2),
            dict(ok, id="system_last", prompt=ok["prompt"] + [{"role": "system", "content": "Be brief."}])]
    _write(tmp_path / "pc.jsonl", rows)
    model = _model(tmp_path)
    manifest, rc = build_index([str(tmp_path / "pc.jsonl")], "qwen2.5-vl", tmp_path / "idx", prompt_field="prompt",
                               chat_field="completion", chat_template=str(model), progress=False, max_error_rate=1)
    assert rc == 0 and manifest["num_samples"] == 1
    assert manifest["errors_by_reason"] == {"unsupported_media": 1, "media_tag_mismatch": 1, "bad_messages": 1}
    manifest, rc = build_index([str(tmp_path / "pc.jsonl")], "qwen2.5-vl", tmp_path / "idx2", prompt_field="prompt",
                               chat_field="completion", chat_template=str(model), progress=False, max_error_rate=1,
                               assistant_only_loss=True)
    assert manifest["num_samples"] == 0 and manifest["errors_by_reason"] == {"unsupported_media": 4}
    _write(tmp_path / "tools.jsonl", [dict(ok, tools=[{"type": "function", "function": {"name": "f"}}])])
    manifest, rc = build_index([str(tmp_path / "tools.jsonl")], "qwen2.5-vl", tmp_path / "idx3", prompt_field="prompt",
                               chat_field="completion", chat_template="chatml", tokenizer=str(model / "tokenizer.json"),
                               progress=False)  # the tools are not read (TRL drops them), so chatml takes the line
    assert rc == 0 and manifest["num_samples"] == 1, manifest["errors_by_reason"]
