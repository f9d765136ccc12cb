"""TRL's conversational prompt-completion lines (``{"prompt": [messages], "completion": [messages]}``, ``fcp index
--prompt-field prompt --chat-field completion``) indexed, read and labelled as TRL's SFTTrainer tokenizes and trains
them by default (``completion_only_loss``).

Reference: TRL's own helpers (``trl.data_utils._tokenize`` and ``common_prefix_length``), called as its
``tokenize_fn`` calls them: the prompt with ``add_generation_prompt=True``, prompt + completion, the completion
trained from the two id lists' common prefix on — the same template, the line's tools and template kwargs. Templates:
Qwen2.5's as shipped (a model folder), SmolLM3's shape with the line's kwargs, and the built-in chatml and llama3
(referenced by their Jinja spelling with a generation prompt). Before, such lines were each a ``missing_field``
error ("no string field") under ``--prompt-field`` and a refusal with ``--chat-field``; a failure here means the
completion is trained on other tokens than TRL trains (the prompt's own assistant turns, the completion's header)
or the lengths are not the samples'.
"""

from __future__ import annotations

import json

import pytest
from test_chat_review import QWEN3, QWEN25, QWEN25_GEN, QWEN_SPECIAL, _model
from test_chat_template_kwargs import SMOL
from test_index_sft import CHATML, LLAMA3, _write

from fcp_data import IndexedDataset
from fcp_data.index import build_index

