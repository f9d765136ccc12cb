"""A model's own chat template (``fcp index --chat-template MODEL_DIR``): the conversation rendered as transformers
renders it, labels on what the template trains.

Reference: transformers' ``apply_chat_template`` on the same tokenizer folder — its text (``tokenize=False``) and,
for a template with ``{% generation %}`` blocks, its ``return_assistant_tokens_mask``. Four templates written here
in the shapes real models use (ChatML with a default system prompt and a think block on the last turn only, Llama 3
trimming contents, a Mistral-like one with ``bos_token``/``eos_token`` and ``raise_exception``): each once with
generation blocks (fcp reads the blocks) and once without them (fcp finds each assistant content and its
end-of-turn marker itself), both held to the mask of the version with blocks. A failure means SFT with the model's
template trains on other tokens than transformers would, or plans with lengths that are not the samples'.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_index_sft import WORDS, _chat_tokenizer, _conversations, _other_format, _write, assert_sample_equals_hf

from fcp_cli.main import main as cli_main
from fcp_data import IndexedDataset
from fcp_data.chat import ChatFormatError, render_chat
from fcp_data.chat_jinja import TemplateError, load_template
from fcp_data.index import build_index, summarize

GEN_A, GEN_B = "{% generation %}", "{% endgeneration %}"
QWEN = ("{%- if messages[0].role != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
        "{%- endif %}\n{%- for m in messages %}\n{%- if m.role == 'assistant' %}"
        "{{ '<|im_start|>assistant\\n' }}{%- if loop.last %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
        "{% generation %}{{ m.content }}{%- for c in m.tool_calls or [] %}"
        "{{ '\\n<tool_call>\\n' + (c | tojson) + '\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>' }}{% endgeneration %}"
        "{{ '\\n' }}\n"
        "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}\n{%- endif %}\n{%- endfor %}")
LLAMA3_TRIM = ("{{ bos_token }}{%- for m in messages %}"
               "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}{%- if m['role'] == 'assistant' %}"
               "{% generation %}{{ m['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
               "{%- else %}{{ m['content'] | trim + '<|eot_id|>' }}{%- endif %}{%- endfor %}")
MISTRAL = """{{ bos_token }}
{% for m in messages %}
    {% if m.role == 'system' %}
        {% if not loop.first %}{{ raise_exception('a system turn must come first') }}{% endif %}
[SYS]{{ m.content }}[/SYS]
    {% elif m.role == 'user' %}
