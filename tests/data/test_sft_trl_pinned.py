"""Pins for ``fcp index --assistant-only-loss`` and TRL's vision prompt-completion lines that the other tests left
open (each found by a mutant that survived them). References are TRL's and transformers' own functions, or values
stated here by hand."""

from __future__ import annotations

import datetime
import hashlib
import types

import pytest
from test_chat_assistant_only import (QWEN_SPECIAL, _assert_equal, _bot, _index, _jinja, _marked_model, _model,
                                      _trl_reference, _trl_rows, _user)
from test_chat_media import _images
from test_chat_pc_media import _model as _vl_model
from test_index_sft import _write

from fcp_data import IndexedDataset
from fcp_data.index import build_index

pytest.importorskip("trl")
pytest.importorskip("transformers")


def test_a_swapped_in_variant_gives_no_false_stop_warning(tmp_path, capsys):
    """TRL checks the stop token on the template it trains with (its variant): Qwen2.5's variant trains <|im_end|>,
    so no 'end-of-turn token untrained' warning (not the check run on the shipped template, which has no blocks)."""
    import trl.chat_template_utils as t
    from transformers import PreTrainedTokenizerFast

    from fcp_cli.main import main as cli_main
    from test_chat_assistant_only import _conversations

    model = _model(tmp_path, "model", _jinja("qwen2_5"), QWEN_SPECIAL)
    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    assert t.is_chat_template_stop_token_trained(hf, chat_template=t.qwen2_5_training_chat_template)  # reference
    _write(tmp_path / "c.jsonl", _conversations())
    assert cli_main(["index", str(tmp_path / "c.jsonl"), "--spec", "text", "--chat-field", "messages",
                     "--chat-template", str(model), "--assistant-only-loss", "--out", str(tmp_path / "idx")]) == 0
    assert "end-of-turn token untrained" not in capsys.readouterr().err


def test_the_variant_is_labelled_by_its_own_hash_and_dated_at_build(tmp_path, monkeypatch):
    """gpt-oss's variant prints the date (strftime_now): the stored template's sha256 is the variant's (hashlib on
    TRL's string), and a sample read on a later day renders the build day's date, so its tokens are the ones the
    index counted (and equal TRL's tokenization on the build day)."""
    import trl.chat_template_utils as t
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    import fcp_data.chat_jinja as chat_jinja
    from fcp_data.chat import resolve_template
    from fcp_data.chat_completion import sft_ids_and_mask
    from fcp_data.chat_trl import training_template

    variant = t.gptoss_training_chat_template
    assert "strftime_now" in variant
    model = _marked_model(tmp_path, "gptoss")
    tpl, _ = training_template(resolve_template(str(model)), model / "tokenizer.json")
    assert tpl["jinja"] == variant and tpl["sha256"] == hashlib.sha256(variant.encode()).hexdigest()
    row = {"id": "plain", "messages": [_user("hi"), _bot("hello")]}
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids, mask = sft_ids_and_mask(tok, row, "messages", tpl)
    want = _trl_reference(PreTrainedTokenizerFast.from_pretrained(str(model)), variant, row, None, "messages")
    assert want is not None and (ids, [x if m else -100 for x, m in zip(ids, mask)]) == want

    class Later(datetime.date):
        @classmethod
        def today(cls):
            return cls(2031, 5, 6)

    monkeypatch.setattr(chat_jinja, "datetime", types.SimpleNamespace(date=Later))
    later, _ = sft_ids_and_mask(tok, row, "messages", tpl)
    assert later == ids


# blocks around the assistant turns, tool calls and tool results written (TRL: supports tools), and the last
# assistant turn ends otherwise than an earlier one (TRL: not prefix-preserving, so get_training_chat_template
# would refuse it) -- SFTTrainer uses such a template as it is, asking for no variant
_BLOCKED_NOT_PREFIX = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}"
    "</tool_call>{% endfor %}<|im_end|>{% if loop.last %} END{% endif %}{% endgeneration %}{% else %}{{ m.content }}"
    "<|im_end|>{% endif %}\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_template_with_blocks_is_used_as_it_is_like_sft_trainer(tmp_path):
    """A template with {% generation %} blocks is never sent to get_training_chat_template (SFTTrainer does not):
    ids and labels equal SFTTrainer(assistant_only_loss=True)'s, though TRL would refuse to patch it."""
    import trl.chat_template_utils as t
    from transformers import PreTrainedTokenizerFast

    model = _model(tmp_path, "model", _BLOCKED_NOT_PREFIX, QWEN_SPECIAL)
    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    assert t.has_generation_markers(_BLOCKED_NOT_PREFIX)
    with pytest.raises(ValueError, match="patching is not supported"):
        t.get_training_chat_template(hf)
    rows = [{"id": "plain", "messages": [_user("hi"), _bot("hello")]},
            {"id": "multi", "messages": [_user("a"), _bot("b"), _user("c"), _bot("d")]}]
    want = _trl_rows(model, rows)
    data = _index(tmp_path, model, rows, chat_field="messages")
    _assert_equal(data, want)


