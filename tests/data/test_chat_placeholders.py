"""Placeholder tokens written by a conversation's text, LLaVA tags, and the pad/EOS tokens of a model's own tokenizer.

References, computed without fcp's splice code: a video's visual-token count from its own frames (PyAV's frame
count and rate under LLaVA-NeXT's sampling rule × 210 tokens per frame; Qwen's grid t·h·w / merge²), the same
conversation spelled with LLaVA's ``<video>`` tag (its ids held to transformers' chat template by
``test_chat_media.py``), and ``transformers.AutoTokenizer`` on the model folder (its ``pad_token_id`` /
``eos_token_id``, ``apply_chat_template``). A failure means a video SFT run trains with one visual position more
than its pixels give (silently wrong features, or an error mid-training), or an index built with a model's own
tokenizer cannot be read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_index_sft import CHATML, LLAMA3, WORDS, _write, assert_sample_equals_hf
from test_media_hostile import make_video

from fcp_cli.main import main as cli_main
from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset
from fcp_data._resources import data_path
from fcp_data.index import build_index

ANSWER = {"from": "gpt", "value": "A grey square brightens."}


def _video(tmp_path, name: str = "v.mp4", n: int = 24, fps: int = 8):
    (tmp_path / "media").mkdir(exist_ok=True)
    return make_video(tmp_path / "media" / name, n, fps=fps)


def _frames(path) -> tuple[int, float]:
    """The video's own frame count and average rate, decoded by PyAV."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        n = sum(1 for _ in c.decode(s))
        return n, float(s.average_rate)


def _placeholders(data: IndexedDataset, s: dict) -> tuple[int, list[tuple[int, int]]]:
    """Placeholder count and runs ``(start, length)`` of a sample's ids."""
    hit = torch.isin(s["input_ids"], torch.tensor(data.placeholder_ids)).tolist() + [False]
    runs, start = [], None
    for k, h in enumerate(hit):
        if h and start is None:
            start = k
        elif not h and start is not None:
            runs.append((start, k - start))
            start = None
    return sum(n for _, n in runs), runs


def _expected_visual_tokens(spec: str, video, s: dict) -> int:
    n, fps = _frames(video)
    if spec == "llava-video":  # LLaVA-NeXT load_video: every round(avg_fps / 1 fps)-th frame, 210 tokens each
        frames = len(range(0, n, max(1, round(fps))))
        assert s["pixel_values"].shape[0] == frames
        return frames * 210
    t, h, w = s["grid_thw"][0].tolist()  # Qwen: patches t·h·w merged 2×2
    assert t == (min(max(n / fps * 2, 4), n) // 2 * 2) // 2  # qwen-vl-utils: frames at 2 fps, pairs per patch
    return t * h * w // 4


@pytest.mark.parametrize("spec", ["llava-video", "qwen2.5-vl"])
def test_llava_video_image_tag_places_the_video_once(tmp_path, spec):
    """LLaVA-Video-178K marks a video's place with ``<image>``: the sample equals the same line with ``<video>``
    (ids, labels, pixels), its placeholders are exactly the video's own count in one run, none trained. Before, the
    tag was a second placeholder (llava-video: 631 for 630) or literal text after a prepended video (Qwen)."""
    video = _video(tmp_path)
    lines = [{"id": tag, "video": "media/v.mp4", "conversations": [
        {"from": "human", "value": f"<{tag}>\nWhat happens in the video?"}, ANSWER]} for tag in ("image", "video")]
    _write(tmp_path / "chat.jsonl", lines)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], spec, tmp_path / "idx", chat_field="conversations",
                               progress=False)
    assert rc == 0 and manifest["num_samples"] == 2, manifest["errors_by_reason"]
    data = IndexedDataset(tmp_path / "idx")
    keys = list(data.index.keys)
    tagged_image, tagged_video = (data[keys.index(k)] for k in ("image", "video"))
    for k in tagged_video:
        assert torch.equal(tagged_image[k], tagged_video[k]), k
    want = _expected_visual_tokens(spec, video, tagged_image)
    count, runs = _placeholders(data, tagged_image)
    assert count == want == int(data.index.num_visual_tokens[keys.index("image")]), (count, want)
    assert len(runs) == 1 and runs[0][1] == want
    assert int(data.index.num_tokens[keys.index("image")]) == len(tagged_image["input_ids"])
    labels = tagged_image["labels"]
    assert not bool(torch.isin(labels, torch.tensor(data.placeholder_ids)).any()) and int((labels != -100).sum()) > 0


