"""A conversation line's tool definitions (its ``tools`` field, ``fcp index --tools-field``) rendered as
``transformers``' ``apply_chat_template(messages, tools=...)`` renders them — as TRL's SFTTrainer passes
``tools=example.get("tools")`` — at index time and read time, for text and for image/video conversations.

Reference: ``apply_chat_template`` on the same template with the same ``tools`` value (text with ``tokenize=False``;
ids and the assistant mask from the template with ``{% generation %}`` blocks). The templates have the shapes the
models ship: Qwen2.5's (``{%- if tools %}`` writes a system turn listing each tool as JSON) and a Mistral-like one that
tests ``tools is not none`` — transformers passes ``tools=None`` when there are none, so such a template must see
None, not an undefined name (before: every conversation without tools got an empty tools block the model never sees).
A failure means an agent is fine-tuned without the tool list its prompts hold, on lengths that are not the samples'.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_chat_media import TEMPLATE as MEDIA_TEMPLATE
from test_chat_media import _clips, _images
from test_chat_media import _reference_many as _media_reference
from test_chat_review import QWEN25, QWEN25_GEN, QWEN_SPECIAL, _call, _model
from test_index_sft import _write

from fcp_cli.main import main as cli_main
from fcp_data import IndexedDataset
from fcp_data.chat import ChatFormatError, chat_tools, render_chat
from fcp_data.index import build_index

# Qwen2.5's tools block as shipped: a system turn (the line's own system text, else the default) listing the tools
_QWEN25_TOOLS_HEAD = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
"""
_QWEN25_SYSTEM = QWEN25[: QWEN25.index("{%- for message in messages %}")]
_INDENTED = "".join("    " + line + "\n" if line else "\n" for line in _QWEN25_SYSTEM.splitlines())


def _with_tools(template: str) -> str:
    """Qwen2.5's template with its tools block: the system part of ``template`` becomes the no-tools branch."""
    return template.replace(_QWEN25_SYSTEM, _QWEN25_TOOLS_HEAD + _INDENTED + "{%- endif %}\n", 1)


QWEN25_TOOLS, QWEN25_TOOLS_GEN = _with_tools(QWEN25), _with_tools(QWEN25_GEN)
# a template that asks ``tools is not none`` (Mistral's do) and writes an assistant turn in a generation block
NOT_NONE = ("{%- if tools is not none %}{{ '[TOOLS]' + (tools | tojson) + '[/TOOLS]' }}{%- endif %}"
            "{%- for m in messages %}{%- if m.role == 'assistant' %}{% generation %}{{ m.content + '<|im_end|>' }}"
            "{% endgeneration %}{%- else %}{{ '[INST]' + m.content + '[/INST]' }}{%- endif %}{%- endfor %}")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city, now.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "description": "Ünïcödé — 東京 ok"}},
                                                "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def _rows() -> list[dict]:
    """Lines as datasets hold them: tools a list, a JSON string (xLAM, many Hub sets), absent, null, blank, ``[]``;
    with and without a system turn, with tool calls."""
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    call = [{"role": "assistant", "content": None, "tool_calls": [_call("get_weather", city="Paris")]},
            {"role": "tool", "content": "21"}, {"role": "assistant", "content": "21 C."}]
    system = [{"role": "system", "content": "Answer briefly."}]
    return [{"id": "list", "tools": [WEATHER, TIME], "messages": ask + call},
            {"id": "string", "tools": json.dumps([WEATHER]), "messages": system + ask + call},
            {"id": "absent", "messages": ask + [{"role": "assistant", "content": "I cannot look."}]},
            {"id": "null", "tools": None, "messages": system + ask + [{"role": "assistant", "content": "No."}]},
            {"id": "blank", "tools": " ", "messages": ask + [{"role": "assistant", "content": "No."}]},
            {"id": "empty", "tools": [], "messages": ask + [{"role": "assistant", "content": "No tools."}]}]