_CONTENT_BLOCKS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
                   "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_completion_whose_only_assistant_text_is_in_the_prompt_is_no_trained_tokens(tmp_path):
    """The completion's one assistant turn is empty and the template trains content only; the prompt's few-shot
    answer is trained by the blocks but is prompt: TRL's two masks ANDed train nothing (its own _tokenize and
    common_prefix_length), so the line is no_trained_tokens, not a sample without labels."""
    from transformers import PreTrainedTokenizerFast

    from fcp_data.chat import ChatFormatError, resolve_template
    from fcp_data.chat_completion import line_text

    model = _model(tmp_path, "model", _CONTENT_BLOCKS, QWEN_SPECIAL)
    row = {"id": "x", "prompt": [_user("1"), _bot("2"), _user("3")], "completion": [_bot("")]}
    want = _trl_reference(PreTrainedTokenizerFast.from_pretrained(str(model)), _CONTENT_BLOCKS, row, "prompt",
                          "completion")
    assert want is not None and all(x == -100 for x in want[1])  # TRL: nothing trained
    with pytest.raises(ChatFormatError) as e:
        line_text(row, "completion", resolve_template(str(model)), None, None, "prompt", True)
    assert e.value.reason == "no_trained_tokens"


def _trl_completion(model, row: dict) -> str:
    """The completion text TRL's ``apply_chat_template`` cuts for a vision prompt-completion line."""
    from PIL import Image
    from transformers import PreTrainedTokenizerFast
    from trl.data_utils import apply_chat_template, prepare_multimodal_messages

    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    images = [Image.new("RGB", (8, 8)) for _ in row["images"]]
    example = {"prompt": prepare_multimodal_messages([dict(m) for m in row["prompt"]], images=images),
               "completion": prepare_multimodal_messages([dict(m) for m in row["completion"]])}
    return apply_chat_template(example, hf)["completion"]


@pytest.mark.parametrize("trim", [False, True])
def test_a_continued_prompt_cuts_where_transformers_continue_final_message_does(tmp_path, trim):
    """A prompt ending with the assistant's words, which the completion continues: with a trailing space kept by
    the template (Qwen2.5-VL as shipped) and with a template that trims contents (``| trim``, as Llama 3's), the
    completion's text equals TRL's (``continue_final_message=True`` in transformers)."""
    from fcp_data.chat import resolve_template
    from fcp_data.chat_completion import media_line

    (tmp_path / "m").mkdir()
    model = _vl_model(tmp_path / "m")
    if trim:
        jinja = (model / "chat_template.jinja").read_text()
        jinja = jinja.replace("{{ message['content'] }}", "{{ message['content'] | trim }}")
        jinja = jinja.replace("{{ content['text'] }}", "{{ content['text'] | trim }}")
        (model / "chat_template.jinja").write_text(jinja)
    text = lambda s: {"type": "text", "text": s}  # noqa: E731
    row = {"id": "c", "images": ["media/x.png"],
           "prompt": [{"role": "user", "content": [{"type": "image"}, text("What?")]},
                      {"role": "assistant", "content": [text("It is" if trim else "It is ")]}],
           "completion": [{"role": "assistant", "content": [text(" a cat." if trim else "a cat.")]}]}
    want = _trl_completion(model, row)
    assert want.startswith("<|im_end|>")  # by hand: the prompt ends with the assistant's words
    _, _, _, completion = media_line(row, "completion", resolve_template(str(model)), prompt_field="prompt")
    assert completion == want


