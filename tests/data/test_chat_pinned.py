"""Chat rendering, labels and media pieces: behaviours of ``fcp_data.chat``, ``fcp_data.chat_jinja`` and
``fcp_data.chat_media`` that no other test pinned, found by mutation review.

Reference, per test: ``transformers``' ``apply_chat_template`` on the same model folder (its text with
``tokenize=False``; its ``return_assistant_tokens_mask``), or hand-computed expectations from the documented
layouts and error reasons (``fcp_data.chat`` / ``fcp_data.chat_jinja`` / ``fcp_data.chat_media`` docstrings).
"""

from __future__ import annotations

import re

import pytest
from test_chat_review import _model
from test_index_sft import _chat_tokenizer

from fcp_data.chat import ChatFormatError, chat_kwargs, render_chat, split_markers, trained_token_mask
from fcp_data.chat_jinja import load_template

ASK, ANSWER = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}


def _template(tmp_path, jinja: str, name: str = "chat_template.jinja") -> dict:
    (tmp_path / name).write_text(jinja)
    return load_template(tmp_path / name)


def _hf(model):
    transformers = pytest.importorskip("transformers")
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(model))


# ------------------------------------------------------------------------------------------------ fcp_data.chat
def test_adjacent_trained_spans_train_the_token_at_their_seam():
    """Two trained spans that touch (``{% generation %}`` blocks written back to back): the token starting where
    the first ends lies in the second and is trained — hand-computed, and what transformers' mask loop does (it
    moves to the next span once a token starts at or past a span's end). Kills: ``<`` for ``<=`` in the loop that
    passes finished spans (the seam token was left untrained)."""
    assert trained_token_mask([(0, 2), (2, 4), (4, 6)], [(0, 2), (2, 4)]) == [True, True, False]
    assert trained_token_mask([(0, 3), (3, 5)], [(1, 3), (3, 4)]) == [True, True]


def test_adjacent_generation_blocks_equal_the_assistant_mask(tmp_path):
    """A template whose assistant turn is two generation blocks back to back (content, then ``<|im_end|>``): the
    reader's labels equal transformers' ``return_assistant_tokens_mask`` on the same folder — the end-of-turn marker,
    which starts exactly where the content's block ends, is trained. Kills: the same seam mutant through
    :func:`render_chat` and the tokenizer's offsets."""
    jinja = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.role == 'assistant' %}"
             "{% generation %}{{ m.content }}{% endgeneration %}{% generation %}{{ '<|im_end|>' }}{% endgeneration %}"
             "{{ '\\n' }}{%- else %}{{ m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}")
    model = _model(tmp_path, "seam", jinja, {"eos_token": "<|im_end|>"})
    hf = _hf(model)
    messages = [ASK, {"role": "assistant", "content": "hello there"}, ASK, {"role": "assistant", "content": "bye"}]
    ref = hf.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    text, spans = render_chat(messages, load_template(model))
    enc = hf.backend_tokenizer.encode(text, add_special_tokens=False)
    assert enc.ids == list(ref["input_ids"])
    assert [int(m) for m in trained_token_mask(enc.offsets, spans)] == list(ref["assistant_masks"])
    assert sum(ref["assistant_masks"]) > 0


def test_an_empty_function_call_list_is_bad_messages():
    """A ShareGPT ``function_call`` turn whose value is ``[]`` calls nothing: ``bad_messages`` (the documented "a
    JSON object {"name": ..., "arguments": ...} (or a list of them)"), not an assistant turn of no calls that the
    built-ins would train as an empty turn. Kills: dropping ``not calls`` from :func:`_function_calls`."""
    for value in ("[]", []):
        with pytest.raises(ChatFormatError, match="a function_call turn's value must be a JSON object") as e:
            render_chat([{"from": "human", "value": "hi"}, {"from": "function_call", "value": value},
                         {"from": "gpt", "value": "ok"}], "chatml")
        assert e.value.reason == "bad_messages"


