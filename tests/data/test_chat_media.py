"""Chat SFT lines with one image or video (``fcp index --chat-field`` on LLaVA / Qwen-VL fine-tuning data).

References, built without fcp's splice code: transformers' ``apply_chat_template`` on a ChatML template with
generation blocks that writes a media part as ONE placeholder token (ids and assistant mask), that token then
replaced by the media's visual block taken from the same file indexed as a plain video/image sample (whose blocks
other tests hold to the processors) — and for images, the block, the pixel values and the grid of transformers'
``Qwen2VLImageProcessorPil`` itself. A failure means a video SFT run trains on other tokens than the model's
processor would give it, or plans with lengths that are not the samples'.
"""

from __future__ import annotations

import json
import tarfile

import numpy as np
import pytest
import torch
from test_index_sft import WORDS, _write

from fcp_cli.main import main as cli_main
from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset
from fcp_data._resources import data_path
from fcp_data.index import build_index, summarize

# ChatML with generation blocks; a media part is one placeholder token, text parts their text
TEMPLATE = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
            "{%- if m.content is string %}{%- set body = m.content %}{%- else %}{%- set ns = namespace(s='') %}"
            "{%- for p in m.content %}{%- if p.type == 'video' %}{%- set ns.s = ns.s + '<|video_pad|>' %}"
            "{%- elif p.type == 'image' %}{%- set ns.s = ns.s + '<|image_pad|>' %}"
            "{%- else %}{%- set ns.s = ns.s + p.text %}{%- endif %}{%- endfor %}{%- set body = ns.s %}{%- endif %}"
            "{%- if m.role == 'assistant' %}{% generation %}{{ body + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
            "{%- else %}{{ body + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}")
PAD = {"video": "<|video_pad|>", "image": "<|image_pad|>"}


def _clips(tmp_path, n: int = 4) -> list[str]:
    with tarfile.open(data_path("samples") / "wds" / "shard-000000.tar") as t:
        names = [m for m in t.getnames() if m.endswith(".mp4")][:n]
        for m in names:
            (tmp_path / "media").mkdir(exist_ok=True)
            (tmp_path / "media" / m).write_bytes(t.extractfile(m).read())
    return names


def _images(tmp_path, sizes) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    (tmp_path / "media").mkdir(exist_ok=True)
    for k, (h, w) in enumerate(sizes):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "media" / f"img{k}.png")
    return [f"img{k}.png" for k in range(len(sizes))]


def _lines(names: list[str], kind: str, seed: int = 0) -> list[tuple[dict, list]]:
    """Per file: (the jsonl line as a dataset spells it, the same conversation as transformers parts). Spellings
    rotate: LLaVA top-level path + tag mid-text in ShareGPT turns; parts with the media between text parts; LLaVA
    without a tag (the media goes before the first user turn's text); a system turn and several rounds."""
    rng = np.random.default_rng(seed)
    say = lambda k: " ".join(rng.choice(WORDS, k))  # noqa: E731
    out = []
    for k, name in enumerate(names):
        pre, post = (say(int(rng.integers(1, 5))) + " ", " " + say(int(rng.integers(1, 8)))) if k % 3 != 2 else \
            ("", say(int(rng.integers(1, 8))))
        answer = say(int(rng.integers(1, 12))) + "."
        system = [{"role": "system", "content": say(4)}] if k % 2 else []
        more = [{"role": "user", "content": say(3) + "?"}, {"role": "assistant", "content": say(5)}] if k % 4 == 3 else []
        parts = [p for p in ({"type": "text", "text": pre}, {"type": kind, kind: f"media/{name}"},
                             {"type": "text", "text": post}) if p.get("text", True)]
        hf = system + [{"role": "user", "content": parts}, {"role": "assistant", "content": answer}] + more
        if k % 3 == 0:  # LLaVA / ShareGPT
            names_ = {"system": "system", "user": "human", "assistant": "gpt"}
            turns = [{"from": names_[m["role"]], "value": m["content"] if isinstance(m["content"], str)
                      else pre + f"<{kind}>" + post} for m in hf]
            line = {"id": f"l{k}", kind: f"media/{name}", "messages": turns}
        elif k % 3 == 1:  # parts
            line = {"id": f"l{k}", "messages": hf}
        else:  # LLaVA without a tag
            line = {"id": f"l{k}", kind: f"media/{name}",
                    "messages": [m if isinstance(m["content"], str) else {"role": "user", "content": post}
                                 for m in hf]}
        out.append((line, hf))
    return out


