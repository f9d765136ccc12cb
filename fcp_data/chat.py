"""Chat-format SFT samples: a conversation (``[{"role": ..., "content": ...}, ...]``) rendered by a chat template
into one text, and which of its characters the loss trains on (the assistant turns). Turns may also be
ShareGPT's ``{"from": "human"|"gpt"|"system", "value": ...}``, and a content a list of OpenAI-style text parts.

``fcp index --chat-field messages --chat-template chatml`` counts the tokens of the rendered text (no EOS is
appended: the template ends every turn itself); :class:`~fcp_data.readers.IndexedDataset` tokenises the same text
once and gives ``labels`` = the token where it overlaps a trained span, else -100 — the assistant mask
Hugging Face's ``apply_chat_template(..., return_assistant_tokens_mask=True)`` gives for a template whose
``{% generation %}`` block holds the assistant's content and end-of-turn marker.

Templates (``TEMPLATES``):

=========  ==========================================================================================
``chatml``  Qwen2/2.5/3(-VL): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per turn; trained:
            an assistant's ``{content}<|im_end|>``
``llama3``  Llama 3: ``<|begin_of_text|>`` then ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``
            per turn; trained: an assistant's ``{content}<|eot_id|>``
=========  ==========================================================================================

Or the model's own Jinja template (``--chat-template`` a model folder, its ``tokenizer_config.json`` or
``chat_template.jinja``): :mod:`fcp_data.chat_jinja`.

The special tokens must be in the tokenizer (``fcp index --tokenizer`` the model's own ``tokenizer.json``); with a
tokenizer that lacks them they are split into ordinary tokens, and index and reader still agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ROLES", "TEMPLATES", "ChatFormatError", "ChatTemplate", "render_chat", "resolve_template", "template_label",
           "trained_token_mask"]

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
                   "tool": "tool", "function": "tool", "observation": "tool"}


def _content(content: Any, k: int) -> str:
    """A turn's text: a string, None (an assistant turn that only calls tools), or OpenAI-style parts
    ``[{"type": "text", "text": ...}, ...]`` joined; image/video parts are refused (text-only conversations)."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        kinds = {p.get("type") for p in content}
        if kinds - {"text"}:
            raise ChatFormatError("bad_messages", f"turn {k} has {', '.join(sorted(map(str, kinds - {'text'})))} "
                                                  "parts: only text conversations are indexed")
        if all(isinstance(p.get("text"), str) for p in content):
            return "".join(p["text"] for p in content)
    raise ChatFormatError("bad_messages", f"turn {k}: content must be a string or a list of text parts, got "
                                          f"{type(content).__name__}")


def _turn(m: Any, k: int) -> tuple[str, str]:
    """``(role, content)`` of one turn: ``{"role", "content"}`` (OpenAI / HF) or ``{"from", "value"}`` (ShareGPT)."""
    # a key holding None is absent (a Parquet/Arrow struct gives every turn every field of the column)
    if isinstance(m, dict) and m.get("role") is not None:
        role, content = m["role"], m.get("content")
    elif isinstance(m, dict) and m.get("from") is not None:
        role = _SHAREGPT_ROLES.get(m["from"], m["from"]) if isinstance(m["from"], str) else m["from"]
        content = m.get("value")
    else:
        raise ChatFormatError("bad_messages", f"turn {k} must be an object with 'role' and 'content' (or ShareGPT's "
                                              "'from' and 'value')")
    if role not in ROLES:
        raise ChatFormatError("bad_messages", f"turn {k} has role {role!r}; use one of {', '.join(ROLES)}")
    return role, _content(content, k)


def _messages(messages: Any) -> list[tuple[str, str]]:
    """``(role, content)`` of each turn; a :class:`ChatFormatError` says what is wrong."""
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("bad_messages", f"messages must be a non-empty list of turns, got "
                                              f"{type(messages).__name__}")
    turns = [_turn(m, k) for k, m in enumerate(messages)]
    if not any(role == "assistant" for role, _ in turns):
        raise ChatFormatError("no_assistant_turn", "no assistant turn: nothing to train on")
    return turns


def render_chat(messages: Any, name: str | dict = "chatml") -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text under template ``name`` (a built-in name, or a model's own template as
    :func:`resolve_template` read it) and the ``[start, end)`` character spans trained on."""
    if isinstance(name, dict):
        from fcp_data.chat_jinja import render

        return render(messages, name)
    t = template(name)
    parts, spans, pos = [t.begin], [], len(t.begin)
    for role, content in _messages(messages):
        head = t.header.format(role=role)
        body = content + t.end_trained
        parts += [head, body, t.end_tail]
        if role == "assistant":
            spans.append((pos + len(head), pos + len(head) + len(body)))
        pos += len(head) + len(body) + len(t.end_tail)
    return "".join(parts), spans


def trained_token_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[bool]:
    """Per token (its ``(start, end)`` character offsets, in order): whether it overlaps a trained span (as HF marks
    every token from the one holding a span's first character to the one holding its last)."""
    out, k = [], 0
    for a, b in offsets:
        while k < len(spans) and spans[k][1] <= a:
            k += 1
        out.append(k < len(spans) and spans[k][0] < b and a < spans[k][1])
    return out
