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
from fcp_exec.layout import zigzag_unshard

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
    return ix, IndexedDataset(ix)


def test_index_to_batches_reassemble_exactly(data):
    ix, reader = data
    base = Cached(reader)
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