def test_a_marker_the_tokenizer_drops_is_reported_as_split():
    """A tokenizer that drops characters it does not know (a BPE without byte fallback or unk token) encodes a marker
    as no token at all: the model would never see it, so it is reported with those split into several (the
    documented rule: "does not encode as one token"). Kills: ``> 1`` for ``!= 1``."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE(vocab={"z": 0}, merges=[]))
    assert tok.encode("<|im_start|>", add_special_tokens=False).ids == []
    assert split_markers("chatml", tok) == ["<|im_start|>", "<|im_end|>"]


def test_a_parquet_turn_with_a_null_role_is_a_sharegpt_turn():
    """A Parquet/Arrow column mixing both spellings gives every turn both sets of fields, the unused ones null: a
    turn ``{"role": None, "content": None, "from": "human", "value": "hi"}`` is the ShareGPT turn it spells (a key
    holding None is absent). Hand-computed chatml text and trained span. Kills: testing ``"role" in turn`` instead of
    a non-null role (the line became "turn 0 has role None")."""
    null = {"role": None, "content": None}
    turns = [{**null, "from": "human", "value": "hi"}, {**null, "from": "gpt", "value": "ok"}]
    text, spans = render_chat(turns, "chatml")
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"
    assert [text[a:b] for a, b in spans] == ["ok<|im_end|>"]


def test_media_parts_are_named_and_never_read_as_text():
    """An image or video part in a text-only conversation is ``bad_messages`` naming the part kind ("turn 0 has
    image parts: only text conversations are indexed"), even when the part also carries a ``"text"`` (it must not
    be trained as that text). Kills: letting image parts through the kind check."""
    for part in ({"type": "image", "image": "a.jpg"}, {"type": "image", "text": "a cat"}):
        with pytest.raises(ChatFormatError, match="turn 0 has image parts: only text conversations are indexed") as e:
            render_chat([{"role": "user", "content": [{"type": "text", "text": "see"}, part]}, ANSWER], "chatml")
        assert e.value.reason == "bad_messages"



def test_every_reasoning_name_is_refused_by_the_builtins():
    """A turn's reasoning under any of the names transformers passes it under (``reasoning_content``, ``thinking``,
    ``reasoning``) is text the built-in templates cannot write: ``unsupported_turn`` naming the key, not a turn
    trained without its reasoning. Kills: dropping ``reasoning`` from ``UNRENDERED_KEYS``."""
    for key in ("reasoning_content", "thinking", "reasoning"):
        with pytest.raises(ChatFormatError, match=f"turn 1 has {key}, which the built-in chatml template") as e:
            render_chat([ASK, {"role": "assistant", "content": "4", key: "2+2 is 4"}], "chatml")
        assert e.value.reason == "unsupported_turn"


# ------------------------------------------------------------------------------------------ fcp_data.chat_jinja
def test_a_lines_kwargs_override_the_special_tokens(tmp_path):
    """A line's template kwargs named like a special token (``bos_token``) replace the tokenizer's, as
    ``apply_chat_template(**kwargs)`` does (transformers: "kwargs overwrite special tokens if both are present").
    Reference: transformers on the same folder. Kills: the special tokens merged over the kwargs."""
    jinja = ("{{ bos_token }}{%- for m in messages %}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' }}"
             "{{ m.content + '<|eot_id|>' }}{%- endfor %}")
    model = _model(tmp_path, "bos", jinja, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    kwargs = chat_kwargs({"chat_template_kwargs": {"bos_token": "<|im_start|>"}}, "chat_template_kwargs")
    text, _ = render_chat([ASK, ANSWER], load_template(model), None, kwargs)
    assert text == _hf(model).apply_chat_template([ASK, ANSWER], tokenize=False, **kwargs)
    assert text.startswith("<|im_start|><|start_header_id|>user")


def test_a_turns_own_thinking_is_kept_beside_its_reasoning_content(tmp_path):
    """A turn giving both ``reasoning_content`` and ``thinking`` keeps its own ``thinking`` (transformers 5 fills
    ``thinking`` from the reasoning only when the turn lacks it). Reference: transformers' text on the same folder.
    Kills: the aliased reasoning written over the turn's own ``thinking``."""
    jinja = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content }}{%- if m.role == 'assistant' %}"
             "{{ '<think>' + (m.thinking or '') + '|' + (m.reasoning_content or '') + '</think>' }}{%- endif %}"
             "{{ '<|im_end|>\\n' }}{%- endfor %}")
    model = _model(tmp_path, "think", jinja, {"eos_token": "<|im_end|>"})
    messages = [ASK, {"role": "assistant", "content": "4", "reasoning_content": "add", "thinking": "count"}]
    text, spans = render_chat(messages, load_template(model))
    assert text == _hf(model).apply_chat_template(messages, tokenize=False)
    assert "<think>count|add</think>" in text
    assert [text[a:b] for a, b in spans] == ["4<think>count|add</think><|im_end|>"]


