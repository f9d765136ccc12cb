"""A model's own chat template (Jinja, as Hugging Face tokenizers ship it) for ``fcp index --chat-template PATH``.

``PATH`` is a model folder (its ``chat_template.jinja``, else the ``chat_template`` of its ``tokenizer_config.json``),
a ``tokenizer_config.json``, or a ``.jinja`` file. :func:`load_template` reads it once at index time into a plain dict
that the index's manifest keeps (template text, the special tokens the template may use, a fixed date), so the
reader renders exactly what the index counted without the file.

The conversation is rendered as ``transformers``' ``apply_chat_template(messages, tokenize=False)`` renders it: the
same Jinja options (``trim_blocks``, ``lstrip_blocks``, loop controls, a sandbox), ``raise_exception``, ``tojson``,
``strftime_now``, ``add_generation_prompt=False`` and the tokenizer's special tokens (``bos_token``, ``eos_token``,
...) as variables. Each turn's ``content`` is the text :mod:`fcp_data.chat` reads (text parts joined; ShareGPT
``from``/``value`` turns become ``{"role", "content"}``, a ``function_call`` turn an assistant turn with
``tool_calls``); a role/content turn keeps its other keys (``tool_calls``, ``reasoning_content`` ...) for the
template to render, less those holding None, and its reasoning under each of transformers 5's names for it
(``reasoning_content``, ``thinking``). One deliberate difference: ``strftime_now`` formats the date the index was
built, not the time of reading, so a template that prints today's date gives the reader the tokens the index counted.

What is trained (the character spans :func:`render` returns; :func:`fcp_data.chat.trained_token_mask` turns them
into token labels):

* a template with ``{% generation %}`` blocks: the text they produce (transformers'
  ``return_assistant_tokens_mask``);
* any other template: each assistant turn from its content — or from the end of the turn's header (the text the
  template writes before an assistant content there, else its generation prompt) when it writes the turn's reasoning
  or tool calls first or the turn has no content: ``<think>`` and ``<tool_call>`` are trained — to the end of the
  turn (e.g. ``<|im_end|>``; trailing whitespace not). Found by rendering the conversation with the assistants' own
  texts marked (content, reasoning, tool call names): each must come back at most once (a content exactly once), in
  order, and the text without the marks must equal the plain rendering. Trimming is fine (the marks are placed
  inside the whitespace); a template that rewrites or drops an assistant's content (Qwen3 moves a
  ``<think>...</think>`` part of the content elsewhere) fails that check, recorded as ``template_changed_content``:
  give such a template ``{% generation %}`` blocks. A template that raises records ``template_error``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from fcp_data.text_tokens import special_tokens

__all__ = ["load_template", "render", "label"]

# noncharacters (never in text a tokenizer should see): a generation block's output, or an assistant's own text
# (content, reasoning, a tool call's name), is written _OPEN + an id (hex digits U+FDE0..U+FDEF) + _SEP + the text +
# _CLOSE
_OPEN, _CLOSE, _SEP = "\ufdd2", "\ufdd3", "\ufdd4"
_DIGIT0 = 0xFDE0
_MARKS = re.compile("[\ufdd0-\ufdef]")
_PIECE = re.compile("\ufdd2([\ufde0-\ufdef]+)\ufdd4|\ufdd3")
_REASONING = ("reasoning_content", "thinking", "reasoning")  # the names transformers passes a turn's reasoning under
_DATA_SUFFIXES = (".jsonl", ".ndjson", ".parquet", ".arrow", ".csv", ".tsv", ".tar", ".idx", ".bin")
_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


class TemplateError(ValueError):
    """A template that cannot be read or compiled (one line for the user)."""


def _read_config(path: Path) -> dict:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TemplateError(f"chat template {path}: not a readable JSON file ({e})") from None
    if not isinstance(cfg, dict):
        raise TemplateError(f"chat template {path}: expected a JSON object (a tokenizer_config.json)")
    return cfg


def _from_config(path: Path) -> tuple[str, dict]:
    cfg = _read_config(path)
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):  # named templates: [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    if not isinstance(tpl, str) or not tpl:
        raise TemplateError(f"chat template {path}: no 'chat_template' string in it (a model with a separate "
                            "chat_template.jinja: give that file or the model folder)")
    return tpl, cfg


def _read_jinja(p: Path) -> str:
    """A ``.jinja`` (or other text) file's template; a data file or a text that never reads ``messages`` is
    refused (a jsonl given by mistake would render every line as itself)."""
    if p.suffix.lower() in _DATA_SUFFIXES:
        raise TemplateError(f"chat template {p}: a {p.suffix} file is data, not a chat template; give the model "
                            "folder, its tokenizer_config.json or chat_template.jinja")
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TemplateError(f"chat template {p}: not a readable text file ({e})") from None
    if not re.search(r"\{[{%]", source) or not re.search(r"\bmessages\b", source):
        raise TemplateError(f"chat template {p}: not a Jinja chat template (no {{{{ }}}} or {{% %}} reading "
                            "`messages`); give the model folder, its tokenizer_config.json or chat_template.jinja")
    return source


def load_template(path: str | Path) -> dict:
    """Read a model's chat template (see the module docstring for ``path``); returns the JSON-able dict the index
    stores. A missing file, a folder without a template or a Jinja syntax error: :class:`TemplateError`."""
    p = Path(path)
    if p.is_dir():
        jinja, cfg_file = p / "chat_template.jinja", p / "tokenizer_config.json"
        if not jinja.is_file() and not cfg_file.is_file():
            raise TemplateError(f"chat template {p}: the folder has neither chat_template.jinja nor "
                                "tokenizer_config.json")
        p = jinja if jinja.is_file() else cfg_file
    if not p.is_file():
        raise TemplateError(f"chat template {p}: no such file")
    cfg_file = p.parent / "tokenizer_config.json"
    if p.suffix == ".json":
        source, cfg = _from_config(p)
    else:
        source = _read_jinja(p)
        try:  # the special tokens of the tokenizer_config.json beside it (transformers 5 keeps the template apart)
            cfg = _read_config(cfg_file) if cfg_file.is_file() else {}
        except TemplateError:
            cfg = {}
    if _MARKS.search(source):
        raise TemplateError(f"chat template {p}: holds characters U+FDD0..U+FDEF, which fcp uses as marks")
    _compile(source)
    # the build date, only for a template that prints dates (else --resume on another day would rebuild every part)
    date = datetime.date.today().isoformat() if "strftime_now" in source else None
    return {"jinja": source, "special_tokens": special_tokens(cfg), "date": date,
            "source": p.name, "sha256": hashlib.sha256(source.encode()).hexdigest()}


def label(tpl: dict) -> str:
    """How the index summary names a template: its file and the start of its hash."""
    return f"{tpl['source']} {tpl['sha256'][:12]}"


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):  # {% generation %}...{% endgeneration %}: the block's output between marks
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_mark", []), [], [], body).set_lineno(lineno)

        def _mark(self, caller):
            return _tag(0) + caller() + _CLOSE

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise TemplateError(f"chat template: Jinja syntax error on line {e.lineno}: {e.message}") from None


def _render(tpl: dict, messages: list[dict], generation_prompt: bool = False) -> str:
    import jinja2

    from fcp_data.chat import ChatFormatError

    day = datetime.date.fromisoformat(tpl["date"]) if tpl.get("date") else datetime.date.today()
    try:
        variables = {**tpl["special_tokens"], **tpl.get("kwargs", {})}  # a line's kwargs over the tokens, as there
        return _compile(tpl["jinja"]).render(messages=messages, tools=tpl.get("tools"), documents=None,
                                             add_generation_prompt=generation_prompt, strftime_now=day.strftime,
                                             **variables)
    except Exception as e:  # noqa: BLE001 - the template is the user's code run on one line: that line fails
        kind = "" if isinstance(e, jinja2.exceptions.TemplateError) else f"{type(e).__name__}: "
        raise ChatFormatError("template_error", f"the chat template refused this conversation: {kind}{e}") from None


def _changed(what: str):
    from fcp_data.chat import ChatFormatError

    return ChatFormatError("template_changed_content", f"the chat template {what}; add {{% generation %}} blocks to "
                                                       "it to say what to train")


def render(messages: Any, tpl: dict, tools: list[dict] | None = None,
           kwargs: dict | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text under the model's template and the ``[start, end)`` character spans trained on;
    ``tools`` as ``apply_chat_template(tools=...)`` passes them (None, as there, when the line has none), ``kwargs``
    as its ``**kwargs`` (template variables; a TRL line's ``chat_template_kwargs``)."""
    from fcp_data.chat import ChatFormatError, turn_dicts

    turns, tpl = _prepared(turn_dicts(messages), tpl, tools, kwargs)  # every render (the marked ones too) sees them
    if _GENERATION_TAG.search(tpl["jinja"]):
        try:
            text, found = _pieces(_render(tpl, turns))
        except ValueError:
            raise ChatFormatError("template_error", "the chat template nests its {% generation %} blocks") from None
        return text, [(a, b) for _, a, b in found if b > a]
    plain = _render(tpl, turns)
    for bare, wrap in _attempts(turns):
        marked, pieces = _marked(turns, wrap, bare)
        try:
            text, found = _pieces(_render(tpl, marked))
        except (ValueError, ChatFormatError):
            continue
        by_turn = _by_turn(found, pieces, turns) if text == plain else None
        if by_turn is not None:
            return plain, _spans(tpl, turns, marked, pieces, by_turn, plain)
    raise _changed("rewrites or drops an assistant turn's content")


