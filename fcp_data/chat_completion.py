"""TRL's conversational prompt-completion lines: ``{"prompt": [messages], "completion": [messages]}``
(``fcp index --prompt-field prompt --chat-field completion``), trained as TRL's SFTTrainer trains them by default
(``completion_only_loss``): the conversation ``prompt + completion`` rendered by the chat template, and every token
after the common prefix of its ids and the ids of the prompt rendered with its generation prompt (TRL's
``common_prefix_length``: a token the two texts split differently at their boundary is trained). So an assistant
turn inside the prompt (a few-shot example) is not trained, and neither is the completion's assistant header; the
end-of-turn marker and what the template writes after it are. A template's ``{% generation %}`` blocks do not
decide these labels (TRL reads them only with ``assistant_only_loss``). Images and videos in such lines are not
supported (``unsupported_media``: index them as one ``--chat-field`` conversation); TRL takes role/content turns
only, fcp ShareGPT's too."""

from __future__ import annotations

from typing import Any

from fcp_data.chat import ChatFormatError, _unrendered, render_chat, template, trained_token_mask, turn_dicts

__all__ = ["line_text", "sft_ids_and_mask"]


def _texts(prompt: Any, completion: Any, name: str | dict, tools, kwargs) -> tuple[str, str]:
    """``(prompt + completion rendered, prompt rendered with its generation prompt)``; ``empty_completion`` when the
    first is a prefix of the second."""
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
    if head.startswith(text):
        raise ChatFormatError("empty_completion", "the completion adds nothing to the prompt's text")
    return text, head


def sft_ids_and_mask(tokenizer, line: dict, chat_field: str, name: str | dict = "chatml",
                     tools: list[dict] | None = None, kwargs: dict | None = None,
                     prompt_field: str | None = None) -> tuple[list[int], list[bool]]:
    """A text conversation line's token ids (``tokenizer``: a ``tokenizers.Tokenizer``) and which are trained: the
    assistant turns' spans (:func:`fcp_data.chat.trained_token_mask`), or with ``prompt_field`` every token after
    the common prefix of the ids of ``prompt + completion`` and of the prompt with its generation prompt — TRL's
    ``common_prefix_length`` (a token the two texts split differently at the boundary is trained, as there)."""
    if not prompt_field:
        text, spans = render_chat(line[chat_field], name, tools, kwargs)
        enc = tokenizer.encode(text, add_special_tokens=False)
        return enc.ids, trained_token_mask(enc.offsets, spans)
    text, head = _texts(line.get(prompt_field), line[chat_field], name, tools, kwargs)
    ids, head_ids = (tokenizer.encode(x, add_special_tokens=False).ids for x in (text, head))
    start = next((k for k, (a, b) in enumerate(zip(ids, head_ids)) if a != b), min(len(ids), len(head_ids)))
    return ids, [k >= start for k in range(len(ids))]


def line_text(line: dict, chat_field: str, name: str | dict = "chatml", tools: list[dict] | None = None,
              kwargs: dict | None = None, prompt_field: str | None = None) -> str:
    """The text a conversation line is tokenized from (``fcp index`` counts its ids): ``line[chat_field]``
    rendered, or with ``prompt_field`` the prompt ``line[prompt_field]`` + the completion ``line[chat_field]``."""
    if prompt_field:
        return _texts(line.get(prompt_field), line[chat_field], name, tools, kwargs)[0]
    return render_chat(line[chat_field], name, tools, kwargs)[0]


def _jinja_text(turns: list[dict], tpl: dict, tools, kwargs, generation_prompt: bool = False) -> str:
    """The text alone, as ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` gives it."""
    from fcp_data.chat_jinja import _MARKS, _prepared, _render

    turns, tpl = _prepared(turns, tpl, tools, kwargs)
    return _MARKS.sub("", _render(tpl, turns, generation_prompt))  # {% generation %} marks (the input has none)
