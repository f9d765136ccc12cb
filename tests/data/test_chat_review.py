"""Chat SFT with the model's own template on the data real SFT sets hold: reasoning (``reasoning_content``), tool
calls (a turn of only tool calls, content None / "" / absent), Parquet rows whose turns carry ``null`` fields, and
ShareGPT ``function_call`` turns; the built-in templates refuse what they cannot write; markers a tokenizer splits
are reported; a data file is no template.

Reference: ``transformers``' ``apply_chat_template`` on the same model folder — the text of the template as shipped
(``tokenize=False``) and, for the labels, the assistant mask (``return_assistant_tokens_mask``) of the same template
with ``{% generation %}`` blocks where docs/SFT.md's rule puts them: an assistant turn from its content, or from the
end of its header when the template writes its reasoning or tool calls first or it has no content (``<think>`` and
``<tool_call>`` trained), to its end-of-turn marker. The templates are written here in the shapes Qwen2.5, Qwen3 and
Llama 3.1 ship (tool calls, think blocks, ``'tool_calls' in message``); the test checks that each blocked version
renders the shipped one's text. A failure means SFT trains a reasoning model without its reasoning, an agent without
its tool calls (or drops those lines), or the model's markers as byte tokens.
"""

from __future__ import annotations

import json

import pytest
from test_index_sft import _chat_tokenizer, _write, assert_sample_equals_hf

from fcp_cli.main import main as cli_main
from fcp_data import IndexedDataset
from fcp_data.chat import ChatFormatError, render_chat
from fcp_data.index import build_index