def _reference(hf_tok, hf_messages: list, kind: str, block: list[int]) -> tuple[list[int], list[int]]:
    return _reference_many(hf_tok, hf_messages, [block])


def _reference_many(hf_tok, hf_messages: list, blocks: list[list[int]]) -> tuple[list[int], list[int]]:
    """transformers' ids and assistant mask with every media part as one placeholder token, the k-th placeholder
    then replaced by ``blocks[k]`` (labels -100 over it)."""
    ref = hf_tok.apply_chat_template(hf_messages, chat_template=TEMPLATE, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
    pads = {hf_tok.convert_tokens_to_ids(t) for t in PAD.values()}
    ids, labels, k = [], [], 0
    for t, m in zip(ref["input_ids"], ref["assistant_masks"]):
        if t in pads:
            ids += blocks[k]
            labels += [-100] * len(blocks[k])
            k += 1
        else:
            ids.append(t)
            labels.append(t if m else -100)
    assert k == len(blocks)
    return ids, labels


@pytest.mark.parametrize("spec", ["qwen2.5-vl", "qwen3-vl", "internvl3", "llava-video", "llava-onevision"])
def test_video_chat_samples_equal_the_reference(tmp_path, spec):
    """Each spelling of a video conversation, with the built-in chatml template and with the model's template
    (generation blocks) from a file: ids and labels equal the reference; pixel values, grid and Qwen's seconds per
    grid equal the same file read as a plain video sample; the index counts the ids and placeholders exactly."""
    transformers = pytest.importorskip("transformers")
    names = _clips(tmp_path)
    plain, _ = build_index([str(tmp_path / "media")], spec, tmp_path / "plain", progress=False)
    plain = IndexedDataset(tmp_path / "plain")
    lines = _lines(names, "video")
    _write(tmp_path / "chat.jsonl", [line for line, _ in lines])
    (tmp_path / "tpl.jinja").write_text(TEMPLATE)
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=plain.spec.tokenizer_path)
    eos = [] if plain.eos_token_id is None else [plain.eos_token_id]
    for template in ("chatml", str(tmp_path / "tpl.jinja")):
        out = tmp_path / f"idx{len(template)}"
        manifest, rc = build_index([str(tmp_path / "chat.jsonl")], spec, out, chat_field="messages",
                                   chat_template=template, progress=False)
        assert rc == 0 and manifest["num_samples"] == len(lines), manifest["errors_by_reason"]
        data = IndexedDataset(out)
        assert data.has_labels
        for (line, hf_messages), name in zip(lines, names):
            i, j = list(data.index.keys).index(line["id"]), list(plain.index.keys).index(name[:-4])
            s, p = data[i], plain[j]
            block = p["input_ids"].tolist()[: len(p["input_ids"]) - len(eos)]
            ids, labels = _reference(hf_tok, hf_messages, "video", block)
            assert s["input_ids"].tolist() == ids and s["labels"].tolist() == labels, (template, line["id"])
            assert int(data.index.num_tokens[i]) == len(ids)
            assert data.num_visual_tokens(s) == int(data.index.num_visual_tokens[i]) == int(plain.index.num_visual_tokens[j])
            assert set(s) == set(p) | {"labels"}
            for key in set(p) - {"input_ids"}:
                assert torch.equal(s[key], p[key]), (key, line["id"])


