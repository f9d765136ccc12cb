"""A conversation line's own chat-template variables (its ``chat_template_kwargs`` field, ``fcp index
--template-kwargs-field``) rendered as TRL's SFTTrainer renders a text conversation: ``apply_chat_template(messages,
tools=..., **example.get("chat_template_kwargs", {}))`` — e.g. SmolLM3's and Qwen3's ``enable_thinking``, which writes
the ``/no_think`` flag and an empty ``<think>`` block into a reasoning-off conversation — at index time and read time;
image/video conversations get them too (TRL's vision collator passes none; fcp does not drop them there).

Reference: transformers' ``apply_chat_template`` on the same template with the line's kwargs (text with
``tokenize=False``; ids and the assistant mask from the same template with ``{% generation %}`` blocks). The template
has the shape SmolLM3's has: a system turn with the reasoning flag and the line's ``custom_instructions``, the empty
think block before the answer when reasoning is off. Before, a line's kwargs were never read: every reasoning-off
conversation of such a dataset was trained as a reasoning-on one (another system turn, no think block), on lengths
that are not the samples'. A failure here means that again.
"""

from __future__ import annotations

import json

import pytest
from test_chat_media import TEMPLATE as MEDIA_TEMPLATE
from test_chat_review import QWEN_SPECIAL, _model
from test_chat_tools import _assert_equals_hf, check_media_lines
from test_index_sft import _write

from fcp_cli.main import main as cli_main
from fcp_data import IndexedDataset
from fcp_data.chat import ChatFormatError, chat_kwargs, chat_tools, render_chat
from fcp_data.index import build_index

_HEAD = ("{%- set think = enable_thinking if enable_thinking is defined else true -%}"
         "{{- '<|im_start|>system\\n' + ('/think' if think else '/no_think') -}}"
         "{%- if custom_instructions is defined and custom_instructions %}{{- '\\n' + custom_instructions -}}"
         "{%- endif -%}{{- '<|im_end|>\\n' -}}")
_ANSWER = "{{- '<|im_start|>assistant\\n' + ('' if think else '<think>\\n\\n</think>\\n') -}}"
_OTHER = "{%- elif m.role != 'system' -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}"
# as a model ships it (no generation blocks: fcp finds each answer itself), and with the blocks (the reference's mask)
SMOL = (_HEAD + "{%- for m in messages -%}{%- if m.role == 'assistant' -%}" + _ANSWER
        + "{{- m.content + '<|im_end|>\\n' -}}" + _OTHER + "{%- endif -%}{%- endfor -%}")
SMOL_GEN = (_HEAD + "{%- for m in messages -%}{%- if m.role == 'assistant' -%}" + _ANSWER
            + "{% generation %}{{- m.content + '<|im_end|>' -}}{% endgeneration %}{{- '\\n' -}}" + _OTHER
            + "{%- endif -%}{%- endfor -%}")


def _rows() -> list[dict]:
    """Lines as datasets hold them: kwargs an object (smoltalk2's column), a JSON string, absent, null, ``{}``."""
    ask = [{"role": "user", "content": "Two plus two?"}, {"role": "assistant", "content": "Four."}]
    return [{"id": "off", "chat_template_kwargs": {"enable_thinking": False}, "messages": ask},
            {"id": "string", "chat_template_kwargs": json.dumps({"enable_thinking": False,
                                                                 "custom_instructions": "Be brief."}),
             "messages": [{"role": "system", "content": "ignored by this template"}] + ask},
            {"id": "on", "chat_template_kwargs": {"enable_thinking": True, "custom_instructions": "Cite."},
             "messages": ask},
            {"id": "absent", "messages": ask},
            {"id": "null", "chat_template_kwargs": None, "messages": ask},
            {"id": "empty", "chat_template_kwargs": {}, "messages": ask + ask}]


