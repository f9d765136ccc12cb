"""SFT jsonl (``fcp index --prompt-field``): a sample is its prompt's tokens then its response's, and
:class:`IndexedDataset` gives it labels that mask the prompt.

References: token ids from the spec's tokenizer applied by hand to each raw prompt and response (the index and the
reader must agree with them and with each other), and the label count of every sample summed over an epoch, which
the collator's per-rank ``num_label_tokens_local`` must reproduce over all ranks. A failure means an SFT run trains
on prompts, normalises by the wrong count, or plans with lengths that are not the samples'.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fcp_cli.main import main as cli_main
from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset
from fcp_data.index import LengthIndex, build_index, summarize
from fcp_data.specs import load_spec

WORDS = "the quick brown fox jumps over a lazy dog while ring attention passes keys around".split()


def _write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = [{"id": f"s{i}", "prompt": " ".join(rng.choice(WORDS, int(rng.integers(0, 60)))),
             "response": " ".join(rng.choice(WORDS, int(rng.integers(1, 90))))} for i in range(n)]
    rows[1]["prompt"] = ""  # no prompt: every token is trained on
    rows[2]["prompt"] = "Ünïcödé prompt — 東京"
    return rows


def test_index_and_reader_match_the_tokenizer_and_mask_the_prompt(tmp_path):
    rows = _rows(30)
    bad = [{"id": "noprompt", "response": "x"}, {"id": "intprompt", "prompt": 3, "response": "x"},
           {"id": "noresp", "prompt": "p"}]
    _write(tmp_path / "sft.jsonl", rows + bad)
    manifest, rc = build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "idx", text_field="response",
                               prompt_field="prompt", progress=False, max_error_rate=0.5)
    assert rc == 0 and manifest["prompt_field"] == "prompt"
    assert "SFT: prompt 'prompt' + response 'response'" in summarize(manifest)
    assert manifest["num_samples"] == 30 and manifest["errors_by_reason"] == {"missing_field": 3}
    tok, eos = load_spec("text").tokenizer(), load_spec("text").eos_id
    data = IndexedDataset(tmp_path / "idx")
    assert data.has_labels
    by_key = {k: i for i, k in enumerate(data.index.keys)}
    for r in rows:
        i = by_key[r["id"]]
        p = tok.encode(r["prompt"], add_special_tokens=False).ids if r["prompt"] else []
        a = tok.encode(r["response"], add_special_tokens=False).ids + [eos]
        s = data[i]
        assert s["input_ids"].tolist() == p + a and int(data.index.num_tokens[i]) == len(p) + len(a), r["id"]
        assert s["labels"].tolist() == [-100] * len(p) + a, r["id"]
    plain, _ = build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "plain", text_field="response",
                           progress=False, max_error_rate=0.5)
    assert plain["num_samples"] == 32 and not IndexedDataset(tmp_path / "plain").has_labels  # noresp still missing


def test_resume_does_not_reuse_parts_built_without_the_prompt(tmp_path):
    rows = _rows(12, seed=1)
    _write(tmp_path / "sft.jsonl", rows)
    build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "idx", text_field="response", progress=False)
    without = LengthIndex.load(tmp_path / "idx").num_tokens.copy()
    build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "idx", text_field="response", prompt_field="prompt",
                resume=True, progress=False)
    with_prompt = LengthIndex.load(tmp_path / "idx").num_tokens
    assert (with_prompt >= without).all() and with_prompt.sum() > without.sum()


def test_prompt_field_errors_are_one_line(tmp_path, capsys):
    _write(tmp_path / "sft.jsonl", _rows(3))
    for field in ("response", "id", ""):
        with pytest.raises(ValueError, match="--prompt-field must be a jsonl/Parquet field name other than"):
            build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "x", text_field="response",
                        prompt_field=field, progress=False)
    rc = cli_main(["index", str(tmp_path / "sft.jsonl"), "--spec", "text", "--out", str(tmp_path / "y"),
                   "--prompt-field", "text", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--prompt-field must be" in err


def test_conversational_prompt_completion_lines_say_what_to_do(tmp_path):
    """TRL's conversational prompt-completion lines (``prompt`` and ``completion`` lists of messages) under
    ``--prompt-field``: each is one ``conversational_field`` error naming the field and ``--chat-field`` (before: "no
    string field 'completion'", though the field is there); a field of other non-text values stays
    ``missing_field``; text lines of the same file index as before."""
    ask, answer = [{"role": "user", "content": "2+2?"}], [{"role": "assistant", "content": "4"}]
    rows = [{"id": "conv", "prompt": ask, "response": answer}, {"id": "convprompt", "prompt": ask, "response": "4"},
            {"id": "sharegpt", "prompt": "2+2?", "response": [{"from": "gpt", "value": "4"}]},
            {"id": "ints", "prompt": "2+2?", "response": [4]}, {"id": "text", "prompt": "2+2?", "response": "4"}]
    _write(tmp_path / "sft.jsonl", rows)
    manifest, rc = build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "idx", text_field="response",
                               prompt_field="prompt", progress=False, max_error_rate=1)
    assert rc == 0 and manifest["num_samples"] == 1
    assert manifest["errors_by_reason"] == {"conversational_field": 3, "missing_field": 1}
    errors = {json.loads(line)["key"]: json.loads(line) for line in
              next((tmp_path / "idx").glob("data-*/errors.jsonl")).read_text().splitlines()}
    assert "field 'response' holds messages" in errors["conv"]["detail"] and "--chat-field" in errors["conv"]["detail"]
    assert "field 'prompt' (--prompt-field) holds messages" in errors["convprompt"]["detail"]
    assert errors["ints"]["reason"] == "missing_field"


@pytest.mark.parametrize("num_ranks, tokens_per_rank", [(1, 1024), (3, 400)])  # 3 ranks: CP groups of degree 2-3
def test_collated_label_counts_over_all_ranks_equal_the_samples(tmp_path, num_ranks, tokens_per_rank):
    """Every rank's DataLoader over one epoch, FCPCollator(sample_labels=True): the ranks' num_label_tokens_local
    of each global batch sum to the labels its samples carry (shifted: a sample's label count is its non-masked
    labels after the first token), and the batch's num_tokens_global stays None for train_step to fill in."""
    _write(tmp_path / "sft.jsonl", _rows(24, seed=2))
    build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "idx", text_field="response", prompt_field="prompt",
                progress=False)
    data = IndexedDataset(tmp_path / "idx")
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=tokens_per_rank)
    want = [int((data[i]["labels"][1:] != -100).sum()) for i in range(len(data))]
    got: dict[int, int] = {}
    samples: dict[int, set[int]] = {}
    degrees: set[int] = set()
    for rank in range(num_ranks):
        sampler = FCPSampler(data.index, num_ranks=num_ranks, rank=rank, cost_model=cost, global_batch_size=6,
                             seed=0, prefetch=0)
        loader = DataLoader(FCPDataset(data), batch_sampler=sampler, collate_fn=FCPCollator(sample_labels=True,
                                                                                          pad_token_id=data.pad_token_id))
        for b in loader:
            assert b["num_tokens_global"] is None
            got[b["global_batch"]] = got.get(b["global_batch"], 0) + b["num_label_tokens_local"]
            samples.setdefault(b["global_batch"], set()).update(b["sample_indices"])
            degrees.add(len(b["ranks"]))
    assert sorted(i for s in samples.values() for i in s) == list(range(len(data)))
    for g, idx in samples.items():
        assert got[g] == sum(want[i] for i in idx), g
    assert num_ranks == 1 or max(degrees) > 1, degrees