def test_image_chat_equals_transformers_processor(tmp_path):
    """Qwen2-VL image conversations: the visual block is <|vision_start|>, grid/4 <|image_pad|>, <|vision_end|>
    with the grid of transformers' Qwen2VLImageProcessorPil, ids and labels the reference around that block; the
    pixel values those of the same file read as a plain image sample, and the processor's own (1e-5) where no
    resize is needed (the reader resizes like torchvision's bicubic, the PIL processor like PIL)."""
    transformers = pytest.importorskip("transformers")
    from PIL import Image

    sizes = [(60, 90), (224, 224), (33, 517), (400, 300), (56, 112), (90, 60)]
    names = _images(tmp_path, sizes)
    lines = _lines(names, "image", seed=1)
    _write(tmp_path / "chat.jsonl", [line for line, _ in lines])
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "qwen2-vl", tmp_path / "idx", chat_field="messages",
                               progress=False)
    assert rc == 0 and manifest["num_samples"] == len(lines), manifest["errors_by_reason"]
    data = IndexedDataset(tmp_path / "idx")
    build_index([str(tmp_path / "media")], "qwen2-vl", tmp_path / "plain", progress=False)
    plain = IndexedDataset(tmp_path / "plain")
    img = data.spec.vision["image"]
    proc = transformers.Qwen2VLImageProcessorPil(min_pixels=img["min_pixels"], max_pixels=img["max_pixels"])
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=data.spec.tokenizer_path)
    tid = hf_tok.convert_tokens_to_ids
    exact = 0
    for (line, hf_messages), name in zip(lines, names):
        ref = proc(images=Image.open(tmp_path / "media" / name).convert("RGB"), return_tensors="np")
        grid = ref["image_grid_thw"][0]
        block = [tid("<|vision_start|>")] + [tid("<|image_pad|>")] * (int(np.prod(grid)) // 4) + [tid("<|vision_end|>")]
        ids, labels = _reference(hf_tok, hf_messages, "image", block)
        i = list(data.index.keys).index(line["id"])
        s = data[i]
        assert s["input_ids"].tolist() == ids and s["labels"].tolist() == labels, line["id"]
        assert int(data.index.num_tokens[i]) == len(ids)
        assert s["grid_thw"].tolist() == [grid.tolist()]
        assert torch.equal(s["pixel_values"], plain[list(plain.index.keys).index(name[:-4])]["pixel_values"])
        if (int(grid[1]) * 14, int(grid[2]) * 14) == Image.open(tmp_path / "media" / name).size[::-1]:
            np.testing.assert_allclose(s["pixel_values"].numpy(), ref["pixel_values"], rtol=0, atol=1e-5)
            exact += 1
    assert exact == 2  # 224x224 and 56x112


def test_media_chat_lines_that_are_no_sample_are_recorded(tmp_path):
    """One reason per bad line, the rest indexed: a missing file (alone, or one of two), a URL, more tags than
    entries, more than MAX_MEDIA media, a file that is not a video, a mark character in the text, a part without a
    path; a relative path under --media-root, found again by the reader after the data moved (``roots``)."""
    names = _clips(tmp_path, 2)
    (tmp_path / "media" / "junk.mp4").write_bytes(b"\x00not a video" * 50)
    ok = {"id": "ok", "video": f"media/{names[0]}", "messages": [{"role": "user", "content": "<video> what?"},
                                                                 {"role": "assistant", "content": "a clip"}]}
    turns = ok["messages"]
    bad = [{"id": "missing", "video": "media/nope.mp4", "messages": turns},
           {"id": "url", "video": "https://x.org/a.mp4", "messages": turns},
           {"id": "both", "video": f"media/{names[0]}", "image": "a.png", "messages": turns},  # a.png is missing
           {"id": "many", "messages": [{"role": "user", "content": [{"type": "video", "video": f"media/{names[0]}"}]
                                        * 257}, turns[1]]},
           {"id": "twotags", "video": f"media/{names[0]}", "messages": [{"role": "user", "content": "<video><video>"},
                                                                        turns[1]]},
           {"id": "junk", "video": "media/junk.mp4", "messages": turns},
           {"id": "mark", "video": f"media/{names[0]}", "messages": [{"role": "user", "content": "a\U000f0001"},
                                                                     turns[1]]},
           {"id": "nopath", "messages": [{"role": "user", "content": [{"type": "video"}]}, turns[1]]}]
    alone = {"id": "alone", "video": f"media/{names[1]}", "messages": [{"role": "user", "content": None}, turns[1]]}
    in_part = {"id": "inpart", "video": f"media/{names[0]}", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<video> what?"}]}, turns[1]]}  # the tag in a text part
    part_and_key = {"id": "partandkey", "video": f"media/{names[0]}",  # two videos: the untagged entry goes first
                    "messages": [{"role": "user", "content": [{"type": "video", "video": f"media/{names[1]}"}]},
                                 turns[1]]}
    _write(tmp_path / "chat.jsonl", [ok, alone, in_part, part_and_key] + bad)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "idx", chat_field="messages",
                               progress=False, max_error_rate=1.0)
    assert rc == 0 and manifest["num_samples"] == 4 and manifest["kinds"] == {"video": 4}
    assert summarize(manifest).startswith("indexed 4 samples (4 video) of 12 seen, 8 errors")
    data = IndexedDataset(tmp_path / "idx")
    same = [data[list(data.index.keys).index(k)] for k in ("ok", "inpart")]
    assert torch.equal(same[0]["input_ids"], same[1]["input_ids"])  # the same conversation, spelled two ways
    assert manifest["errors_by_reason"] == {"bad_messages": 2, "corrupt_video": 1, "media_tag_mismatch": 1,
                                            "missing_media": 2, "too_many_media": 1, "unsupported_media": 1}
    manifest, _ = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "idxt", chat_field="messages",
                              progress=False, max_error_rate=1.0)
    assert manifest["num_samples"] == 0 and manifest["errors_by_reason"] == {"bad_messages": 12}  # a text spec
    # --media-root: paths relative to another folder, and the reader finds them there too
    (tmp_path / "lines").mkdir()
    _write(tmp_path / "lines" / "chat.jsonl", [ok])
    rc = cli_main(["index", str(tmp_path / "lines" / "chat.jsonl"), "--spec", "qwen2.5-vl", "--chat-field",
                   "messages", "--media-root", str(tmp_path), "--out", str(tmp_path / "idxr"), "--no-progress"])
    first = IndexedDataset(tmp_path / "idxr")[0]
    assert rc == 0 and len(first["input_ids"]) > 100
    # moved with the jsonl: ``roots`` relocates both (once: the new prefix starts with the old one)
    (tmp_path / "moved").mkdir()
    for d in ("lines", "media"):
        (tmp_path / d).rename(tmp_path / "moved" / d)
    moved_data = IndexedDataset(tmp_path / "idxr", roots={str(tmp_path.resolve()): str((tmp_path / "moved").resolve())})
    moved = moved_data[0]
    assert all(torch.equal(first[k], moved[k]) for k in first)
    # the sampler given the dataset itself places the conversation's visual block through the same roots
    sampler = FCPSampler(moved_data, num_ranks=1, rank=0, global_batch_size=1, prefetch=0,
                         cost_model=CostModel.preset("qwen3-1.7b", "h100"))
    assert len(list(sampler)) == 1
    vis = torch.tensor(moved_data.placeholder_ids)
    assert sampler.visual_layout(0, len(moved["input_ids"])) == int(torch.isin(moved["input_ids"][1:], vis).sum()) > 0
    with pytest.raises(ValueError, match="is not a folder"):
        build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "x", chat_field="messages",
                    media_root=str(tmp_path / "nope"), progress=False)
    with pytest.raises(ValueError, match="give both"):
        build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "x", media_root=str(tmp_path),
                    progress=False)