QWEN25 = r"""{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
# the same text; the header's "\n" written before the content or the first tool call, the turn in a block
QWEN25_GEN = QWEN25.replace(r"""        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}""", r"""        {{- '<|im_start|>' + message.role + '\n' }}{% generation %}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if message.content or not loop.first %}{{- '\n' }}{%- endif %}""").replace(
    r"""'\n<tool_call>\n{"name": "' }}""", r"""'<tool_call>\n{"name": "' }}""").replace(
    r"""        {%- endfor %}
        {{- '<|im_end|>\n' }}""", r"""        {%- endfor %}
        {{- '<|im_end|>' }}{% endgeneration %}{{- '\n' }}""").replace(
    r"""or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}""",
    r"""%}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" and not message.tool_calls %}
        {{- '<|im_start|>assistant\n' }}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}{{- '\n' }}""")

_QWEN3_HEAD = r"""{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
"""
_QWEN3_CALLS = r"""        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
"""
_QWEN3_TAIL = r"""    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
QWEN3 = _QWEN3_HEAD + r"""        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
""" + _QWEN3_CALLS + r"""        {{- '<|im_end|>\n' }}
""" + _QWEN3_TAIL
# the same text: a turn with reasoning trained from <think>, the last turn's empty think block not trained
QWEN3_GEN = _QWEN3_HEAD + r"""        {%- set think = loop.index0 > ns.last_query_index and reasoning_content %}
        {%- set empty_think = loop.index0 > ns.last_query_index and loop.last and not reasoning_content %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if empty_think %}
            {{- '<think>\n\n</think>\n\n' }}
        {%- endif %}
        {% generation %}
        {%- if think %}
            {{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- elif empty_think %}
            {{- content.lstrip('\n') }}
        {%- else %}
            {{- content }}
        {%- endif %}
""" + _QWEN3_CALLS + r"""        {{- '<|im_end|>' }}{% endgeneration %}{{- '\n' }}
""" + _QWEN3_TAIL

LLAMA31 = r"""{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""
LLAMA31_GEN = LLAMA31.replace(r"""    {%- if not (message.role == 'ipython'""", r"""    {%- if message.role == 'assistant' and 'tool_calls' not in message %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}
    {%- elif not (message.role == 'ipython'""").replace(
    r"""        {{- '{"name": "' + tool_call.name + '", ' }}""",
    r"""        {% generation %}{{- '{"name": "' + tool_call.name + '", ' }}""").replace(
    r"""        {{- "}" }}
        {{- "<|eot_id|>" }}""", r"""        {{- "}" }}
        {{- "<|eot_id|>" }}{% endgeneration %}""")

QWEN_SPECIAL = {"eos_token": "<|im_end|>"}
LLAMA_SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def _call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _model(tmp_path, name: str, jinja: str, special: dict):
    """A model folder as the Hub ships one: tokenizer.json with the template's special tokens (and Qwen's
    <tool_call>/<think> tokens), tokenizer_config.json, chat_template.jinja."""
    from tokenizers import AddedToken, Tokenizer

    d = tmp_path / name
    d.mkdir()
    tok = Tokenizer.from_file(str(_chat_tokenizer(tmp_path)))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<tool_call>", "</tool_call>", "<think>",
                                                                  "</think>")])
    tok.save(str(d / "tokenizer.json"))
    (d / "chat_template.jinja").write_text(jinja)
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **special}))
    return d


def _index_equals_hf(tmp_path, name: str, jinja: str, gen: str, special: dict, rows: list[dict],
                     written: list[dict] | None = None, ext: str = "jsonl"):
    """Index ``written`` (default ``rows``) with the model folder's template as shipped; every sample must equal
    transformers on the same folder: text of the shipped template, ids and labels of the blocked one on ``rows``."""
    transformers = pytest.importorskip("transformers")
    model = _model(tmp_path, name, jinja, special)
    data_file = tmp_path / f"{name}.{ext}"
    if ext == "parquet":
        pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
        pq.write_table(pa.Table.from_pylist(written or rows), data_file)
    else:
        _write(data_file, written or rows)
    manifest, rc = build_index([str(data_file)], "text", tmp_path / f"idx-{name}", chat_field="messages",
                               chat_template=str(model), progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / f"idx-{name}")
    for r in rows:
        shipped = hf.apply_chat_template(r["messages"], tokenize=False)
        unblocked = gen.replace("{% generation %}", "{% if true %}").replace("{% endgeneration %}", "{% endif %}")
        assert hf.apply_chat_template(r["messages"], chat_template=unblocked, tokenize=False) == shipped, r["id"]
        assert render_chat(r["messages"], manifest["chat_template"])[0] == shipped, r["id"]
        assert_sample_equals_hf(data, r, hf, gen)
    return data, hf


def _trained(data: IndexedDataset, hf, key: str) -> list[str]:
    """The trained runs of sample ``key``, decoded."""
    s = data[list(data.index.keys).index(key)]
    runs, cur = [], []
    for t, lab in zip(s["input_ids"].tolist(), s["labels"].tolist()):
        if lab != -100:
            cur.append(t)
        elif cur:
            runs, cur = runs + [cur], []
    return [hf.decode(r) for r in runs + ([cur] if cur else [])]


def test_qwen3_reasoning_is_trained_with_its_think_block(tmp_path):
    """Qwen3's template as shipped (no generation blocks): a turn's ``reasoning_content`` is trained with its think
    block (before: only the content after it); an earlier turn's reasoning that the template drops is not;
    ``thinking`` is read as transformers 5 reads it; the last turn's empty think block stays untrained."""
    rows = [
        {"id": "reasoning", "messages": [{"role": "user", "content": "What is 2+2?"},
                                         {"role": "assistant", "reasoning_content": "Two plus two makes four.",
                                          "content": "4"}]},
        {"id": "multi", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
                                     {"role": "assistant", "reasoning_content": "dropped later", "content": "b"},
                                     {"role": "user", "content": "c"},
                                     {"role": "assistant", "reasoning_content": "\nkept\n", "content": "\n\nd"}]},
        {"id": "thinking", "messages": [{"role": "user", "content": "q"},
                                        {"role": "assistant", "thinking": "hmm", "content": "a"}]},
        {"id": "plain", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    ]
    data, hf = _index_equals_hf(tmp_path, "qwen3", QWEN3, QWEN3_GEN, QWEN_SPECIAL, rows)
    assert _trained(data, hf, "reasoning") == ["<think>\nTwo plus two makes four.\n</think>\n\n4<|im_end|>"]
    assert _trained(data, hf, "multi") == ["b<|im_end|>", "<think>\nkept\n</think>\n\nd<|im_end|>"]
    assert _trained(data, hf, "plain") == ["hello<|im_end|>"]


def test_qwen3_turns_of_only_tool_calls_are_indexed(tmp_path):
    """Qwen3's template as shipped: turns of only tool calls (content "" / None / absent, with or without reasoning,
    one or two calls) are indexed and trained from their think block or <tool_call> to <|im_end|> (before: every
    such line template_changed_content)."""
    rows = [
        {"id": "agent", "messages": [{"role": "user", "content": "Compute 2+2"},
                                     {"role": "assistant", "reasoning_content": "use the tool", "content": "",
                                      "tool_calls": [_call("calc", x="2+2"), _call("log", level=1)]},
                                     {"role": "tool", "content": "4"}, {"role": "tool", "content": "ok"},
                                     {"role": "assistant", "content": None, "tool_calls": [_call("done")]},
                                     {"role": "tool", "content": "."},
                                     {"role": "assistant", "content": "It is 4."}]},
        {"id": "calls", "messages": [{"role": "user", "content": "Weather?"},
                                     {"role": "assistant", "tool_calls": [_call("weather", city="Paris")]},
                                     {"role": "tool", "content": "21"},
                                     {"role": "assistant", "content": "Let me also check.",
                                      "tool_calls": [_call("weather", city="Lyon")]}]},
        {"id": "last", "messages": [{"role": "user", "content": "Weather?"},
                                    {"role": "assistant", "content": "", "tool_calls": [_call("weather")]}]},
    ]
    data, hf = _index_equals_hf(tmp_path, "qwen3", QWEN3, QWEN3_GEN, QWEN_SPECIAL, rows)
    assert _trained(data, hf, "agent")[0].startswith("<think>\nuse the tool\n</think>\n\n<tool_call>\n")
    assert _trained(data, hf, "agent")[1] == '<tool_call>\n{"name": "done", "arguments": {}}\n</tool_call><|im_end|>'
    assert _trained(data, hf, "last") == ['<tool_call>\n{"name": "weather", "arguments": {}}\n</tool_call><|im_end|>']


def test_qwen25_turns_of_only_tool_calls_are_indexed(tmp_path):
    """Qwen2.5's template as shipped: a tool call with content None, "", absent, or after text, one or two calls,
    and a ShareGPT ``function_call`` turn (read as that assistant turn's ``tool_calls``, results as ``observation``):
    all indexed, trained from <tool_call> (or the text) to <|im_end|> (before: template_changed_content, and
    function_call a bad role)."""
    call = _call("get_weather", city="Paris")
    rows = [{"id": f"c{k}", "messages": [{"role": "user", "content": "Weather?"}, dict(turn, role="assistant"),
                                         {"role": "tool", "content": "21"},
                                         {"role": "assistant", "content": "21 C."}]}
            for k, turn in enumerate([{"content": None, "tool_calls": [call]}, {"content": "", "tool_calls": [call]},
                                      {"tool_calls": [call]}, {"content": "Let me check.", "tool_calls": [call]},
                                      {"content": None, "tool_calls": [call, _call("get_time", tz="CET")]}])]
    sharegpt = {"id": "sharegpt", "messages": [
        {"from": "human", "value": "Weather?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": "21"}, {"from": "gpt", "value": "21 C."}]}
    openai = {"id": "sharegpt", "messages": [{"role": "user", "content": "Weather?"},
                                             {"role": "assistant", "content": "", "tool_calls": [call]},
                                             {"role": "tool", "content": "21"},
                                             {"role": "assistant", "content": "21 C."}]}
    data, hf = _index_equals_hf(tmp_path, "qwen25", QWEN25, QWEN25_GEN, QWEN_SPECIAL, rows + [openai],
                                written=rows + [sharegpt])
    want = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
    for key in ("c0", "c1", "c2", "sharegpt"):
        assert _trained(data, hf, key) == [want, "21 C.<|im_end|>"], key
    with pytest.raises(ChatFormatError, match="function_call turn's value must be a JSON object") as e:
        render_chat([{"from": "function_call", "value": "get_weather(Paris)"}, {"from": "gpt", "value": "x"}],
                    "chatml")
    assert e.value.reason == "bad_messages"


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_llama31_null_fields_and_tool_calls(tmp_path, ext):
    """Llama 3.1's template as shipped (``'tool_calls' in message``) on rows whose every turn carries
    ``"tool_calls": null`` (a Parquet struct column): the null fields are absent, as transformers makes them
    (before: every row a template_error), and a turn of only a tool call is trained from its JSON to <|eot_id|>."""
    rows = [{"id": f"r{k}", "messages": [{"role": "user", "content": f"question {k}", "tool_calls": None},
                                         {"role": "assistant", "content": f" answer {k}\n", "tool_calls": None}]}
            for k in range(3)]
    rows.append({"id": "call", "messages": [
        {"role": "system", "content": "You call tools.", "tool_calls": None},
        {"role": "user", "content": "q", "tool_calls": None},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function",
                                                               "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_calls": None},
        {"role": "assistant", "content": "It is 42.", "tool_calls": None}]})
    data, hf = _index_equals_hf(tmp_path, f"llama31-{ext}", LLAMA31, LLAMA31_GEN, LLAMA_SPECIAL, rows, ext=ext)
    assert _trained(data, hf, "r0") == ["answer 0<|eot_id|>"]
    assert _trained(data, hf, "call") == ['{"name": "f", "parameters": "{}"}<|eot_id|>', "It is 42.<|eot_id|>"]


def test_builtin_templates_refuse_what_they_cannot_write(tmp_path):
    """``chatml`` / ``llama3`` write a role and a text: a line with tool calls (content None: before, an empty turn
    trained as ``<|im_end|>``), reasoning, or a ShareGPT function_call is recorded ``unsupported_turn`` naming
    --chat-template, not trained without them; the other lines index as before (transformers' mask of the same
    layout with generation blocks)."""
    pytest.importorskip("transformers")
    import transformers
    from test_index_sft import CHATML, LLAMA3

    tok = _chat_tokenizer(tmp_path)
    plain = [{"id": "plain", "messages": [{"role": "user", "content": "Weather?"},
                                          {"role": "assistant", "content": "Sunny."}]}]
    bad = [{"id": "calls", "messages": [{"role": "user", "content": "Weather?"},
                                        {"role": "assistant", "content": None, "tool_calls": [_call("w")]},
                                        {"role": "tool", "content": "21"}, {"role": "assistant", "content": "21."}]},
           {"id": "reasoning", "messages": [{"role": "user", "content": "2+2?"},
                                            {"role": "assistant", "reasoning_content": "four", "content": "4"}]},
           {"id": "function_call", "messages": [{"from": "human", "value": "Weather?"},
                                                {"from": "function_call", "value": '{"name": "w", "arguments": {}}'},
                                                {"from": "observation", "value": "21"}, {"from": "gpt", "value": "21."}]}]
    _write(tmp_path / "chat.jsonl", plain + bad)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok))
    for name, gen in (("chatml", CHATML), ("llama3", LLAMA3)):
        manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / name, tokenizer=str(tok),
                                   chat_field="messages", chat_template=name, progress=False, max_error_rate=1)
        assert manifest["num_samples"] == 1 and manifest["errors_by_reason"] == {"unsupported_turn": 3}, name
        assert_sample_equals_hf(IndexedDataset(tmp_path / name, tokenizer=str(tok)), plain[0], hf, gen)
        errors = [json.loads(x) for x in (tmp_path / name / manifest["data"] / "errors.jsonl").read_text().splitlines()]
        assert all("--chat-template MODEL_DIR" in e["detail"] for e in errors), errors
    with pytest.raises(ChatFormatError, match="turn 1 has tool_calls, which the built-in chatml template"):
        render_chat(bad[0]["messages"], "chatml")