[INST] {{ m.content }} [/INST]
    {% else %}
 {% generation %}{{ m.content | trim + eos_token }}{% endgeneration %}
    {% endif %}
{% endfor %}"""  # multi-line, indented block tags: the rendering depends on trim_blocks and lstrip_blocks
TEMPLATES = {"qwen": QWEN, "llama3_trim": LLAMA3_TRIM, "mistral": MISTRAL}


def _plain(jinja: str) -> str:
    """The template without generation blocks, rendering the same text (a plain block in their place keeps what
    ``trim_blocks`` trims)."""
    return jinja.replace(GEN_A, "{% if true %}").replace(GEN_B, "{% endif %}")


def _model_dir(tmp_path, jinja: str, name: str = "model"):
    """A model folder as the Hub ships one: tokenizer.json (with the templates' special tokens) and a
    tokenizer_config.json naming bos/eos and holding the chat template."""
    from tokenizers import AddedToken, Tokenizer

    d = tmp_path / name
    d.mkdir()
    tok = Tokenizer.from_file(str(_chat_tokenizer(tmp_path)))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<think>", "</think>")])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True}, "chat_template": jinja}))
    return d


def _rows(n: int) -> list[dict]:
    rows = _conversations(n, seed=7)
    rng = np.random.default_rng(3)
    for r in rows[::4]:  # outer whitespace, which a trimming template drops
        r["messages"][-1]["content"] = "  " + " ".join(rng.choice(WORDS, 3)) + " \n"
    for r in rows[::3]:  # tool calls, which a template may render (kept in role/content turns: rows 0, 3, ...)
        call = {"type": "function", "function": {"name": "search", "arguments": {"q": "東京", "k": 3}}}
        next(m for m in r["messages"] if m["role"] == "assistant")["tool_calls"] = [call]
    return rows


@pytest.mark.parametrize("blocks", [True, False], ids=["generation-blocks", "no-blocks"])
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_model_template_equals_hf_apply_chat_template(tmp_path, name, blocks):
    """Index and reader with the model folder's own template: text equal to transformers' rendering of the same
    template, ids and count equal to its tokenisation, labels equal to its assistant mask of the template with
    generation blocks — whether fcp reads the blocks or finds the turns without them."""
    transformers = pytest.importorskip("transformers")
    gen = TEMPLATES[name]
    model = _model_dir(tmp_path, gen if blocks else _plain(gen))
    rows = _rows(16)
    _write(tmp_path / "chat.jsonl", [_other_format(r, k) for k, r in enumerate(rows)])
    # no --tokenizer: the model folder's own tokenizer.json counts, and the reader finds it again by itself
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "idx", chat_field="messages",
                               chat_template=str(model), progress=False)
    assert rc == 0 and manifest["num_samples"] == len(rows), manifest["errors_by_reason"]
    assert "(tokenizer_config.json " in summarize(manifest)
    assert f"tokenizer {model / 'tokenizer.json'}" in summarize(manifest)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(model))
    data = IndexedDataset(tmp_path / "idx")
    for r in rows:
        text = hf.apply_chat_template(r["messages"], tokenize=False)
        assert render_chat(r["messages"], manifest["chat_template"])[0] == text, r["id"]
        assert_sample_equals_hf(data, r, hf, gen)


def test_an_index_reads_back_with_the_tokenizer_it_recorded_unless_it_changed(tmp_path):
    """An index built with --tokenizer (the model's) opens without it (fcp train --data has no --tokenizer); a
    tokenizer.json changed since is refused by the fingerprint check, and passing the right one still works."""
    model = _model_dir(tmp_path, QWEN)
    _write(tmp_path / "chat.jsonl", _conversations(4))
    build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "idx", chat_field="messages",
                tokenizer=str(model / "tokenizer.json"), progress=False)
    first = IndexedDataset(tmp_path / "idx")[0]["input_ids"]
    assert first.tolist() == IndexedDataset(tmp_path / "idx", tokenizer=str(model / "tokenizer.json"))[0][
        "input_ids"].tolist()
    (tmp_path / "keep.json").write_bytes((model / "tokenizer.json").read_bytes())
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["added_tokens"] = tok["added_tokens"][:-1]
    (model / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="differs from the one the index was built with"):
        IndexedDataset(tmp_path / "idx")
    assert IndexedDataset(tmp_path / "idx", tokenizer=str(tmp_path / "keep.json"))[0]["input_ids"].tolist() == \
        first.tolist()
    # a spec given as a file (not a bundled name) is found again by its recorded path
    from fcp_data.specs import load_spec

    raw = dict(load_spec("text").raw, name="my-spec")
    (tmp_path / "my-spec.json").write_text(json.dumps(raw))
    build_index([str(tmp_path / "chat.jsonl")], str(tmp_path / "my-spec.json"), tmp_path / "idx2",
                chat_field="messages", progress=False)
    assert IndexedDataset(tmp_path / "idx2").spec.name == "my-spec"


def test_builtin_templates_equal_the_same_template_read_from_a_file(tmp_path):
    """``--chat-template chatml`` and the same template given as a file (no generation blocks) render the same
    text and train the same characters."""
    from test_index_sft import CHATML, LLAMA3

    for name, jinja in (("chatml", CHATML), ("llama3", LLAMA3)):
        (tmp_path / f"{name}.jinja").write_text(_plain(jinja))
        tpl = load_template(tmp_path / f"{name}.jinja")
        for r in _conversations(12, seed=11):
            assert render_chat(r["messages"], tpl) == render_chat(r["messages"], name), (name, r["id"])


def test_lines_a_template_refuses_or_rewrites_are_recorded(tmp_path):
    """Per line, never the end of the run: a template's ``raise_exception`` (``template_error``), a template that
    rewrites an assistant content it has no generation blocks for (``template_changed_content``), a conversation
    holding fcp's mark characters (``bad_messages``)."""
    rewrite = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if '</think>' in m.content %}"
               "{{ m.content.split('</think>')[-1].lstrip('\\n') }}{%- else %}{{ m.content }}{%- endif %}"
               "{{ '<|im_end|>\\n' }}{%- endfor %}")
    for jinja, reason, bad in [
        (_plain(MISTRAL), "template_error", [{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
                                             {"role": "assistant", "content": "c"}]),
        (rewrite, "template_changed_content", [{"role": "user", "content": "a"},
                                               {"role": "assistant", "content": "<think>r</think>\n\nc"}]),
        (rewrite, "bad_messages", [{"role": "user", "content": "a\ufdd2"}, {"role": "assistant", "content": "c"}]),
    ]:
        d = _model_dir(tmp_path, jinja, name=f"m{reason}")
        good = _conversations(3, seed=1)
        _write(tmp_path / f"{reason}.jsonl", good + [{"id": "bad", "messages": bad}])
        manifest, rc = build_index([str(tmp_path / f"{reason}.jsonl")], "text", tmp_path / f"idx{reason}",
                                   tokenizer=str(d / "tokenizer.json"), chat_field="messages",
                                   chat_template=str(d / "tokenizer_config.json"), progress=False,
                                   max_error_rate=0.5)
        assert rc == 0 and manifest["num_samples"] == 3 and manifest["errors_by_reason"] == {reason: 1}, reason
        with pytest.raises(ChatFormatError) as e:
            render_chat(bad, manifest["chat_template"])
        assert e.value.reason == reason


def test_template_sources_and_their_errors(tmp_path, capsys):
    """A folder's chat_template.jinja wins over its tokenizer_config.json; named templates pick ``default``; a
    template that prints the date prints the index's build date, so index and reader agree on any day; a missing
    path, a folder without a template, a config without one and a Jinja syntax error are one line and exit 2."""
    d = _model_dir(tmp_path, "config {{ messages[0].content }}")
    assert load_template(d)["source"] == "tokenizer_config.json"
    (d / "chat_template.jinja").write_text("jinja {{ messages[0].content }} {{ eos_token }}")
    assert load_template(d)["source"] == "chat_template.jinja"
    # transformers 5's layout: the template apart, tokenizer_config.json without one — its special tokens still used
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_template(d)["special_tokens"]["eos_token"] == "</s>"
    (tmp_path / "named.json").write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "t"},
                                                                       {"name": "default", "template": "d"}]}))
    assert load_template(tmp_path / "named.json")["jinja"] == "d"
    (tmp_path / "date.jinja").write_text("{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m.content }}"
                                         "{% endfor %}")
    tpl = load_template(tmp_path / "date.jinja")
    assert tpl["date"] is not None and load_template(d)["date"] is None
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    assert render_chat(msgs, dict(tpl, date="2024-07-26")) == ("26 Jul 2024ua", [(12, 13)])
    (tmp_path / "syntax.jinja").write_text("{% for m in messages %}{{ m.content }")
    (tmp_path / "empty").mkdir()
    (tmp_path / "nochat.json").write_text(json.dumps({"bos_token": "<s>"}))
    _write(tmp_path / "chat.jsonl", _conversations(2))
    for path, says in [(tmp_path / "syntax.jinja", "Jinja syntax error on line 1"),
                       (tmp_path / "empty", "neither chat_template.jinja nor tokenizer_config.json"),
                       (tmp_path / "nochat.json", "no 'chat_template' string"),
                       (tmp_path / "missing.jinja", "unknown chat template")]:
        with pytest.raises(ValueError, match=says):
            build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "x", chat_field="messages",
                        chat_template=str(path), progress=False)
        rc = cli_main(["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--out", str(tmp_path / "y"),
                       "--chat-field", "messages", "--chat-template", str(path), "--no-progress"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1 and says in err, err
    with pytest.raises(TemplateError):
        load_template(tmp_path / "syntax.jinja")