def _prepared(turns: list[dict], tpl: dict, tools, kwargs) -> tuple[list[dict], dict]:
    """The turns as templates read them (:func:`_aliased`) and ``tpl`` with the line's tools and kwargs; a
    noncharacter anywhere (fcp's own marks) is ``bad_messages``."""
    from fcp_data.chat import ChatFormatError

    turns = [_aliased(t) for t in turns]
    if any(_MARKS.search(json.dumps(t, ensure_ascii=False, default=str))
           for t in turns + (tools or []) + [kwargs or {}]):
        raise ChatFormatError("bad_messages", "the conversation holds characters U+FDD0..U+FDEF (noncharacters)")
    return turns, {**tpl, "tools": tools, "kwargs": kwargs or {}}


def _aliased(turn: dict) -> dict:
    """A turn's reasoning under each name templates read, as transformers 5 passes it: the first of
    ``reasoning_content`` / ``thinking`` / ``reasoning`` also as ``reasoning_content`` and (unless given)
    ``thinking``."""
    r = next((turn[k] for k in _REASONING if turn.get(k) is not None), None)
    return turn if r is None else {"thinking": r, **turn, "reasoning_content": r}


def _attempts(turns: list[dict]) -> list[tuple[bool, Any]]:
    """How to mark: every content (even empty) first — a template that writes its contents as they are — then,
    for a conversation with an assistant turn of no content but reasoning or tool calls, those bare (a marked
    empty content is no longer empty: ``{% if message.content %}`` would change its mind); each with the marks
    around the whole text, then inside its outer whitespace (a template that trims it keeps them)."""
    out = [(False, _wrap_all), (False, _wrap_core)]
    own = lambda t: t.get("tool_calls") or any(isinstance(t.get(k), str) and t[k] for k in _REASONING)  # noqa: E731
    if any(t["role"] == "assistant" and not t["content"] and own(t) for t in turns):
        out += [(True, _wrap_all), (True, _wrap_core)]
    return out