def _image(tmp_path, name: str = "a.png", h: int = 56, w: int = 84) -> str:
    from PIL import Image

    (tmp_path / "media").mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / "media" / name)
    return f"media/{name}"


def _conv(text: str) -> list[dict]:
    return [{"from": "human", "value": text}, ANSWER]


@pytest.mark.parametrize("spec", ["qwen2.5-vl", "llava-video"])
def test_placeholders_in_text_and_stray_tags_are_recorded(tmp_path, spec):
    """One reason per line, never an extra placeholder: a literal placeholder token in the text (with an image,
    and in a text-only line), an ``<image>`` tag whose ``"image"`` is null, a ``<video>`` tag on a line of images
    only, an empty path. Every indexed sample's placeholders equal its grid's count (Qwen: t·h·w/4; LLaVA-Video:
    729 per image) and a Qwen batch collates with M-RoPE."""
    img = _image(tmp_path)
    literal = "<|image_pad|>" if spec == "qwen2.5-vl" else "<image>"
    parts = [{"role": "user", "content": [{"type": "image", "image": img}, {"type": "text", "text": f"is {literal}?"}]},
             {"role": "assistant", "content": "no"}]
    lines = [{"id": "ok", "image": img, "conversations": _conv("<image>\nWhat is it?")},
             {"id": "pad_with_image", "image": img, "conversations": _conv(f"<image>\nWhat is {literal} here?")},
             {"id": "pad_in_part", "conversations": parts},
             {"id": "pad_text_only", "conversations": _conv(f"What is {literal}?")},
             {"id": "tag_image_null", "image": None, "conversations": _conv("<image>\nDescribe it.")},
             {"id": "video_tag_images", "image": img, "conversations": _conv("<video>\nDescribe.")},
             {"id": "empty_path", "image": "", "conversations": _conv("Hello?")}]
    _write(tmp_path / "chat.jsonl", lines)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], spec, tmp_path / "idx", chat_field="conversations",
                               progress=False, max_error_rate=1.0)
    errors = {json.loads(x)["key"]: json.loads(x) for x in (tmp_path / "idx" / "errors.jsonl").read_text().splitlines()}
    reasons = {k: e["reason"] for k, e in errors.items()}
    with_image = "placeholder_in_text" if spec == "qwen2.5-vl" else "media_tag_mismatch"  # llava: a 2nd <image> tag
    assert reasons == {"pad_with_image": with_image, "pad_in_part": "placeholder_in_text",
                       "pad_text_only": "placeholder_in_text", "tag_image_null": "media_tag_mismatch",
                       "video_tag_images": "media_tag_mismatch", "empty_path": "bad_messages"}, reasons
    assert "empty string, not a file path" in errors["empty_path"]["detail"]
    assert literal in errors["pad_in_part"]["detail"] and "<video>" in errors["video_tag_images"]["detail"]
    data = IndexedDataset(tmp_path / "idx")
    assert list(data.index.keys) == ["ok"]
    s = data[0]
    count, runs = _placeholders(data, s)
    if spec == "qwen2.5-vl":
        t, h, w = s["grid_thw"][0].tolist()
        assert count == t * h * w // 4 == (56 // 28) * (84 // 28)  # 56x84 needs no resize: 2x3 merged patches
        collate = FCPCollator(sample_labels=True, pad_token_id=data.pad_token_id, visual_token_id=data.placeholder_ids,
                              mrope=True)
        sampler = FCPSampler(data, num_ranks=1, rank=0, global_batch_size=1, seed=0, prefetch=0,
                             cost_model=CostModel.preset("qwen3-1.7b", "h100"))
        for lst in sampler:
            assert collate(FCPDataset(data).__getitems__(lst))["sample_indices"] == (0,)
    else:
        assert count == 729 and len(runs) == 1


