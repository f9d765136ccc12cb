"""TRL's conversational prompt-completion lines: ``{"prompt": [messages], "completion": [messages]}``
(``fcp index --prompt-field prompt --chat-field completion``), trained as TRL's SFTTrainer trains them by default
(``completion_only_loss``): the conversation ``prompt + completion`` rendered by the chat template, and every token
after the common prefix of its ids and the ids of the prompt rendered with its generation prompt (TRL's
``common_prefix_length``: a token the two texts split differently at their boundary is trained). So an assistant
turn inside the prompt (a few-shot example) is not trained, and neither is the completion's assistant header; the
end-of-turn marker and what the template writes after it are. A template's ``{% generation %}`` blocks do not
decide these labels — unless the index was built with ``--assistant-only-loss`` (TRL's ``assistant_only_loss``): then
a token is trained where both masks say so, the completion's and the blocks' (a user turn inside a completion is not
trained; :mod:`fcp_data.chat_trl` gives a template its blocks). Lines with images or videos (in the prompt, as TRL's
``images`` column puts them) are cut as TRL's vision collator cuts them — the prompt's text at the first character
where the two renders differ, the completion's text tokenised apart and trained whole (:func:`media_line`). TRL
takes role/content turns only, fcp ShareGPT's too."""

from __future__ import annotations

from typing import Any

from fcp_data.chat import (ChatFormatError, _unrendered, line_template_inputs, render_chat, template, trained_token_mask,
                           turn_dicts)

__all__ = ["line_text", "media_line", "sft_ids_and_mask"]


def _common(a, b) -> int:
    """The length of the common prefix of two sequences (texts or id lists)."""
    return next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _check_lists(prompt: Any, completion: Any) -> None:
    for what, value in (("prompt", prompt), ("completion", completion)):
        if not isinstance(value, list) or not value:
            raise ChatFormatError("bad_messages", f"the {what} must be a non-empty list of messages (a "
                                                  f"conversational prompt-completion line), got {type(value).__name__}")


def _texts(prompt: Any, completion: Any, name: str | dict, tools, kwargs, with_spans: bool = False,
           continued: bool = False) -> tuple[str, str, list[tuple[int, int]]]:
    """``(prompt + completion rendered, prompt rendered with its generation prompt, the first's trained spans)``
    (the spans of a model's template only ``with_spans``, else ``[]``; ``continued``: the prompt rendered as
    continuing its final turn instead, :func:`_continued`); ``empty_completion`` when the first is a prefix of the
    second."""
    _check_lists(prompt, completion)
    turns = turn_dicts(prompt + completion)  # every turn checked; an assistant turn somewhere
    if isinstance(name, dict):  # one render of the whole line: with its spans (marks taken out) or without
        text, spans = render_chat(prompt + completion, name, tools, kwargs) if with_spans else \
            (_jinja_text(turns, name, tools, kwargs), [])
        head = _jinja_text(turns[: len(prompt)], name, tools, kwargs, generation_prompt=True)
    else:
        text, spans = render_chat(prompt + completion, name, tools, kwargs)
        t = template(name)
        head = t.begin
        for k, turn in enumerate(turns[: len(prompt)]):
            _unrendered(turn, k, name)
            head += t.header.format(role=turn["role"]) + turn["content"] + t.end_trained + t.end_tail
        head += t.header.format(role="assistant")  # the generation prompt
    head = _continued(turns[: len(prompt)], name, tools, kwargs) if continued else head
    if head.startswith(text):
        raise ChatFormatError("empty_completion", "the completion adds nothing to the prompt's text")
    return text, head, spans


def sft_ids_and_mask(tokenizer, line: dict, chat_field: str, name: str | dict = "chatml",
                     tools: list[dict] | None = None, kwargs: dict | None = None,
                     prompt_field: str | None = None, assistant_only: bool = False) -> tuple[list[int], list[bool]]:
    """A text conversation line's token ids (``tokenizer``: a ``tokenizers.Tokenizer``) and which are trained: the
    assistant turns' spans (:func:`fcp_data.chat.trained_token_mask`), or with ``prompt_field`` every token after
    the common prefix of the ids of ``prompt + completion`` and of the prompt with its generation prompt — TRL's
    ``common_prefix_length`` (a token the two texts split differently at the boundary is trained, as there) — and,
    with ``assistant_only``, inside the assistant turns' spans too (TRL's two masks with ``assistant_only_loss``)."""
    if not prompt_field:
        text, spans = render_chat(line[chat_field], name, tools, kwargs)
        enc = tokenizer.encode(text, add_special_tokens=False)
        return enc.ids, trained_token_mask(enc.offsets, spans)
    text, head, spans = _texts(line.get(prompt_field), line[chat_field], name, tools, kwargs, assistant_only)
    enc = tokenizer.encode(text, add_special_tokens=False)
    ids, head_ids = enc.ids, tokenizer.encode(head, add_special_tokens=False).ids
    start = _common(ids, head_ids)
    mask = [k >= start for k in range(len(ids))]
    if assistant_only:
        mask = [a and b for a, b in zip(mask, trained_token_mask(enc.offsets, spans))]
    return ids, mask