def _tag(i: int) -> str:
    return _OPEN + "".join(chr(_DIGIT0 + int(d, 16)) for d in format(i, "x")) + _SEP


def _wrap_all(text: str, tag: str) -> str:
    return tag + text + _CLOSE


def _wrap_core(text: str, tag: str) -> str:
    """Marks inside the text's outer whitespace (a template that trims it keeps the marks)."""
    core = text.strip()
    lead = text[: len(text) - len(text.lstrip())]
    return lead + tag + core + _CLOSE + text[len(lead) + len(core):]


def _mark_call(call: Any, mark) -> Any:
    """A tool call with its function's name marked (``{"function": {"name": ...}}`` or ``{"name": ...}``)."""
    if not isinstance(call, dict):
        return call
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
        return {**call, "function": {**fn, "name": mark(fn["name"])}}
    if isinstance(call.get("name"), str) and call["name"]:
        return {**call, "name": mark(call["name"])}
    return call


def _marked(turns: list[dict], wrap, bare: bool) -> tuple[list[dict], list[tuple[int, str]]]:
    """The turns with each assistant's own text marked — its reasoning, its content and, when ``bare``, its tool
    calls' names, an empty content left bare where the turn has any of those — and per mark id ``(turn, kind)``."""
    out, pieces = [], []

    def add(j: int, kind: str, text: str, how) -> str:
        pieces.append((j, kind))
        return how(text, _tag(len(pieces) - 1))

    for j, t in enumerate(turns):
        if t["role"] == "assistant":
            t, n = dict(t), len(pieces)
            for key in _REASONING:
                if isinstance(t.get(key), str) and t[key]:
                    t[key] = add(j, "reasoning", t[key], wrap)
            if bare and isinstance(t.get("tool_calls"), list):
                t["tool_calls"] = [_mark_call(c, lambda s, j=j: add(j, "tool", s, _wrap_all)) for c in t["tool_calls"]]
            if t["content"] or not bare or len(pieces) == n:
                t["content"] = add(j, "content", t["content"], wrap)
        out.append(t)
    return out, pieces


def _id(digits: str) -> int:
    return int("".join(format(ord(c) - _DIGIT0, "x") for c in digits), 16)


