"""TRL's conversational prompt-completion lines: ``{"prompt": [messages], "completion": [messages]}``
(``fcp index --prompt-field prompt --chat-field completion``), trained as TRL's SFTTrainer trains them by default
(``completion_only_loss``): the conversation ``prompt + completion`` rendered by the chat template, and every token
the completion adds after the prompt rendered with its generation prompt — the two texts' common prefix, as TRL's
``common_prefix_length`` of the two token lists (here in characters, then mapped to tokens like any trained span).
So an assistant turn inside the prompt (a few-shot example) is not trained, and neither is the completion's
assistant header; the end-of-turn marker and what the template writes after it are. Images and videos in such
lines are not supported (``unsupported_media``: index them as one ``--chat-field`` conversation)."""

from __future__ import annotations

import os
from typing import Any

from fcp_data.chat import ChatFormatError, _unrendered, render_chat, template, turn_dicts

__all__ = ["render_line", "render_prompt_completion"]


def render_prompt_completion(prompt: Any, completion: Any, name: str | dict = "chatml", tools: list[dict] | None = None,
                             kwargs: dict | None = None) -> tuple[str, list[tuple[int, int]]]:
    """``(text, [(start, end)])``: ``prompt + completion`` under template ``name`` (a built-in name or a model's
    template, :func:`fcp_data.chat.resolve_template`) and the one span trained (module docstring); ``tools`` and
    ``kwargs`` as :func:`fcp_data.chat.render_chat` takes them."""
    for what, value in (("prompt", prompt), ("completion", completion)):
        if not isinstance(value, list) or not value:
            raise ChatFormatError("bad_messages", f"the {what} must be a non-empty list of messages (a "
                                                  f"conversational prompt-completion line), got {type(value).__name__}")
    turns = turn_dicts(prompt + completion)  # every turn checked; an assistant turn somewhere
    if isinstance(name, dict):
        text = _jinja_text(turns, name, tools, kwargs)
        head = _jinja_text(turns[: len(prompt)], name, tools, kwargs, generation_prompt=True)
    else:
        text, _ = render_chat(prompt + completion, name, tools, kwargs)
        t = template(name)
        head = t.begin
        for k, turn in enumerate(turns[: len(prompt)]):
            _unrendered(turn, k, name)
            head += t.header.format(role=turn["role"]) + turn["content"] + t.end_trained + t.end_tail
        head += t.header.format(role="assistant")  # the generation prompt
    start = len(os.path.commonprefix([head, text]))
    if start >= len(text):
        raise ChatFormatError("empty_completion", "the completion adds nothing to the prompt's text")
    return text, [(start, len(text))]


def render_line(line: dict, chat_field: str, name: str | dict = "chatml", tools: list[dict] | None = None,
                kwargs: dict | None = None, prompt_field: str | None = None) -> tuple[str, list[tuple[int, int]]]:
    """A text conversation line rendered with its trained spans: ``line[chat_field]``'s assistant turns
    (:func:`fcp_data.chat.render_chat`), or with ``prompt_field`` the completion ``line[chat_field]`` after the
    prompt ``line[prompt_field]`` (:func:`render_prompt_completion`)."""
    if prompt_field:
        return render_prompt_completion(line.get(prompt_field), line[chat_field], name, tools, kwargs)
    return render_chat(line[chat_field], name, tools, kwargs)


def _jinja_text(turns: list[dict], tpl: dict, tools, kwargs, generation_prompt: bool = False) -> str:
    """The text alone, as ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` gives it."""
    from fcp_data.chat_jinja import _prepared, _render

    turns, tpl = _prepared(turns, tpl, tools, kwargs)
    return _render(tpl, turns, generation_prompt)