def _hf_tools(row: dict):
    """What TRL passes: ``example.get("tools")``, a JSON string read as the list it holds, a blank one as None."""
    t = row.get("tools")
    return (json.loads(t) if t.strip() else None) if isinstance(t, str) else t


def _assert_equals_hf(data: IndexedDataset, hf, row: dict, shipped: str, gen: str, kwargs: dict | None = None) -> None:
    """Sample ``row`` equals transformers with ``kwargs`` (default: the line's tools, as TRL passes them): the text
    of the ``shipped`` template, ids and assistant mask of ``gen`` (the same with {% generation %} blocks)."""
    kwargs = {"tools": _hf_tools(row)} if kwargs is None else kwargs
    text = hf.apply_chat_template(row["messages"], chat_template=shipped, tokenize=False, **kwargs)
    ref = hf.apply_chat_template(row["messages"], chat_template=gen, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True, **kwargs)
    ids, mask = list(ref["input_ids"]), list(ref["assistant_masks"])
    assert hf.decode(ids) == text, row["id"]  # the blocked template writes the shipped text
    i = list(data.index.keys).index(row["id"])
    s = data[i]
    assert s["input_ids"].tolist() == ids and int(data.index.num_tokens[i]) == len(ids), row["id"]
    assert s["labels"].tolist() == [t if m else -100 for t, m in zip(ids, mask)], row["id"]


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_qwen25_tools_equal_apply_chat_template(tmp_path, ext):
    """Qwen2.5's template as shipped: every spelling of a line's tools gives transformers' text, ids and mask with
    ``tools=`` that value — the tool list in the system turn (``[]``, absent, null, blank: the plain system turn);
    jsonl and Parquet (tools as a JSON string column, the Hub's usual form) alike."""
    transformers = pytest.importorskip("transformers")
    model = _model(tmp_path, "qwen25", QWEN25_TOOLS, QWEN_SPECIAL)
    rows = _rows()
    data_file = tmp_path / f"chat.{ext}"
    if ext == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist([dict(r, tools=json.dumps(_hf_tools(r)) if r.get("tools") is not None
                                                  else None) for r in rows]), data_file)
    else:
        _write(data_file, rows)
    manifest, rc = build_index([str(data_file)], "text", tmp_path / "idx", chat_field="messages",
                               chat_template=str(model), progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    assert manifest["tools_field"] == "tools"
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / "idx")
    for r in rows:
        _assert_equals_hf(data, hf, r, QWEN25_TOOLS, QWEN25_TOOLS_GEN)
    listed = data[list(data.index.keys).index("list")]["input_ids"].tolist()
    assert '"name": "get_time"' in hf.decode(listed) and "# Tools" in hf.decode(listed)
    assert "# Tools" not in hf.decode(data[list(data.index.keys).index("absent")]["input_ids"].tolist())


def test_a_template_asking_tools_is_not_none_sees_none(tmp_path):
    """transformers passes ``tools=None`` when a line has none; a template testing ``tools is not none`` writes no
    tools block then (before: the name was undefined, ``is not none`` true, an empty ``[TOOLS][/TOOLS]`` block
    written into every conversation), and writes one for ``[]`` as transformers does."""
    transformers = pytest.importorskip("transformers")
    model = _model(tmp_path, "mistralish", NOT_NONE, QWEN_SPECIAL)
    rows = [r for r in _rows() if r["id"] in ("list", "absent", "null", "empty")]
    rows = [dict(r, messages=[m for m in r["messages"] if m["role"] in ("user", "assistant") and m["content"]])
            for r in rows]
    _write(tmp_path / "chat.jsonl", rows)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "idx", chat_field="messages",
                               chat_template=str(model), progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / "idx")
    for r in rows:
        _assert_equals_hf(data, hf, r, NOT_NONE, NOT_NONE)
    assert render_chat(rows[1]["messages"], manifest["chat_template"])[0].startswith("[INST]")  # no tools: none
    assert render_chat(rows[1]["messages"], manifest["chat_template"], [])[0].startswith("[TOOLS][][/TOOLS]")