def test_media_chat_labels_through_sampler_and_collator(tmp_path):
    """An epoch of video conversations on 2 ranks (CP groups cut through visual blocks): FCPCollator(sample_labels=
    True) counts per global batch exactly the samples' trained labels after the shift, never a placeholder."""
    names = _clips(tmp_path, 4)
    lines = [line for line, _ in _lines(names * 3, "video", seed=5)]
    for k, line in enumerate(lines):
        line["id"] = f"x{k}"
    _write(tmp_path / "chat.jsonl", lines)
    build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "idx", chat_field="messages", progress=False)
    data = IndexedDataset(tmp_path / "idx")
    vis = torch.tensor(data.placeholder_ids)
    want = [int((data[i]["labels"][1:] != -100).sum()) for i in range(len(data))]
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=1500)
    got: dict[int, int] = {}
    members: dict[int, set[int]] = {}
    for rank in range(2):
        sampler = FCPSampler(data.index, num_ranks=2, rank=rank, cost_model=cost, global_batch_size=4, seed=0,
                             prefetch=0)
        collate = FCPCollator(sample_labels=True, pad_token_id=data.pad_token_id, visual_token_id=data.placeholder_ids)
        for lst in sampler:
            b = collate(FCPDataset(data).__getitems__(lst))
            assert not bool(torch.isin(b["labels"], vis).any())
            got[b["global_batch"]] = got.get(b["global_batch"], 0) + b["num_label_tokens_local"]
            members.setdefault(b["global_batch"], set()).update(b["sample_indices"])
    assert sorted(i for s in members.values() for i in s) == list(range(len(data)))
    assert got == {g: sum(want[i] for i in idx) for g, idx in members.items()}