def _pieces(marked: str) -> tuple[str, list[tuple[int, int, int]]]:
    """``marked`` without the marks and each marked text's ``(id, start, end)`` in it, in order; ValueError when
    the marks do not pair up (a template that cut or took apart a marked text)."""
    parts = _PIECE.split(marked)  # text, id digits (None: a close mark), text, ...
    text, found, pos, opened = parts[::2], [], len(parts[0]), None
    for k in range(1, len(parts), 2):
        if parts[k] is None and opened is not None:
            found.append((*opened, pos))
            opened = None
        elif parts[k] is not None and opened is None:
            opened = (_id(parts[k]), pos)
        else:
            raise ValueError("unbalanced marks")
        pos += len(parts[k + 1])
    out = "".join(text)
    if opened is not None or _MARKS.search(out):
        raise ValueError("unbalanced marks")
    return out, found


def _turn_end(marked: str, pieces: list[tuple[int, str]], j: int) -> str | None:
    """What follows the last marked text of ``marked`` (a conversation cut right after assistant turn ``j``),
    without trailing whitespace — None unless that text is turn ``j``'s."""
    close = marked.rfind(_CLOSE)
    opened = marked.rfind(_OPEN, 0, close)
    sep = marked.find(_SEP, opened, close)
    if min(close, opened, sep) < 0 or not _PIECE.fullmatch(marked[opened: sep + 1]):
        return None
    end = marked[close + 1:]
    return end.rstrip() if pieces[_id(marked[opened + 1: sep])][0] == j and not _MARKS.search(end) else None


def _by_turn(found: list[tuple[int, int, int]], pieces: list[tuple[int, str]],
             turns: list[dict]) -> dict[int, list[tuple[str, int, int]]] | None:
    """The written marked texts per assistant turn, ``(kind, start, end)`` in order — None unless each was written
    at most once, each marked content exactly once, the turns in order and every assistant turn something."""
    ids = [i for i, _, _ in found]
    if len(set(ids)) != len(ids) or any(i >= len(pieces) for i in ids):
        return None
    if any(kind == "content" and i not in ids for i, (_, kind) in enumerate(pieces)):
        return None
    order = [pieces[i][0] for i in ids]
    if order != sorted(order) or set(order) != {j for j, t in enumerate(turns) if t["role"] == "assistant"}:
        return None
    out: dict[int, list[tuple[str, int, int]]] = {}
    for i, a, b in found:
        out.setdefault(pieces[i][0], []).append((pieces[i][1], a, b))
    return out


def _spans(tpl: dict, turns: list[dict], marked: list[dict], pieces: list[tuple[int, str]],
           by_turn: dict[int, list[tuple[str, int, int]]], plain: str) -> list[tuple[int, int]]:
    """Each assistant turn's trained span: from its content — or, when the template writes something of its own
    before the turn's first marked text (``<think>`` before the reasoning, ``<tool_call>`` before a call), from the
    end of the turn's header — to its end of turn: what follows the turn's last marked text when the conversation is
    cut right after the turn, without trailing whitespace."""
    out, lo = [], 0
    for j in sorted(by_turn):
        first, last = by_turn[j][0], by_turn[j][-1]
        a = first[1] if first[0] == "content" else _after_header(tpl, turns[:j], plain, lo, first[1])
        end = _turn_end(_render(tpl, marked[: j + 1]), pieces, j)
        if end is None or not plain.startswith(end, last[2]):
            raise _changed("ends an assistant turn differently in the middle of a conversation")
        lo = last[2] + len(end)
        out.append((a, lo))
    return [s for s in out if s[1] > s[0]]


def _after_header(tpl: dict, before: list[dict], plain: str, lo: int, q: int) -> int:
    """Where an assistant turn that follows the turns ``before`` starts, its first marked text at ``q`` of ``plain``
    (and nothing of it before ``lo``): after the last place in between that the template writes an assistant's
    header — the text before an assistant content at that point of the conversation, or the generation prompt."""
    from fcp_data.chat import ChatFormatError

    def rendered(messages: list[dict], prompt: bool = False) -> str | None:
        try:
            return _render(tpl, messages, generation_prompt=prompt)
        except ChatFormatError:
            return None

    base = rendered(before) or ""
    heads = []
    probe = rendered(before + [{"role": "assistant", "content": _OPEN}])
    if probe is not None and probe.startswith(base) and probe.count(_OPEN) == 1:
        heads.append(probe[len(base): probe.index(_OPEN)])
    prompt = rendered(before, prompt=True)
    if prompt is not None and prompt.startswith(base):
        heads.append(prompt[len(base):])
    ends = [k + len(h) for h in heads if h and (k := plain.rfind(h, lo, q)) >= 0]
    if not ends:
        raise _changed("writes an assistant turn without content and without the header it writes before one")
    return max(ends)