def test_tools_that_cannot_be_rendered_are_recorded(tmp_path):
    """The built-in templates cannot write tools: such a line is ``unsupported_tools`` (never indexed without
    them); tools that are no list of objects are ``bad_tools``, naming the field; lines without tools index as
    before."""
    ask = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    bad = {"notjson": "[{'name': 'f'}]", "object": {"name": "f"}, "numbers": [1, 2], "emptyobj": [{}], "number": 3}
    rows = ([{"id": "plain", "messages": ask}, {"id": "tools", "tools": [WEATHER], "messages": ask}]
            + [{"id": k, "tools": v, "messages": ask} for k, v in bad.items()])
    _write(tmp_path / "chat.jsonl", rows)
    for template in ("chatml", "llama3"):
        manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / f"idx-{template}",
                                   chat_field="messages", chat_template=template, progress=False, max_error_rate=1)
        assert rc == 0 and manifest["num_samples"] == 1, template
        assert manifest["errors_by_reason"] == {"unsupported_tools": 1, "bad_tools": len(bad)}, template
    with pytest.raises(ChatFormatError, match="built-in chatml template cannot write") as e:
        render_chat(ask, "chatml", [WEATHER])
    assert e.value.reason == "unsupported_tools"
    assert render_chat(ask, "chatml", []) == render_chat(ask, "chatml")  # nothing to write
    with pytest.raises(ChatFormatError, match="tools field 'tools' is a string but not JSON") as e:
        chat_tools({"tools": bad["notjson"]}, "tools")
    assert e.value.reason == "bad_tools"
    with pytest.raises(ChatFormatError, match="tools field 'fns' must be a list of tool objects"):
        chat_tools({"fns": {"name": "f"}}, "fns")
    assert chat_tools({"fns": [WEATHER]}, "tools") is None and chat_tools({"tools": "[]"}, "tools") == []