@pytest.mark.parametrize("spec", ["qwen2.5-vl", "qwen3-vl", "internvl3"])
def test_several_media_in_one_conversation_equal_the_reference(tmp_path, spec):
    """Images and videos together: parts in several turns, a LLaVA list with one tag per entry, an untagged list
    (before the first user turn's text), tagged videos and images whose tags set the order. ids and labels equal
    the reference with each placeholder replaced by the plain sample's block; pixel values, grid rows and Qwen's
    seconds per grid are the plain samples' concatenated in order; the index counts every token."""
    transformers = pytest.importorskip("transformers")
    clips = _clips(tmp_path, 2)
    imgs = _images(tmp_path, [(60, 90), (112, 84)])
    build_index([str(tmp_path / "media")], spec, tmp_path / "plain", progress=False)
    plain = IndexedDataset(tmp_path / "plain")
    p = {n: plain[list(plain.index.keys).index(n.rsplit(".", 1)[0])] for n in clips + imgs}
    eos = 0 if plain.eos_token_id is None else 1
    v0, v1, i0, i1 = (f"media/{n}" for n in clips + imgs)
    part = lambda kind, path: {"type": kind, kind: path}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    answer = {"role": "assistant", "content": "they differ."}
    cases = [  # (jsonl line, transformers messages, media in order)
        ({"messages": [{"role": "user", "content": [part("image", i0), text(" compare "), part("video", v0),
                                                    text(" and "), part("image", i1)]}, answer,
                       {"role": "user", "content": [part("video", v1), text("now?")]}, answer]},
         None, [imgs[0], clips[0], imgs[1], clips[1]]),
        ({"image": [i0, i1], "messages": [{"role": "user", "content": "first <image> then"}, answer,
                                          {"role": "user", "content": "<image>\nsecond"}, answer]},
         [{"role": "user", "content": [text("first "), part("image", i0), text(" then")]}, answer,
          {"role": "user", "content": [part("image", i1), text("\nsecond")]}, answer], [imgs[0], imgs[1]]),
        ({"image": [i0, i1], "messages": [{"role": "user", "content": "what differs?"}, answer]},
         [{"role": "user", "content": [part("image", i0), part("image", i1), text("what differs?")]}, answer],
         [imgs[0], imgs[1]]),
        ({"video": [v1], "image": [i1], "messages": [{"role": "user", "content": "<image> vs <video>?"}, answer]},
         [{"role": "user", "content": [part("image", i1), text(" vs "), part("video", v1), text("?")]}, answer],
         [imgs[1], clips[1]]),
    ]
    lines = [dict(line, id=f"m{k}") for k, (line, _, _) in enumerate(cases)]
    _write(tmp_path / "chat.jsonl", lines)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], spec, tmp_path / "idx", chat_field="messages",
                               progress=False)
    assert rc == 0 and manifest["num_samples"] == len(cases), manifest["errors_by_reason"]
    data = IndexedDataset(tmp_path / "idx")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=plain.spec.tokenizer_path)
    for k, (line, hf_messages, order) in enumerate(cases):
        i = list(data.index.keys).index(f"m{k}")
        s = data[i]
        blocks = [p[n]["input_ids"].tolist()[: len(p[n]["input_ids"]) - eos] for n in order]
        ids, labels = _reference_many(hf_tok, hf_messages or line["messages"], blocks)
        assert s["input_ids"].tolist() == ids and s["labels"].tolist() == labels, k
        assert int(data.index.num_tokens[i]) == len(ids) and data.num_visual_tokens(s) == int(data.index.num_visual_tokens[i])
        assert int(data.index.num_visual_tokens[i]) == sum(int(plain.index.num_visual_tokens[
            list(plain.index.keys).index(n.rsplit(".", 1)[0])]) for n in order)
        for key in ("pixel_values", "grid_thw", "second_per_grid_ts"):
            parts = [p[n][key] for n in order if key in p[n]]
            assert (key in s) == bool(parts), (k, key)
            if parts:
                assert torch.equal(s[key], torch.cat(parts)), (k, key)