def _hf_kwargs(row: dict, field: str = "chat_template_kwargs") -> dict:
    """What TRL passes: ``example.get("chat_template_kwargs", {})`` (a JSON string read as its object — TRL itself
    takes objects only; null as none)."""
    kw = row.get(field)
    return json.loads(kw) if isinstance(kw, str) else kw or {}


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_template_kwargs_equal_apply_chat_template(tmp_path, ext):
    """Every spelling of a line's kwargs gives transformers' text, ids and mask with those kwargs: reasoning off
    writes ``/no_think`` and the empty think block (trained as the model writes it at inference: outside the answer
    here, as the template's generation block says), the line's instructions reach the system turn, and lines without
    kwargs render as before. Parquet: the kwargs a struct column (fields a line lacks are null there and passed as
    None, as datasets and TRL pass them)."""
    transformers = pytest.importorskip("transformers")
    model = _model(tmp_path, "smol", SMOL, QWEN_SPECIAL)
    rows = _rows()
    data_file = tmp_path / f"chat.{ext}"
    if ext == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist([dict(r, chat_template_kwargs=_hf_kwargs(r) or None) for r in rows]),
                       data_file)
        rows = pq.read_table(data_file).to_pylist()  # what a reader of the file gets: struct fields filled with None
        assert rows[0]["chat_template_kwargs"] == {"enable_thinking": False, "custom_instructions": None}
    else:
        _write(data_file, rows)
    for template in (model, model / "chat_template.jinja"):  # the folder, or its template file alone
        out = tmp_path / f"idx-{template.name}"
        manifest, rc = build_index([str(data_file)], "text", out, chat_field="messages", chat_template=str(template),
                                   tokenizer=str(model / "tokenizer.json"), progress=False)
        assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
        assert manifest["template_kwargs_field"] == "chat_template_kwargs"
        hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
        data = IndexedDataset(out)
        for r in rows:
            _assert_equals_hf(data, hf, r, SMOL, SMOL_GEN, _hf_kwargs(r))
        texts = {r["id"]: hf.decode(data[list(data.index.keys).index(r["id"])]["input_ids"].tolist()) for r in rows}
        assert "/no_think" in texts["off"] and "<think>\n\n</think>\nFour." in texts["off"]
        assert "/no_think\nBe brief." in texts["string"] and "/think\nCite." in texts["on"]
        assert all("/think<|im_end|>" in texts[k] and "<think>" not in texts[k] for k in ("absent", "null", "empty"))


def test_kwargs_that_cannot_be_rendered_are_recorded(tmp_path):
    """Kwargs that are no object of template variables are ``bad_template_kwargs``, naming the field: a list, text
    that is not JSON, JSON past Python's integer digit limit or nesting past its stack (a ValueError and a
    RecursionError from inside ``json``), a number, a key that is one of apply_chat_template's own parameters
    (``tools``, ``add_generation_prompt``, ``conversations``: TRL merges the kwargs into that call, so they would
    replace its tools, add a generation prompt or fail — not template variables) or no name. The built-in templates
    read no variable: their lines index as without kwargs (same counts)."""
    ask = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    bad = {"list": [{"enable_thinking": False}], "notjson": "{'enable_thinking': False}", "number": 3,
           "tools": {"tools": []}, "prompt": {"add_generation_prompt": True}, "notaname": {"enable-thinking": False},
           "messages": {"messages": []}, "conversations": {"conversations": 1},
           "digits": '{"a": ' + "1" * 5000 + "}", "deep": "[" * 100_000}
    good = {"plain": None, "off": {"enable_thinking": False}, "blank": " "}
    rows = ([{"id": k, "chat_template_kwargs": v, "messages": ask} for k, v in good.items()]
            + [{"id": k, "chat_template_kwargs": v, "messages": ask} for k, v in bad.items()])
    _write(tmp_path / "chat.jsonl", rows)
    for template in ("chatml", "llama3"):
        manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / f"idx-{template}",
                                   chat_field="messages", chat_template=template, progress=False, max_error_rate=1)
        assert rc == 0 and manifest["num_samples"] == len(good), template
        assert manifest["errors_by_reason"] == {"bad_template_kwargs": len(bad)}, template
        data = IndexedDataset(tmp_path / f"idx-{template}")
        assert len({data[i]["input_ids"].tolist().__repr__() for i in range(len(good))}) == 1
        assert data[0]["input_ids"].tolist() == data.spec.tokenizer().encode(
            render_chat(ask, template)[0], add_special_tokens=False).ids
    with pytest.raises(ChatFormatError, match="'kw' is a string but not JSON") as e:
        chat_kwargs({"kw": bad["notjson"]}, "kw")
    assert e.value.reason == "bad_template_kwargs"
    with pytest.raises(ChatFormatError, match="names add_generation_prompt, tools"):
        chat_kwargs({"kw": {"tools": [], "add_generation_prompt": True, "ok": 1}}, "kw")
    with pytest.raises(ChatFormatError, match="must be an object of template variables"):
        chat_kwargs({"kw": [1]}, "kw")
    assert chat_kwargs({"kw": {"a": 1}}, "other") == {} and chat_kwargs({"kw": '{"a": null}'}, "kw") == {"a": None}
    assert chat_tools({"tools": '""'}, "tools") is None  # a JSON blank string is no tools, as it was at stop 61