CHATML = ("{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' }}{%- if m['role'] == 'assistant' %}"
          "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
          "{%- else %}{{ m['content'] + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}")
LLAMA3 = ("{{ '<|begin_of_text|>' }}{%- for m in messages %}"
          "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}{%- if m['role'] == 'assistant' %}"
          "{% generation %}{{ m['content'] + '<|eot_id|>' }}{% endgeneration %}"
          "{%- else %}{{ m['content'] + '<|eot_id|>' }}{%- endif %}{%- endfor %}")


def _chat_tokenizer(tmp_path):
    """The bundled tiny BPE plus the chat templates' special tokens (a real model's tokenizer.json has them)."""
    from tokenizers import AddedToken, Tokenizer

    from fcp_data._resources import data_path

    tok = Tokenizer.from_file(str(data_path("tokenizers") / "tiny-bpe.json"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
                                                                  "<|start_header_id|>", "<|end_header_id|>",
                                                                  "<|eot_id|>")])
    tok.save(str(tmp_path / "chat-tokenizer.json"))
    return tmp_path / "chat-tokenizer.json"


def _conversations(n: int, seed: int = 4) -> list[dict]:
    rng = np.random.default_rng(seed)
    say = lambda k: " ".join(rng.choice(WORDS, k)) + rng.choice(["", ".", "?\n", " 東京"])  # noqa: E731
    rows = []
    for i in range(n):
        turns = [{"role": "system", "content": say(int(rng.integers(0, 8)))}] if i % 3 == 0 else []
        for _ in range(int(rng.integers(1, 4))):
            turns += [{"role": "user", "content": say(int(rng.integers(1, 20)))},
                      {"role": "assistant", "content": say(int(rng.integers(0, 30)))}]
        rows.append({"id": f"c{i}", "messages": turns})
    return rows


