"""Chat SFT lines with images and videos (LLaVA / Qwen-VL fine-tuning data) for ``fcp index --chat-field``.

A line names its media in one of two ways:

* LLaVA: a top-level ``"video": "clips/a.mp4"`` or ``"image": "imgs/b.jpg"`` (or a list of paths: multi-image
  data) and one ``<video>`` / ``<image>`` tag per entry in the turns' text where each goes, in order (no tag at
  all: the entries go before the first user turn's text, as LLaVA's loaders put them); a line whose entries are
  videos only may mark them with ``<image>`` too, as LLaVA-Video-178K's lines do;
* parts (transformers / OpenAI style): content parts ``{"type": "video", "video": "clips/a.mp4"}`` (or
  ``"image"``; the path also as ``"path"`` or ``"url"``) among the text parts, as many as the turn has.

The media may also be embedded: a value ``{"bytes": ..., "path": ...}`` (how Hugging Face datasets store an Image
or Video cell in Parquet) is read from its bytes.

A relative path is resolved against ``fcp index --media-root`` (default: the folder of the jsonl file). The
conversation is rendered by its chat template with one mark character (a private-use code point of plane 15, one
per media) at each media's position; the sample is the tokens of the text between the marks and, at each mark,
that media's visual block (the spec's markers, timestamps and exactly its visual-token count of placeholders, as
for a video/image sample). Labels: the assistant turns as for a text conversation (:mod:`fcp_data.chat`); a visual
block is never trained. The sample's ``grid_thw`` has one row per media in order of position, ``pixel_values``
are theirs concatenated.

Recorded per line: a tag count that differs from the entries, a tag of a kind the line has no entry of, a tag
whose entry is null (``media_tag_mismatch``), more than ``MAX_MEDIA`` media (``too_many_media``), a URL
(``unsupported_media``), a file that is missing (``missing_media``), a visual placeholder token in the text itself
(``placeholder_in_text``: a literal ``<|image_pad|>``, or ``<image>`` under a spec whose placeholder it is).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MAX_MEDIA", "ChatMedia", "check_text", "check_text_ids", "find_media", "has_media", "mark", "media_path",
           "split_render", "token_labels"]

MAX_MEDIA = 256  # images/videos in one conversation
_MARK0 = 0xF0000  # media k is marked by chr(_MARK0 + k) (Supplementary Private Use Area-A)
_MARKS = re.compile("[\U000F0000-\U000FFFFD]")
_KINDS = ("video", "image")
_TOP_KEYS = (("video", "video"), ("image", "image"), ("videos", "video"), ("images", "image"))  # TRL's: images
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


def _placeholder(p: Any) -> bool:
    """A media part with no file or bytes of its own (TRL's ``{"type": "image"}``; a Parquet struct's null fields)."""
    return isinstance(p, dict) and p.get("type") in _KINDS and not any(
        isinstance(p.get(k), (str, dict)) for k in (p["type"], *_PART_KEYS))


def has_media(obj: dict, chat_field: str) -> bool:
    """Whether a chat line names an image or a video (either spelling); an empty list names none, like null."""
    if any(obj.get(k) is not None and obj.get(k) != [] for k, _ in _TOP_KEYS):
        return True
    turns = obj.get(chat_field)
    return isinstance(turns, list) and any(
        isinstance(m, dict) and isinstance(m.get(_turn_text_key(m) or ""), list)
        and any(isinstance(p, dict) and p.get("type") in _KINDS for p in m[_turn_text_key(m)]) for m in turns)


def mark(k: int) -> str:
    """The character that stands for media ``k`` in a rendered conversation."""
    return chr(_MARK0 + k)


def _top_level(obj: dict) -> dict[str, list[ChatMedia]]:
    """LLaVA's top-level entries per kind (a path, an embedded cell, or a list of them), or TRL's ``images`` /
    ``videos`` (the same; one spelling per kind)."""
    out = {}
    for key, kind in _TOP_KEYS:
        v = obj.get(key)
        if v is None:
            continue
        items = v if isinstance(v, list) else [v]
        if not items:
            continue
        if kind in out:
            raise _err("bad_messages", f"the line has both {kind!r} and {key!r} entries: give its {kind}s in one")
        media = []
        for item in items:
            if isinstance(item, dict):
                media.append(_embedded(kind, item))
            elif isinstance(item, str) and item:
                media.append(ChatMedia(kind, item))
            elif item == "":
                raise _err("bad_messages", f"{kind!r} holds an empty string, not a file path (leave the key out, or "
                                           f"null, on a line without {'an' if kind == 'image' else 'a'} {kind})")
            else:
                raise _err("bad_messages", f"{kind!r} must hold file paths, got {type(item).__name__}")
        out[kind] = media
    return out


class _Placer:
    """Turns media into marks while walking the turns: parts where they stand, top-level entries at their tags."""

    def __init__(self, top: dict[str, list[ChatMedia]]) -> None:
        self.top, self.used = top, {k: 0 for k in top}
        self.media: list[ChatMedia] = []
        # tag -> the kind whose entries it places: LLaVA-Video's lines (only videos) mark the video with <image>
        self.tags = {_TAGS[k]: k for k in top}
        if list(top) == ["video"]:
            self.tags["<image>"] = "video"

    def _new(self, m: ChatMedia) -> str:
        self.media.append(m)
        if len(self.media) > MAX_MEDIA:
            raise _err("too_many_media", f"more than {MAX_MEDIA} images/videos in one conversation")
        return mark(len(self.media) - 1)

    def text(self, t: str) -> str:
        """``t`` with each top-level kind's tags replaced by the marks of its next entries (a line with top-level
        entries and a tag of a kind it has none of is a ``media_tag_mismatch``, not literal text)."""
        stray = next((g for k, g in _TAGS.items() if self.top and g not in self.tags and g in t), None)
        if stray is not None:
            have = ", ".join(f"{len(v)} {k!r}" for k, v in self.top.items())
            raise _err("media_tag_mismatch", f"a tag {stray} on a line whose entries are {have} only")
        tags = [g for g in self.tags if g in t]
        if not tags:
            return t
        pattern = re.compile("|".join(re.escape(g) for g in tags))

        def sub(m: re.Match) -> str:
            kind = self.tags[m.group(0)]
            return self._take(kind, f"{' / '.join(g for g in self.tags if self.tags[g] == kind)} tags")
        return pattern.sub(sub, t)

    def _take(self, kind: str, what: str) -> str:
        """The mark of ``kind``'s next top-level entry (a tag or a placeholder part stands for it)."""
        n = self.used[kind]
        if n >= len(self.top[kind]):
            raise _err("media_tag_mismatch", f"more {what} than {kind!r} entries ({len(self.top[kind])})")
        self.used[kind] = n + 1
        return self._new(self.top[kind][n])

    def content(self, c: Any) -> Any:
        if isinstance(c, str):
            return self.text(c)
        if not isinstance(c, list):
            return c
        out = []
        for p in c:
            if _placeholder(p) and p["type"] in self.top:  # TRL's {"type": "image"}: the line's next entry
                out.append({"type": "text", "text": self._take(p["type"], f"{p['type']} parts")})
                continue
            found = _media_part(p)
            if found is not None:
                out.append({"type": "text", "text": self._new(found)})
            elif isinstance(p, dict) and isinstance(p.get("text"), str):
                out.append(dict(p, text=self.text(p["text"])))
            else:
                out.append(p)
        return out