def test_reader_refuses_a_placeholder_in_text_of_an_older_index(tmp_path, monkeypatch):
    """An index built before the check holds the line with a literal ``<|image_pad|>`` (7 placeholders for a grid
    of 6): reading it is now a ``placeholder_in_text`` error, which FCPDataset records and skips, instead of a
    sample the M-RoPE collator refuses mid-training."""
    import fcp_data.chat_media as chat_media
    from fcp_data.read_errors import SkippedSample
    from fcp_data.slots import MicroBatchMeta, SampleSlot

    img = _image(tmp_path)
    _write(tmp_path / "chat.jsonl", [{"id": "pad", "image": img, "conversations": _conv("<image> is <|image_pad|>?")}])
    monkeypatch.setattr(chat_media, "check_text_ids", lambda spec, ids: None, raising=False)  # an older fcp
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "idx",
                               chat_field="conversations", progress=False)
    monkeypatch.undo()
    assert rc == 0 and manifest["num_samples"] == 1
    data = IndexedDataset(tmp_path / "idx")
    with pytest.raises(ValueError, match=r"holds 1 '<\|image_pad\|>' token"):
        data[0]
    n = int(data.index.num_tokens[0])
    meta = MicroBatchMeta(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=n - 1,
                          ranks=(0,), cp_rank=0)
    got, _ = FCPDataset(data, max_consecutive_errors=5)[SampleSlot(index=0, num_tokens=n, length=n, meta=meta)]
    assert isinstance(got, SkippedSample) and "image_pad" in got.detail


# ------------------------------------------------------------------ a model's own tokenizer (no <|pad|>)

