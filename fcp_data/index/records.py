"""The text of one parsed jsonl line or Parquet row, as ``fcp index`` counts it: its text field, ``(prompt,
response)`` with ``--prompt-field``, or its conversation rendered by the chat template (``--chat-field``). A line
that is no sample raises a :class:`~fcp_data.index.probe.ProbeError` whose reason the index records."""

from __future__ import annotations

from fcp_data.index.probe import ProbeError

__all__ = ["check_unicode", "jsonl_text", "chat_text"]


def check_unicode(text: str) -> None:
    """Text the tokenizer accepts: valid Unicode (JSON can spell lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ProbeError("bad_encoding", f"lone surrogate at character {e.start}") from None


def jsonl_text(obj, cfg: dict, spec=None) -> str | tuple[str, str]:
    """The text of one parsed JSON line, or ``(prompt, response)`` with a ``prompt_field``; a ``ProbeError`` says
    why the line is not a sample."""
    if not isinstance(obj, dict):
        raise ProbeError("bad_json", f"line is a JSON {type(obj).__name__}, not an object")
    if cfg.get("chat_field"):
        return chat_text(obj, cfg, spec)
    text = obj.get(cfg["text_field"])
    if not isinstance(text, str):
        not_a_string(obj, cfg["text_field"], "")
    if not text.strip():
        raise ProbeError("empty_sample", "empty text")
    check_unicode(text)
    if not cfg.get("prompt_field"):
        return text
    prompt = obj.get(cfg["prompt_field"])
    if not isinstance(prompt, str):
        not_a_string(obj, cfg["prompt_field"], " (--prompt-field)")
    check_unicode(prompt)
    return prompt, text


def not_a_string(obj: dict, field: str, option: str):
    """The error of a text field that holds no string: ``missing_field``, or ``conversational_field`` naming what to
    do when it holds messages (TRL's conversational prompt-completion format)."""
    value = obj.get(field)
    if isinstance(value, list) and value and all(isinstance(m, dict) and ("role" in m or "from" in m) for m in value):
        raise ProbeError("conversational_field", f"field {field!r}{option} holds messages, not text (a conversational "
                                                 "prompt-completion line): index such lines with --prompt-field "
                                                 "PROMPT --chat-field COMPLETION")
    raise ProbeError("missing_field", f"no string field {field!r}{option}")


def chat_text(obj: dict, cfg: dict, spec=None) -> str:
    """The rendered conversation of a chat-format line (:mod:`fcp_data.chat`); under a multimodal spec, checked for
    a visual placeholder in its text and a LLaVA tag without its media (:func:`fcp_data.chat_media.check_text`)."""
    from fcp_data.chat import ChatFormatError, line_template_inputs
    from fcp_data.chat_completion import line_text
    from fcp_data.chat_media import check_text

    for field, option in ((cfg["chat_field"], "--chat-field"), (cfg.get("prompt_field"), "--prompt-field")):
        if field and field not in obj:
            raise ProbeError("missing_field", f"no field {field!r} ({option})")
    try:
        text = line_text(obj, cfg["chat_field"], cfg.get("chat_template") or "chatml",
                         *line_template_inputs(obj, cfg.get("tools_field"), cfg.get("template_kwargs_field")),
                         cfg.get("prompt_field"), bool(cfg.get("assistant_only_loss")))
        for field in (cfg["chat_field"], cfg.get("prompt_field")) if spec is not None else ():
            if field:  # a prompt-completion line's prompt turns too
                check_text(spec, obj, field, text)
    except ChatFormatError as e:
        raise ProbeError(e.reason, str(e)) from None
    check_unicode(text)
    return text
