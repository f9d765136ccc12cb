"""The EOS and pad tokens of a spec, resolved against the tokenizer in use.

A spec names them: ``text.eos_token`` (appended to each text sample, SFT response and caption when
``text.append_eos``) and ``text.pad_token`` (the collator's padding; the EOS when the spec names none). The bundled
specs name ``<|endoftext|>`` and ``<|pad|>``, tokens of the bundled tokenizer. A model's own tokenizer.json
(``--tokenizer``, ``--chat-template MODEL_DIR``) may lack them — Qwen2.5/Qwen3 have no ``<|pad|>``, Llama 3 has
neither — and then the ``eos_token`` / ``pad_token`` of the ``tokenizer_config.json`` beside that tokenizer.json
take their place, the tokens ``transformers.AutoTokenizer`` gives the model (a model without a pad token pads with
its EOS, as trainers pad Llama). A token the spec names and the tokenizer has always wins, so every index that read
before reads the same ids. An EOS taken from tokenizer_config.json is trained on, so it is part of the spec's
fingerprint (:func:`fingerprint_extra`); a pad never is (pads carry no label).

Neither there: :func:`check_tokens` refuses at index time, in one line, what the reader could not read
(``fcp index`` exits 2) — a tokenizer with no EOS for text, prompt/response or caption samples, or no pad at all.

A text after a visual block (a conversation's next piece, a caption) and a text inside one (time stamps, frame
labels) are tokenized as the model's processor tokenizes them inside the whole prompt (:func:`encode_after`,
:func:`block_text_ids`), which differs from a text of its own for a SentencePiece-style tokenizer that marks an
input's first word (:func:`prefixes_first_word`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["config_tokens", "special_tokens", "prefixes_first_word", "encode_after", "block_text_ids", "resolve",
           "eos_id", "pad_id", "has_eos", "check_tokens", "fingerprint_extra"]

CONFIG = "tokenizer_config.json"


def special_tokens(cfg: dict) -> dict[str, str]:
    """``bos_token``, ``eos_token``, ... of a tokenizer_config.json's dict (a string, or an AddedToken dict's
    content)."""
    out = {}
    for k, v in cfg.items():
        v = v.get("content") if k.endswith("_token") and isinstance(v, dict) else v
        if k.endswith("_token") and isinstance(v, str):
            out[k] = v
    return out


def config_tokens(tokenizer_path: str | Path) -> dict[str, str]:
    """``eos_token`` / ``pad_token`` of the tokenizer_config.json beside ``tokenizer_path`` (:func:`special_tokens`);
    ``{}`` without a readable one."""
    try:
        cfg = json.loads((Path(tokenizer_path).parent / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    found = special_tokens(cfg) if isinstance(cfg, dict) else {}
    return {k: found[k] for k in ("eos_token", "pad_token") if found.get(k)}


@functools.lru_cache(maxsize=64)
def resolve(tokenizer_path: str, eos: str | None, pad: str | None) -> tuple[str | None, str | None]:
    """``(eos, pad)``: the tokens the tokenizer has, by the rule of the module docstring (None: none found)."""
    from fcp_data.specs import _load_tokenizer

    tok = _load_tokenizer(tokenizer_path)
    has = lambda t: t is not None and tok.token_to_id(t) is not None  # noqa: E731
    cfg = config_tokens(tokenizer_path)
    e = eos if has(eos) else cfg.get("eos_token") if has(cfg.get("eos_token")) else None
    want = pad if pad is not None else eos  # the old rule: the spec's pad, else its EOS
    p = want if has(want) else cfg.get("pad_token") if has(cfg.get("pad_token")) else e
    return e, p


def _missing(spec, what: str) -> ValueError:
    t = spec.text
    named = " / ".join(repr(t[k]) for k in ("pad_token", "eos_token") if t.get(k)) if what == "pad" else \
        repr(t.get("eos_token"))
    use = "the padding token" if what == "pad" else "the end-of-text token appended to each text, response and caption"
    return ValueError(f"spec {spec.name!r}: the tokenizer {spec.tokenizer_path} has no {what} token ({use}): not "
                      f"{named} (the spec's), and no {CONFIG} beside it names one it has; put the model's {CONFIG} "
                      f"beside its tokenizer.json, or give a spec file (--spec FILE.json) whose text.{what}_token is "
                      "one of its tokens")


def eos_id(spec) -> int | None:
    """The id appended after text (None when the spec appends none); a ValueError when the tokenizer has none."""
    if not spec.text.get("append_eos"):
        return None
    e, _ = resolve(spec.tokenizer_path, spec.text.get("eos_token"), spec.text.get("pad_token"))
    if e is None:
        raise _missing(spec, "eos")
    return spec.token_id(e)


def pad_id(spec) -> int:
    """The collator's padding id; a ValueError when the tokenizer has no pad and no EOS."""
    _, p = resolve(spec.tokenizer_path, spec.text.get("eos_token"), spec.text.get("pad_token"))
    if p is None:
        raise _missing(spec, "pad")
    return spec.token_id(p)