def test_damaged_images_are_errors_at_index_time(tmp_path):
    """A PNG/JPEG cut after a valid header passed the header probe and then failed in the reader, ending a training
    run: it is now ``corrupt_image`` when indexing (as a folder sample and in a conversation); an image given as a
    line's video is ``corrupt_video``. Every indexed sample reads back."""
    import io

    from PIL import Image

    names = _images(tmp_path, [(64, 96)])
    good = (tmp_path / "media" / names[0]).read_bytes()
    jpg = io.BytesIO()
    Image.open(io.BytesIO(good)).save(jpg, format="JPEG")
    (tmp_path / "media" / "cutp.png").write_bytes(good[: len(good) // 2])
    (tmp_path / "media" / "cutj.jpg").write_bytes(jpg.getvalue()[: len(jpg.getvalue()) // 2])
    manifest, _ = build_index([str(tmp_path / "media")], "qwen2-vl", tmp_path / "plain", progress=False,
                              max_error_rate=1.0)
    assert manifest["num_samples"] == 1 and manifest["errors_by_reason"] == {"corrupt_image": 2}
    turns = [{"role": "user", "content": "<image> what?"}, {"role": "assistant", "content": "noise"}]
    lines = [{"id": "ok", "image": f"media/{names[0]}", "messages": turns},
             {"id": "cutpng", "image": "media/cutp.png", "messages": turns},
             {"id": "cutjpg", "image": "media/cutj.jpg", "messages": turns},
             {"id": "asvideo", "video": f"media/{names[0]}", "messages": [dict(turns[0], content="<video>"), turns[1]]}]
    _write(tmp_path / "chat.jsonl", lines)
    manifest, _ = build_index([str(tmp_path / "chat.jsonl")], "qwen2-vl", tmp_path / "idx", chat_field="messages",
                              progress=False, max_error_rate=1.0)
    assert manifest["num_samples"] == 1
    assert manifest["errors_by_reason"] == {"corrupt_image": 2, "corrupt_video": 1}
    for d in ("plain", "idx"):
        data = IndexedDataset(tmp_path / d)
        assert all(len(data[i]["input_ids"]) == int(data.index.num_tokens[i]) for i in range(len(data)))


@pytest.mark.parametrize("spec", ["qwen3-vl", "llava-video"])
def test_visual_layout_of_conversations_matches_the_reader(tmp_path, spec):
    """The sampler's visual layout (placeholders among positions 1..n-1 of a sample cut at n: its masked loss
    denominator) equals the count in the reader's own ids, for every cut, on one- and several-media
    conversations — media first (llava-video's block starts with placeholders) or after text."""
    from fcp_data.visual_layout import IndexVisualLayout

    clips = _clips(tmp_path, 2)
    imgs = _images(tmp_path, [(60, 90), (112, 84)])
    answer = {"role": "assistant", "content": "yes."}
    lines = [{"id": "one", "video": f"media/{clips[0]}", "messages": [{"role": "user", "content": "see <video>"},
                                                                       answer]},
             {"id": "first", "messages": [{"role": "user", "content": [{"type": "video", "video": f"media/{clips[1]}"},
                                                                       {"type": "image", "image": f"media/{imgs[0]}"}]},
                                          answer]},
             {"id": "many", "image": [f"media/{imgs[0]}", f"media/{imgs[1]}"],
              "messages": [{"role": "user", "content": "a <image> b <image> c"}, answer]}]
    _write(tmp_path / "chat.jsonl", lines)
    for template in ("chatml", str(tmp_path / "bare.jinja")):
        (tmp_path / "bare.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")  # no header
        out = tmp_path / f"idx{len(template)}"
        build_index([str(tmp_path / "chat.jsonl")], spec, out, chat_field="messages", chat_template=template,
                    progress=False)
        data = IndexedDataset(out)
        layout = IndexVisualLayout(data.index)
        vis = torch.tensor(data.placeholder_ids)
        for i in range(len(data)):
            ids = data[i]["input_ids"]
            for n in sorted({1, 2, 3, 5, 17, 40, 100, 300, len(ids) // 2, len(ids) - 1, len(ids)}):
                if n <= len(ids):
                    assert layout(i, n) == int(torch.isin(ids[1:n], vis).sum()), (template, data.index.keys[i], n)
