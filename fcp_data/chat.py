"""Chat-format SFT samples: a conversation (``[{"role": ..., "content": ...}, ...]``) rendered by a chat template
into one text, and which of its characters the loss trains on (the assistant turns). Turns may also be
ShareGPT's ``{"from": "human"|"gpt"|"system", "value": ...}``, and a content a list of OpenAI-style text parts.

``fcp index --chat-field messages --chat-template chatml`` counts the tokens of the rendered text (no EOS is
appended: the template ends every turn itself); :class:`~fcp_data.readers.IndexedDataset` tokenises the same text
once and gives ``labels`` = the token where it overlaps a trained span, else -100 — the assistant mask
Hugging Face's ``apply_chat_template(..., return_assistant_tokens_mask=True)`` gives for a template whose
``{% generation %}`` block holds the assistant's content and end-of-turn marker.

Templates (``TEMPLATES``), generic layouts rather than any model's exact template:

=========  ==========================================================================================
``chatml``  ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per turn; trained: an assistant's
            ``{content}<|im_end|>`` (Qwen's own templates add a default system prompt and write tool calls and
            results their own way)
``llama3``  Llama 3's layout: ``<|begin_of_text|>`` then ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}
            <|eot_id|>`` per turn, contents not trimmed; trained: an assistant's ``{content}<|eot_id|>``
=========  ==========================================================================================

They write a turn's role and text only: a turn carrying what they cannot write (``tool_calls``, a ShareGPT
``function_call``, ``reasoning_content`` ...) is refused (``unsupported_turn``) rather than trained without it;
such data takes the model's own Jinja template (``--chat-template`` a model folder, its ``tokenizer_config.json``
or ``chat_template.jinja``): :mod:`fcp_data.chat_jinja`.

The special tokens must be in the tokenizer (``fcp index --tokenizer`` the model's own ``tokenizer.json``); with a
tokenizer that lacks them they are split into ordinary tokens (``fcp index`` warns, :func:`split_markers`), and
index and reader still agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ROLES", "TEMPLATES", "UNRENDERED_KEYS", "ChatFormatError", "ChatTemplate", "chat_kwargs", "chat_tools",
           "line_template_inputs", "render_chat",
           "resolve_template", "split_markers", "template_label", "template_markers", "trained_token_mask",
           "turn_dicts"]

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatTemplate:
    """``begin`` once, then per turn ``header`` (``{role}`` filled in), the content, ``end``; an assistant turn
    trains on its content and ``end`` (``end`` is ``end_trained`` + an untrained tail such as a newline)."""

    begin: str
    header: str
    end_trained: str
    end_tail: str = ""


TEMPLATES = {
    "chatml": ChatTemplate(begin="", header="<|im_start|>{role}\n", end_trained="<|im_end|>", end_tail="\n"),
    "llama3": ChatTemplate(begin="<|begin_of_text|>", header="<|start_header_id|>{role}<|end_header_id|>\n\n",
                           end_trained="<|eot_id|>"),
}


class ChatFormatError(ValueError):
    """A conversation that is not a sample; ``reason`` is the error tag the index records."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def template(name: str) -> ChatTemplate:
    if name not in TEMPLATES:
        raise ValueError(f"unknown chat template {name!r}; use one of {', '.join(TEMPLATES)}, or the path of a "
                         "model's own (its folder, tokenizer_config.json or chat_template.jinja)")
    return TEMPLATES[name]


def resolve_template(value: str | dict) -> str | dict:
    """``--chat-template``: a built-in name stays a name; a path is read into the dict the index keeps
    (:func:`fcp_data.chat_jinja.load_template`); anything else is a ValueError naming both kinds."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value in TEMPLATES:
        return value
    from pathlib import Path

    if isinstance(value, str) and value and Path(value).exists():
        from fcp_data.chat_jinja import load_template

        return load_template(value)
    template(str(value))  # raises, naming the built-in templates and the path forms
    raise AssertionError("unreachable")


def template_label(value: str | dict) -> str:
    """How a summary names the template an index was built with."""
    if isinstance(value, dict):
        from fcp_data.chat_jinja import label

        return label(value)
    return value


# ShareGPT / LLaVA ("from", "value") speaker names, as their loaders map them
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
                   "tool": "tool", "function": "tool", "observation": "tool", "function_call": "assistant"}
# what a turn may carry besides its text that the built-in templates cannot write (the model's own template can)
UNRENDERED_KEYS = ("tool_calls", "function_call", "reasoning_content", "thinking", "reasoning")


def _content(content: Any, k: int) -> str:
    """A turn's text: a string, None (an assistant turn that only calls tools), or OpenAI-style parts
    ``[{"type": "text", "text": ...}, ...]`` joined; image/video parts are refused (text-only conversations)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        untyped = next((i for i, p in enumerate(content) if not isinstance(p.get("type"), str)), None)
        if untyped is not None:
            raise ChatFormatError("bad_messages", f"turn {k}: content part {untyped} has no \"type\" (a text part is "
                                                  "{\"type\": \"text\", \"text\": ...})")
        kinds = {p["type"] for p in content}
        if kinds - {"text"}:
            raise ChatFormatError("bad_messages", f"turn {k} has {', '.join(sorted(kinds - {'text'}))} "
                                                  "parts: only text conversations are indexed")
        if all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise ChatFormatError("bad_messages", f"turn {k}: content must be a string or a list of text parts, got "
                                          f"{type(content).__name__}")