def find_media(obj: dict, chat_field: str) -> tuple[list[ChatMedia], list]:
    """The line's images/videos in order of position, and its conversation with their marks (:func:`mark`)."""
    turns = obj.get(chat_field)
    if not isinstance(turns, list):
        raise _err("bad_messages", f"messages must be a non-empty list of turns, got {type(turns).__name__}")
    if _MARKS.search(_all_text(turns)):
        raise _err("bad_messages", "the conversation holds characters of the Supplementary Private Use Area-A, "
                                   "which fcp uses as marks")
    placer, out = _Placer(_top_level(obj)), []
    for m in turns:
        key = _turn_text_key(m)
        out.append(m if key is None else {**m, key: placer.content(m.get(key))})
    untagged = [k for k in placer.top if placer.used[k] == 0]
    for k in placer.top:
        if 0 < placer.used[k] < len(placer.top[k]):
            raise _err("media_tag_mismatch", f"{placer.used[k]} {_TAGS[k]} tags for {len(placer.top[k])} "
                                             f"{k!r} entries")
    if untagged:
        out = _prepend(out, placer, untagged)
    if not placer.media:
        raise _err("bad_messages", "no image or video in the line")
    return _in_order(placer.media, out)


def _prepend(out: list, placer: _Placer, kinds: list[str]) -> list:
    """Untagged top-level entries before the first user turn's text (videos, then images, each in list order)."""
    first = next((j for j, m in enumerate(out) if _role(m) == "user"), None)
    if first is None:
        raise _err("bad_messages", "no user turn to put the images/videos in")
    marks = "".join(placer._new(m) for k in kinds for m in placer.top[k])
    key = _turn_text_key(out[first])
    c = out[first].get(key)
    c = marks + (c or "") if c is None or isinstance(c, str) else \
        [{"type": "text", "text": marks}, *c] if isinstance(c, list) else c
    out[first] = {**out[first], key: c}
    return out