def test_a_template_that_drops_the_content_of_a_reasoning_turn_is_refused(tmp_path):
    """A template that writes an assistant turn's reasoning but not its content (the answer is lost): each content
    must come back exactly once, so the line is ``template_changed_content`` (documented), not trained on the
    reasoning alone. Kills: dropping the "each marked content exactly once" check."""
    jinja = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}"
             "{%- if m.role == 'assistant' and m.reasoning_content %}{{ '<think>' + m.reasoning_content + '</think>' }}"
             "{%- else %}{{ m.content }}{%- endif %}{{ '<|im_end|>\\n' }}{%- endfor %}")
    tpl = _template(tmp_path, jinja)
    with pytest.raises(ChatFormatError, match="rewrites or drops an assistant turn's content") as e:
        render_chat([ASK, {"role": "assistant", "content": "4", "reasoning_content": "add"}], tpl)
    assert e.value.reason == "template_changed_content"


def test_nested_generation_blocks_are_a_template_error(tmp_path):
    """A ``{% generation %}`` block inside another cannot say what is trained: the line is ``template_error`` (the
    template's fault, as for a template that raises), with a detail naming the nesting — not
    ``template_changed_content``, which says the template rewrote a content. Kills: the other reason."""
    jinja = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.role == 'assistant' %}"
             "{% generation %}{% generation %}{{ m.content }}{% endgeneration %}{{ '<|im_end|>' }}{% endgeneration %}"
             "{{ '\\n' }}{%- else %}{{ m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}")
    with pytest.raises(ChatFormatError, match=r"nests its \{% generation %\} blocks") as e:
        render_chat([ASK, ANSWER], _template(tmp_path, jinja))
    assert e.value.reason == "template_error"


def test_a_template_that_writes_the_turns_out_of_order_is_refused(tmp_path):
    """A template that writes the conversation backwards: the assistants' texts must come back in turn order, else
    which text ends which turn cannot be told — ``template_changed_content`` (documented: "each must come back at
    most once ..., in order"). (Dropping the order check of ``_by_turn`` alone is caught later, by the end-of-turn
    check of ``_spans``: an equivalent mutant; this pins the outcome.)"""
    jinja = ("{%- for m in messages|reverse %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
             "{%- endfor %}")
    tpl = _template(tmp_path, jinja)
    with pytest.raises(ChatFormatError) as e:
        render_chat([ASK, {"role": "assistant", "content": "one"}, ASK, {"role": "assistant", "content": "two"}], tpl)
    assert e.value.reason == "template_changed_content"