def _function_calls(value: Any, k: int) -> list[dict]:
    """A ShareGPT ``function_call`` turn's value (``{"name": ..., "arguments": ...}`` as JSON, or a list of them)
    as OpenAI-style ``tool_calls``."""
    import json

    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        calls = None
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                                           and "arguments" in c for c in calls):
        raise ChatFormatError("bad_messages", f"turn {k}: a function_call turn's value must be a JSON object "
                                              "{\"name\": ..., \"arguments\": ...} (or a list of them)")
    return [{"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]


def turn_dict(m: Any, k: int) -> dict:
    """One turn as the template sees it: ``{"role", "content"}`` with the content's text (:func:`_content`) and a
    role/content turn's other keys in their order — except those holding None, which are absent (a Parquet/Arrow
    struct gives every turn every field of the column; transformers drops them too). A ShareGPT turn
    (``from``/``value``) has no other keys; its ``function_call`` turn becomes an assistant turn with
    ``tool_calls``."""
    if isinstance(m, dict) and m.get("role") is not None:
        out = {key: v for key, v in m.items() if v is not None}
        content = m.get("content")
    elif isinstance(m, dict) and m.get("from") is not None:
        role = _SHAREGPT_ROLES.get(m["from"], m["from"]) if isinstance(m["from"], str) else m["from"]
        out, content = {"role": role}, m.get("value")
        if m["from"] == "function_call":
            out["tool_calls"], content = _function_calls(content, k), None
    else:
        raise ChatFormatError("bad_messages", f"turn {k} must be an object with 'role' and 'content' (or ShareGPT's "
                                              "'from' and 'value')")
    if out["role"] not in ROLES:
        raise ChatFormatError("bad_messages", f"turn {k} has role {out['role']!r}; use one of {', '.join(ROLES)}")
    out["content"] = _content(content, k)
    return out


def turn_dicts(messages: Any) -> list[dict]:
    """Each turn as :func:`turn_dict` gives it; a :class:`ChatFormatError` says what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("bad_messages", f"messages must be a non-empty list of turns, got "
                                              f"{type(messages).__name__}")
    turns = [turn_dict(m, k) for k, m in enumerate(messages)]
    if not any(t["role"] == "assistant" for t in turns):
        raise ChatFormatError("no_assistant_turn", "no assistant turn: nothing to train on")
    return turns


def _unrendered(turn: dict, k: int, name: str) -> None:
    """Refuse a turn carrying what built-in template ``name`` cannot write (it would train the turn without it)."""
    calls = ("tool_calls", "function_call")  # calls: a list, an object or JSON text; reasoning: a text, not a flag
    keys = [key for key in UNRENDERED_KEYS
            if isinstance(turn.get(key), (list, dict, str) if key in calls else str) and turn[key]]
    if keys:
        raise ChatFormatError("unsupported_turn", f"turn {k} has {' and '.join(keys)}, which the built-in {name} "
                                                  "template cannot write: index with the model's own template, "
                                                  "--chat-template MODEL_DIR")


def _line_json(line: Any, field: str | None, reason: str, what: str) -> Any:
    """A line's ``field``, a JSON string read as the value it holds; None for no field, null or a blank string."""
    import json

    value = line.get(field) if field and isinstance(line, dict) else None
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ChatFormatError(reason, f"{what} {field!r} is a string but not JSON ({e.msg} at character "
                                          f"{e.pos})") from None
        except (ValueError, RecursionError) as e:  # an integer past Python's digit limit; nesting past the stack
            raise ChatFormatError(reason, f"{what} {field!r} is JSON that cannot be read ({type(e).__name__}: "
                                          f"{str(e)[:120]})") from None
        return None if isinstance(value, str) and not value.strip() else value  # '""' is no value, as before
    return value


def chat_tools(line: Any, field: str | None) -> list[dict] | None:
    """The tool definitions of a conversation line — its ``field`` (``fcp index --tools-field``, ``tools`` by
    default, as TRL's SFTTrainer reads them) — as ``apply_chat_template(tools=...)`` takes them: a list of objects
    (JSON schemas, ``{"type": "function", "function": {...}}``), or a JSON string of one (how many Hugging Face
    datasets store them). No field, null or a blank string: None (no tools); ``[]`` stays ``[]``, as transformers
    passes it (a template testing ``tools is not none`` writes its tools section for it). Anything else is
    ``bad_tools``."""
    value = _line_json(line, field, "bad_tools", "tools field")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) and t for t in value):
        raise ChatFormatError("bad_tools", f"tools field {field!r} must be a list of tool objects (or a JSON "
                                           f"string of one), got {type(value).__name__}")
    return value