def _all_text(x: Any) -> str:
    """Every string inside ``x`` (dict values and list items, in order), joined."""
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        return "".join(_all_text(v) for v in x.values())
    if isinstance(x, list):
        return "".join(_all_text(v) for v in x)
    return ""


def _in_order(media: list[ChatMedia], turns: list) -> tuple[list[ChatMedia], list]:
    """The media sorted by where their marks stand in the turns, and the turns with the marks renumbered to match
    (mark ``k`` = the ``k``-th position: the order the template writes them)."""
    seen = [ord(ch) - _MARK0 for ch in _MARKS.findall(_all_text(turns))]
    if sorted(seen) != list(range(len(media))):
        raise _err("bad_messages", "an image/video position could not be placed in the turns")
    new = {mark(old): mark(k) for k, old in enumerate(seen)}
    return [media[k] for k in seen], _renumber(turns, new)


def _renumber(x: Any, new: dict[str, str]) -> Any:
    if isinstance(x, str):
        return _MARKS.sub(lambda m: new[m.group(0)], x) if _MARKS.search(x) else x
    if isinstance(x, dict):
        return {k: _renumber(v, new) for k, v in x.items()}
    if isinstance(x, list):
        return [_renumber(v, new) for v in x]
    return x


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


def split_render(messages: list, template, n: int, tools: list[dict] | None = None,
                 kwargs: dict | None = None) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """The conversation rendered (with the line's ``tools`` and template ``kwargs``,
    :func:`fcp_data.chat.line_template_inputs`) and cut at its ``n`` media marks: the ``n + 1`` texts around them and
    the trained spans of each. The marks must come back once each, in the order :func:`find_media` gave the media."""
    from fcp_data.chat import render_chat

    return cut_at_marks(*render_chat(messages, template, tools, kwargs), n)


def cut_at_marks(text: str, spans: list[tuple[int, int]], n: int) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """``text`` cut at its ``n`` media marks (each once, in order): the ``n + 1`` pieces and their trained spans."""
    found = [(m.start(), ord(m.group(0)) - _MARK0) for m in _MARKS.finditer(text)]
    order = [k for _, k in found]
    if sorted(order) != list(range(n)):
        raise _err("template_changed_content", f"the chat template wrote {len(found)} image/video positions for {n}")
    if order != list(range(n)):
        raise _err("template_changed_content", "the chat template wrote the images/videos in another order")
    cuts = [-1] + [p for p, _ in found] + [len(text)]
    pieces, piece_spans = [], []
    for a, b in zip(cuts, cuts[1:]):
        lo = a + 1
        pieces.append(text[lo:b])
        piece_spans.append([(max(s0, lo) - lo, min(s1, b) - lo) for s0, s1 in spans if s0 < b and s1 > lo])
    return pieces, piece_spans