def test_an_empty_answer_beside_a_turn_of_only_tool_calls_is_trained(tmp_path):
    """A template that writes a content only when a turn has no tool calls, or has a content (``{% if m.content %}``
    after the calls): a turn of only tool calls is marked bare (its call's name), and a later assistant turn with an
    empty answer is still marked, so it trains its end of turn. Hand-computed spans: the call turn from the end of
    its header to ``<|im_end|>``, the empty answer its ``<|im_end|>``. Kills: leaving an empty content of a turn
    with nothing else unmarked in the bare attempt (the line became ``template_changed_content``)."""
    jinja = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.tool_calls %}"
             "{%- for c in m.tool_calls %}{{ '<tool_call>' + c.function.name + '</tool_call>' }}{%- endfor %}"
             "{%- if m.content %}{{ '\\n' + m.content }}{%- endif %}{%- else %}{{ m.content }}{%- endif %}"
             "{{ '<|im_end|>\\n' }}{%- endfor %}")
    call = {"type": "function", "function": {"name": "weather", "arguments": {}}}
    messages = [ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "21"},
                {"role": "assistant", "content": ""}]
    text, spans = render_chat(messages, _template(tmp_path, jinja))
    assert text == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<tool_call>weather</tool_call><|im_end|>\n"
                    "<|im_start|>tool\n21<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n")
    assert [text[a:b] for a, b in spans] == ["<tool_call>weather</tool_call><|im_end|>", "<|im_end|>"]


def test_noncharacters_in_tools_or_kwargs_are_bad_messages(tmp_path):
    """fcp marks texts with U+FDD0..U+FDEF while rendering: a line whose tools or template kwargs hold one would
    confuse those marks, and is ``bad_messages`` naming the noncharacters (documented), whatever the template does
    with them. Kills: checking only the turns."""
    jinja = ("{%- if tools %}{{ '<|im_start|>system\\n' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
             "{%- if note %}{{ note }}{%- endif %}"
             "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}")
    tpl = _template(tmp_path, jinja)
    tool = {"type": "function", "function": {"name": "f", "description": "a \ufdd3 b"}}
    for tools, kwargs in (([tool], None), (None, {"note": "x\ufdd2y"})):
        with pytest.raises(ChatFormatError, match="noncharacters") as e:
            render_chat([ASK, ANSWER], tpl, tools, kwargs)
        assert e.value.reason == "bad_messages"


# ------------------------------------------------------------------------------------------ fcp_data.text_tokens
def test_a_spec_without_a_pad_pads_with_its_own_eos_before_the_configs_pad(tmp_path):
    """The documented rule: a token the spec names and the tokenizer has always wins, and a spec that names no pad
    pads with its EOS (the old rule) — so a ``pad_token`` in the tokenizer_config.json beside the tokenizer does not
    change the pad of such a spec (indexes that read before read the same). Hand-computed from the rule. Kills:
    falling back to the config's pad instead of the spec's EOS."""
    import json

    from fcp_data.text_tokens import resolve

    tok = _chat_tokenizer(tmp_path)
    config = {"eos_token": "<|eot_id|>", "pad_token": "<|im_start|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert resolve(str(tok), "<|im_end|>", None) == ("<|im_end|>", "<|im_end|>")
    assert resolve(str(tok), "<|im_end|>", "<|begin_of_text|>") == ("<|im_end|>", "<|begin_of_text|>")
    assert resolve(str(tok), "<|nope|>", None) == ("<|eot_id|>", "<|im_start|>")  # neither there: the config's


def test_an_added_token_dict_in_tokenizer_config_names_its_content(tmp_path):
    """Older tokenizer_config.json files write a special token as an AddedToken dict (``{"__type": "AddedToken",
    "content": "<|eot_id|>", ...}``): its ``content`` is the token — as transformers reads it (its ``eos_token`` on
    the same folder) — for the EOS/pad fallback and for a model template's ``eos_token`` variable. Kills: ignoring
    the dict form."""
    import json
    import shutil

    from fcp_data.text_tokens import config_tokens

    model = tmp_path / "m"
    model.mkdir()
    shutil.copy(_chat_tokenizer(tmp_path), model / "tokenizer.json")
    added = lambda t: {"__type": "AddedToken", "content": t, "lstrip": False, "normalized": False,  # noqa: E731
                       "rstrip": False, "single_word": False}
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                             "eos_token": added("<|eot_id|>"),
                                                             "pad_token": added("<|im_end|>")}))
    (model / "chat_template.jinja").write_text("{%- for m in messages %}{{ m.content + eos_token }}{%- endfor %}")
    hf = _hf(model)
    assert config_tokens(model / "tokenizer.json") == {"eos_token": hf.eos_token, "pad_token": hf.pad_token}
    assert hf.eos_token == "<|eot_id|>"
    text, _ = render_chat([ASK, ANSWER], load_template(model))
    assert text == hf.apply_chat_template([ASK, ANSWER], tokenize=False) == "hi<|eot_id|>ok<|eot_id|>"