# the built-ins as Jinja, with the generation prompt TRL asks for (apply_chat_template(add_generation_prompt=True))
CHATML_GEN = CHATML + "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
LLAMA3_GEN = LLAMA3 + ("{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                       "{%- endif %}")


def _rows() -> list[dict]:
    """One turn each way; a system prompt; a few-shot prompt (its assistant turn is prompt, not trained); a completion
    of several turns; ShareGPT turns."""
    user = lambda s: {"role": "user", "content": s}  # noqa: E731
    bot = lambda s: {"role": "assistant", "content": s}  # noqa: E731
    return [{"id": "one", "prompt": [user("What is 2+2?")], "completion": [bot("4.")]},
            {"id": "system", "prompt": [{"role": "system", "content": "Be brief."}, user("Capital of France?")],
             "completion": [bot("Paris")]},
            {"id": "fewshot", "prompt": [user("1+1?"), bot("2"), user("2+3?")], "completion": [bot("5")]},
            {"id": "turns", "prompt": [user("Hi")], "completion": [bot("Hello!"), user("Bye"), bot("Bye now.")]},
            {"id": "sharegpt", "prompt": [{"from": "human", "value": "Sky colour?"}],
             "completion": [{"from": "gpt", "value": "Blue."}]}]


def _as_roles(messages: list[dict]) -> list[dict]:
    """ShareGPT turns as role/content ones (fcp reads both spellings; TRL takes role/content prompt-completion lines
    only, so the reference is given those)."""
    names = {"human": "user", "gpt": "assistant", "system": "system"}
    return [{"role": names[m["from"]], "content": m["value"]} if "from" in m else m for m in messages]


def _trl(tok, row: dict, template: str, kwargs: dict) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` as TRL's SFTTrainer makes them for a conversational prompt-completion line."""
    from trl.data_utils import _tokenize, common_prefix_length

    prompt, completion = _as_roles(row["prompt"]), _as_roles(row["completion"])
    kw = {"chat_template": template, "tools": None, **kwargs}
    prompt_ids = _tokenize(tok, prompt, add_generation_prompt=True, **kw)["input_ids"]
    ids = _tokenize(tok, prompt + completion, **kw)["input_ids"]
    k = common_prefix_length(prompt_ids, ids)
    return ids, [-100] * k + ids[k:]


@pytest.mark.parametrize("template, ext", [("qwen25", "jsonl"), ("qwen25", "parquet"), ("smol", "jsonl"),
                                           ("chatml", "jsonl"), ("llama3", "jsonl"), ("qwen25_gen", "jsonl"),
                                           ("chatml_jinja", "jsonl")])
def test_prompt_completion_lines_equal_trl(tmp_path, template, ext):
    """Index and reader equal TRL's ids and completion-only labels, line by line; the summary says what is trained;
    a few-shot prompt's assistant turn is not trained. Parquet: the Hub's form (message structs, the fields a turn
    lacks null). Templates with ``{% generation %}`` blocks (Qwen2.5's with them, chatml as Jinja): their blocks do
    not reach the text (before: fcp's block marks were written into the sample) and do not decide the labels (TRL
    uses them only with ``assistant_only_loss``)."""
    pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    jinja = {"qwen25": QWEN25, "smol": SMOL, "chatml": CHATML_GEN, "llama3": LLAMA3_GEN, "qwen25_gen": QWEN25_GEN,
             "chatml_jinja": CHATML_GEN}[template]
    model = _model(tmp_path, "model", jinja, QWEN_SPECIAL)
    rows = _rows()
    if template == "smol":  # the line's template kwargs reach both renders, as TRL passes them
        rows = [dict(r, chat_template_kwargs={"enable_thinking": k % 2 == 0}) for k, r in enumerate(rows)]
    if ext == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pc.parquet")
    else:
        _write(tmp_path / "pc.jsonl", rows)
    given = template if template in ("chatml", "llama3") else str(model)
    manifest, rc = build_index([str(tmp_path / f"pc.{ext}")], "text", tmp_path / "idx", prompt_field="prompt",
                               chat_field="completion", chat_template=given, tokenizer=str(model / "tokenizer.json"),
                               progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    from fcp_data.index.merge import summarize

    assert "prompt 'prompt' + completion 'completion'" in summarize(manifest)
    assert "labels on the completion (TRL's completion-only loss)" in summarize(manifest)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / "idx")
    assert data.has_labels
    for r in rows:
        ids, labels = _trl(hf, r, jinja, r.get("chat_template_kwargs", {}))
        i = list(data.index.keys).index(r["id"])
        s = data[i]
        assert s["input_ids"].tolist() == ids and int(data.index.num_tokens[i]) == len(ids), (template, r["id"])
        assert s["labels"].tolist() == labels, (template, r["id"])
        assert 0 < sum(t != -100 for t in labels) < len(ids)
    from fcp_exec.train_data import _labels_note

    assert _labels_note(data) == ", SFT labels (the completion)"  # fcp train's data line says what is trained
    fewshot = data[list(data.index.keys).index("fewshot")]
    trained = hf.decode([t for t in fewshot["labels"].tolist() if t != -100])
    assert "5" in trained and "2" not in trained  # the prompt's example answer is context only


def test_prompt_completion_lines_that_are_no_samples_are_recorded(tmp_path, capsys):
    """A prompt or completion that is no list of messages (text, empty) is ``bad_messages``; no assistant turn in
    either, ``no_assistant_turn``; a line without its prompt field, ``missing_field``; an image in a prompt-completion
    line is the prompt's (``test_chat_pc_media.py``), never dropped: under a text spec ``bad_messages``, under a
    vision spec its file is looked for (``missing_media`` here). ``--prompt-field`` naming the ``--chat-field`` is one
    line and exit 2."""
    from fcp_cli.main import main as cli_main

    user, bot = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
    image = {"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "what?"}]}
    rows = [{"id": "ok", "prompt": [user], "completion": [bot]},
            {"id": "text", "prompt": "q", "completion": [bot]}, {"id": "empty", "prompt": [user], "completion": []},
            {"id": "noanswer", "prompt": [user], "completion": [user]}, {"id": "noprompt", "completion": [bot]},
            {"id": "image", "prompt": [image], "completion": [bot]}]
    _write(tmp_path / "pc.jsonl", rows)
    for spec in ("text", "qwen2.5-vl"):
        manifest, rc = build_index([str(tmp_path / "pc.jsonl")], spec, tmp_path / f"idx-{spec}", prompt_field="prompt",
                                   chat_field="completion", progress=False, max_error_rate=1)
        assert rc == 0 and manifest["num_samples"] == 1, spec
        by = manifest["errors_by_reason"]
        want = {"bad_messages": 2, "no_assistant_turn": 1, "missing_field": 1}
        want.update({"bad_messages": 3} if spec == "text" else {"missing_media": 1})  # the image line
        assert by == want, spec
    errors = [json.loads(x) for x in next((tmp_path / "idx-qwen2.5-vl").glob("data-*/errors.jsonl")).read_text()
              .splitlines()]
    assert any(e["key"] == "image" and "x.png" in e["detail"] for e in errors)
    capsys.readouterr()
    rc = cli_main(["index", str(tmp_path / "pc.jsonl"), "--spec", "text", "--out", str(tmp_path / "x"),
                   "--prompt-field", "completion", "--chat-field", "completion", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "name the same field" in err and not (tmp_path / "x").exists()


# Qwen3's generation prompt as shipped: with enable_thinking false it ends in an empty think block
QWEN3_REAL = QWEN3.replace("""{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
""", """{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and """
    """enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}""")


def _newline_merging_model(tmp_path):
    """A model folder with Qwen3's template and a tokenizer with Qwen2's pre-tokenizer split and a ``\\n\\n`` token
    (``ĊĊ``), as Qwen's vocabulary has: the generation prompt's last ``\\n\\n`` is one token there, while the full
    conversation splits it where the completion goes on."""
    from tokenizers import Tokenizer

    model = _model(tmp_path, "qwen3", QWEN3_REAL, QWEN_SPECIAL)
    tok = json.loads((model / "tokenizer.json").read_text())
    vocab, merges = tok["model"]["vocab"], tok["model"]["merges"]
    vocab["ĊĊ"] = max([t["id"] for t in tok["added_tokens"]] + list(vocab.values())) + 1
    merges.insert(0, ["Ċ", "Ċ"] if merges and isinstance(merges[0], list) else "Ċ Ċ")
    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
             r"\s+(?!\S)|\s+")
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    (model / "tokenizer.json").write_text(json.dumps(tok))
    t = Tokenizer.from_file(str(model / "tokenizer.json"))
    head, full = (t.encode(x, add_special_tokens=False).tokens for x in ("</think>\n\n", "</think>\nTwo"))
    assert head[-1] == "ĊĊ" and "Ċ" in full and "ĊĊ" not in full  # the texts part inside the head's last token
    return model


def test_labels_start_at_the_common_prefix_of_the_token_lists(tmp_path):
    """Qwen3 with ``enable_thinking`` false writes ``<think>\\n\\n</think>\\n\\n`` as the generation prompt; the
    full conversation writes the completion's reasoning there. The texts part inside the generation prompt's last
    token, so TRL trains from that token on (its common prefix is of the id lists); a character prefix would leave
    the token holding the first ``\\n`` of the completion's own think block untrained. Reference: TRL's helpers."""
    pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    model = _newline_merging_model(tmp_path)
    user, off = {"role": "user", "content": "2+2?"}, {"enable_thinking": False}
    rows = [{"id": "reasoning", "prompt": [user], "chat_template_kwargs": off,
             "completion": [{"role": "assistant", "content": "4", "reasoning_content": "Two plus two."}]},
            {"id": "plain", "prompt": [user], "chat_template_kwargs": off,
             "completion": [{"role": "assistant", "content": "4"}]},
            {"id": "thinking", "prompt": [user], "completion": [{"role": "assistant", "content": "4"}]}]
    _write(tmp_path / "pc.jsonl", rows)
    manifest, rc = build_index([str(tmp_path / "pc.jsonl")], "text", tmp_path / "idx", prompt_field="prompt",
                               chat_field="completion", chat_template=str(model), progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / "idx")
    for i, r in enumerate(rows):
        ids, labels = _trl(hf, r, QWEN3_REAL, r.get("chat_template_kwargs", {}))
        assert data[i]["input_ids"].tolist() == ids and data[i]["labels"].tolist() == labels, r["id"]
    first = hf.convert_ids_to_tokens([t for t in data[0]["labels"].tolist() if t != -100])[0]
    assert first == "Ċ"  # the token the two texts split differently is trained, as TRL trains it


def test_a_llava_tag_in_a_prompt_without_its_media_is_recorded(tmp_path):
    """Under a multimodal spec a prompt turn that starts with a LLaVA tag (``<image>\\n...``) but a line without the
    image lost its media: ``media_tag_mismatch``, as in a conversation (before: the prompt's turns were not looked
    at)."""
    rows = [{"id": "tag", "prompt": [{"role": "user", "content": "<image>\nWhat is it?"}],
             "completion": [{"role": "assistant", "content": "A cat."}]},
            {"id": "ok", "prompt": [{"role": "user", "content": "What is it?"}],
             "completion": [{"role": "assistant", "content": "A cat."}]}]
    _write(tmp_path / "pc.jsonl", rows)
    manifest, rc = build_index([str(tmp_path / "pc.jsonl")], "qwen2.5-vl", tmp_path / "idx", prompt_field="prompt",
                               chat_field="completion", progress=False, max_error_rate=1)
    assert rc == 0 and manifest["num_samples"] == 1 and manifest["errors_by_reason"] == {"media_tag_mismatch": 1}