# apply_chat_template's (and render_jinja_template's) own parameters and the names it gives the template itself. TRL
# merges a line's kwargs into that call, so such a key would not be a template variable: it would replace TRL's
# template or tools, add a generation prompt, change the call's output — or fail ("got multiple values"). Refused.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "conversation", "conversations", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "sanitize_control_tokens", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs",
    "raise_exception", "strftime_now"})


def chat_kwargs(line: Any, field: str | None) -> dict:
    """A conversation line's own chat-template variables — its ``field`` (``fcp index --template-kwargs-field``,
    ``chat_template_kwargs`` by default, the column TRL's SFTTrainer merges into ``apply_chat_template(...)`` per
    example: e.g. ``{"enable_thinking": false}`` for SmolLM3/Qwen3 templates): an object, or a JSON string of one.
    No field, null or a blank string: ``{}``. A key that names one of apply_chat_template's own parameters
    (``RESERVED_TEMPLATE_KWARGS``), a key that is not a name, or anything else is ``bad_template_kwargs``."""
    value = _line_json(line, field, "bad_template_kwargs", "template kwargs field")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ChatFormatError("bad_template_kwargs", f"template kwargs field {field!r} must be an object of template "
                                                     f"variables (or a JSON string of one), got {type(value).__name__}")
    bad = sorted(str(k) for k in value if not isinstance(k, str) or not k.isidentifier()
                 or k in RESERVED_TEMPLATE_KWARGS)
    if bad:
        raise ChatFormatError("bad_template_kwargs", f"template kwargs field {field!r} names {', '.join(bad)}: not a "
                                                     "template variable (apply_chat_template's own parameters, which "
                                                     "would change the call itself, are not set per line)")
    return value


def line_template_inputs(line: Any, tools_field: str | None,
                         kwargs_field: str | None) -> tuple[list[dict] | None, dict]:
    """``(tools, kwargs)`` of a conversation line, as TRL's SFTTrainer gives them to ``apply_chat_template``
    (:func:`chat_tools`, :func:`chat_kwargs`): ``render_chat(messages, template, *line_template_inputs(...))``."""
    return chat_tools(line, tools_field), chat_kwargs(line, kwargs_field)


def render_chat(messages: Any, name: str | dict = "chatml", tools: list[dict] | None = None,
                kwargs: dict | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text under template ``name`` (a built-in name, or a model's own template as
    :func:`resolve_template` read it) and the ``[start, end)`` character spans trained on; ``tools`` (from
    :func:`chat_tools`) are given to a model's template as ``apply_chat_template(tools=...)`` gives them, and
    refused by the built-ins (``unsupported_tools``: they cannot write them); ``kwargs`` (from :func:`chat_kwargs`)
    are its template variables as ``apply_chat_template(**kwargs)`` passes them (the built-ins read none)."""
    if isinstance(name, dict):
        from fcp_data.chat_jinja import render

        return render(messages, name, tools, kwargs)
    if tools:
        raise ChatFormatError("unsupported_tools", f"the line has {len(tools)} tool definition(s), which the built-in "
                                                   f"{name} template cannot write: index with the model's own "
                                                   "template, --chat-template MODEL_DIR")
    t = template(name)
    parts, spans, pos = [t.begin], [], len(t.begin)
    for k, turn in enumerate(turn_dicts(messages)):
        _unrendered(turn, k, name)
        head = t.header.format(role=turn["role"])
        body = turn["content"] + t.end_trained
        parts += [head, body, t.end_tail]
        if turn["role"] == "assistant":
            spans.append((pos + len(head), pos + len(head) + len(body)))
        pos += len(head) + len(body) + len(t.end_tail)
    return "".join(parts), spans


def template_markers(value: str | dict) -> list[str]:
    """The special tokens a template writes: a built-in's ``<|...|>`` markers; for a model's template, its
    ``<|...|>`` / ``<｜...｜>`` literals and the tokenizer_config tokens it names (``bos_token`` ...)."""
    import re

    if isinstance(value, dict):
        source = value["jinja"]
        named = [v for k, v in sorted(value.get("special_tokens", {}).items())
                 if re.search(rf"\b{re.escape(k)}\b", source)]
    else:
        t = template(value)
        source, named = t.begin + t.header + t.end_trained, []
    found = re.findall(r"<[|｜][^<>|｜\s'\"\\]{1,64}[|｜]>", source)
    return list(dict.fromkeys(found + [v for v in named if v]))


def split_markers(value: str | dict, tokenizer) -> list[str]:
    """The markers of :func:`template_markers` that ``tokenizer`` (a ``tokenizers.Tokenizer``) does not encode as
    one token: the model would see them spelled out in ordinary tokens."""
    return [m for m in template_markers(value) if len(tokenizer.encode(m, add_special_tokens=False).ids) != 1]


def trained_token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Per token (its ``(start, end)`` character offsets, in order): whether it overlaps a trained span (as HF marks
    every token from the one holding a span's first character to the one holding its last)."""
    out, k = [], 0
    for a, b in offsets:
        while k < len(spans) and spans[k][1] <= a:
            k += 1
        out.append(k < len(spans) and spans[k][0] < b and a < spans[k][1])
    return out