def line_text(line: dict, chat_field: str, name: str | dict = "chatml", tools: list[dict] | None = None,
              kwargs: dict | None = None, prompt_field: str | None = None, assistant_only: bool = False) -> str:
    """The text a conversation line is tokenized from (``fcp index`` counts its ids): ``line[chat_field]``
    rendered, or with ``prompt_field`` the prompt ``line[prompt_field]`` + the completion ``line[chat_field]``.
    ``assistant_only`` (TRL's ``assistant_only_loss``, which stops on such a line): a line whose assistant spans
    train no text (of its completion, with ``prompt_field``) is ``no_trained_tokens``."""
    if prompt_field:
        text, head, spans = _texts(line.get(prompt_field), line[chat_field], name, tools, kwargs, assistant_only)
    else:
        (text, spans), head = render_chat(line[chat_field], name, tools, kwargs), ""
    if assistant_only:
        common = _common(text, head)
        if not any(b > common for a, b in spans):
            raise ChatFormatError("no_trained_tokens", "no assistant text to train" + (" in the completion" if
                                  prompt_field else "") + " (--assistant-only-loss: the template's "
                                  "{% generation %} blocks, or the assistant turns, hold none)")
    return text


_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' own


def _continued(turns: list[dict], name: str | dict, tools, kwargs) -> str:
    """The prompt as ``apply_chat_template(continue_final_message=True)`` renders it (TRL's, for a prompt that ends
    with an assistant turn): rendered with a tag after its final turn's content and cut at the tag (and its trailing
    whitespace, where the template trimmed the content)."""
    tagged = turns[:-1] + [{**turns[-1], "content": (turns[-1]["content"] or "") + _CONTINUE_TAG}]
    text = _jinja_text(tagged, name, tools, kwargs) if isinstance(name, dict) else render_chat(tagged, name)[0]
    at = text.rfind(_CONTINUE_TAG.strip())
    if at < 0:
        raise ChatFormatError("template_changed_content", "the chat template drops the content of the prompt's final "
                                                          "turn, which the completion continues")
    return text[:at] if text[at: at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


def _jinja_text(turns: list[dict], tpl: dict, tools, kwargs, generation_prompt: bool = False) -> str:
    """The text alone, as ``apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`` gives it."""
    from fcp_data.chat_jinja import _MARKS, _prepared, _render

    turns, tpl = _prepared(turns, tpl, tools, kwargs)
    return _MARKS.sub("", _render(tpl, turns, generation_prompt))  # {% generation %} marks (the input has none)


def media_line(obj: dict, chat_field: str, template: str | dict, fields: tuple = (None, None),
               prompt_field: str | None = None) -> tuple[list, list[str], list, str | None]:
    """``(media, pieces, spans, completion)`` of a line with images/videos: its media in order of position and the
    rendered conversation cut at them (:func:`fcp_data.chat_media.split_render`), ``completion`` None — or, with
    ``prompt_field``, TRL's vision prompt-completion line as its vision collator makes it: the prompt's text (the
    common prefix of the prompt rendered with its generation prompt — continuing its final turn when that is an
    assistant's, a system turn last being ``bad_messages`` — and of prompt + completion, as TRL's
    ``apply_chat_template`` cuts it) cut at the media, nothing of it trained, and the rest of the text, the completion,
    tokenised apart and trained whole. The media are the prompt's (a top-level ``images``/``videos`` column goes
    there, as ``prepare_multimodal_messages`` puts it); one in the completion is ``unsupported_media``. The line's
    ``tools`` and template kwargs (``fields``: their field names, :func:`fcp_data.chat.line_template_inputs`) are not
    read then: TRL's SFTTrainer drops those columns from vision data."""
    from fcp_data.chat_media import _MARKS, cut_at_marks, find_media, split_render

    if not prompt_field:
        media, messages = find_media(obj, chat_field)
        return (media, *split_render(messages, template, len(media), *line_template_inputs(obj, *fields)), None)
    prompt, completion = obj.get(prompt_field), obj.get(chat_field)
    _check_lists(prompt, completion)
    media, messages = find_media({**obj, chat_field: prompt + completion}, chat_field)
    last = turn_dicts(messages)[len(prompt) - 1]["role"]
    if last == "system":  # TRL: "Invalid role in the last message"
        raise ChatFormatError("bad_messages", "the prompt ends with a system turn: nothing for the completion to "
                                              "answer or continue")
    text, head, _ = _texts(messages[: len(prompt)], messages[len(prompt):], template, None, None,
                           continued=last == "assistant")
    cut = _common(text, head)
    if _MARKS.search(text[cut:]):
        raise ChatFormatError("unsupported_media", "an image/video after the prompt's text (in the completion, or "
                                                   "the template renders the prompt otherwise once the completion "
                                                   "follows): TRL's vision collator takes them in the prompt only")
    pieces, _ = cut_at_marks(text[:cut], [], len(media))
    return media, pieces, [[] for _ in pieces], text[cut:]
