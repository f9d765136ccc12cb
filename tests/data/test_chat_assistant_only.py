"""``fcp index --assistant-only-loss``: chat SFT lines indexed, read and labelled as TRL's
``SFTTrainer(assistant_only_loss=True)`` prepares them — a model template without ``{% generation %}`` blocks swapped
for TRL's training variant of it (Qwen3's keeps every assistant turn's ``<think>`` block), labels on what the blocks
hold, and for prompt-completion lines on the assistant turns of the completion only (TRL ANDs its two masks).

Reference: TRL's own ``SFTTrainer`` (a tiny random Qwen3, CPU) preparing the same rows as a ``datasets.Dataset`` with
the same model folder as its ``processing_class``: its ``train_dataset``'s ``input_ids`` and ``labels``, token for
token. The templates are the ones TRL recognises, read from TRL's package (``trl.chat_template_utils``): the exact
strings Qwen3, Qwen2.5 and Llama 3 ship. Before this option, fcp rendered Qwen3's shipped template (earlier turns'
reasoning dropped, a ``<think>`` in a content a ``template_changed_content`` error) where a TRL run with
``assistant_only_loss`` renders and trains its training variant.
"""

from __future__ import annotations

import json
import warnings

import pytest
from test_chat_review import QWEN_SPECIAL, _call, _model
from test_index_sft import _write

from fcp_cli.main import main as cli_main
from fcp_data import IndexedDataset
from fcp_data.index import build_index

pytest.importorskip("trl")
pytest.importorskip("transformers")
LLAMA_SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def _jinja(name: str) -> str:
    """A template as its model ships it, as TRL stores it to recognise it."""
    import trl.chat_template_utils as t

    return getattr(t, f"{name}_chat_template")


def _user(s: str) -> dict:
    return {"role": "user", "content": s}


def _bot(s: str, **kw) -> dict:
    return {"role": "assistant", "content": s, **kw}


def _conversations() -> list[dict]:
    """Multi-turn with reasoning in an earlier turn (Qwen3's shipped template drops it there, its training variant
    keeps it), a system prompt, a tool call and its result, a plain turn."""
    return [
        {"id": "multi", "messages": [_user("a"), _bot("b", reasoning_content="first thought"), _user("c"),
                                     _bot("d", reasoning_content="second thought")]},
        {"id": "system", "messages": [{"role": "system", "content": "Be brief."}, _user("Capital of France?"),
                                      _bot("Paris")]},
        {"id": "tool", "messages": [_user("Compute 2+2"), _bot("", tool_calls=[_call("calc", x="2+2")]),
                                    {"role": "tool", "content": "4"}, _bot("It is 4.")],
         "tools": json.dumps([{"type": "function", "function": {"name": "calc", "description": "evaluate",
                                                                "parameters": {"type": "object", "properties": {
                                                                    "x": {"type": "string"}}}}}])},
        {"id": "plain", "messages": [_user("hi"), _bot("hello")]},
    ]


def _prompt_completions() -> list[dict]:
    """A completion of several turns (its user turn is not trained under assistant-only loss), a few-shot prompt."""
    return [{"id": "turns", "prompt": [_user("Hi")], "completion": [_bot("Hello!"), _user("Bye"), _bot("Bye now.")]},
            {"id": "fewshot", "prompt": [_user("1+1?"), _bot("2"), _user("2+3?")], "completion": [_bot("5")]},
            {"id": "one", "prompt": [_user("What is 2+2?")], "completion": [_bot("4.")]}]


def _trl_rows(model, rows: list[dict]) -> dict[str, tuple[list[int], list[int]]]:
    """``{id: (input_ids, labels)}`` as TRL's SFTTrainer(assistant_only_loss=True) prepares ``rows`` (every row given
    every column: ``Dataset.from_list`` takes its columns from the first row)."""
    import datasets
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    tok = PreTrainedTokenizerFast.from_pretrained(str(model))
    config = AutoConfig.for_model("qwen3", vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = SFTConfig(output_dir=str(model / "out"), assistant_only_loss=True, bf16=False, max_length=None,
                         report_to=[], use_cpu=True, dataset_num_proc=None)
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_config(config), args=args, processing_class=tok,
                             train_dataset=datasets.Dataset.from_list(
                                 [{k: r.get(k) for k in set().union(*rows)} for r in rows]))
    prepared = trainer.train_dataset
    return {r["id"]: (p["input_ids"], p["labels"]) for r, p in zip(rows, prepared)}


