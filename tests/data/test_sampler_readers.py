"""The data side end to end on the bundled samples: LengthIndex (qwen3-vl spec, videos + images + text) →
FCPSampler (4 ranks, every rank simulated in this process) → FCPDataset(IndexedDataset) → FCPCollator with
visual tokens and Qwen-VL 3-D positions.

Reference: the reader's samples themselves. For every CP group of every micro-batch, the shards of all its
ranks reassembled with ``zigzag_unshard`` must equal the group's documents padded to 2·degree, the visual
rows must cover each kept placeholder once, and over a global batch the label tokens of all ranks must sum
to ``num_tokens_global``. A failure means the model would see different tokens, images or loss
normalisation than the index and the plan promise.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data._resources import data_path
from fcp_data.collator import FCPCollator, qwen_vl_mrope_positions
from fcp_data.cost import CostModel
from fcp_data.index import LengthIndex, build_index
from fcp_data.readers import IndexedDataset
from fcp_data.sampler import FCPDataset, FCPSampler
from fcp_data.layout import zigzag_unshard

SAMPLES = data_path("samples")
CM = CostModel(alpha1=2e-10, alpha2=5e-7, alpha3=2e4, beta1=1e-3, beta2=2e-4, bandwidth_intra=2e11,
               bandwidth_inter=2.5e10, ranks_per_node=2, tokens_per_rank=1536)  # 6144 per micro-batch: the longest doc is truncated
NUM_RANKS = 4


class Cached:
    """Memoise the reader (videos are decoded once; the reader's own correctness is tested elsewhere)."""

    def __init__(self, base):
        self.base, self.cache = base, {}

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        if i not in self.cache:
            self.cache[i] = self.base[i]
        return self.cache[i]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("ix") / "qwen3-vl"
    build_index([str(SAMPLES / "wds" / "shard-{000000..000003}.tar"), str(SAMPLES / "text.jsonl")], "qwen3-vl", out,
                progress=False, probe="av")
    ix = LengthIndex.load(out)
    reader = IndexedDataset(ix)
    return ix, reader, Cached(reader)  # one cache for the module: each video is decoded once, not once per test


def test_index_to_batches_reassemble_exactly(data):
    ix, reader, base = data
    vis = torch.tensor(reader.placeholder_ids)
    collate = FCPCollator(pad_token_id=reader.pad_token_id, visual_token_id=reader.placeholder_ids, mrope=True)
    ds = FCPDataset(base)
    per_rank = []
    for r in range(NUM_RANKS):
        s = FCPSampler(ix, num_ranks=NUM_RANKS, rank=r, cost_model=CM, global_batch_size=96, seed=0,
                       on_overlong="truncate", prefetch=1)
        per_rank.append([collate(ds.__getitems__(lst)) for lst in s])
    assert len({len(b) for b in per_rank}) == 1
    seen, label_tokens, totals, vis_degrees = [], {}, {}, set()
    for pos in range(len(per_rank[0])):
        batches = [b[pos] for b in per_rank]
        groups = {}
        for b in batches:
            g = b["global_batch"]
            totals[g] = b["num_tokens_global"]
            label_tokens[g] = label_tokens.get(g, 0) + int((b["labels"] != -100).sum())
            if b["ranks"]:
                groups.setdefault(b["ranks"], {})[b["cp_rank"]] = b
        for ranks, by_cp in groups.items():
            degree = len(ranks)
            shards = [by_cp[c] for c in range(degree)]
            idx = shards[0]["sample_indices"]
            assert all(sh["sample_indices"] == idx for sh in shards)
            seen.extend(idx)
            cu = (shards[0]["cu_seqlens"].to(torch.long) * degree).tolist()
            docs = [base[i]["input_ids"] for i in idx]
            ids = zigzag_unshard([sh["input_ids"] for sh in shards], cu, degree)
            mr = zigzag_unshard([sh["mrope_position_ids"].T for sh in shards], cu, degree).T
            kept_vis = 0
            for k, (i, doc) in enumerate(zip(idx, docs)):
                n = min(len(doc), NUM_RANKS * CM.tokens_per_rank)
                seg = ids[cu[k]:cu[k + 1]]
                assert (cu[k + 1] - cu[k]) % (2 * degree) == 0 and cu[k + 1] - cu[k] - n < 2 * degree
                assert torch.equal(seg[:n], doc[:n]) and bool((seg[n:] == reader.pad_token_id).all())
                ref = qwen_vl_mrope_positions(doc, base[i].get("grid_thw"), vis, 2)[:, :n]
                assert torch.equal(mr[:, cu[k]:cu[k] + n], ref)
                kept_vis += int(torch.isin(doc[:n], vis).sum())
            if kept_vis:
                vis_degrees.add(degree)
            rows = torch.cat([sh["visual_index"] for sh in shards])
            assert sorted(rows.tolist()) == list(range(kept_vis)) or kept_vis == 0
            for sh in shards:
                assert bool(torch.isin(sh["input_ids"][sh["visual_pos"]], vis).all())
            pix = [base[i]["pixel_values"] for i in idx if "pixel_values" in base[i]]
            if pix:
                assert all(torch.equal(sh["pixel_values"], torch.cat(pix)) for sh in shards)
    assert sorted(seen) == list(range(len(ix)))
    assert label_tokens == totals
    # the scenario covers what it claims: visual documents on multi-rank groups and a truncated video
    assert max(vis_degrees) >= 2 and s.num_truncated >= 1


CAP = 1200  # micro-batch capacity of the masked-label test: cuts the longest videos inside their visual block


def _masked_reference(doc, n, vis):
    """Non-ignored labels of a document cut to n tokens: n − 1 minus the placeholder targets (positions 1..n−1)."""
    return n - 1 - int(torch.isin(doc[1:n], vis).sum())


@pytest.mark.parametrize("spec,num_ranks", [("qwen3-vl", 1), ("qwen3-vl", 2), ("qwen3-vl", 3), ("qwen3-vl", 4),
                                            ("llava-video", 2)])
def test_masked_labels_match_num_tokens_global(tmp_path, data, spec, num_ranks):
    """Visual labels masked (the collator's default) on the bundled videos/images/text, 1..4 ranks, the
    longest videos cut inside their visual block (micro-batch capacity CAP = 1200 tokens in every case): for every global batch, the
    non-ignored labels of all ranks sum to num_tokens_global, which equals the count taken from the
    reader's own input_ids (n − 1 − placeholders at positions 1..n−1), and no label is a placeholder.
    llava-video puts placeholders at position 0 (never a target). A failure means the loss denominator
    the sampler computes from the index (IndexVisualLayout) differs from the labels the collator trains on."""
    if spec == "qwen3-vl":
        ix, reader, base = data
    else:
        out = tmp_path / spec
        build_index([str(SAMPLES / "wds" / "shard-{000000..000003}.tar"), str(SAMPLES / "text.jsonl")], spec, out,
                    progress=False, probe="av")
        ix = LengthIndex.load(out)
        reader = IndexedDataset(ix)
        base = Cached(reader)
    vis = torch.tensor(reader.placeholder_ids)
    collate = FCPCollator(pad_token_id=reader.pad_token_id, visual_token_id=reader.placeholder_ids)
    ds = FCPDataset(base)
    cm = CM.replace(tokens_per_rank=CAP // num_ranks)
    samplers = [FCPSampler(ix, num_ranks=num_ranks, rank=r, cost_model=cm, global_batch_size=96, seed=1,
                           on_overlong="truncate", prefetch=0) for r in range(num_ranks)]
    per_rank = [[collate(ds.__getitems__(lst)) for lst in s] for s in samplers]
    labels, totals, ref, vis_degrees = {}, {}, {}, set()
    for pos in range(len(per_rank[0])):
        for b in (rk[pos] for rk in per_rank):
            g = b["global_batch"]
            assert totals.setdefault(g, b["num_tokens_global"]) == b["num_tokens_global"]
            lab = b["labels"]
            labels[g] = labels.get(g, 0) + int((lab != -100).sum())
            assert not bool(torch.isin(lab, vis).any())
            if b["cp_rank"] == 0:
                for i in b["sample_indices"]:
                    n = min(len(base[i]["input_ids"]), CAP)
                    ref[g] = ref.get(g, 0) + _masked_reference(base[i]["input_ids"], n, vis)
            if b["ranks"] and bool(torch.isin(b["input_ids"], vis).any()):
                vis_degrees.add(len(b["ranks"]))
    assert labels == totals == ref
    assert sum(ref.values()) < sum(min(int(x), CAP) - 1 for x in ix.num_tokens)  # placeholders were masked
    cut = [i for i in range(len(ix)) if int(ix.num_tokens[i]) > CAP and
           0 < int(torch.isin(base[i]["input_ids"][:CAP], vis).sum()) < int(ix.num_visual_tokens[i])]
    assert samplers[0].num_truncated >= 1 and len(cut) >= 2  # truncation inside visual blocks is covered
    assert max(vis_degrees) == num_ranks or num_ranks == 3
    if spec == "llava-video":
        assert any(int(base[i]["input_ids"][0]) in reader.placeholder_ids for i in range(len(ix)))


def test_caption_labels_mask_the_visual_block(data):
    """``IndexedDataset(caption_labels=True)``: an image's and a video's labels are -100 over the whole visual block
    (markers, timestamps, placeholders) and the caption's ids + EOS after it — reference: the .txt member tokenised
    by hand; input_ids unchanged; a text sample gets no labels (the collator then trains on all of it). A failure
    means a caption-only recipe trains on markers/timestamps or loses caption tokens."""
    from fcp_data.index import KIND_IMAGE, KIND_TEXT, KIND_VIDEO

    ix, reader, base = data
    cap = IndexedDataset(ix, caption_labels=True)
    assert cap.has_labels and not reader.has_labels
    tok = reader.spec.tokenizer()
    for kind in (KIND_IMAGE, KIND_VIDEO, KIND_TEXT):
        i = next(k for k in range(len(ix)) if int(ix.kind[k]) == kind)
        s, plain = cap[i], base[i]
        assert torch.equal(s["input_ids"], plain["input_ids"])
        if kind == KIND_TEXT:
            assert "labels" not in s
            continue
        text = tok.encode(reader.read_member(i, "txt").decode("utf-8"), add_special_tokens=False).ids
        text += [reader.eos_token_id]
        n = len(text)
        assert s["labels"][-n:].tolist() == text == s["input_ids"][-n:].tolist()
        assert bool((s["labels"][:-n] == -100).all()) and int(ix.num_visual_tokens[i]) <= s["labels"].numel() - n
    with pytest.raises(TypeError, match="caption_labels must be True or False"):
        IndexedDataset(ix, caption_labels="yes")
