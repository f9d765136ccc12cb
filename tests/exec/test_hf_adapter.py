"""The HF adapter in one process: the loss paths against a hand-computed reference, and misuse → clear errors.

* :func:`lm_loss` on the collator's pre-shifted labels equals the stock model's per-document loss (float64,
  1e-12); HF's own loss with :func:`hf_loss_kwargs` equals it up to HF's float32 upcast (1e-6); passing the
  collator's labels as plain ``labels=`` (HF shifts them again) is measurably wrong — the pitfall the helper
  exists for.
* Misuse fails with a message that says what to do: no ``fcp_context``, an idle batch, a VL batch without 3-D
  positions, a model that was never given to ``apply_fcp``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from _requires import transformers_models
import torch

transformers_models()

from fcp_data import FCPCollator  # noqa: E402
from fcp_data.slots import SampleSlot  # noqa: E402
from fcp_exec.integrations import hf  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


def _slot(i: int, n: int, total: int):
    return SampleSlot(index=i, ranks=(0,), cp_rank=0, length=n, num_tokens=n, epoch=0, global_batch=0, micro_batch=0,
                      num_micro_batches=1, num_tokens_global=total)


def _text_batch(docs):
    total = sum(len(d) - 1 for d in docs)
    return FCPCollator(pad_token_id=1)([({"input_ids": d}, _slot(i, len(d), total)) for i, d in enumerate(docs)])


@pytest.fixture(scope="module")
def qwen3():
    torch.manual_seed(0)
    ref = hf.build_model(CONFIGS / "qwen3-tiny.json", dtype=torch.float64, seed=0)
    docs = [torch.randint(10, 2000, (n,)) for n in (37, 20, 5)]
    return ref, hf.apply_fcp(copy.deepcopy(ref)), docs


@torch.no_grad()
def test_lm_loss_matches_stock_per_document_loss(qwen3):
    ref, model, docs = qwen3
    total = sum(len(d) - 1 for d in docs)
    want = sum(float(torch.nn.functional.cross_entropy(ref(input_ids=d[None]).logits[0, :-1], d[1:], reduction="sum"))
               for d in docs) / total
    batch = _text_batch(docs)
    got = float(hf.fcp_loss(model, batch))
    assert abs(got - want) <= 1e-12 * want


@torch.no_grad()
def test_hf_labels_path_needs_shift_labels(qwen3):
    _, model, docs = qwen3
    batch = _text_batch(docs)
    ours = float(hf.fcp_loss(model, batch))
    inputs = hf.batch_inputs(batch, model)
    theirs = float(model(**inputs, **hf.hf_loss_kwargs(batch)).loss)
    assert abs(theirs - ours) <= 1e-6 * ours  # HF's ForCausalLMLoss upcasts to float32
    naive = float(model(**hf.batch_inputs(batch, model), labels=batch["labels"][None],
                        num_items_in_batch=batch["num_tokens_global"]).loss)
    assert abs(naive - ours) > 1e-3 * ours  # labels shifted twice: a different (wrong) loss


def test_attention_without_context_is_a_clear_error(qwen3):
    _, model, docs = qwen3
    with pytest.raises(ValueError, match="fcp_context"):
        model(input_ids=docs[0][None], use_cache=False)


def test_idle_batch_and_unprepared_model_are_clear_errors(qwen3):
    ref, model, docs = qwen3
    batch = _text_batch(docs)
    with pytest.raises(ValueError, match="apply_fcp"):
        hf.batch_inputs(batch, ref)
    idle = dict(batch, ranks=(), cp_rank=-1, input_ids=torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="idle"):
        hf.batch_inputs(idle, model)


def test_vl_batch_without_3d_positions_is_a_clear_error():
    model = hf.apply_fcp(hf.build_model(CONFIGS / "qwen2_vl-tiny.json", dtype=torch.float64, seed=0))
    batch = _text_batch([torch.randint(10, 2000, (9,))])
    with pytest.raises(ValueError, match="hf_collator"):
        hf.batch_inputs(batch, model)


@torch.no_grad()
def test_builtin_mrope_positions_for_a_qwen2_5_vl_model_are_named_once():
    """``FCPCollator(mrope=True)``'s built-in rule differs from Qwen2-VL / Qwen2.5-VL's own ``get_rope_index`` for
    videos under transformers >= 5.3 (fcp_data/mrope.py; a review measured 140-2708 positions per real video off by
    up to 27, gradients 9 % off the stock model): a model of those types given such a batch warns once, naming
    ``hf_collator``; a batch of positions from elsewhere (``position_fn``, ``hf_collator``) does not."""
    import warnings

    model = hf.apply_fcp(hf.build_model(CONFIGS / "qwen2_5_vl-tiny.json", dtype=torch.float64, seed=0))
    vid = int(hf.unwrap(model).config.video_token_id)
    doc = torch.randint(10, 2000, (9,))
    batch = FCPCollator(pad_token_id=1, visual_token_id=vid, mrope=True)([({"input_ids": doc}, _slot(0, 9, 8))])
    assert batch["mrope_rule"] == "fcp"
    hf._WARNED_POSITIONS.discard("qwen2_5_vl")
    with pytest.warns(UserWarning, match=r"qwen2_5_vl model gets 3-D positions of FCPCollator\(mrope=True\)'s "
                                         r"built-in rule.*hf_collator\(model\)"):
        hf.batch_inputs(batch, model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.batch_inputs(dict(batch), model)  # once per model type
        hf._WARNED_POSITIONS.discard("qwen2_5_vl")
        own = FCPCollator(pad_token_id=1, visual_token_id=vid, position_fn=lambda s, ids: torch.arange(
            ids.numel()).expand(3, -1))([({"input_ids": doc}, _slot(0, 9, 8))])
        assert "mrope_rule" not in own
        hf.batch_inputs(own, model)


def test_config_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="no model config"):
        hf.load_config(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON model config"):
        hf.load_config(bad)
    bad.write_text('{"hidden_size": 8}')
    with pytest.raises(ValueError, match="model_type"):
        hf.load_config(bad)
    # found by fuzzing: a field of the wrong type raised huggingface_hub's StrictDataclassFieldValidationError (no
    # ValueError), a negative size reached torch as a tensor shape (RuntimeError)
    bad.write_text('{"model_type": "qwen3", "hidden_size": "big"}')
    with pytest.raises(ValueError, match="transformers cannot build this config: .*hidden_size"):
        hf.load_config(bad)
    # transformers 5.3 stored such fields unchecked (5.5.4 checks them) (a str or float reached torch.empty as a TypeError)
    bad.write_text('{"model_type": "qwen2_vl", "vision_config": {"depth": 2.5}}')
    with pytest.raises(ValueError, match="transformers cannot build this config: .*depth"):
        hf.build_model(bad)
    bad.write_text('{"model_type": "qwen3", "hidden_size": -8, "num_attention_heads": 2}')
    with pytest.raises(ValueError, match="cannot build a qwen3 model from this config: .*negative dimension"):
        hf.build_model(bad)


def test_apply_fcp_checks_kernel_and_timeout_at_once(qwen3):
    """An unknown kernel name or a timeout <= 0 was stored and failed only at the first forward (or never, for the
    timeout, until a peer hung); the model is left untouched by the refused call."""
    model = copy.deepcopy(qwen3[0])  # the stock model, never given to apply_fcp
    before = model.config._attn_implementation
    for kw, match in (({"kernel": "bogus"}, "kernel must be an AttentionKernel or one of cpu"),
                      ({"kernel": 3}, "kernel must be an AttentionKernel"),
                      ({"timeout": -1}, "timeout must be a positive number of seconds"),
                      ({"timeout": "10"}, "timeout must be a positive number of seconds")):
        with pytest.raises(ValueError, match=match):
            hf.apply_fcp(model, **kw)
    assert model.config._attn_implementation == before and getattr(model, "_fcp_state", None) is None
    assert hf.apply_fcp(model, kernel="reference", timeout=30) is model


def test_sft_labels_in_one_process_match_the_stock_masked_loss(qwen3):
    """``FCPCollator(sample_labels=True)`` on two micro-batches of one global batch, through ``train_step`` (one
    process, so the count is this rank's): the loss equals the stock model's CE over each document's masked,
    shifted labels divided by the masked count of the whole global batch (1e-12), and so does HF's own loss via
    ``hf_loss_kwargs`` (1e-6: float32); a batch whose count was never filled in is a clear ValueError in ``lm_loss``,
    ``hf_loss_kwargs`` and ``fill_num_tokens_global`` on a causal-LM batch. A failure means SFT prompts are trained on
    or the loss is normalised per micro-batch."""
    from fcp_exec.step import fill_num_tokens_global, make_reducer, train_step

    ref, model, docs = qwen3
    labels = [d.clone() for d in docs]
    for lab, k in zip(labels, (12, 19, 0)):
        lab[:k] = -100
    want_num = sum(int((lab[1:] != -100).sum()) for lab in labels)
    with torch.no_grad():
        want = sum(float(torch.nn.functional.cross_entropy(ref(input_ids=d[None]).logits[0, :-1], lab[1:],
                                                           ignore_index=-100, reduction="sum"))
                   for d, lab in zip(docs, labels)) / want_num
    collate = FCPCollator(pad_token_id=1, sample_labels=True)

    def micro_batch(m, idx):
        slots = [SampleSlot(index=i, ranks=(0,), cp_rank=0, length=len(docs[i]), num_tokens=len(docs[i]), epoch=0,
                            global_batch=0, micro_batch=m, num_micro_batches=2, num_tokens_global=999) for i in idx]
        return collate([({"input_ids": docs[i], "labels": labels[i]}, s) for i, s in zip(idx, slots)])

    with pytest.raises(ValueError, match="num_tokens_global is None.*train_step"):
        hf.lm_loss(torch.zeros(1, 1, 5), micro_batch(0, [2]))
    with pytest.raises(ValueError, match="num_tokens_global is None"):
        hf.hf_loss_kwargs(micro_batch(0, [2]))
    with pytest.raises(ValueError, match="without num_label_tokens_local"):
        fill_num_tokens_global([_text_batch(docs)])
    batches = [micro_batch(0, [0, 2]), micro_batch(1, [1])]
    net, reducer = make_reducer("allreduce", model)
    res = train_step(net, iter([dict(b) for b in batches]), hf.fcp_loss, reducer, pad_token_id=1)
    net.zero_grad(set_to_none=True)
    assert res.num_tokens == want_num and abs(res.loss - want) <= 1e-12 * want, (res, want, want_num)
    assert fill_num_tokens_global(batches) == want_num
    with torch.no_grad():
        theirs = sum(float(net(**hf.batch_inputs(b, net), **hf.hf_loss_kwargs(b)).loss) for b in batches)
    assert abs(theirs - want) <= 1e-6 * want


def test_train_data_of_an_sft_index_turns_sample_labels_on(tmp_path):
    """``fcp train --data <index built with --prompt-field>`` needs no flag: the training data says it carries labels
    (train.py then builds the collator with sample_labels); truncation to --max-tokens cuts the labels with the ids;
    the labels mask the prompt (reference: the reader's own sample)."""
    import json

    from fcp_data import IndexedDataset
    from fcp_data.index import build_index
    from fcp_exec.train_data import load_train_data

    rows = [{"id": f"s{i}", "prompt": "a question " * (i + 3), "response": "the answer " * (i + 5)} for i in range(4)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    build_index([str(tmp_path / "sft.jsonl")], "text", tmp_path / "idx", text_field="response", prompt_field="prompt",
                progress=False)
    data = load_train_data("tiny-llm", str(tmp_path / "idx"), max_tokens=16)
    assert data.has_labels and "SFT labels (prompt masked)" in data.description
    full = IndexedDataset(tmp_path / "idx")[0]
    s = data.dataset[0]
    assert s["input_ids"].tolist() == full["input_ids"][:16].tolist() and s["labels"].tolist() == full["labels"][:16].tolist()
    assert (full["labels"] == -100).sum() > 0 and not load_train_data("tiny-llm", "synthetic").has_labels


def test_caption_labels_reach_the_training_data(tmp_path):
    """``fcp train --caption-labels``: the bundled image/video index is read with caption-only labels and the run's
    data says so (train.py then builds the collator with sample_labels); an image sample's labels are -100 up to
    its caption, which is trained (reference: the reader without the option, same input_ids)."""
    from fcp_data.index import KIND_IMAGE
    from fcp_exec.train_data import load_train_data

    data = load_train_data("tiny-mllm", None, caption_labels=True, cache_dir=str(tmp_path))
    plain = load_train_data("tiny-mllm", None, cache_dir=str(tmp_path))
    assert data.has_labels and "caption-only labels" in data.description and not plain.has_labels
    index = data.dataset.base.index
    i = next(k for k in range(len(data.dataset)) if int(index.kind[int(data.dataset.keep[k])]) == KIND_IMAGE)
    s, p = data.dataset[i], plain.dataset[i]
    assert torch.equal(s["input_ids"], p["input_ids"]) and "labels" not in p
    trained = (s["labels"] != -100).nonzero().flatten()
    assert trained.numel() > 0 and int(trained[0]) > int(index.num_visual_tokens[int(data.dataset.keep[i])])
    assert torch.equal(s["labels"][trained], s["input_ids"][trained]) and int(trained[-1]) == s["labels"].numel() - 1


@torch.no_grad()
def test_a_copy_of_a_run_batch_with_other_boundaries_or_ranks_gets_its_own_ring(qwen3):
    """batch_inputs caches the ring in the batch; a dict copy of a batch that ran, with other cu_seqlens or ranks (or
    none), kept using the old ring without a word (found by a review of the executor). The reference: the loss of the
    same batch without the cached ring."""
    _, model, _ = qwen3
    docs = [torch.randint(10, 2000, (n,)) for n in (20, 16, 6)]  # even lengths: no padding inside the batch
    batch = _text_batch(docs)
    before = float(hf.fcp_loss(model, batch))  # caches the ring in the batch
    merged = _text_batch([torch.cat(docs[:2]), docs[2]])  # the same tokens, the first two documents as one
    edited = dict(batch, cu_seqlens=merged["cu_seqlens"], position_ids=merged["position_ids"])  # the cache copied too
    fresh = {k: v for k, v in edited.items() if not k.startswith("_fcp_ring")}
    assert torch.equal(edited["input_ids"], merged["input_ids"])
    assert float(hf.fcp_loss(model, edited)) == pytest.approx(float(hf.fcp_loss(model, fresh)), rel=1e-12)
    assert abs(float(hf.fcp_loss(model, fresh)) - before) > 1e-6 * before  # other boundaries: another loss
    # the same tensor object edited in place after a forward (the cache was keyed by id(cu_seqlens): kept)
    own = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items() if not k.startswith("_fcp_ring")}
    assert float(hf.fcp_loss(model, own)) == pytest.approx(before, rel=1e-12)
    tokens = torch.cat(docs)
    moved = _text_batch([tokens[:10], tokens[10:36], tokens[36:]])  # 3 documents again, other boundaries
    for k, v in moved.items():
        if torch.is_tensor(v) and k in own:
            assert own[k].shape == v.shape, k
            own[k].copy_(v)
    assert torch.equal(own["cu_seqlens"], moved["cu_seqlens"]) and not torch.equal(own["cu_seqlens"], batch["cu_seqlens"])
    assert float(hf.fcp_loss(model, own)) == pytest.approx(float(hf.fcp_loss(model, moved)), rel=1e-12)
    # ranks as a tensor (validate_ranks takes one): tensor([0]) was falsy, so the rank was called idle
    tensor_ranks = {k: v for k, v in batch.items() if not k.startswith("_fcp_ring")}
    tensor_ranks["ranks"] = torch.tensor(list(batch["ranks"]))
    assert float(hf.fcp_loss(model, tensor_ranks)) == pytest.approx(before, rel=1e-12)
    with pytest.raises(ValueError, match=r"this process is rank 0, which is not in its CP group ranks=\[3\]"):
        hf.fcp_loss(model, dict(batch, ranks=(3,)))
    with pytest.raises(ValueError, match="the batch has no cu_seqlens"):
        hf.fcp_loss(model, {k: v for k, v in batch.items() if k != "cu_seqlens"})


def test_agree_skips_refuses_duplicate_ranks_before_any_message():
    """ranks=(0, 0) reached torch's point-to-point code and failed there with an IndexError."""
    from fcp_exec.skips import agree_skips

    with pytest.raises(ValueError, match="ranks has duplicates"):
        agree_skips({"ranks": (0, 0), "cp_rank": 0, "read_status": (0,)})