def test_template_kwargs_field_option(tmp_path, capsys):
    """``--template-kwargs-field`` names another field (the default is then not read); without --chat-field, naming
    the conversation, key or tools field, it is one line and exit 2 with nothing written."""
    transformers = pytest.importorskip("transformers")
    model = _model(tmp_path, "smol", SMOL, QWEN_SPECIAL)
    row = {"id": "kw", "flags": {"enable_thinking": False}, "chat_template_kwargs": {"custom_instructions": "no"},
           "messages": [{"role": "user", "content": "Paris?"}, {"role": "assistant", "content": "Sunny."}]}
    _write(tmp_path / "chat.jsonl", [row])
    rc = cli_main(["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--out", str(tmp_path / "idx"),
                   "--chat-field", "messages", "--chat-template", str(model), "--template-kwargs-field", "flags",
                   "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "template kwargs in 'flags'" in out
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    _assert_equals_hf(IndexedDataset(tmp_path / "idx"), hf, row, SMOL, SMOL_GEN, row["flags"])
    chat = ["--chat-field", "messages"]
    for extra, want in [(["--template-kwargs-field", "flags"], "--template-kwargs-field is for the template variables"),
                        (chat + ["--template-kwargs-field", "messages"], "--template-kwargs-field must be a"),
                        (chat + ["--template-kwargs-field", "id"], "--template-kwargs-field must be a"),
                        (chat + ["--template-kwargs-field", "tools"], "name one field twice")]:
        args = ["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--out", str(tmp_path / "x"), "--no-progress"]
        rc = cli_main(args + extra)
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and want in err, (extra, err)
        assert not (tmp_path / "x").exists()


def test_an_index_built_before_template_kwargs_reads_as_it_was_counted(tmp_path):
    """An index whose manifest has no ``template_kwargs_field`` (built before it) was counted without the lines'
    kwargs: its reader renders without them, so the samples keep the lengths the index holds. (Such an index is
    made here by counting with a kwargs field the lines lack, then dropping the key from its manifest.)"""
    model = _model(tmp_path, "smol", SMOL, QWEN_SPECIAL)
    rows = _rows()[:3]
    _write(tmp_path / "chat.jsonl", rows)
    for out, field in (("new", None), ("old", "absent_field")):
        build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / out, chat_field="messages",
                    chat_template=str(model), template_kwargs_field=field, progress=False)
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    del manifest["template_kwargs_field"]
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    old, new = IndexedDataset(tmp_path / "old"), IndexedDataset(tmp_path / "new")
    for i, r in enumerate(rows):
        without = old.spec.tokenizer().encode(render_chat(r["messages"], manifest["chat_template"])[0],
                                              add_special_tokens=False).ids
        assert old[i]["input_ids"].tolist() == without and int(old.index.num_tokens[i]) == len(without), r["id"]
        assert new[i]["input_ids"].tolist() != without, r["id"]  # these lines' kwargs change their text


# the media template with SmolLM3's reasoning flag in a system turn of its own
MEDIA_KWARGS = ("{{ '<|im_start|>system\\n' + ('/think' if enable_thinking is not defined or enable_thinking "
                "else '/no_think') + '<|im_end|>\\n' }}" + MEDIA_TEMPLATE)


@pytest.mark.parametrize("spec", ["qwen2.5-vl", "llava-video"])
def test_media_conversations_with_template_kwargs(tmp_path, spec):
    """Image/video conversations with kwargs (a JSON string; an object) equal transformers with the kwargs
    (:func:`test_chat_tools.check_media_lines`: ids, labels, index counts, the sampler's visual layout)."""
    off = {"enable_thinking": False}
    extra = ({"chat_template_kwargs": json.dumps(off)}, {"chat_template_kwargs": off})
    texts = check_media_lines(tmp_path, spec, MEDIA_KWARGS, extra, _hf_kwargs)
    assert all("/no_think" in t for t in texts)