def test_an_eos_written_escaped_in_tokenizer_json_adds_nothing_to_the_fingerprint(tmp_path):
    """``fingerprint_extra``: an appended EOS that the tokenizer.json holds (hashed with it already) adds nothing,
    also when the file writes it with ``\\uXXXX`` escapes (``json.dumps``' default; DeepSeek's
    ``<｜end▁of▁sentence｜>`` in an ASCII-escaped file); only an EOS taken from tokenizer_config.json adds its name.
    Hand-computed from the documented rule. Kills: looking for the unescaped spelling only."""
    import json

    from fcp_data.text_tokens import fingerprint_extra

    eos = "<｜end▁of▁sentence｜>"
    path = tmp_path / "tokenizer.json"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos}))
    escaped = json.dumps({"added_tokens": [{"id": 1, "content": eos}]}).encode()
    assert b"\\uff5c" in escaped
    assert fingerprint_extra({"append_eos": True, "eos_token": eos}, path, escaped) == b""
    assert fingerprint_extra({"append_eos": True, "eos_token": eos}, path, b"{}") == \
        f"\0eos from tokenizer_config.json: {eos}".encode()


# -------------------------------------------------------------------------------------------- fcp_data.chat_media
def _human(text: str) -> dict:
    return {"from": "human", "value": text}


GPT = {"from": "gpt", "value": "A cat."}


def test_fewer_tags_than_entries_is_a_mismatch_not_a_dropped_image():
    """Two top-level images and one ``<image>`` tag: which image goes where cannot be told, so the line is
    ``media_tag_mismatch`` ("1 <image> tags for 2 'image' entries", documented: "a tag count that differs from the
    entries") — not a sample of the first image with the second silently left out. Kills: dropping the partial-use
    check of :func:`find_media`."""
    from fcp_data.chat_media import find_media

    line = {"image": ["a.jpg", "b.jpg"], "conversations": [_human("<image>\nCompare."), GPT]}
    with pytest.raises(ChatFormatError, match=r"1 <image> tags for 2 'image' entries") as e:
        find_media(line, "conversations")
    assert e.value.reason == "media_tag_mismatch"


def test_untagged_entries_go_videos_first_then_images():
    """Untagged top-level entries go before the first user turn's text, videos first, then images, each in list
    order (documented in ``_prepend``): a line with an image and a video and no tags gives the video as media 0.
    Hand-computed marks. Kills: images placed before videos."""
    from fcp_data.chat_media import ChatMedia, find_media, mark

    line = {"image": ["a.jpg", "b.jpg"], "video": "v.mp4", "conversations": [_human("Describe."), GPT]}
    media, turns = find_media(line, "conversations")
    assert media == [ChatMedia("video", "v.mp4"), ChatMedia("image", "a.jpg"), ChatMedia("image", "b.jpg")]
    assert turns[0]["value"] == mark(0) + mark(1) + mark(2) + "Describe."


