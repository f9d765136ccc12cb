"""Chat SFT lines with one image or video (LLaVA / Qwen-VL fine-tuning data) for ``fcp index --chat-field``.

A line names its media in one of two ways:

* LLaVA: a top-level ``"video": "clips/a.mp4"`` or ``"image": "imgs/b.jpg"`` and a ``<video>`` / ``<image>`` tag in
  a turn's text where it goes (no tag: before the first user turn's text, as LLaVA's loaders put it);
* parts (transformers / OpenAI style): a content part ``{"type": "video", "video": "clips/a.mp4"}`` (or
  ``"image"``; the path also as ``"path"`` or ``"url"``) among the text parts.

The media may also be embedded: a value ``{"bytes": ..., "path": ...}`` (how Hugging Face datasets store an Image
or Video cell in Parquet) is read from its bytes.

A relative path is resolved against ``fcp index --media-root`` (default: the folder of the jsonl file). The
conversation is rendered by its chat template with one mark character at the media's position; the sample is the
tokens of the text before it, the media's visual block (the spec's markers, timestamps and exactly
``num_visual_tokens`` placeholders, as for a video/image sample) and the tokens of the text after it. Labels: the
assistant turns as for a text conversation (:mod:`fcp_data.chat`); the visual block is never trained.

One image or video per conversation (the index keeps one per sample): a second one is ``multiple_media``; a URL
``unsupported_media``; a file that is missing ``missing_media``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MEDIA_MARK", "ChatMedia", "find_media", "has_media", "media_path", "split_render", "token_labels"]

MEDIA_MARK = "\ufdd4"  # a noncharacter: where the visual block goes in the rendered conversation
_KINDS = ("video", "image")
_TAGS = {"video": "<video>", "image": "<image>"}
_PART_KEYS = ("path", "url")


@dataclass(frozen=True)
class ChatMedia:
    kind: str  # "video" or "image"
    path: str  # as the line spells it
    data: bytes | None = None  # the file's bytes, when the record embeds them (a Parquet row's {"bytes", "path"})


def _embedded(kind: str, v: dict) -> ChatMedia:
    """Hugging Face datasets' Image/Video cell ``{"bytes": ..., "path": ...}``: the bytes when present, else the
    path."""
    data = v.get("bytes")
    if isinstance(data, (bytes, bytearray)) and data:
        return ChatMedia(kind, v.get("path") if isinstance(v.get("path"), str) else "", bytes(data))
    if isinstance(v.get("path"), str) and v["path"]:
        return ChatMedia(kind, v["path"])
    raise _err("bad_messages", f"{kind!r} holds neither bytes nor a path")


def _err(reason: str, detail: str):
    from fcp_data.chat import ChatFormatError

    return ChatFormatError(reason, detail)


def _turn_text_key(m: Any) -> str | None:
    """Where a turn keeps its text (a key holding None is absent, as in a Parquet struct)."""
    if not isinstance(m, dict):
        return None
    return "content" if m.get("role") is not None else "value" if m.get("from") is not None else None


def _media_part(p: Any) -> ChatMedia | None:
    if not isinstance(p, dict) or p.get("type") not in _KINDS:
        return None
    kind = p["type"]
    if isinstance(p.get(kind), dict):
        return _embedded(kind, p[kind])
    path = next((p[k] for k in (kind, *_PART_KEYS) if isinstance(p.get(k), str)), None)
    if path is None:
        raise _err("bad_messages", f"a {kind} part without a path (give it as {kind!r}, 'path' or 'url')")
    return ChatMedia(kind, path)


def has_media(obj: dict, chat_field: str) -> bool:
    """Whether a chat line names an image or a video (either spelling)."""
    if any(obj.get(k) is not None for k in _KINDS):
        return True
    turns = obj.get(chat_field)
    return isinstance(turns, list) and any(
        isinstance(m, dict) and isinstance(m.get(_turn_text_key(m) or ""), list)
        and any(isinstance(p, dict) and p.get("type") in _KINDS for p in m[_turn_text_key(m)]) for m in turns)


def _top_level(obj: dict) -> ChatMedia | None:
    named = [k for k in _KINDS if obj.get(k) is not None]
    if len(named) > 1:
        raise _err("multiple_media", "the line has both 'video' and 'image': one image or video per conversation")
    if not named:
        return None
    v = obj[named[0]]
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    if isinstance(v, list):
        raise _err("multiple_media", f"{len(v)} entries in {named[0]!r}: one image or video per conversation")
    if isinstance(v, dict):
        return _embedded(named[0], v)
    if not isinstance(v, str) or not v:
        raise _err("bad_messages", f"{named[0]!r} must be a file path, got {type(v).__name__}")
    return ChatMedia(named[0], v)


def find_media(obj: dict, chat_field: str) -> tuple[ChatMedia, list]:
    """The line's image or video and its conversation with :data:`MEDIA_MARK` at the media's position."""
    turns = obj.get(chat_field)
    if not isinstance(turns, list):
        raise _err("bad_messages", f"messages must be a non-empty list of turns, got {type(turns).__name__}")
    media, out = _top_level(obj), []
    tag = _TAGS[media.kind] if media else None
    placed = False
    for k, m in enumerate(turns):
        key = _turn_text_key(m)
        if key is None:
            out.append(m)
            continue
        c = m.get(key)
        if isinstance(c, str) and MEDIA_MARK in c or isinstance(c, list) and any(
                isinstance(p, dict) and MEDIA_MARK in str(p.get("text", "")) for p in c):
            raise _err("bad_messages", f"turn {k} holds the character U+FDD4 (a noncharacter)")
        if isinstance(c, list):
            parts = []
            for p in c:
                found = _media_part(p)
                if found is None:
                    parts.append(p)
                    continue
                if media is not None:
                    raise _err("multiple_media", "more than one image or video: one per conversation")
                media, placed = found, True
                parts.append({"type": "text", "text": MEDIA_MARK})
            c = parts
        if tag:
            c, placed = _place_tag(c, tag, placed, media.kind)
        out.append({**m, key: c})
    if media is None:
        raise _err("bad_messages", "no image or video in the line")
    if not placed:
        first = next((j for j, m in enumerate(out) if _role(m) == "user"), None)
        if first is None:
            raise _err("bad_messages", f"no user turn to put the {media.kind} in")
        key = _turn_text_key(out[first])
        c = out[first].get(key)
        c = MEDIA_MARK + (c or "") if c is None or isinstance(c, str) else \
            [{"type": "text", "text": MEDIA_MARK}, *c] if isinstance(c, list) else c
        out[first] = {**out[first], key: c}
    return media, out


def _place_tag(c: Any, tag: str, placed: bool, kind: str) -> tuple[Any, bool]:
    """A turn's content with its ``<video>``/``<image>`` tag (in a string or a text part) turned into the mark."""
    texts = [c] if isinstance(c, str) else [p.get("text") for p in c if isinstance(p, dict)] if isinstance(c, list) \
        else []
    n = sum(t.count(tag) for t in texts if isinstance(t, str))
    if n == 0:
        return c, placed
    if placed or n > 1:
        raise _err("multiple_media", f"more than one {tag} tag: one {kind} per conversation")
    if isinstance(c, str):
        return c.replace(tag, MEDIA_MARK), True
    return [dict(p, text=p["text"].replace(tag, MEDIA_MARK)) if isinstance(p, dict) and isinstance(p.get("text"), str)
            else p for p in c], True