def test_an_image_conversation_with_nothing_trained_is_no_trained_tokens(tmp_path):
    """Blocks around the assistant's content only and an empty answer: transformers' assistant mask is all 0 (TRL
    would train nothing on it), so the line is recorded no_trained_tokens, not indexed."""
    from transformers import PreTrainedTokenizerFast

    (tmp_path / "m").mkdir()
    model = _vl_model(tmp_path / "m")
    jinja = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{% set body = m.content %}"
             "{% else %}{% set ns = namespace(s='') %}{% for p in m.content %}{% if p.type == 'image' %}"
             "{% set ns.s = ns.s + '<|vision_start|><|image_pad|><|vision_end|>' %}{% else %}"
             "{% set ns.s = ns.s + p.text %}{% endif %}{% endfor %}{% set body = ns.s %}{% endif %}"
             "{% if m.role == 'assistant' %}{% generation %}{{ body }}{% endgeneration %}{% else %}{{ body }}{% endif %}"
             "<|im_end|>\n{% endfor %}")
    (model / "chat_template.jinja").write_text(jinja)
    imgs = _images(tmp_path, [(60, 90)])
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}
    rows = [{"id": "ok", "images": [f"media/{imgs[0]}"], "messages": [user, {"role": "assistant", "content": "A cat."}]},
            {"id": "empty", "images": [f"media/{imgs[0]}"], "messages": [user, {"role": "assistant", "content": ""}]}]
    hf = PreTrainedTokenizerFast.from_pretrained(str(model))
    ref = hf.apply_chat_template(rows[1]["messages"], chat_template=jinja, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    assert 1 not in ref["assistant_masks"]  # the reference: nothing to train
    _write(tmp_path / "chat.jsonl", rows)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "qwen2.5-vl", tmp_path / "idx", chat_field="messages",
                               chat_template=str(model), assistant_only_loss=True, progress=False, max_error_rate=1)
    assert rc == 0 and manifest["num_samples"] == 1 and manifest["errors_by_reason"] == {"no_trained_tokens": 1}
    assert list(IndexedDataset(tmp_path / "idx").index.keys) == ["ok"]


def test_a_manifest_whose_assistant_only_loss_is_no_bool_is_damaged(tmp_path):
    """The manifest's assistant_only_loss decides the labels at read time: a value other than true/false (by hand:
    the string "yes") is a damaged index, one ValueError, not read as true."""
    import json
    import shutil

    from fcp_data import bundled_index

    shutil.copytree(bundled_index("text"), tmp_path / "idx")
    mf = tmp_path / "idx" / "manifest.json"
    m = json.loads(mf.read_text())
    mf.write_text(json.dumps(dict(m, assistant_only_loss="yes")))
    with pytest.raises(ValueError, match="assistant_only_loss must be bool.*damaged"):
        IndexedDataset(tmp_path / "idx")


@pytest.mark.parametrize("rate", [1.5, -0.1])
def test_a_max_error_rate_outside_0_1_is_refused(tmp_path, rate):
    """--max-error-rate is a fraction: by hand, 1.5 and -0.1 are outside [0, 1] and refused before anything is
    written."""
    from fcp_data._resources import data_path

    with pytest.raises(ValueError, match=r"--max-error-rate must be in \[0, 1\]"):
        build_index([str(data_path("samples") / "text.jsonl")], "text", tmp_path / "idx", progress=False,
                    max_error_rate=rate)
    assert not (tmp_path / "idx").exists()


def test_an_fcp_index_given_as_the_single_eval_dataset_of_trls_sft_trainer_is_refused():
    """``eval_dataset=index`` (one dataset, not a dict of them) is checked like ``train_dataset``: TRL's
    SFTTrainer cannot take an fcp index there either."""
    from trl import SFTTrainer

    from fcp_data import bundled_index
    from fcp_exec.integrations.hf_trainer import FCPTrainer
    from fcp_exec.integrations.hf_trainer_args import check_loss

    class FCPSFTTrainer(FCPTrainer, SFTTrainer):
        pass

    args = types.SimpleNamespace(packing=False, loss_type="nll")
    check_loss(FCPSFTTrainer, args, {"eval_dataset": None})  # nothing indexed: no error
    with pytest.raises(ValueError, match=r"an fcp index \(IndexedDataset\) is tokenized and labelled already"):
        check_loss(FCPSFTTrainer, args, {"eval_dataset": IndexedDataset(bundled_index("text"))})