def test_a_tag_before_trailing_whitespace_still_ends_the_turn():
    """``check_text``: a text-only line under a multimodal spec whose turn ends with a tag followed by whitespace
    (``"What is it?\\n<image>\\n"``) or starts with one after it (``" <image> Describe"``) lost its image —
    ``media_tag_mismatch``: the turn's text is compared with its outer whitespace stripped. Kills: comparing the
    raw text."""
    from fcp_data.chat_media import check_text
    from fcp_data.specs import load_spec

    spec = load_spec("qwen2.5-vl")
    for text in ("What is it?\n<image>\n", "  <image>\nDescribe it."):
        line = {"conversations": [_human(text), GPT]}
        with pytest.raises(ChatFormatError, match="a turn starts or ends with a tag <image>") as e:
            check_text(spec, line, "conversations", "rendered")
        assert e.value.reason == "media_tag_mismatch"
    check_text(spec, {"conversations": [_human("The <image> tag of HTML?"), GPT]}, "conversations", "rendered")


def _split(tmp_path, jinja: str, user: str):
    """:func:`split_render` of a two-turn line whose user text holds the marks of ``user`` (``{0}``, ``{1}``)."""
    from fcp_data.chat_media import mark, split_render

    messages = [{"role": "user", "content": user.format(mark(0), mark(1))}, {"role": "assistant", "content": "ok"}]
    return split_render(messages, _template(tmp_path, jinja), user.count("{"))


def test_a_template_that_reorders_or_drops_media_is_template_changed_content(tmp_path):
    """The marks must come back once each and in the order :func:`find_media` gave the media; a template that writes
    them in another order (here: a user text written reversed) or drops them is ``template_changed_content``
    (documented reason of :func:`split_render`), not pieces that give each image another's place. Kills: dropping
    the order check; recording the count mismatch under another reason."""
    gen = ("{% generation %}{{ m.content + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}")
    reverse = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.role == 'assistant' %}" + gen +
               "{%- else %}{{ (m.content | reverse | join('')) + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}")
    with pytest.raises(ChatFormatError, match="wrote the images/videos in another order") as e:
        _split(tmp_path, reverse, "{0} and {1}")
    assert e.value.reason == "template_changed_content"
    drop = ("{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' }}{%- if m.role == 'assistant' %}" + gen +
            "{%- else %}{{ 'hidden<|im_end|>\\n' }}{%- endif %}{%- endfor %}")
    with pytest.raises(ChatFormatError, match="wrote 0 image/video positions for 2") as e:
        _split(tmp_path, drop, "{0} and {1}")
    assert e.value.reason == "template_changed_content"
    pieces, spans = _split(tmp_path, reverse.replace("(m.content | reverse | join(''))", "m.content"), "{0} and {1}")
    assert pieces == ["<|im_start|>user\n", " and ", "<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n"]
    assert spans == [[], [], [(len("<|im_end|>\n<|im_start|>assistant\n"), len("<|im_end|>\n<|im_start|>assistant\n"
                                                                               "ok<|im_end|>"))]]


def test_placeholder_in_text_counts_every_occurrence():
    """``placeholder_in_text`` says how many placeholder tokens the text holds — every occurrence (two literal
    ``<|image_pad|>`` are 2), the count of extra visual positions the model would get. Hand-computed. Kills:
    counting distinct placeholder kinds."""
    from fcp_data.chat_media import check_text_ids
    from fcp_data.specs import load_spec

    spec = load_spec("qwen2.5-vl")
    pad = spec.placeholder_ids[0]
    ids = spec.encode("a") + [pad, pad] + spec.encode("b")
    with pytest.raises(ChatFormatError, match=re.escape(f"holds 2 {spec.placeholder_tokens[0]!r} token(s)")) as e:
        check_text_ids(spec, ids)
    assert e.value.reason == "placeholder_in_text"
    check_text_ids(spec, spec.encode("plain text"))
    check_text_ids(load_spec("text"), [pad, pad])  # a text spec has no placeholder