def _role(m: Any) -> str | None:
    key = _turn_text_key(m)
    if key == "content":
        return m["role"]
    return {"human": "user", "user": "user"}.get(m["from"]) if key == "value" else None


def media_path(media: ChatMedia, jsonl_path: str | Path, media_root: str | None) -> Path | bytes:
    """The media of a line: its embedded bytes, else its file — an absolute path as is, a relative one under
    ``media_root`` (else the folder of the jsonl/Parquet file). A URL is refused (``unsupported_media``): fcp reads
    local files."""
    if media.data is not None:
        return media.data
    if "://" in media.path:
        raise _err("unsupported_media", f"{media.path!r} is a URL: download the {media.kind}s and give paths")
    p = Path(os.path.expanduser(media.path))
    return p if p.is_absolute() else Path(media_root or Path(jsonl_path).parent) / p


def split_render(messages: list, template) -> tuple[str, str, list[tuple[int, int]], list[tuple[int, int]]]:
    """The conversation rendered, cut at the media mark: ``(before, after, trained spans of before, of after)``."""
    from fcp_data.chat import render_chat

    text, spans = render_chat(messages, template)
    if text.count(MEDIA_MARK) != 1:
        raise _err("template_changed_content", f"the chat template wrote the image/video position "
                                               f"{text.count(MEDIA_MARK)} times, not once")
    k = text.index(MEDIA_MARK)
    before = [(a, min(b, k)) for a, b in spans if a < k]
    after = [(max(a, k + 1) - k - 1, b - k - 1) for a, b in spans if b > k + 1]
    return text[:k], text[k + 1:], before, after


def token_labels(spec, before: str, after: str, spans_before, spans_after,
                 visual: list[int]) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)``: the text before the media, the visual block, the text after (each text tokenised
    on its own, so the placeholder count is exact); labels keep the trained spans' tokens, -100 elsewhere."""
    from fcp_data.chat import trained_token_mask

    tok = spec.tokenizer()
    ids, labels = [], []
    for text, spans, block in ((before, spans_before, visual), (after, spans_after, None)):
        enc = tok.encode(text, add_special_tokens=False) if text else None
        if enc is not None:
            ids += enc.ids
            labels += [t if m else -100 for t, m in zip(enc.ids, trained_token_mask(enc.offsets, spans))]
        if block is not None:
            ids += block
            labels += [-100] * len(block)
    return ids, labels