def _other_format(row: dict, k: int) -> dict:
    """The same conversation as a dataset may spell it: every third as ShareGPT turns (``from``/``value``), every
    third with OpenAI-style text parts (split in two), the rest as is."""
    if k % 3 == 1:
        names = {"user": "human", "assistant": "gpt", "system": "system"}
        return {**row, "messages": [{"from": names[m["role"]], "value": m["content"]} for m in row["messages"]]}
    if k % 3 == 2:
        parts = lambda c: [{"type": "text", "text": c[: len(c) // 2]}, {"type": "text", "text": c[len(c) // 2:]}]  # noqa: E731
        return {**row, "messages": [{"role": m["role"], "content": parts(m["content"])} for m in row["messages"]]}
    return row


@pytest.mark.parametrize("name, jinja", [("chatml", CHATML), ("llama3", LLAMA3)])
def test_chat_samples_equal_hf_apply_chat_template(tmp_path, name, jinja):
    """``fcp index --chat-field messages --chat-template NAME``: every conversation's ids equal transformers'
    ``apply_chat_template`` with the same template written in Jinja, the labels equal its assistant-token mask
    (``{% generation %}``: the assistant's content and end-of-turn marker), and the index counts exactly those ids;
    the same holds for conversations spelled as ShareGPT turns or OpenAI text parts; lines that are no
    conversation (no assistant turn, a bad role, a string, an image part) are recorded, not indexed. A failure
    means multi-turn SFT trains on user turns or headers, or plans with lengths that are not the samples'."""
    transformers = pytest.importorskip("transformers")
    tok_path = _chat_tokenizer(tmp_path)
    rows = _conversations(20)
    bad = [{"id": "noassist", "messages": [{"role": "user", "content": "hi"}]},
           {"id": "badrole", "messages": [{"role": "robot", "content": "x"}, {"role": "assistant", "content": "y"}]},
           {"id": "str", "messages": "hello"}, {"id": "nofield", "text": "x"},
           {"id": "image", "messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}]},
                                        {"role": "assistant", "content": "a cat"}]},
           {"id": "listfrom", "messages": [{"from": ["gpt"], "value": "x"}]}]
    _write(tmp_path / "chat.jsonl", [_other_format(r, k) for k, r in enumerate(rows)] + bad)
    manifest, rc = build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "idx", tokenizer=str(tok_path),
                               chat_field="messages", chat_template=name, progress=False, max_error_rate=0.5)
    assert rc == 0 and manifest["num_samples"] == 20
    assert f"SFT: conversations in 'messages' ({name} template)" in summarize(manifest)
    assert manifest["errors_by_reason"] == {"bad_messages": 4, "missing_field": 1, "no_assistant_turn": 1}
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_path))
    data = IndexedDataset(tmp_path / "idx", tokenizer=str(tok_path))
    assert data.has_labels
    for r in rows:
        assert_sample_equals_hf(data, r, hf, jinja)


def assert_sample_equals_hf(data: IndexedDataset, row: dict, hf, jinja: str) -> None:
    """The indexed conversation ``row`` read back: ids and the index's count equal transformers' tokenisation with
    template ``jinja`` (which has generation blocks), labels its assistant mask, something trained and not all."""
    ref = hf.apply_chat_template(row["messages"], chat_template=jinja, tokenize=True, return_dict=True,
                                 return_assistant_tokens_mask=True)
    ids, mask = list(ref["input_ids"]), list(ref["assistant_masks"])
    i = list(data.index.keys).index(row["id"])
    s = data[i]
    assert s["input_ids"].tolist() == ids and int(data.index.num_tokens[i]) == len(ids), row["id"]
    assert s["labels"].tolist() == [t if m else -100 for t, m in zip(ids, mask)], row["id"]
    assert 0 < sum(mask) < len(ids), row["id"]


def test_chat_field_errors_are_one_line(tmp_path, capsys):
    _write(tmp_path / "chat.jsonl", _conversations(2))
    with pytest.raises(ValueError, match="--prompt-field and --chat-field name the same field 'messages'"):
        build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "x", chat_field="messages",
                    prompt_field="messages", progress=False)
    with pytest.raises(ValueError, match="unknown chat template 'vicuna'; use one of chatml, llama3"):
        build_index([str(tmp_path / "chat.jsonl")], "text", tmp_path / "x", chat_field="messages",
                    chat_template="vicuna", progress=False)
    rc = cli_main(["index", str(tmp_path / "chat.jsonl"), "--spec", "text", "--out", str(tmp_path / "y"),
                   "--chat-field", "messages", "--prompt-field", "messages", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "name the same field" in err