def has_eos(spec) -> bool:
    """Whether the spec's EOS resolves (an index of conversations, which append none, reads without one)."""
    return resolve(spec.tokenizer_path, spec.text.get("eos_token"), spec.text.get("pad_token"))[0] is not None


def check_tokens(spec, eos: bool) -> None:
    """Index time: the reader of this index will find its pad token, and its EOS when ``eos`` (text samples,
    prompt/response and captions append one; conversations end their turns themselves). A ValueError, one line."""
    if eos:
        eos_id(spec)
    pad_id(spec)


def fingerprint_extra(text: dict, tokenizer_path: Path, tokenizer_bytes: bytes) -> bytes:
    """What the spec's fingerprint adds when its appended EOS is not in the tokenizer.json (whose bytes are hashed
    already) but comes from the tokenizer_config.json beside it: that token; else nothing (every fingerprint that
    existed stays as it was)."""
    eos = text.get("eos_token")
    if not text.get("append_eos") or not isinstance(eos, str):
        return b""
    if any(json.dumps(eos, ensure_ascii=a).encode() in tokenizer_bytes for a in (False, True)):
        return b""
    got = config_tokens(tokenizer_path).get("eos_token")
    return f"\0eos from {CONFIG}: {got}".encode() if got else b""


_PROBES = ("Describe it", " and then", "\nnext", "word")


@functools.lru_cache(maxsize=16)
def _prefixes(tokenizer_path: str, sep: str) -> bool:
    from fcp_data.specs import _load_tokenizer

    tok = _load_tokenizer(tokenizer_path)
    return any(tok.encode(sep + p, add_special_tokens=False).ids[1:] != tok.encode(p, add_special_tokens=False).ids
               for p in _PROBES)


def prefixes_first_word(spec) -> bool:
    """True when the spec's tokenizer encodes a text at the start of the input otherwise than right after a special
    token — a SentencePiece-style ``Metaspace(prepend_scheme="first")`` gives ``▁`` to the input's first word only
    (Llama 2, Mistral, Vicuna as tokenizers >= 0.15 writes them). False for byte-level BPE (Qwen, every bundled
    spec). Such a text after a visual block is tokenized by :func:`encode_after`."""
    return bool(spec.is_multimodal) and _prefixes(spec.tokenizer_path, spec.placeholder_tokens[0])


@functools.lru_cache(maxsize=4096)
def _after_cached(tokenizer_path: str, sep: str, text: str) -> tuple[int, ...]:
    from fcp_data.specs import _load_tokenizer

    return tuple(_load_tokenizer(tokenizer_path).encode(sep + text, add_special_tokens=False).ids[1:])


def block_text_ids(spec, text: str, at_start: bool = False) -> list[int]:
    """Ids of a text inside a visual block (Qwen3-VL's ``<0.5 seconds>`` time stamps, InternVL's ``Frame1: `` labels)
    as the model's processor gives them: it writes the block into the prompt and tokenizes the whole, so such a text
    is no input's start — :func:`encode_after` for a tokenizer that marks an input's first word
    (:func:`prefixes_first_word`), else the text's own ids (cached: the same labels recur in every sample).
    ``at_start``: the text opens its input (a plain image/video sample's first label): its own ids."""
    if at_start or not prefixes_first_word(spec):
        return spec.encode(text)
    if len(text) <= 64:
        return list(_after_cached(spec.tokenizer_path, spec.placeholder_tokens[0], text))
    return encode_after(spec, text)[0]


def encode_after(spec, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """``(ids, character offsets)`` of ``text`` as the model's processor tokenizes it right after a visual block
    (the processor tokenizes the whole prompt, so such a text is no input's start): for a tokenizer that writes an
    input's first word otherwise (:func:`prefixes_first_word`), the ids of the spec's placeholder + ``text`` without
    the placeholder's; else ``text``'s own."""
    tok = spec.tokenizer()
    if not prefixes_first_word(spec):
        enc = tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets
    sep = spec.placeholder_tokens[0]
    enc = tok.encode(sep + text, add_special_tokens=False)
    return enc.ids[1:], [(a - len(sep), b - len(sep)) for a, b in enc.offsets[1:]]