def _model_folder(tmp_path, name: str, drop: set[str], add: tuple[str, ...], config: dict | None,
                  template: str | None = None):
    """A model folder as the Hub ships it: tokenizer.json (the bundled tiny BPE without ``drop``, with ``add`` as
    special tokens), tokenizer_config.json (``config``, when given) and chat_template.jinja."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(data_path("tokenizers") / "tiny-bpe.json"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in add])
    raw = json.loads(tok.to_str())
    raw["added_tokens"] = [a for a in raw["added_tokens"] if a["content"] not in drop]
    for t in drop:
        raw["model"]["vocab"].pop(t)
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer.json").write_text(json.dumps(raw), encoding="utf-8")
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config}))
    if template is not None:
        (d / "chat_template.jinja").write_text(template)
    return d


def _conversations(n: int) -> list[dict]:
    rng = np.random.default_rng(3)
    say = lambda k: " ".join(rng.choice(WORDS, k))  # noqa: E731
    return [{"id": f"c{i}", "messages": [{"role": "user", "content": say(int(rng.integers(1, 9)))},
                                         {"role": "assistant", "content": say(int(rng.integers(1, 12)))}]}
            for i in range(n)]


def _collated_labels(data: IndexedDataset) -> int:
    """Label tokens an epoch on one rank trains (FCPSampler + FCPCollator(sample_labels=True)), checked against the
    samples' own; the pad id the collator packs with is the dataset's."""
    want = sum(int((data[i]["labels"][1:] != -100).sum()) for i in range(len(data)))
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=512)
    got = 0
    for lst in FCPSampler(data.index, num_ranks=1, rank=0, cost_model=cost, global_batch_size=4, seed=0, prefetch=0):
        b = FCPCollator(sample_labels=True, pad_token_id=data.pad_token_id)(FCPDataset(data).__getitems__(lst))
        got += b["num_label_tokens_local"]
    assert got == want > 0
    return got


def test_qwen_like_model_folder_without_pad_indexes_reads_and_trains(tmp_path, capsys):
    """The README's flow ``--spec text --chat-template MODEL_DIR`` with a Qwen-like folder (``<|endoftext|>``,
    ``<|im_start|>``, ``<|im_end|>``, no ``<|pad|>``): the index reads (before: "token '<|pad|>' is not in ...;
    add it as a special token"), pads with the model's own pad token (transformers' ``pad_token_id``), its ids and
    labels equal transformers' chat template, an epoch collates every label, and ``fcp train`` trains a step on it."""
    transformers = pytest.importorskip("transformers")
    model = _model_folder(tmp_path, "qwen", {"<|pad|>"}, ("<|im_start|>", "<|im_end|>"),
                          {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, CHATML)
    rows = _conversations(8)
    _write(tmp_path / "chat.jsonl", rows)
    rc = cli_main(["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--chat-field", "messages",
                   "--chat-template", str(model), "--out", str(tmp_path / "idx"), "--no-progress"])
    assert rc == 0
    hf = transformers.AutoTokenizer.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / "idx")
    assert data.pad_token_id == hf.pad_token_id == hf.convert_tokens_to_ids("<|endoftext|>")
    for r in rows:
        assert_sample_equals_hf(data, r, hf, CHATML)
    _collated_labels(data)
    config = json.loads((Path(__file__).resolve().parents[2] / "examples" / "configs" / "qwen3-tiny.json").read_text())
    (tmp_path / "qwen3.json").write_text(json.dumps({**config, "vocab_size": 2048}))  # the folder's ids reach 2002
    capsys.readouterr()
    assert cli_main(["train", "--model", f"hf:{tmp_path / 'qwen3.json'}", "--data", str(tmp_path / "idx"), "--nproc",
                     "1", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "done: 1 steps" in out and "skipped" not in out, out


def test_llama_like_model_folder_appends_the_models_eos(tmp_path):
    """A Llama-3-like folder (neither ``<|endoftext|>`` nor ``<|pad|>``; eos ``<|eot_id|>``, no pad token):
    prompt/response lines index (before: every line of the file one ``shard_failed``, exit 1) and read as prompt
    ids, response ids and the model's EOS (transformers' ``eos_token_id``), padded with that EOS; conversations
    under the llama3 template read as transformers renders them. The EOS read from tokenizer_config.json is part of
    the index's identity: another one there afterwards is refused, not appended silently."""
    transformers = pytest.importorskip("transformers")
    model = _model_folder(tmp_path, "llama", {"<|pad|>", "<|endoftext|>"},
                          ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                           "<|end_of_text|>"), {"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"})
    hf = transformers.AutoTokenizer.from_pretrained(str(model))
    rows = [{"id": f"p{i}", "prompt": " ".join(WORDS[i:i + 3]), "text": " ".join(WORDS[i + 3:i + 9])} for i in range(6)]
    _write(tmp_path / "sft.jsonl", rows)
    rc = cli_main(["index", str(tmp_path / "sft.jsonl"), "--spec", "text", "--prompt-field", "prompt", "--tokenizer",
                   str(model / "tokenizer.json"), "--out", str(tmp_path / "idx"), "--no-progress"])
    assert rc == 0
    data = IndexedDataset(tmp_path / "idx")
    assert hf.pad_token_id is None and data.pad_token_id == hf.eos_token_id == hf.convert_tokens_to_ids("<|eot_id|>")
    for i, r in enumerate(rows):
        p, a = hf.encode(r["prompt"], add_special_tokens=False), hf.encode(r["text"], add_special_tokens=False)
        s = data[list(data.index.keys).index(r["id"])]
        assert s["input_ids"].tolist() == p + a + [hf.eos_token_id] and s["labels"].tolist() == [-100] * len(p) + a + [
            hf.eos_token_id] and int(data.index.num_tokens[i]) == len(p) + len(a) + 1, r["id"]
    _collated_labels(data)
    chats = _conversations(4)
    _write(tmp_path / "chat.jsonl", chats)
    assert cli_main(["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--chat-field", "messages",
                     "--chat-template", "llama3", "--tokenizer", str(model / "tokenizer.json"), "--out",
                     str(tmp_path / "chat_idx"), "--no-progress"]) == 0
    chat = IndexedDataset(tmp_path / "chat_idx")
    for r in chats:
        assert_sample_equals_hf(chat, r, hf, LLAMA3)
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    from fcp_data import text_tokens

    text_tokens.resolve.cache_clear()  # a new process would read the file again
    with pytest.raises(ValueError, match="differs from the one the index was built with"):
        IndexedDataset(tmp_path / "idx")


def test_a_tokenizer_without_eos_or_pad_is_refused_at_index_time(tmp_path, capsys):
    """A bare tokenizer.json (no tokenizer_config.json beside it) with neither ``<|endoftext|>`` nor ``<|pad|>``:
    ``fcp index`` says so in one line and exits 2 — before, the conversations indexed (exit 0) into an index that no
    reader could open, and prompt/response lines failed as ``shard_failed`` with exit 1."""
    model = _model_folder(tmp_path, "bare", {"<|pad|>", "<|endoftext|>"},
                          ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), None)
    _write(tmp_path / "sft.jsonl", [{"id": "p", "prompt": "a b", "text": "c d"}])
    _write(tmp_path / "chat.jsonl", _conversations(2))
    cases = [(["sft.jsonl", "--prompt-field", "prompt"], "has no eos token"),
             (["chat.jsonl", "--chat-field", "messages", "--chat-template", "llama3"], "has no pad token")]
    for k, (args, match) in enumerate(cases):
        capsys.readouterr()
        rc = cli_main(["index", str(tmp_path / args[0]), *args[1:], "--spec", "text", "--tokenizer",
                       str(model / "tokenizer.json"), "--out", str(tmp_path / f"idx{k}"), "--no-progress"])
        out, err = capsys.readouterr()
        assert rc == 2 and err.count("\n") == 1 and err.startswith("fcp index: error:") and match in err, (rc, err)
        assert "tokenizer_config.json" in err and not (tmp_path / f"idx{k}").exists()  # refused before --out is made


def test_conversations_beside_text_files_need_the_eos_before_out_is_made(tmp_path, capsys):
    """Conversations end their turns themselves, but a folder's (or a tar shard's) text samples end in an EOS: a
    tokenizer with a pad and no EOS given conversations and a folder of .txt files is one line, exit 2, and no
    ``--out`` — before, the refusal came from inside the first task, leaving ``OUT/.lock`` and ``OUT/parts``
    (found by review). Conversations alone with that tokenizer index (they need no EOS)."""
    model = _model_folder(tmp_path, "noeos", {"<|endoftext|>"}, ("<|im_start|>", "<|im_end|>"), None)
    _write(tmp_path / "chat.jsonl", _conversations(2))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("plain text")
    base = ["--spec", "text", "--tokenizer", str(model / "tokenizer.json"), "--chat-field", "messages", "--no-progress"]
    capsys.readouterr()
    rc = cli_main(["index", str(tmp_path / "chat.jsonl"), str(tmp_path / "docs"), *base, "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "has no eos token" in err, (rc, err)
    assert not (tmp_path / "x").exists()
    assert cli_main(["index", str(tmp_path / "chat.jsonl"), *base, "--out", str(tmp_path / "y")]) == 0


def test_bundled_specs_keep_their_tokens_and_fingerprints(tmp_path):
    """Indexes that read before read the same (this test passes on the code before the fallback too): the bundled
    specs' EOS/pad are their own tokens and a fingerprint is still sha256(spec JSON, tokenizer bytes) — also with a
    model's tokenizer_config.json (naming other tokens) beside a tokenizer that has the spec's tokens."""
    import hashlib

    from fcp_data.specs import load_spec

    for name in ("text", "qwen2.5-vl", "llava-video"):
        sp = load_spec(name)
        assert sp.eos_id == sp.tokenizer().token_to_id("<|endoftext|>")
        raw = json.loads((data_path("tokenizers") / f"{name}.json").read_text())
        h = hashlib.sha256(json.dumps(raw, sort_keys=True).encode())
        h.update((data_path("tokenizers") / "tiny-bpe.json").read_bytes())
        assert sp.fingerprint == h.hexdigest()
    d = tmp_path / "m"
    d.mkdir()
    shutil.copy(data_path("tokenizers") / "tiny-bpe.json", d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}))
    _write(tmp_path / "t.jsonl", [{"id": "t", "text": "the quick fox"}])
    build_index([str(tmp_path / "t.jsonl")], "text", tmp_path / "idx", tokenizer=str(d / "tokenizer.json"),
                progress=False)
    data = IndexedDataset(tmp_path / "idx")
    tok = data.spec.tokenizer()
    assert data.pad_token_id == tok.token_to_id("<|pad|>") and data.eos_token_id == tok.token_to_id("<|endoftext|>")
    assert data[0]["input_ids"].tolist() == tok.encode("the quick fox").ids + [tok.token_to_id("<|endoftext|>")]
    assert data.spec.fingerprint == load_spec("text", d / "tokenizer.json").fingerprint == load_spec("text").fingerprint


def test_fcp_index_given_a_megatron_dataset_points_to_its_reader(tmp_path, capsys):
    """``fcp index PREFIX.idx`` (or .bin, or the prefix): one line naming MegatronIndexedDocuments, exit 2 —
    before, "not a .jsonl, .parquet or .arrow file" (or the prefix read as a missing jsonl)."""
    import struct

    seq = np.asarray([10, 20, 5], dtype=np.int32)
    ptr = np.concatenate([[0], np.cumsum(seq.astype(np.int64) * 2)[:-1]])
    (tmp_path / "corpus.idx").write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 3, 3) + seq.tobytes()
                                          + ptr.tobytes() + np.asarray([0, 1, 3], dtype=np.int64).tobytes())
    (tmp_path / "corpus.bin").write_bytes(np.arange(35, dtype=np.uint16).tobytes())
    for given in ("corpus.idx", "corpus.bin", "corpus"):
        capsys.readouterr()
        rc = cli_main(["index", str(tmp_path / given), "--spec", "text", "--out", str(tmp_path / "out"),
                       "--no-progress"])
        _, err = capsys.readouterr()
        assert rc == 2 and err.count("\n") == 1, (given, err)
        assert "MegatronIndexedDocuments" in err and f"--lengths {tmp_path / 'corpus'}.idx" in err, err


