"""TRL's ``assistant_only_loss=True`` for ``fcp index --assistant-only-loss``: the template swap and the stop check.

TRL's SFTTrainer with ``assistant_only_loss=True`` trains what the chat template's ``{% generation %}`` blocks hold
(``apply_chat_template(return_assistant_tokens_mask=True)``). A model template without such blocks is replaced, before
any line is tokenized, by TRL's *training variant* of it (``trl.chat_template_utils.get_training_chat_template``:
Qwen2.5/3, Llama 3.0, Gemma 1-3, gpt-oss, DeepSeek-V3, Phi-3 ... — blocks added, and for Qwen3 every assistant turn
keeps its ``<think>`` block, so earlier turns render the same whatever follows). fcp asks TRL itself for that
variant, so an index renders exactly what that TRL version renders; the index stores the variant, its readers need
no TRL. A template TRL does not know is one error, as in TRL (add ``{% generation %}`` blocks to it); a template with
blocks is used as it is. Like TRL, a warning when the blocks leave the assistant's end-of-turn token untrained (the
model would never learn to stop). The built-in templates (``chatml``, ``llama3``) already train each assistant
turn's content and end marker: they are used as they are.
"""

from __future__ import annotations

import datetime
import hashlib
import sys
from pathlib import Path

__all__ = ["assistant_only", "training_template"]


def _hf_tokenizer(tokenizer_path: str | Path, tpl: dict):
    """The ``transformers`` tokenizer TRL's checks render and tokenize with: the index's tokenizer.json, the
    template's special tokens and the template itself."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path), **tpl.get("special_tokens", {}))
    tok.chat_template = tpl["jinja"]
    return tok


def training_template(tpl: str | dict, tokenizer_path: str | Path | None) -> tuple[str | dict, str | None]:
    """``(the template TRL's SFTTrainer(assistant_only_loss=True) renders with, a warning or None)`` for ``tpl`` (a
    built-in name or a model template as :func:`fcp_data.chat.resolve_template` read it). A ValueError (one line)
    when TRL or the tokenizer cannot be loaded, or TRL has no training variant of a template without
    ``{% generation %}`` blocks; a template with blocks is used as it is (with TRL present: its stop check)."""
    if not isinstance(tpl, dict):
        return tpl, None
    from fcp_data.chat_jinja import _GENERATION_TAG, label

    blocks = bool(_GENERATION_TAG.search(tpl["jinja"]))
    try:
        from trl.chat_template_utils import get_training_chat_template, is_chat_template_stop_token_trained
    except Exception as e:  # noqa: BLE001 - not installed, or an install that fails to import: one line
        if blocks:
            return tpl, None
        raise ValueError(f"--assistant-only-loss takes TRL's training variant of a chat template without "
                         f"{{% generation %}} blocks (the chat template {label(tpl)} has none), as its SFTTrainer "
                         f"does: that needs trl>=1.0 (pip install 'fcp[trl]'; importing it gave "
                         f"{type(e).__name__}), or give a template with {{% generation %}} blocks") from None
    if tokenizer_path is None:
        raise ValueError("--assistant-only-loss needs the model's tokenizer (--tokenizer its tokenizer.json, or "
                         "--chat-template its folder)")
    try:
        tok = _hf_tokenizer(tokenizer_path, tpl)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"--assistant-only-loss: transformers cannot load the tokenizer {tokenizer_path} "
                         f"({type(e).__name__}: {_first_line(e)})") from None
    new = None if blocks else _variant(get_training_chat_template, tok, label(tpl))
    out = tpl if new is None else {**tpl, "jinja": new, "source": f"{tpl['source']} (TRL training variant)",
                                   "sha256": hashlib.sha256(new.encode()).hexdigest(),
                                   "date": datetime.date.today().isoformat() if "strftime_now" in new else None}
    return out, _stop_warning(is_chat_template_stop_token_trained, tok, out, new)


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else ""


def _variant(get_training_chat_template, tok, name: str) -> str:
    """TRL's training variant of the tokenizer's template (TRL raises ValueError for one it does not know)."""
    try:
        return get_training_chat_template(tok)
    except ValueError as e:
        raise ValueError(f"--assistant-only-loss: the chat template {name} has no {{% generation %}} blocks and TRL "
                         f"has no training variant of it ({_first_line(e)}); add {{% generation %}} blocks around what "
                         "the assistant says") from None
    except Exception as e:  # noqa: BLE001 - a template TRL's checks cannot render: one line, not a traceback
        raise ValueError(f"--assistant-only-loss: TRL's checks of the chat template {name} failed: "
                         f"{type(e).__name__}: {_first_line(e)}") from None


def _stop_warning(is_chat_template_stop_token_trained, tok, tpl: dict, new: str | None) -> str | None:
    """TRL's warning when the blocks leave the assistant's end-of-turn token untrained — not when the tokenizer
    splits the template's markers into ordinary tokens (then fcp index's own warning says so, and TRL's check,
    which looks for one end-of-turn token, would misfire)."""
    from fcp_data.chat import split_markers
    from fcp_data.chat_jinja import label

    if split_markers(tpl, tok.backend_tokenizer):
        return None
    try:
        trains_stop = is_chat_template_stop_token_trained(tok, chat_template=new)
    except Exception:  # noqa: BLE001 - a check TRL cannot render says nothing either way
        return None
    return None if trains_stop else (
        f"the {{% generation %}} blocks of the chat template {label(tpl)} leave the assistant's end-of-turn token "
        "untrained: the model may not learn to stop (TRL's SFTTrainer warns the same)")


def assistant_only(chat: dict, tokenizer_path: str | Path | None) -> dict:
    """``fcp index``'s chat options for ``--assistant-only-loss``: refused without conversations; the template TRL
    would render with (a warning on stderr when it leaves the end-of-turn token untrained, as TRL warns)."""
    if chat["chat_field"] is None:
        raise ValueError("--assistant-only-loss trains the assistant turns of --chat-field conversations; give both")
    tpl, warning = training_template(chat["chat_template"], tokenizer_path)
    if warning:
        print(f"fcp index: warning: {warning}", file=sys.stderr)
    return {**chat, "chat_template": tpl, "assistant_only_loss": True}
