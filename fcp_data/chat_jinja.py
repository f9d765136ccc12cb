"""A model's own chat template (Jinja, as Hugging Face tokenizers ship it) for ``fcp index --chat-template PATH``.

``PATH`` is a model folder (its ``chat_template.jinja``, else the ``chat_template`` of its ``tokenizer_config.json``),
a ``tokenizer_config.json``, or a ``.jinja`` file. :func:`load_template` reads it once at index time into a plain dict
that the index's manifest keeps (template text, the special tokens the template may use, a fixed date), so the
reader renders exactly what the index counted without the file.

The conversation is rendered as ``transformers``' ``apply_chat_template(messages, tokenize=False)`` renders it: the
same Jinja options (``trim_blocks``, ``lstrip_blocks``, loop controls, a sandbox), ``raise_exception``, ``tojson``,
``strftime_now``, ``add_generation_prompt=False`` and the tokenizer's special tokens (``bos_token``, ``eos_token``,
...) as variables. Each turn's ``content`` is the text :mod:`fcp_data.chat` reads (text parts joined; ShareGPT
``from``/``value`` turns become ``{"role", "content"}``); a role/content turn keeps its other keys (``tool_calls``,
``reasoning_content`` ...) for the template to render. One deliberate difference: ``strftime_now`` formats the date
the index was built, not the time of reading, so a template that prints today's date gives the reader the tokens
the index counted.

What is trained (the character spans :func:`render` returns; :func:`fcp_data.chat.trained_token_mask` turns them
into token labels):

* a template with ``{% generation %}`` blocks: the text they produce (transformers'
  ``return_assistant_tokens_mask``);
* any other template: each assistant turn's content and the text the template writes after it up to the end of
  the turn (e.g. ``<|im_end|>``, with any tool calls it renders there; trailing whitespace such as a newline is not
  trained), found by rendering the conversation
  with marked contents: the marks must come back in order, once per assistant turn, and the text without them must
  equal the plain rendering. Trimming is fine (Llama 3 trims each content: the marks are placed inside the
  whitespace); a template that rewrites or drops an assistant's content (Qwen3 moves a ``<think>...</think>`` part of
  the content elsewhere) fails that check for the lines it rewrites, recorded as ``template_changed_content``: give
  such a template ``{% generation %}`` blocks. A template that raises (``raise_exception``: "roles must alternate
  ...") records ``template_error``.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["load_template", "render", "label"]

# noncharacters U+FDD0..U+FDD3 (never in text a tokenizer should see): generation-block and assistant-content marks
_GEN_A, _GEN_B, _MARK_A, _MARK_B = "\ufdd0", "\ufdd1", "\ufdd2", "\ufdd3"
_MARKS = re.compile("[\ufdd0-\ufdd3]")
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


def _special_tokens(cfg: dict) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... of a tokenizer_config.json (a string, or an AddedToken dict's content)."""
    out = {}
    for k, v in cfg.items():
        if k.endswith("_token") and isinstance(v, dict):
            v = v.get("content")
        if k.endswith("_token") and isinstance(v, str):
            out[k] = v
    return out


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
        try:
            source = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise TemplateError(f"chat template {p}: not a readable text file ({e})") from None
        try:  # the special tokens of the tokenizer_config.json beside it (transformers 5 keeps the template apart)
            cfg = _read_config(cfg_file) if cfg_file.is_file() else {}
        except TemplateError:
            cfg = {}
    if _MARKS.search(source):
        raise TemplateError(f"chat template {p}: holds characters U+FDD0..U+FDD3, which fcp uses as marks")
    _compile(source)
    # the build date, only for a template that prints dates (else --resume on another day would rebuild every part)
    date = datetime.date.today().isoformat() if "strftime_now" in source else None
    return {"jinja": source, "special_tokens": _special_tokens(cfg), "date": date,
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
            return _GEN_A + caller() + _GEN_B

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


def _render(tpl: dict, messages: list[dict]) -> str:
    import jinja2

    from fcp_data.chat import ChatFormatError

    day = datetime.date.fromisoformat(tpl["date"]) if tpl.get("date") else datetime.date.today()
    try:
        return _compile(tpl["jinja"]).render(messages=messages, add_generation_prompt=False,
                                             strftime_now=day.strftime, **tpl["special_tokens"])
    except Exception as e:  # noqa: BLE001 - the template is the user's code run on one line: that line fails
        kind = "" if isinstance(e, jinja2.exceptions.TemplateError) else f"{type(e).__name__}: "
        raise ChatFormatError("template_error", f"the chat template refused this conversation: {kind}{e}") from None


def _unmark(marked: str, a: str, b: str) -> tuple[str, list[tuple[int, int]]]:
    """``marked`` without the marks ``a``/``b`` and the spans they enclosed (in the unmarked text)."""
    text, spans, pos, start = [], [], 0, None
    for piece in re.split(f"([{a}{b}])", marked):
        if piece == a and start is None:
            start = pos
        elif piece == b and start is not None:
            spans.append((start, pos))
            start = None
        elif piece in (a, b):
            raise ValueError("unbalanced marks")
        else:
            text.append(piece)
            pos += len(piece)
    if start is not None:
        raise ValueError("unbalanced marks")
    return "".join(text), spans


def render(messages: Any, tpl: dict) -> tuple[str, list[tuple[int, int]]]:
    """The conversation's text under the model's template and the ``[start, end)`` character spans trained on."""
    from fcp_data.chat import ChatFormatError, _messages

    turns = [_extras(m) | {"role": r, "content": c} for m, (r, c) in zip(messages, _messages(messages))]
    if any(_MARKS.search(json.dumps(t, ensure_ascii=False)) for t in turns):
        raise ChatFormatError("bad_messages", "the conversation holds characters U+FDD0..U+FDD3 (noncharacters)")
    if _GENERATION_TAG.search(tpl["jinja"]):
        text, spans = _unmark(_render(tpl, turns), _GEN_A, _GEN_B)
        return text, [s for s in spans if s[1] > s[0]]
    plain = _render(tpl, turns)
    for wrap in (_wrap_all, _wrap_core):
        marked = _render(tpl, [dict(t, content=wrap(t["content"])) if t["role"] == "assistant" else t for t in turns])
        try:
            text, spans = _unmark(marked, _MARK_A, _MARK_B)
        except ValueError:
            continue
        if text == plain and len(spans) == sum(t["role"] == "assistant" for t in turns):
            return plain, _with_turn_ends(tpl, turns, wrap, plain, spans)
    raise ChatFormatError("template_changed_content", "the chat template rewrites or drops an assistant turn's "
                                                      "content; add {% generation %} blocks to it to say what to train")


def _extras(m: dict) -> dict:
    """A role/content turn's other keys (``tool_calls``, ``reasoning_content``, ``name`` ...), which the template may
    render; a ShareGPT turn has none."""
    return {k: v for k, v in m.items() if k not in ("role", "content")} if m.get("role") is not None else {}


def _wrap_all(content: str) -> str:
    return _MARK_A + content + _MARK_B


def _wrap_core(content: str) -> str:
    """Marks inside the content's outer whitespace (a template that trims it keeps the marks)."""
    core = content.strip()
    lead = content[: len(content) - len(content.lstrip())]
    return lead + _MARK_A + core + _MARK_B + content[len(lead) + len(core):]


def _with_turn_ends(tpl: dict, turns: list[dict], wrap, plain: str,
                    spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each content span extended over the end-of-turn text the template writes after it: what follows the last
    assistant content when the conversation is cut right after that turn, without trailing whitespace."""
    from fcp_data.chat import ChatFormatError

    out, k = [], 0
    for j, t in enumerate(turns):
        if t["role"] != "assistant":
            continue
        cut = [dict(u, content=wrap(u["content"])) if u["role"] == "assistant" else u for u in turns[: j + 1]]
        end = _render(tpl, cut).rsplit(_MARK_B, 1)[-1].rstrip()
        a, b = spans[k]
        if _MARKS.search(end) or not plain.startswith(end, b):
            raise ChatFormatError("template_changed_content", "the chat template ends an assistant turn differently "
                                                              "in the middle of a conversation; add {% generation %} "
                                                              "blocks to it to say what to train")
        out.append((a, b + len(end)))
        k += 1
    return [s for s in out if s[1] > s[0]]