def _metaspace_tokenizer(path, extra: tuple[str, ...] = ()):
    """A SentencePiece-style tokenizer (``Metaspace(prepend_scheme="first")``, as Llama 2 / Mistral / Vicuna ship
    theirs with tokenizers >= 0.15) holding the Qwen-VL specs' and ChatML's special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(["Describe the image in detail", "the cat sat on the mat\nand slept", "What is it? yes."]
                            * 20, trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>"]))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|endoftext|>", "<|pad|>", "<|vision_start|>",
                                                                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
                                                                  "<|im_start|>", "<|im_end|>") + extra])
    tok.save(str(path))
    return tok


def test_texts_after_a_visual_block_tokenize_as_in_the_whole_prompt(tmp_path, capsys):
    """A tokenizer that gives ``▁`` to an input's first word only: the processor tokenizes the whole prompt, so the
    text after an image (a conversation's next piece, a caption) starts without it. fcp tokenizes those texts apart
    and must give the same ids — before, one ``▁`` more after every block (index and reader agreeing on it).
    References: transformers' ``apply_chat_template`` over the whole conversation with each image as one placeholder
    (then the plain sample's block in its place), and the tokenizer on the whole block + caption string. The bundled
    tokenizers are not affected."""
    transformers = pytest.importorskip("transformers")
    from test_chat_media import TEMPLATE, _images, _reference_many

    from fcp_data.specs import load_spec
    from fcp_data.text_tokens import prefixes_first_word

    tok = _metaspace_tokenizer(tmp_path / "sp.json")
    apart = tok.encode("\nDescribe the cat", add_special_tokens=False).tokens
    assert apart == ["▁"] + tok.encode("<|image_pad|>\nDescribe the cat", add_special_tokens=False).tokens[1:]
    assert prefixes_first_word(load_spec("qwen2.5-vl", str(tmp_path / "sp.json")))
    assert not any(prefixes_first_word(load_spec(n)) for n in ("qwen2.5-vl", "qwen3-vl", "internvl3", "llava-video"))
    imgs = _images(tmp_path, [(60, 90), (112, 84)])
    (tmp_path / "media" / "img0.txt").write_text("the cat sat on the mat")
    sp = ["--spec", "qwen2.5-vl", "--tokenizer", str(tmp_path / "sp.json"), "--no-progress"]
    capsys.readouterr()
    assert cli_main(["index", str(tmp_path / "media"), *sp, "--out", str(tmp_path / "plain")]) == 0
    assert "first word" not in capsys.readouterr().err  # handled for this spec: nothing to warn about
    plain = IndexedDataset(tmp_path / "plain")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "sp.json"))
    eos = hf.convert_tokens_to_ids("<|endoftext|>")
    s0, s1 = (plain[list(plain.index.keys).index(k)]["input_ids"].tolist() for k in ("img0", "img1"))
    block0, block1 = s0[: s0.index(hf.convert_tokens_to_ids("<|vision_end|>")) + 1], s1[:-1]
    caption = hf("".join(hf.convert_ids_to_tokens(block0)) + "the cat sat on the mat", add_special_tokens=False)
    assert s0 == caption["input_ids"] + [eos] and s1 == block1 + [eos]
    assert int(plain.index.num_tokens[list(plain.index.keys).index("img0")]) == len(s0)
    answer = {"role": "assistant", "content": "It is a cat. Yes."}
    line = {"id": "c", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Describe"}, {"type": "image", "image": f"media/{imgs[0]}"},
        {"type": "text", "text": "\nand the cat"}, {"type": "image", "image": f"media/{imgs[1]}"},
        {"type": "text", "text": "in detail"}]}, answer]}
    _write(tmp_path / "chat.jsonl", [line])
    (tmp_path / "tpl.jinja").write_text(TEMPLATE)
    assert cli_main(["index", str(tmp_path / "chat.jsonl"), *sp, "--chat-field", "messages", "--chat-template",
                     str(tmp_path / "tpl.jinja"), "--out", str(tmp_path / "chat")]) == 0
    data = IndexedDataset(tmp_path / "chat")
    ids, labels = _reference_many(hf, line["messages"], [block0, block1])
    s = data[0]
    assert s["input_ids"].tolist() == ids and s["labels"].tolist() == labels
    assert int(data.index.num_tokens[0]) == len(ids)
    from fcp_data.visual_layout import IndexVisualLayout

    vis = torch.tensor(data.placeholder_ids)
    assert all(IndexVisualLayout(data.index)(0, n) == int(torch.isin(s["input_ids"][1:n], vis).sum())
               for n in range(1, len(ids) + 1, 7))


@pytest.mark.parametrize("spec", ["qwen3-vl", "internvl3"])
def test_texts_inside_a_video_block_tokenize_as_in_the_whole_prompt(tmp_path, capsys, spec):
    """The same tokenizer with a spec whose video blocks hold texts (Qwen3-VL's ``<0.5 seconds>`` time stamps,
    InternVL's ``Frame1: `` labels). In a conversation the processor writes the block into the prompt and tokenizes
    the whole, so no label starts an input; a plain video sample's block opens its input, so its first label does.
    References: the tokenizer on the whole prompt string — the template's text with the video's placeholder replaced
    by the block as the processor spells it (each text, each special token repeated as the plan says) — and on the
    plain sample's block string. Before, fcp gave every label one ``▁`` more (index, reader and the sampler's
    layout agreeing on it) and ``fcp index`` warned."""
    transformers = pytest.importorskip("transformers")
    from test_chat_media import TEMPLATE, _clips

    from fcp_data.visual_layout import IndexVisualLayout, row_plan

    extra = ("<|vision_pad|>",) if spec == "qwen3-vl" else ("<img>", "</img>", "<IMG_CONTEXT>")
    _metaspace_tokenizer(tmp_path / "sp.json", extra)
    clips = _clips(tmp_path, 2)
    lines = [{"id": c, "messages": [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                                                 {"type": "video", "video": f"media/{c}"}]},
                                    {"role": "assistant", "content": "the cat sat"}]} for c in clips]
    _write(tmp_path / "chat.jsonl", lines)
    (tmp_path / "tpl.jinja").write_text(TEMPLATE)
    sp = ["--spec", spec, "--tokenizer", str(tmp_path / "sp.json"), "--no-progress"]
    capsys.readouterr()
    assert cli_main(["index", str(tmp_path / "media"), *sp, "--out", str(tmp_path / "plain")]) == 0
    assert cli_main(["index", str(tmp_path / "chat.jsonl"), *sp, "--chat-field", "messages", "--chat-template",
                     str(tmp_path / "tpl.jinja"), "--out", str(tmp_path / "chat")]) == 0
    assert "first word" not in capsys.readouterr().err
    plain, chat = IndexedDataset(tmp_path / "plain"), IndexedDataset(tmp_path / "chat")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "sp.json"))
    vis = torch.tensor(plain.placeholder_ids)
    for data in (plain, chat):
        layout = IndexVisualLayout(data.index)
        for i in range(len(data)):
            key = data.index.keys[i]
            segments = row_plan(data.spec, plain.index, list(plain.index.keys).index(key.rsplit(".", 1)[0])
                                if data is chat else i).segments
            labels = [seg[1] for seg in segments if seg[0] == "text"]
            assert labels and all(hf.tokenize(x)[0].startswith("▁") for x in labels)  # alone, each starts with it
            block = "".join(seg[1] if seg[0] == "text" else seg[1] * int(seg[2]) for seg in segments)
            if data is plain:
                want = hf(block, add_special_tokens=False)["input_ids"] + [hf.convert_tokens_to_ids("<|endoftext|>")]
            else:
                line = next(x for x in lines if x["id"] == key)
                text = hf.apply_chat_template(line["messages"], chat_template=TEMPLATE, tokenize=False)
                want = hf(text.replace("<|video_pad|>", block, 1), add_special_tokens=False)["input_ids"]
            ids = data[i]["input_ids"].tolist()
            assert ids == want and int(data.index.num_tokens[i]) == len(ids), (spec, key)
            # the sampler's count of a cut's visual positions, from the index (no pixel decoded)
            assert all(layout(i, n) == int(torch.isin(torch.tensor(ids[1:n]), vis).sum())
                       for n in range(1, len(ids), 97))


@pytest.mark.parametrize("spec", ["qwen2.5-vl", "internvl3"])
def test_a_dropped_media_tag_is_refused_whether_its_entry_is_null_or_absent(tmp_path, spec):
    """A text-only line whose turn starts or ends with a LLaVA tag (``<image>\\n...``) lost its media: recorded
    ``media_tag_mismatch`` whether its ``image`` entry is absent, null or empty (a Parquet row of a mixed set carries
    the null column) — before, absent passed as text with a literal tag. A tag inside prose (HTML's ``<video>``
    element) is text in both spellings — before, a null ``image`` column refused it (found by review)."""
    ask = lambda text: [{"from": "human", "value": text}, ANSWER]  # noqa: E731
    html = "How does the <video> element of HTML5 load its source?"
    lines = [{"id": "tag_absent", "conversations": ask("<image>\nDescribe it.")},
             {"id": "tag_null", "image": None, "conversations": ask("<image>\nDescribe it.")},
             {"id": "tag_end_empty", "video": [], "conversations": ask("What happens here?\n<video>")},
             {"id": "html_absent", "conversations": ask(html)},
             {"id": "html_null", "image": None, "video": None, "conversations": ask(html)}]
    _write(tmp_path / "chat.jsonl", lines)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], spec, tmp_path / "idx", chat_field="conversations",
                               progress=False, max_error_rate=1.0)
    errors = {json.loads(x)["key"]: json.loads(x) for x in (tmp_path / "idx" / "errors.jsonl").read_text().splitlines()}
    assert {k: e["reason"] for k, e in errors.items()} == {k: "media_tag_mismatch" for k in
                                                           ("tag_absent", "tag_null", "tag_end_empty")}
    assert "no 'image'/'video' entry" in errors["tag_absent"]["detail"]
    assert "'image' is null" in errors["tag_null"]["detail"] and "'video' is empty" in errors["tag_end_empty"]["detail"]
    data = IndexedDataset(tmp_path / "idx")
    assert sorted(data.index.keys) == ["html_absent", "html_null"]
    assert data[0]["input_ids"].tolist() == data[1]["input_ids"].tolist()  # the same text, the same sample