def test_markers_the_tokenizer_splits_are_reported(tmp_path, capsys):
    """No --tokenizer (the bundled byte-level BPE) under chatml, or another model's tokenizer under a model's
    template: one warning line naming exactly the markers that tokenizer encodes as several tokens (before:
    nothing); the model's own tokenizer: no warning."""
    from fcp_data.specs import load_spec

    _write(tmp_path / "chat.jsonl", [{"id": "c", "messages": [{"role": "user", "content": "hi"},
                                                             {"role": "assistant", "content": "hello"}]}])
    plain = load_spec("text").tokenizer()
    split = lambda ms: [m for m in ms if len(plain.encode(m, add_special_tokens=False).ids) > 1]  # noqa: E731
    assert split(["<|im_start|>", "<|im_end|>"]) == ["<|im_start|>", "<|im_end|>"]
    build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "a", chat_field="messages", progress=False)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "<|im_start|>, <|im_end|> of the chatml chat template" in err, err
    build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "b", chat_field="messages", progress=False,
                tokenizer=str(_chat_tokenizer(tmp_path)))
    assert "warning" not in capsys.readouterr().err
    model = _model(tmp_path, "llama", LLAMA31, LLAMA_SPECIAL)
    build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "c", chat_field="messages", progress=False,
                chat_template=str(model))
    assert "warning" not in capsys.readouterr().err
    build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "d", chat_field="messages", progress=False,
                chat_template=str(model), tokenizer=load_spec("text").tokenizer_path)
    err = capsys.readouterr().err
    markers = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|begin_of_text|>"]
    assert err.count("warning") == 1 and split(markers) == markers and all(m in err for m in markers), err


