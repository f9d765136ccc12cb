"""FCPCollator: packing, padding, shifted labels, positions and zigzag sharding (DESIGN.md §7).

The reference is built here in plain Python from the documents (pad each to 2·degree, shift labels inside
the document, positions 0..P−1); the collator's per-rank shards, reassembled with
``fcp_data.layout.zigzag_unshard`` over all cp_ranks, must equal it exactly.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fcp_data.collator import FCPCollator, qwen_vl_mrope_positions
from fcp_data.sampler import FCPDataset, SampleSlot, SlotList
from fcp_data.layout import zigzag_unshard

PAD, IGN = 7, -100


def _slots(lengths, keep, degree, cp_rank, total=None, ranks=None, text=None):
    ranks = tuple(range(10, 10 + degree)) if ranks is None else ranks
    total = sum(k - 1 for k in keep) if total is None else total
    return [SampleSlot(index=i, ranks=ranks, cp_rank=cp_rank, num_tokens=k, length=n, num_tokens_global=total,
                       epoch=1, global_batch=2, micro_batch=0, num_micro_batches=1, num_text_labels_global=text)
            for i, (n, k) in enumerate(zip(lengths, keep))]


def _reference(docs, keep, degree):
    ids, labels, pos, cu = [], [], [], [0]
    for doc, n in zip(docs, keep):
        d = doc[:n]
        p = n + (-n) % (2 * degree)
        ids += d + [PAD] * (p - n)
        labels += d[1:] + [IGN] * (p - n + 1)
        pos += list(range(p))
        cu.append(cu[-1] + p)
    return ids, labels, pos, cu


@st.composite
def _docs(draw):
    num = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, 40), min_size=num, max_size=num))
    docs = [draw(st.lists(st.integers(1000, 1100), min_size=n, max_size=n)) for n in lengths]
    keep = [draw(st.integers(1, n)) for n in lengths]
    return docs, keep


@pytest.mark.parametrize("degree", range(1, 9))
@settings(max_examples=25, deadline=None)
@given(case=_docs())
def test_unshard_of_all_cp_ranks_equals_padded_documents(degree, case):
    """Reassembling every cp_rank's shard gives the padded docs, shifted labels and positions exactly;
    a failure means the collator pads, shifts, truncates or shards differently from DESIGN §7."""
    docs, keep = case
    collate = FCPCollator(pad_token_id=PAD, ignore_index=IGN)
    ref_ids, ref_lab, ref_pos, ref_cu = _reference(docs, keep, degree)
    outs = []
    for r in range(degree):
        slots = _slots([len(d) for d in docs], keep, degree, r)
        outs.append(collate([({"input_ids": torch.tensor(d)}, s) for d, s in zip(docs, slots)]))
    for r, out in enumerate(outs):
        assert out["cu_seqlens"].dtype == torch.int32
        assert out["cu_seqlens"].tolist() == [c // degree for c in ref_cu]
        assert out["max_seqlen"] == max(b - a for a, b in zip(ref_cu, ref_cu[1:])) // degree
        assert out["cp_rank"] == r and out["ranks"] == tuple(range(10, 10 + degree))
        assert out["num_tokens_global"] == sum(k - 1 for k in keep)
        assert out["sample_indices"] == tuple(range(len(docs)))
    for key, ref in (("input_ids", ref_ids), ("labels", ref_lab), ("position_ids", ref_pos)):
        full = zigzag_unshard([o[key] for o in outs], ref_cu, degree)
        assert full.tolist() == ref, key
    # every label token is counted once over the group
    assert sum(int((o["labels"] != IGN).sum()) for o in outs) == sum(k - 1 for k in keep)


def test_idle_rank_gets_empty_batch_with_metadata():
    """An idle rank's empty SlotList gives an empty batch that still carries num_tokens_global; a failure
    means the loss normalisation on idle ranks breaks."""
    empty = SlotList(epoch=3, global_batch=4, micro_batch=1, num_micro_batches=2, num_tokens_global=1234)
    items = FCPDataset([{"input_ids": [1, 2]}]).__getitems__(empty)
    out = FCPCollator(visual_token_id=5, mrope=True)(items)
    assert out["num_tokens_global"] == 1234 and out["ranks"] == () and out["cp_rank"] == -1
    assert (out["epoch"], out["global_batch"], out["micro_batch"], out["num_micro_batches"]) == (3, 4, 1, 2)
    assert out["input_ids"].numel() == 0 and out["cu_seqlens"].tolist() == [0] and out["max_seqlen"] == 0
    assert out["mrope_position_ids"].shape == (3, 0) and out["visual_pos"].numel() == 0
    with pytest.raises(ValueError, match="metadata"):
        FCPCollator()([])


def test_input_errors_are_clear():
    """Mixed groups, stale lengths and bad ids raise ValueError naming the problem."""
    collate = FCPCollator()
    a = _slots([4], [4], 2, 0)[0]
    b = _slots([4], [4], 2, 1)[0]
    with pytest.raises(ValueError, match="one CP group"):
        collate([({"input_ids": [1, 2, 3, 4]}, a), ({"input_ids": [1, 2, 3, 4]}, b)])
    with pytest.raises(ValueError, match="stale"):
        collate([({"input_ids": [1, 2, 3]}, a)])
    assert collate.__class__(strict_lengths=False)([({"input_ids": [1, 2, 3, 4, 5]}, a)])["input_ids"].numel() == 2
    with pytest.raises(ValueError, match="1-D integer"):
        collate([({"input_ids": torch.ones(4)}, a)])


V = 99  # visual placeholder id in these tests


def test_mrope_positions_match_hand_derived_qwen_vl_rule():
    """Text, a 1×4×4 image (merge 2 → 2×2 tokens), text, a 2×2×4 video (→ 2×1×2 tokens), text. The
    expected values are derived by hand from the Qwen2-VL rule in the fcp_data.mrope docstring."""
    ids = torch.tensor([1, 2, V, V, V, V, 3, V, V, V, V, 4])
    grid = torch.tensor([[1, 4, 4], [2, 2, 4]])
    got = qwen_vl_mrope_positions(ids, grid, torch.tensor([V]), 2).tolist()
    s1 = 2  # image starts where the next text token would
    img = [(s1, s1, s1), (s1, s1, s1 + 1), (s1, s1 + 1, s1), (s1, s1 + 1, s1 + 1)]
    t3 = s1 + 2  # max of image (3) + 1
    s2 = t3 + 1
    vid = [(s2, s2, s2), (s2, s2, s2 + 1), (s2 + 1, s2, s2), (s2 + 1, s2, s2 + 1)]
    expect = [(0, 0, 0), (1, 1, 1), *img, (t3, t3, t3), *vid, (s2 + 2, s2 + 2, s2 + 2)]
    assert [tuple(c) for c in zip(*got)] == expect
    with pytest.raises(ValueError, match="disagree"):
        qwen_vl_mrope_positions(ids[:9], grid, torch.tensor([V]), 2)


def test_mrope_frame_groups_split_by_timestamp_text():
    """Qwen3-VL layout: a 2×4×4 video as two frame-group runs with text between them; each run restarts
    the temporal index and the text continues after its maximum (hand-derived expected values)."""
    ids = torch.tensor([1, V, V, V, V, 5, V, V, V, V, 2])
    got = [tuple(c) for c in zip(*qwen_vl_mrope_positions(ids, torch.tensor([[2, 4, 4]]), torch.tensor([V]), 2).tolist())]
    run = lambda s: [(s, s, s), (s, s, s + 1), (s, s + 1, s), (s, s + 1, s + 1)]  # noqa: E731
    assert got == [(0, 0, 0), *run(1), (3, 3, 3), *run(4), (6, 6, 6)]
    with pytest.raises(ValueError, match="whole number"):
        qwen_vl_mrope_positions(torch.tensor([1, V, V, V, 2]), torch.tensor([[2, 4, 4]]), torch.tensor([V]), 2)


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_multimodal_visual_scatter_and_mrope_shards(degree):
    """Visual tokens: on every cp_rank, visual_pos points at placeholders and visual_index names the
    placeholder's row in the group's visual embeddings (placeholder order over the untruncated docs);
    over all ranks the rows of the kept placeholders appear once each. mrope shards reassemble to the
    per-document positions, pads continuing. pixel_values/grid_thw are concatenated in slot order.
    A failure means the model would scatter image embeddings to the wrong tokens."""
    doc0 = [1, 2, V, V, V, V, 3, 4, 5]                 # one 1×4×4 image
    doc1 = [6] * 3                                      # text only
    doc2 = [7, V, V, V, V, 8, V, V, V, V, 9]           # two images, truncated inside the second
    docs, keep = [doc0, doc1, doc2], [9, 3, 8]
    grids = [torch.tensor([[1, 4, 4]]), None, torch.tensor([[1, 4, 4], [2, 2, 4]])]
    pix = [torch.full((16, 3), 0.0), None, torch.cat([torch.full((16, 3), 2.0), torch.full((16, 3), 3.0)])]
    samples = []
    for d, g, p in zip(docs, grids, pix):
        s = {"input_ids": torch.tensor(d)}
        if g is not None:
            s["grid_thw"], s["pixel_values"] = g, p
        samples.append(s)
    collate = FCPCollator(pad_token_id=PAD, visual_token_id=[V], mrope=True)
    _, _, _, cu = _reference(docs, keep, degree)
    # reference: global packed position -> visual row, over kept placeholders
    ref_rows, row = {}, 0
    for k, (d, n) in enumerate(zip(docs, keep)):
        for t, tok in enumerate(d):
            if tok == V:
                if t < n:
                    ref_rows[cu[k] + t] = row
                row += 1
    seen, outs = [], []
    from fcp_data.layout import zigzag_index
    text = sum(n - 1 - sum(tok == V for tok in d[1:n]) for d, n in zip(docs, keep))
    for r in range(degree):
        slots = _slots([len(d) for d in docs], keep, degree, r, text=text)
        out = collate(list(zip(samples, slots)))
        outs.append(out)
        gidx = zigzag_index(cu, degree, r)
        for p, rw in zip(out["visual_pos"].tolist(), out["visual_index"].tolist()):
            assert out["input_ids"][p] == V
            assert ref_rows[int(gidx[p])] == rw
            seen.append(rw)
        assert out["pixel_values"].shape == (48, 3) and out["grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4], [2, 2, 4]]
    assert sorted(seen) == sorted(ref_rows.values())
    mr = zigzag_unshard([o["mrope_position_ids"].T for o in outs], cu, degree).T
    for k, (d, n) in enumerate(zip(docs, keep)):
        ref = qwen_vl_mrope_positions(torch.tensor(d), grids[k], torch.tensor([V]), 2)[:, :n]
        seg = mr[:, cu[k]:cu[k + 1]]
        assert torch.equal(seg[:, :n], ref)
        top = int(ref.max()) + 1
        assert seg[:, n:].tolist() == [list(range(top, top + cu[k + 1] - cu[k] - n))] * 3


def test_grid_count_mismatch_is_reported():
    """With mrope, a sample whose placeholder count disagrees with grid_thw is a ValueError naming it."""
    slot = _slots([5], [5], 1, 0)[0]
    with pytest.raises(ValueError, match="sample 0 has 3 visual"):
        FCPCollator(visual_token_id=V, mrope=True)([({"input_ids": [1, V, V, V, 2], "grid_thw": [[1, 4, 4]]}, slot)])


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_masked_visual_labels(degree):
    """mask_visual_labels (default): no label targets a placeholder, every other label is the plain
    shifted label, a placeholder at position 0 costs no label, and the non-ignored labels of all cp_ranks
    sum to the slot's num_text_labels_global, which the batch reports as num_tokens_global. With
    mask_visual_labels=False the labels and denominator are the unmasked ones. A failure means the LM is
    trained on (or normalised by) placeholder targets, unlike Qwen-VL/InternVL/LLaVA recipes."""
    V2 = 98
    docs = [[V, V, V, 1, 2, 3],                        # placeholders from position 0 (LLaVA-Video layout)
            [4, 5, V, V2, V, V, 6, 7, V, 8],            # two placeholder ids, truncated inside the second run
            [9, 10, 11]]
    keep = [6, 9, 3]
    samples = [{"input_ids": torch.tensor(d)} for d in docs]
    text = sum(n - 1 - sum(tok in (V, V2) for tok in d[1:n]) for d, n in zip(docs, keep))
    assert text == (5 - 2) + (8 - 5) + 2
    _, ref_lab, _, cu = _reference(docs, keep, degree)
    ref_ids = _reference(docs, keep, degree)[0]
    masked = [IGN if lab in (V, V2) else lab for lab in ref_lab]
    for mask, want, denom in ((True, masked, text), (False, ref_lab, sum(k - 1 for k in keep))):
        collate = FCPCollator(pad_token_id=PAD, visual_token_id=[V, V2], mask_visual_labels=mask)
        outs = [collate(list(zip(samples, _slots([len(d) for d in docs], keep, degree, r, text=text))))
                for r in range(degree)]
        labels = zigzag_unshard([o["labels"] for o in outs], cu, degree).tolist()
        assert labels == want
        assert sum(int((o["labels"] != IGN).sum()) for o in outs) == denom
        assert all(o["num_tokens_global"] == denom for o in outs)
        if mask:
            ids = zigzag_unshard([o["input_ids"] for o in outs], cu, degree).tolist()
            assert ids == ref_ids and not any(lab in (V, V2) for lab in labels)
    empty = SlotList(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=50,
                     num_text_labels_global=text)
    assert FCPCollator(pad_token_id=PAD, visual_token_id=V)(empty)["num_tokens_global"] == text


def test_masked_visual_labels_need_a_visual_layout():
    """Without the sampler's masked count (plain lengths, no visual layout) a batch whose labels would
    target placeholders is a ValueError naming the fix, instead of a silently wrong denominator; text-only
    batches and mask_visual_labels=False still work. A failure means a wrong loss normalisation goes unnoticed."""
    docs = [[1, V, V, 2], [3, 4]]
    samples = [{"input_ids": torch.tensor(d)} for d in docs]
    slots = _slots([4, 2], [4, 2], 1, 0)
    with pytest.raises(ValueError, match="LengthIndex"):
        FCPCollator(pad_token_id=PAD, visual_token_id=V)(list(zip(samples, slots)))
    out = FCPCollator(pad_token_id=PAD, visual_token_id=V, mask_visual_labels=False)(list(zip(samples, slots)))
    assert out["num_tokens_global"] == 4 == int((out["labels"] != IGN).sum())
    text = _slots([2], [2], 1, 0)
    out = FCPCollator(pad_token_id=PAD, visual_token_id=V)([(samples[1], text[0])])
    assert out["num_tokens_global"] == 1 == int((out["labels"] != IGN).sum())


def _sft_reference(docs, labels, keep, degree, visual=()):
    """Shifted labels from the samples' own (HF-convention) labels: target of token t is labels[t+1] inside the kept
    document, -100 at its end, on pads and where the next token is a visual placeholder."""
    out = []
    for doc, lab, n in zip(docs, labels, keep):
        p = n + (-n) % (2 * degree)
        src = doc if lab is None else lab
        out += [IGN if src[t + 1] == IGN or doc[t + 1] in visual else src[t + 1] for t in range(n - 1)]
        out += [IGN] * (p - n + 1)
    return out


@st.composite
def _sft_docs(draw):
    docs, keep = draw(_docs())
    labels = []
    for d in docs:
        if draw(st.booleans()):  # a prompt of any length masked, then random masked tokens inside the answer
            prompt = draw(st.integers(0, len(d)))
            holes = draw(st.lists(st.integers(0, len(d) - 1), max_size=3))
            labels.append([IGN if t < prompt or t in holes else tok for t, tok in enumerate(d)])
        else:
            labels.append(None)  # no labels key: the causal-LM copy of input_ids
    return docs, labels, keep


@pytest.mark.parametrize("degree", [1, 2, 3, 5])
@settings(max_examples=25, deadline=None)
@given(case=_sft_docs())
def test_sample_labels_shift_mask_and_count_per_rank(degree, case):
    """sample_labels=True (SFT prompt masks): reassembled over every cp_rank, the labels equal the plain-Python
    shift of each sample's own labels (-100 kept, doc ends and pads ignored); num_tokens_global is None and the
    cp_ranks' num_label_tokens_local sum to the reference's label count, each rank counting its own shard. A
    failure means SFT losses train on prompt tokens or are normalised by the wrong count."""
    docs, labels, keep = case
    collate = FCPCollator(pad_token_id=PAD, ignore_index=IGN, sample_labels=True)
    samples = [{"input_ids": torch.tensor(d), **({} if lab is None else {"labels": torch.tensor(lab)})}
               for d, lab in zip(docs, labels)]
    outs = [collate(list(zip(samples, _slots([len(d) for d in docs], keep, degree, r)))) for r in range(degree)]
    ref = _sft_reference(docs, labels, keep, degree)
    cu = _reference(docs, keep, degree)[3]
    assert zigzag_unshard([o["labels"] for o in outs], cu, degree).tolist() == ref
    assert all(o["num_tokens_global"] is None for o in outs)
    assert [o["num_label_tokens_local"] for o in outs] == [int((o["labels"] != IGN).sum()) for o in outs]
    assert sum(o["num_label_tokens_local"] for o in outs) == sum(lab != IGN for lab in ref)


def test_sample_labels_with_visual_tokens_idle_ranks_and_errors():
    """With visual placeholders the samples' masks and the visual-target mask combine (no sampler visual layout
    needed: the count comes from the labels); an idle rank reports 0 local labels; labels of the wrong length or
    below -100 are one ValueError naming the sample; without sample_labels a prompt mask is refused with the fix."""
    doc = [1, 2, V, V, 3, 4, 5]
    lab = [IGN, 2, V, V, 3, 4, 5]  # the sample leaves its placeholders unmasked: the visual rule masks them
    collate = FCPCollator(pad_token_id=PAD, visual_token_id=V, sample_labels=True)
    for degree in (1, 2):
        outs = [collate([({"input_ids": doc, "labels": lab}, _slots([7], [7], degree, r)[0])]) for r in range(degree)]
        got = zigzag_unshard([o["labels"] for o in outs], _reference([doc], [7], degree)[3], degree).tolist()
        assert got == _sft_reference([doc], [lab], [7], degree, visual=(V,)) and got[:7] == [2, IGN, IGN, 3, 4, 5, IGN]
        assert sum(o["num_label_tokens_local"] for o in outs) == 4
    empty = SlotList(epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1, num_tokens_global=50)
    out = collate(empty)
    assert out["num_tokens_global"] is None and out["num_label_tokens_local"] == 0
    slot = _slots([3], [3], 1, 0)[0]
    with pytest.raises(ValueError, match="sample 0: labels has 2 entries but input_ids has 3"):
        collate([({"input_ids": [1, 2, 3], "labels": [1, 2]}, slot)])
    with pytest.raises(ValueError, match=r"sample 0: labels must be token ids >= 0 or ignore_index \(-100\), got -5"):
        collate([({"input_ids": [1, 2, 3], "labels": [1, -5, 3]}, slot)])
    with pytest.raises(ValueError, match=r"pass FCPCollator\(sample_labels=True\)"):
        FCPCollator()([({"input_ids": [1, 2, 3], "labels": [IGN, 2, 3]}, slot)])
    with pytest.raises(TypeError, match="sample_labels must be True or False"):
        FCPCollator(sample_labels="yes")
    with pytest.raises(TypeError, match="signed_grids must be True or False"):  # was bool("no"): True
        FCPCollator(signed_grids="no")
    with pytest.raises(ValueError, match=r"sample 0: pixel_values must be an array of numbers, got str"):
        collate([({"input_ids": [1, 2, 3], "pixel_values": "abc"}, slot)])  # was torch's bare TypeError


# Low-value gap found by mutation testing in fcp_data/mrope.py: a placeholder run that holds the *remaining* frame
# groups of a partly consumed video and then the next image (no separator between them; the module docstring's rule
# "a run takes as many whole frame groups of the current image as it holds", then goes on with the next image). With
# ``k = min(run // per, t)`` instead of ``t - frames_done`` the run over-consumes the video and the document is refused.
# Reference: positions derived by hand from the docstring rule (merge 2).
MROPE_V = 101


def test_run_with_the_last_frame_group_of_a_video_then_an_image():
    ids = torch.tensor([1, 2] + [MROPE_V] * 4 + [3] + [MROPE_V] * 8)
    grid = torch.tensor([[2, 4, 4], [1, 4, 4]])  # a 2-frame-group video, then an image; 4 tokens per frame group
    got = qwen_vl_mrope_positions(ids, grid, torch.tensor([MROPE_V]), 2)
    t = [0, 1, 2, 2, 2, 2, 4, 5, 5, 5, 5, 7, 7, 7, 7]
    h = [0, 1, 2, 2, 3, 3, 4, 5, 5, 6, 6, 7, 7, 8, 8]
    w = [0, 1, 2, 3, 2, 3, 4, 5, 6, 5, 6, 7, 8, 7, 8]
    assert got.tolist() == [t, h, w], got.tolist()