def _index(tmp_path, model, rows: list[dict], ext: str = "jsonl", **kw) -> IndexedDataset:
    f = tmp_path / f"data.{ext}"
    if ext == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(rows), f)
    else:
        _write(f, rows)
    manifest, rc = build_index([str(f)], "text", tmp_path / "idx", chat_template=str(model), progress=False,
                               assistant_only_loss=True, **kw)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    assert manifest["assistant_only_loss"] is True
    return IndexedDataset(tmp_path / "idx")


def _assert_equal(data: IndexedDataset, want: dict) -> None:
    for key, (ids, labels) in want.items():
        i = list(data.index.keys).index(key)
        s = data[i]
        assert s["input_ids"].tolist() == ids and int(data.index.num_tokens[i]) == len(ids), key
        assert s["labels"].tolist() == labels, key
        assert 0 < sum(t != -100 for t in labels) < len(ids), key


@pytest.mark.parametrize("name, special", [("qwen3", QWEN_SPECIAL), ("qwen2_5", QWEN_SPECIAL),
                                           ("llama3", LLAMA_SPECIAL), ("qwen3_training", QWEN_SPECIAL)])
def test_conversations_equal_trl_assistant_only(tmp_path, name, special):
    """Conversations: the template TRL swaps in, ids and labels equal TRL's; the index stores the variant and names
    it; Qwen3's earlier turn keeps its reasoning (the shipped template drops it). A template that has blocks already
    (TRL's Qwen3 variant given as the model's own) is used as it is, by TRL and by fcp."""
    model = _model(tmp_path, "model", _jinja(name), special)
    rows = _conversations() if name != "llama3" else [r for r in _conversations() if r["id"] != "tool"]
    if name == "llama3":  # TRL's llama3 template renders no reasoning: rows without it
        rows = [dict(r, messages=[{k: v for k, v in m.items() if k != "reasoning_content"} for m in r["messages"]])
                for r in rows]
    want = _trl_rows(model, rows)
    data = _index(tmp_path, model, rows, chat_field="messages")
    _assert_equal(data, want)
    from fcp_data.index.merge import summarize

    text = summarize(data.index.manifest)
    assert ("(TRL training variant)" in text) == (name != "qwen3_training")
    assert "labels on the assistant turns (TRL's assistant-only loss)" in text
    assert data.index.manifest["chat_template"]["jinja"] == _jinja("qwen3_training" if "qwen3" in name else
                                                                   f"{name}_training")
    if "qwen3" in name:
        from transformers import PreTrainedTokenizerFast

        hf = PreTrainedTokenizerFast.from_pretrained(str(model))
        s = data[list(data.index.keys).index("multi")]
        trained = hf.decode([t for t in s["labels"].tolist() if t != -100])
        assert "first thought" in trained and "second thought" in trained


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_prompt_completion_trains_the_completions_assistant_turns(tmp_path, ext):
    """Prompt-completion lines: TRL's completion mask AND its assistant mask — a user turn inside the completion and
    the prompt's few-shot answer stay untrained; Parquet's message structs (null fields) read the same."""
    model = _model(tmp_path, "model", _jinja("qwen2_5"), QWEN_SPECIAL)
    rows = _prompt_completions()
    want = _trl_rows(model, rows)
    data = _index(tmp_path, model, rows, ext, prompt_field="prompt", chat_field="completion")
    _assert_equal(data, want)
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    s = data[list(data.index.keys).index("turns")]
    trained = hf.decode([t for t in s["labels"].tolist() if t != -100])
    assert "Hello!" in trained and "Bye now." in trained and "Bye<" not in trained.replace("Bye now.", "")
    from fcp_data.index.merge import summarize

    assert "the completion's assistant turns (TRL's completion-only and assistant-only loss)" in \
        summarize(data.index.manifest)
    from fcp_exec.train_data import _labels_note

    assert _labels_note(data) == ", SFT labels (the completion's assistant turns)"  # fcp train's data line


def test_without_the_option_labels_stay_fcps_and_templates_stay_as_shipped(tmp_path):
    """The option changes what it says and nothing else: without it, the shipped template is stored (Qwen3 renders
    the earlier turn without its reasoning) and a prompt-completion line trains its whole completion."""
    model = _model(tmp_path, "model", _jinja("qwen3"), QWEN_SPECIAL)
    _write(tmp_path / "c.jsonl", _conversations())
    manifest, rc = build_index([str(tmp_path / "c.jsonl")], "text", tmp_path / "plain", chat_field="messages",
                               chat_template=str(model), progress=False)
    assert rc == 0 and "assistant_only_loss" not in manifest
    assert manifest["chat_template"]["jinja"] == _jinja("qwen3")
    data = IndexedDataset(tmp_path / "plain")
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    text = hf.decode(data[list(data.index.keys).index("multi")]["input_ids"].tolist())
    assert "first thought" not in text and "second thought" in text