def test_tools_field_option(tmp_path, capsys):
    """``--tools-field`` names another field (the default ``tools`` is then not read); without --chat-field, or
    naming the conversation or key field, it is one line and exit 2."""
    transformers = pytest.importorskip("transformers")
    model = _model(tmp_path, "qwen25", QWEN25_TOOLS, QWEN_SPECIAL)
    row = {"id": "fn", "functions": json.dumps([WEATHER]), "tools": "ignored: not the field asked for",
           "messages": [{"role": "user", "content": "Paris?"}, {"role": "assistant", "content": "Sunny."}]}
    _write(tmp_path / "chat.jsonl", [row])
    rc = cli_main(["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--out", str(tmp_path / "idx"),
                   "--chat-field", "messages", "--chat-template", str(model), "--tools-field", "functions",
                   "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0 and "tools in 'functions'" in out
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    _assert_equals_hf(IndexedDataset(tmp_path / "idx"), hf, dict(row, tools=row["functions"]), QWEN25_TOOLS,
                      QWEN25_TOOLS_GEN)
    for extra, want in [([], "--tools-field is the tool definitions of --chat-field conversations; give both"),
                        (["--chat-field", "messages", "--tools-field", "messages"], "--tools-field must be a"),
                        (["--chat-field", "messages", "--tools-field", "id"], "--tools-field must be a")]:
        args = ["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--out", str(tmp_path / "x"), "--no-progress"]
        rc = cli_main(args + (extra or ["--tools-field", "functions"]))
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and want in err, (extra, err)
        assert not (tmp_path / "x").exists()


# the media template with Qwen2.5's way of listing tools in a system turn of their own
MEDIA_TOOLS = ("{%- if tools %}{{ '<|im_start|>system\\n# Tools' }}{%- for t in tools %}{{ '\\n' + (t | tojson) }}"
               "{%- endfor %}{{ '<|im_end|>\\n' }}{%- endif %}" + MEDIA_TEMPLATE)


def check_media_lines(tmp_path, spec: str, template: str, extra: tuple[dict, dict],
                      hf_kwargs) -> list[str]:
    """Two image/video conversations (a video; an image and a video), each with its ``extra`` fields, indexed with
    ``template``: ids and labels equal the reference (transformers with ``hf_kwargs(line)``, what TRL passes; each
    media part one placeholder then replaced by the plain sample's visual block), the index counts them, and the
    sampler's visual layout (several media: read from the record again) equals the reader's ids. Returns the
    reference's texts."""
    transformers = pytest.importorskip("transformers")
    from fcp_data.visual_layout import IndexVisualLayout

    clips, imgs = _clips(tmp_path, 1), _images(tmp_path, [(60, 90)])
    build_index([str(tmp_path / "media")], spec, tmp_path / "plain", progress=False)
    plain = IndexedDataset(tmp_path / "plain")
    eos = 0 if plain.eos_token_id is None else 1
    block = {n: (lambda s: s["input_ids"].tolist()[: len(s["input_ids"]) - eos])(
        plain[list(plain.index.keys).index(n.rsplit(".", 1)[0])]) for n in clips + imgs}
    answer = {"role": "assistant", "content": "It rains."}
    one = {"id": "one", **extra[0], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Where? "},
                                     {"type": "video", "video": f"media/{clips[0]}"}]}, answer]}
    two = {"id": "two", **extra[1], "messages": [
        {"role": "user", "content": [{"type": "image", "image": f"media/{imgs[0]}"}, {"type": "text", "text": " and "},
                                     {"type": "video", "video": f"media/{clips[0]}"}]}, answer]}
    _write(tmp_path / "chat.jsonl", [one, two])
    (tmp_path / "tpl.jinja").write_text(template)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], spec, tmp_path / "idx", chat_field="messages",
                               chat_template=str(tmp_path / "tpl.jinja"), progress=False)
    assert rc == 0 and manifest["num_samples"] == 2, manifest["errors_by_reason"]
    data = IndexedDataset(tmp_path / "idx")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=plain.spec.tokenizer_path)
    layout, vis = IndexVisualLayout(data.index), torch.tensor(data.placeholder_ids)
    texts = []
    for row, order in ((one, clips), (two, imgs + clips)):
        i = list(data.index.keys).index(row["id"])
        s = data[i]
        hf = _WithKwargs(hf_tok, template, hf_kwargs(row))
        texts.append(hf.apply_chat_template(row["messages"], template, tokenize=False))
        ids, labels = _media_reference(hf, row["messages"], [block[n] for n in order])
        assert s["input_ids"].tolist() == ids and s["labels"].tolist() == labels, row["id"]
        assert int(data.index.num_tokens[i]) == len(ids)
        n = len(ids)
        for cut in (1, 2, n // 3, n // 2, n - 1, n):
            assert layout(i, cut) == int(torch.isin(s["input_ids"][1:cut], vis).sum()), (row["id"], cut)
    return texts


class _WithKwargs:
    """A tokenizer whose ``apply_chat_template`` renders ``template`` with ``kwargs`` added (the media reference
    helper takes a tokenizer)."""

    def __init__(self, tok, template: str, kwargs: dict):
        self.tok, self.template, self.kwargs = tok, template, kwargs

    def apply_chat_template(self, messages, chat_template, **kw):
        return self.tok.apply_chat_template(messages, chat_template=self.template, **kw, **self.kwargs)

    def convert_tokens_to_ids(self, t):
        return self.tok.convert_tokens_to_ids(t)


@pytest.mark.parametrize("spec", ["qwen2.5-vl", "llava-video"])
def test_media_conversations_with_tools(tmp_path, spec):
    """Image/video conversations with tools (a JSON string; a list) equal transformers with ``tools=``
    (:func:`check_media_lines`), the tools listed."""
    extra = ({"tools": json.dumps([WEATHER])}, {"tools": [WEATHER, TIME]})
    texts = check_media_lines(tmp_path, spec, MEDIA_TOOLS, extra, lambda row: {"tools": _hf_tools(row)})
    assert all("# Tools" in t for t in texts) and '"get_time"' in texts[1]