def check_text_ids(spec, ids: list[int]) -> None:
    """Token ids of conversation text (never of a visual block): a visual placeholder among them is a
    ``placeholder_in_text`` error — a literal ``<|image_pad|>``, or LLaVA's ``<image>`` where it is the placeholder
    itself, would be one more image/video position than any pixels give (the model then fails, or fills it with
    another position's features)."""
    if not spec.is_multimodal:
        return
    found = set(spec.placeholder_ids).intersection(ids)
    if found:
        names = ", ".join(repr(t) for t, i in zip(spec.placeholder_tokens, spec.placeholder_ids) if i in found)
        raise _err("placeholder_in_text", f"the conversation's text holds {sum(ids.count(i) for i in found)} "
                                          f"{names} token(s), the visual placeholder of spec {spec.name!r}: "
                                          "give images/videos as tags or parts, not as their placeholder")


def check_text(spec, obj: dict, chat_field: str, text: str) -> None:
    """A text-only conversation (no image/video entry) under a multimodal spec: a turn that starts or ends with a LLaVA
    tag (``<image>`` then a newline) lost its media — whether its entry is absent, null or empty, as a Parquet row
    of a mixed set has it — and is a ``media_tag_mismatch``; a tag inside the prose (HTML's ``<video>`` element) is
    text; a placeholder token in the rendered ``text`` a ``placeholder_in_text`` (:func:`check_text_ids`)."""
    if not spec.is_multimodal:
        return
    turns = obj.get(chat_field)
    texts = [_all_text(t.get("content", t.get("value"))) if isinstance(t, dict) else _all_text(t)
             for t in (turns if isinstance(turns, list) else [])]
    ends = [t.strip() for t in texts]
    tag = next((g for g in _TAGS.values() if any(t.startswith(g) or t.endswith(g) for t in ends)), None)
    if tag is not None:
        entries = [f"{k!r} is {_json_name(obj[k])}" for k, _ in _TOP_KEYS if k in obj] or ["no 'image'/'video' entry"]
        raise _err("media_tag_mismatch", f"a turn starts or ends with a tag {tag} but the line has no image or video "
                                         f"for it ({' and '.join(entries)}; dropped?)")
    if any(t in text for t in spec.placeholder_tokens):
        check_text_ids(spec, spec.tokenizer().encode(text, add_special_tokens=False).ids)


def _json_name(v: Any) -> str:
    return "null" if v is None else "empty" if v in ([], "") else type(v).__name__


def piece_tokens(spec, text: str, k: int) -> tuple[list[int], list[tuple[int, int]]]:
    """``(ids, offsets)`` of a conversation's text piece ``k`` (:func:`split_render`): the first as an input's start,
    the others as the processor tokenizes them after a visual block (:func:`fcp_data.text_tokens.encode_after`)."""
    from fcp_data.text_tokens import encode_after

    if k:
        return encode_after(spec, text)
    enc = spec.tokenizer().encode(text, add_special_tokens=False)
    return enc.ids, enc.offsets


def token_labels(spec, pieces: list[str], spans: list, blocks: list[list[int]],
                 completion: str | None = None) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)``: each text piece tokenised on its own (so every placeholder count is exact;
    :func:`piece_tokens`) and the visual blocks between them; labels keep the trained spans' tokens, -100 elsewhere
    (never a visual block). ``completion`` (a prompt-completion line's, :func:`fcp_data.chat_completion.media_line`):
    tokenised apart after them, as an input's start, and trained whole."""
    from fcp_data.chat import trained_token_mask

    ids, labels = [], []
    for k, (text, sp) in enumerate(zip(pieces, spans)):
        if text:
            got, offsets = piece_tokens(spec, text, k)
            check_text_ids(spec, got)
            ids += got
            labels += [t if m else -100 for t, m in zip(got, trained_token_mask(offsets, sp))]
        if k < len(blocks):
            ids += blocks[k]
            labels += [-100] * len(blocks[k])
    if completion:
        got = piece_tokens(spec, completion, 0)[0]
        check_text_ids(spec, got)
        ids, labels = ids + got, labels + got
    return ids, labels