def test_bad_uses_are_one_line_and_exit_2(tmp_path, capsys):
    """Without --chat-field; a template without blocks that TRL does not know (TRL: 'patching is not supported');
    a template whose blocks leave <|im_end|> untrained is indexed with TRL's warning; a line with nothing to train
    is recorded no_trained_tokens, not trained on nothing."""
    _write(tmp_path / "c.jsonl", _conversations())
    _write(tmp_path / "t.jsonl", [{"id": "t", "text": "hello"}])
    assert cli_main(["index", str(tmp_path / "t.jsonl"), "--spec", "text", "--assistant-only-loss",
                     "--out", str(tmp_path / "i0")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--assistant-only-loss trains the assistant turns of --chat-field" in err[0]
    unknown = _model(tmp_path, "unknown", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
                                          "<|im_end|>\n{% endfor %}", QWEN_SPECIAL)
    assert cli_main(["index", str(tmp_path / "c.jsonl"), "--spec", "text", "--chat-field", "messages",
                     "--chat-template", str(unknown), "--assistant-only-loss", "--out", str(tmp_path / "i1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "TRL has no training variant of it" in err[0] and "{% generation %}" in err[0]
    assert not (tmp_path / "i1").exists()
    untrained_stop = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
                      "{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
                      "<|im_end|>\n{% endfor %}")
    blocked = _model(tmp_path, "blocked", untrained_stop, QWEN_SPECIAL)
    rows = [{"id": "ok", "messages": [_user("q"), _bot("a")]}, {"id": "empty", "messages": [_user("q"), _bot("")]}]
    _write(tmp_path / "e.jsonl", rows)
    assert cli_main(["index", str(tmp_path / "e.jsonl"), "--spec", "text", "--chat-field", "messages",
                     "--chat-template", str(blocked), "--assistant-only-loss", "--max-error-rate", "1",
                     "--out", str(tmp_path / "i2")]) == 0
    out = capsys.readouterr()
    assert "leave the assistant's end-of-turn token untrained" in out.err and "no_trained_tokens 1" in out.out
    data = IndexedDataset(tmp_path / "i2")
    assert list(data.index.keys) == ["ok"]


def test_image_conversations_take_the_training_variant(tmp_path):
    """Image conversations under Qwen2.5-VL's shipped template (as a processor folder holds it): TRL's training
    variant is stored and rendered; ids and labels equal transformers' ``apply_chat_template(...,
    return_assistant_tokens_mask=True)`` on that variant, its ``<|vision_start|><|image_pad|><|vision_end|>`` replaced
    by the visual block of transformers' ``Qwen2VLImageProcessorPil`` grid (never trained). LLaVA spellings and
    parts alike (``test_chat_media._lines``)."""
    import shutil

    import numpy as np
    import trl.chat_template_utils as t
    from PIL import Image
    from test_chat_media import _images, _lines
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessorPil

    from fcp_data.specs import load_spec

    model = tmp_path / "vl"
    model.mkdir()
    shutil.copy(load_spec("qwen2.5-vl").tokenizer_path, model / "tokenizer.json")
    (model / "chat_template.jinja").write_text(_jinja("qwen2_5_vl"))
    (model / "tokenizer_config.json").write_text(json.dumps(QWEN_SPECIAL))
    names = _images(tmp_path, [(60, 90), (56, 112), (224, 224), (90, 60)])
    lines = _lines(names, "image", seed=2)
    _write(tmp_path / "chat.jsonl", [line for line, _ in lines])
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "idx", chat_field="messages",
                               chat_template=str(model), assistant_only_loss=True, progress=False)
    assert rc == 0 and manifest["num_samples"] == len(lines), manifest["errors_by_reason"]
    variant = t.qwen2_5_vl_training_chat_template
    assert manifest["chat_template"]["jinja"] == variant
    data = IndexedDataset(tmp_path / "idx")
    hf = PreTrainedTokenizerFast(tokenizer_file=str(model / "tokenizer.json"))
    img = data.spec.vision["image"]
    proc = Qwen2VLImageProcessorPil(min_pixels=img["min_pixels"], max_pixels=img["max_pixels"])
    start, pad, end = (hf.convert_tokens_to_ids(x) for x in ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"))
    for (line, hf_messages), name in zip(lines, names):
        grid = proc(images=Image.open(tmp_path / "media" / name).convert("RGB"), return_tensors="np")["image_grid_thw"][0]
        block = [start] + [pad] * (int(np.prod(grid)) // 4) + [end]
        for m in hf_messages:  # the parts' paths relative to the jsonl, as the processor would be given them
            m["content"] = m["content"] if isinstance(m["content"], str) else [
                dict(p, image=str(tmp_path / p["image"])) if p["type"] == "image" else p for p in m["content"]]
        ref = hf.apply_chat_template(hf_messages, chat_template=variant, tokenize=True, return_dict=True,
                                     return_assistant_tokens_mask=True)
        ids, labels, k = [], [], 0
        src, mask = ref["input_ids"], ref["assistant_masks"]
        while k < len(src):
            if src[k: k + 3] == [start, pad, end]:
                ids, labels, k = ids + block, labels + [-100] * len(block), k + 3
            else:
                ids, labels, k = ids + [src[k]], labels + [src[k] if mask[k] else -100], k + 1
        s = data[list(data.index.keys).index(line["id"])]
        assert s["input_ids"].tolist() == ids and s["labels"].tolist() == labels, line["id"]
        assert 0 < sum(x != -100 for x in labels)


def _marked_model(tmp_path, name: str):
    """A model folder for TRL's template ``name``: the chat tokenizer plus every marker it or its variant writes as
    one special token (a real model's tokenizer has them)."""
    import re

    from tokenizers import AddedToken, Tokenizer

    import trl.chat_template_utils as t

    special = {"bos_token": "<s>", "eos_token": "</s>"}
    model = _model(tmp_path, name, _jinja(name), special)
    source = _jinja(name) + getattr(t, f"{name}_training_chat_template")
    marks = set(re.findall(r"<[|｜][^<>|｜\s'\"\\]{1,64}[|｜]>", source)) | set(special.values()) | \
        {"<start_of_turn>", "<end_of_turn>"}
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(m, special=True) for m in sorted(marks)])
    tok.save(str(model / "tokenizer.json"))
    return model


def _trl_reference(hf, template: str, row: dict, prompt_field: str | None, chat_field: str):
    """``(ids, labels)`` as TRL's ``tokenize_fn`` + ``build_labels`` make them with ``assistant_only_loss`` (its own
    ``_tokenize`` and ``common_prefix_length``), or None where TRL raises (a template that refuses the line, or a
    line without any assistant token)."""
    from trl.data_utils import _tokenize, common_prefix_length

    tools = json.loads(row["tools"]) if isinstance(row.get("tools"), str) else row.get("tools")
    kw = {"chat_template": template, "tools": tools, **(row.get("chat_template_kwargs") or {})}
    try:
        if prompt_field:
            head = _tokenize(hf, row[prompt_field], add_generation_prompt=True, **kw)["input_ids"]
        full = _tokenize(hf, (row[prompt_field] if prompt_field else []) + row[chat_field],
                         return_assistant_tokens_mask=True, **kw)
    except Exception:  # noqa: BLE001 - the template raised (roles, tools it cannot write)
        return None
    ids, masks = full["input_ids"], [full["assistant_masks"]]
    if 1 not in masks[0]:
        return None
    if prompt_field:
        n = common_prefix_length(head, ids)
        masks.append([0] * n + [1] * (len(ids) - n))
    return ids, [x if all(b) else -100 for x, *b in zip(ids, *masks)]


@pytest.mark.parametrize("name", ["gemma", "gemma3", "gptoss", "deepseekv3", "phi3_5", "qwen3_instruct_2507",
                                  "glm4moe", "qwen3_5_think", "lfm2", "smolvlm"])
def test_more_templates_equal_trls_tokenization(tmp_path, name):
    """Ten more of the templates TRL has variants of, on conversations (reasoning, a system turn, tools, template
    kwargs) and prompt-completion lines: fcp's ids and labels equal TRL's own tokenization with its variant, line by
    line; where TRL raises on a line (a template that refuses a system turn or a tool call), fcp records the line."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from fcp_data.chat import ChatFormatError, line_template_inputs, resolve_template
    from fcp_data.chat_completion import line_text, sft_ids_and_mask
    from fcp_data.chat_trl import training_template

    model = _marked_model(tmp_path, name)
    tpl, _ = training_template(resolve_template(str(model)), model / "tokenizer.json")
    assert tpl["jinja"] == getattr(__import__("trl.chat_template_utils", fromlist=["x"]), f"{name}_training_chat_template")
    hf, tok = PreTrainedTokenizerFast.from_pretrained(str(model)), Tokenizer.from_file(str(model / "tokenizer.json"))
    rows = [(r, None, "messages") for r in _conversations()] + \
        [(dict(r, chat_template_kwargs={"enable_thinking": False}), None, "messages") for r in _conversations()[:1]] + \
        [(r, "prompt", "completion") for r in _prompt_completions()]
    equal = 0
    for row, prompt_field, chat_field in rows:
        want = _trl_reference(hf, tpl["jinja"], row, prompt_field, chat_field)
        inputs = line_template_inputs(row, "tools", "chat_template_kwargs")
        try:
            line_text(row, chat_field, tpl, *inputs, prompt_field, True)
            ids, mask = sft_ids_and_mask(tok, row, chat_field, tpl, *inputs, prompt_field, True)
        except ChatFormatError:
            assert want is None, (name, row["id"])
            continue
        assert want is not None and (ids, [x if m else -100 for x, m in zip(ids, mask)]) == want, (name, row["id"])
        equal += 1
    assert equal >= 4, name  # the plain lines at least: never a pass by refusing everything


def test_without_trl_a_template_with_blocks_still_indexes(tmp_path, monkeypatch, capsys):
    """TRL is asked only for a template without blocks: without it (not installed, or failing to import) a template
    with blocks indexes as it is, and one without is one line, exit 2, naming the install."""
    import sys

    _write(tmp_path / "c.jsonl", _conversations())
    blocked = _model(tmp_path, "blocked", _jinja("qwen3_training"), QWEN_SPECIAL)
    shipped = _model(tmp_path, "shipped", _jinja("qwen3"), QWEN_SPECIAL)
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl raises ImportError
    monkeypatch.setitem(sys.modules, "trl.chat_template_utils", None)
    assert cli_main(["index", str(tmp_path / "c.jsonl"), "--spec", "text", "--chat-field", "messages", "--chat-template",
                     str(blocked), "--assistant-only-loss", "--out", str(tmp_path / "i0")]) == 0
    capsys.readouterr()
    assert cli_main(["index", str(tmp_path / "c.jsonl"), "--spec", "text", "--chat-field", "messages", "--chat-template",
                     str(shipped), "--assistant-only-loss", "--out", str(tmp_path / "i1")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs trl>=1.0" in err[0] and "ModuleNotFoundError" in err[0]


def test_completions_without_assistant_text_are_recorded_and_resume_rereads(tmp_path, capsys):
    """A prompt-completion line whose completion holds no assistant turn (its only assistant turn is in the prompt)
    is no_trained_tokens; ``--resume`` without the option counts the parts again (its fingerprint differs) and the
    index trains whole completions again."""
    rows = _prompt_completions() + [{"id": "user_only", "prompt": [_user("1"), _bot("2")],
                                     "completion": [_user("3")]}]
    _write(tmp_path / "pc.jsonl", rows)
    base = ["index", str(tmp_path / "pc.jsonl"), "--spec", "text", "--prompt-field", "prompt", "--chat-field",
            "completion", "--max-error-rate", "1", "--out", str(tmp_path / "idx")]
    assert cli_main(base + ["--assistant-only-loss"]) == 0
    assert "no_trained_tokens 1" in capsys.readouterr().out
    only = IndexedDataset(tmp_path / "idx")
    turns = only[list(only.index.keys).index("turns")]["labels"]
    assert cli_main(base + ["--resume"]) == 0
    whole = IndexedDataset(tmp_path / "idx")
    assert "assistant_only_loss" not in whole.index.manifest and len(whole) == len(rows)
    more = whole[list(whole.index.keys).index("turns")]["labels"]
    assert int((more != -100).sum()) > int((turns != -100).sum())  # the completion's user turn is trained again


def test_markers_the_tokenizer_splits_give_one_warning_not_trls(tmp_path, capsys):
    """A tokenizer without the template's markers (the bundled one beside a bare .jinja): fcp index's own warning
    names the split markers; TRL's stop check (which looks for one end-of-turn token) is not run on it, so no
    false 'end-of-turn token untrained' warning."""
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "chat_template.jinja").write_text(_jinja("qwen2_5"))
    _write(tmp_path / "c.jsonl", _conversations())
    assert cli_main(["index", str(tmp_path / "c.jsonl"), "--spec", "text", "--chat-field", "messages",
                     "--chat-template", str(tmp_path / "t" / "chat_template.jinja"), "--assistant-only-loss",
                     "--out", str(tmp_path / "idx")]) == 0
    err = capsys.readouterr().err
    assert "has no token for <|im_start|>, <|im_end|>" in err and "end-of-turn token untrained" not in err