def test_a_data_file_is_no_chat_template(tmp_path, capsys):
    """``--chat-template data.jsonl`` (a data file) or a text file that is no chat template: one line, exit 2
    (before: read as a template that writes every line as itself)."""
    rows = [{"id": "c", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}]
    _write(tmp_path / "data.jsonl", rows)
    (tmp_path / "notes.jinja").write_text("hello {{ name }}")
    for path, says in [(tmp_path / "data.jsonl", "a .jsonl file is data, not a chat template"),
                       (tmp_path / "notes.jinja", "not a Jinja chat template")]:
        with pytest.raises(ValueError, match=says):
            build_index([str(tmp_path / "data.jsonl")], "text", tmp_path / "x", chat_field="messages",
                        chat_template=str(path), progress=False)
        rc = cli_main(["index", str(tmp_path / "data.jsonl"), "--spec", "text", "--out", str(tmp_path / "y"),
                       "--chat-field", "messages", "--chat-template", str(path), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and says in err, err


def test_a_part_without_type_is_named(tmp_path):
    """A content part without "type": a recorded line saying so (before: "turn 0 has None parts")."""
    _write(tmp_path / "chat.jsonl", [{"id": "u", "messages": [{"role": "user", "content": [{"text": "hi"}]},
                                                             {"role": "assistant", "content": "ok"}]}])
    manifest, _ = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "i", chat_field="messages",
                              progress=False, max_error_rate=1)
    assert manifest["errors_by_reason"] == {"bad_messages": 1}
    untyped = [{"role": "user", "content": [{"text": "hi"}]}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(ChatFormatError, match='turn 0: content part 0 has no "type"') as e:
        render_chat(untyped, "chatml")
    assert e.value.reason == "bad_messages"


def test_builtin_templates_take_reasoning_flags_as_no_reasoning():
    """A reasoning key holding a flag or number (``"thinking": false``, ``"reasoning": 0``; some sets mark turns
    so) is no reasoning text: the built-ins write the turn as they would without it (before: ``unsupported_turn``,
    the line lost; found by review). A reasoning text, a call list, object or JSON text is still refused."""
    ask = {"role": "user", "content": "q"}
    plain = render_chat([ask, {"role": "assistant", "content": "a"}], "chatml")
    for extra in ({"thinking": False}, {"reasoning": 0}, {"reasoning_content": True}, {"tool_calls": []}):
        assert render_chat([ask, {"role": "assistant", "content": "a", **extra}], "chatml") == plain, extra
    for extra in ({"thinking": "hmm"}, {"tool_calls": [_call("f")]}, {"function_call": {"name": "f"}},
                  {"function_call": '{"name": "f"}'}):
        with pytest.raises(ChatFormatError, match="which the built-in llama3 template cannot write") as e:
            render_chat([ask, {"role": "assistant", "content": "a", **extra}], "llama3")
        assert e.value.reason == "unsupported_turn", extra
