"""``FCPCollator(future_tokens=D)``: each local token's look-ahead tokens, their labels and validity (multi-token
prediction, :mod:`fcp_data.lookahead`).

Reference, in plain Python per document: for a token at position ``p`` of a document of ``n`` kept tokens, depth
``k`` is valid iff ``p + k < n``; its id is the document's token ``p + k`` (the pad id otherwise) and its label the
shifted label at ``p + k`` — the next token, or with the samples' own labels that token's label (``ignore_index``
otherwise). The collator's shards of every CP rank, reassembled with ``zigzag_unshard``, must equal it exactly, for
degrees 1–5, truncated documents and SFT label masks; that is also torchtitan's ``roll_mtp_sequence`` over one
document (tested against torchtitan's own model and loss in ``tests/exec/test_torchtitan.py``).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.collator import FCPCollator
from fcp_data.layout import zigzag_unshard
from fcp_data.sampler import FCPDataset, SampleSlot, SlotList

PAD, IGN, DEPTH = 7, -100, 3


def _slots(lengths, keep, degree, cp_rank):
    ranks = tuple(range(degree))
    return [SampleSlot(index=i, ranks=ranks, cp_rank=cp_rank, num_tokens=k, length=n,
                       num_tokens_global=sum(k - 1 for k in keep), epoch=0, global_batch=0, micro_batch=0,
                       num_micro_batches=1) for i, (n, k) in enumerate(zip(lengths, keep))]


def _reference(docs, labels, keep, degree):
    """``{key: [DEPTH lists]}`` over the packed, padded documents (not sharded)."""
    out = {"future_ids": [[] for _ in range(DEPTH)], "future_labels": [[] for _ in range(DEPTH)],
           "future_valid": [[] for _ in range(DEPTH)]}
    for doc, lab, n in zip(docs, labels, keep):
        padded = n + (-n) % (2 * degree)
        src = doc if lab is None else lab
        shifted = [src[t + 1] if t + 1 < n else IGN for t in range(n)]  # the collator's labels of this document
        for k in range(1, DEPTH + 1):
            for p in range(padded):
                ok = p + k < n
                out["future_ids"][k - 1].append(doc[p + k] if ok else PAD)
                out["future_labels"][k - 1].append(shifted[p + k] if ok else IGN)
                out["future_valid"][k - 1].append(ok)
    return out


@st.composite
def _case(draw):
    num = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, 30), min_size=num, max_size=num))
    docs = [draw(st.lists(st.integers(1000, 1100), min_size=n, max_size=n)) for n in lengths]
    keep = [draw(st.integers(1, n)) for n in lengths]
    labels = [[IGN if t < draw(st.integers(0, len(d))) else tok for t, tok in enumerate(d)]
              if draw(st.booleans()) else None for d in docs]  # an SFT prompt mask, or the causal-LM copy
    return docs, labels, keep


@pytest.mark.parametrize("degree", [1, 2, 3, 5])
@settings(max_examples=25, deadline=None)
@given(case=_case())
def test_look_ahead_tokens_equal_the_per_document_shift(degree, case):
    docs, labels, keep = case
    sft = any(lab is not None for lab in labels)
    collate = FCPCollator(pad_token_id=PAD, ignore_index=IGN, sample_labels=sft, future_tokens=DEPTH)
    samples = [{"input_ids": torch.tensor(d), **({} if lab is None else {"labels": torch.tensor(lab)})}
               for d, lab in zip(docs, labels)]
    outs = [collate(list(zip(samples, _slots([len(d) for d in docs], keep, degree, r)))) for r in range(degree)]
    ref = _reference(docs, labels, keep, degree)
    cu = [0]
    for n in keep:
        cu.append(cu[-1] + n + (-n) % (2 * degree))
    for key, rows in ref.items():
        for o in outs:
            assert o[key].shape == (DEPTH, o["input_ids"].numel()), key
        for k in range(DEPTH):
            full = zigzag_unshard([o[key][k] for o in outs], cu, degree)
            assert full.tolist() == rows[k], (key, k + 1)
    # depth 1's input is the next token: wherever it exists, the main label (without an SFT mask) names it
    if not sft:
        for o in outs:
            ok = o["future_valid"][0]
            assert torch.equal(o["future_ids"][0][ok], o["labels"][ok])


def test_idle_ranks_and_bad_depths():
    """An idle rank gets ``[D, 0]`` arrays (and the step's idle dummy ``[D, 2]`` ones with no target); a depth that
    is not an int >= 0 is one ValueError; without the option the batch has no look-ahead keys."""
    from fcp_exec.step import idle_batch

    empty = SlotList(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=5)
    out = FCPCollator(future_tokens=2)(FCPDataset([{"input_ids": [1, 2]}]).__getitems__(empty))
    assert out["future_ids"].shape == out["future_labels"].shape == out["future_valid"].shape == (2, 0)
    assert out["future_valid"].dtype == torch.bool and out["future_ids"].dtype == torch.long
    dummy = idle_batch(out, pad_token_id=PAD, ignore_index=IGN)
    assert dummy["future_ids"].tolist() == [[PAD, PAD]] * 2 and dummy["future_labels"].tolist() == [[IGN, IGN]] * 2
    assert not dummy["future_valid"].any()
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="future_tokens must be an int >= 0"):
            FCPCollator(future_tokens=bad)
    plain = FCPCollator()([({"input_ids": [1, 2, 3]}, _slots([3], [3], 1, 0)[0])])
    assert not any(k.startswith("future") for k in plain)
