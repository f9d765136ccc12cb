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
from fcp_data.index import LengthIndex, build_index
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
        with pytest.raises(ValueError, match="--prompt-field must be a jsonl field name other than"):
            build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "x", text_field="response",
                        prompt_field=field, progress=False)
    rc = cli_main(["index", str(tmp_path / "sft.jsonl"), "--spec", "text", "--out", str(tmp_path / "y"),
                   "--prompt-field", "text", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--prompt-field must be" in err


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

