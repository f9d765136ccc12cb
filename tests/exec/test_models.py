"""tiny-llm / tiny-mllm in one process: attention wiring vs a dense reference, RoPE, packing isolation,
the vision encoder's frame split (exact rows and exact gradient sums), determinism and validation."""

from __future__ import annotations

import pytest
import torch

import fcp_exec.models.tiny_llm as tiny_llm_mod
from fcp_exec.models import (TinyLLMConfig, TinyMLLMConfig, apply_rope, build_model, frame_table,
                             token_loss_sum)
from fcp_exec.testing import dense_attention

F64 = torch.float64
SMALL = TinyLLMConfig(vocab_size=97, hidden=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, ffn=48)


def _packed(lengths, vocab=97, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab, (sum(lengths),), generator=g)
    pos = torch.cat([torch.arange(n) for n in lengths])
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return ids, pos, cu


def test_attention_goes_through_ring_attention_and_matches_dense(monkeypatch):
    """Degree-1 ring attention inside the model vs the same model with a dense fp64 per-document causal
    attention (GQA expanded): logits and gradients to 1e-12. A failure means the model passes wrong
    shapes, heads or masks to ring_attention."""
    ids, pos, cu = _packed([7, 12, 1, 20])
    model = build_model("tiny-llm", seed=1, dtype=F64, llm=SMALL)
    labels = torch.roll(ids, -1)
    out = model(ids, pos, cu, (0,))
    token_loss_sum(out, labels).backward()
    g_ring = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    monkeypatch.setattr(tiny_llm_mod, "_attention",
                        lambda q, k, v, ring, ranks, causal: dense_attention(q, k, v, ring.cu, causal=causal))
    ref = model(ids, pos, cu, (0,))
    token_loss_sum(ref, labels).backward()
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for n, p in model.named_parameters():
        torch.testing.assert_close(g_ring[n], p.grad, rtol=1e-10, atol=1e-13, msg=n)


def test_packed_documents_do_not_see_each_other():
    """Logits of a document are the same packed with others or alone (block-diagonal causal mask)."""
    model = build_model("tiny-llm", seed=0, dtype=F64, llm=SMALL)
    ids, pos, cu = _packed([9, 14, 5])
    packed = model(ids, pos, cu, (0,))
    alone = model(ids[9:23], pos[9:23], torch.tensor([0, 14], dtype=torch.int32), (0,))
    torch.testing.assert_close(packed[9:23], alone, rtol=0, atol=1e-13)


def test_rope_is_relative_and_identity_at_zero():
    """RoPE: ⟨rope(q, i), rope(k, j)⟩ depends only on i − j (fp64, 1e-12), and position 0 is identity."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 16, generator=g, dtype=F64), torch.randn(1, 2, 16, generator=g, dtype=F64)
    t = torch.tensor

    def dot(i, j):
        return (apply_rope(q, t([i]), 1e4) * apply_rope(k, t([j]), 1e4)).sum(-1)

    torch.testing.assert_close(dot(3, 10), dot(103, 110), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dot(5000, 4000), dot(1000, 0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(apply_rope(q, t([0]), 1e4), q, rtol=0, atol=0)


def test_frame_table():
    """Frames of grid (2,4,4) and (1,2,6), merge 2: rows [0,4), [4,8), [8,11); patches 0, 16, 32."""
    tab = frame_table(torch.tensor([[2, 4, 4], [1, 2, 6]]), 2)
    assert tab.tolist() == [[0, 4, 0, 4, 4], [4, 4, 16, 4, 4], [8, 3, 32, 2, 6]]
    with pytest.raises(ValueError, match="merge_size"):
        frame_table(torch.tensor([[1, 3, 4]]), 2)


def test_vision_split_rows_and_gradients_are_exact():
    """Each rank encodes only the frames holding its visual tokens. Rows must equal the full encoding, and
    the sum of per-rank gradients (any partition of the rows, e.g. zigzag chunks cutting frames) must equal
    the gradient of encoding everything at once (fp64, 1e-12). A failure breaks MLLM equivalence."""
    cfg = TinyMLLMConfig(llm=SMALL, patch_dim=12, vision_hidden=8, vision_heads=2, vision_ffn=16)
    model = build_model("tiny-mllm", seed=2, dtype=F64, llm=SMALL, patch_dim=12, vision_hidden=8,
                        vision_heads=2, vision_ffn=16)
    assert model.cfg == cfg
    grid = torch.tensor([[3, 4, 4], [1, 2, 6], [2, 2, 2]])
    n_rows = int(frame_table(grid, 2)[:, 1].sum())
    pv = torch.randn(int(grid.prod(1).sum()), 12, dtype=F64, generator=torch.Generator().manual_seed(0))
    weights = torch.randn(n_rows, SMALL.hidden, dtype=F64, generator=torch.Generator().manual_seed(1))
    full = model.vision(pv, grid, torch.arange(n_rows))
    (full * weights).sum().backward()
    g_full = {n: p.grad.clone() for n, p in model.vision.named_parameters()}
    model.zero_grad()
    parts = [torch.tensor([0, 1, 2, 9, 10, 15]), torch.tensor([3, 4, 5, 6, 7, 8]),
             torch.tensor([11, 12, 13, 14, 16]), torch.tensor([], dtype=torch.long)]
    assert sorted(torch.cat(parts).tolist()) == list(range(n_rows))
    for idx in parts:
        rows = model.vision(pv, grid, idx)
        torch.testing.assert_close(rows, full[idx], rtol=0, atol=1e-14)
        if idx.numel():
            (rows * weights[idx]).sum().backward()
    for n, p in model.vision.named_parameters():
        torch.testing.assert_close(p.grad, g_full[n], rtol=1e-11, atol=1e-14, msg=n)


def test_mllm_replaces_placeholders_with_vision_rows():
    """TinyMLLM == TinyLLM fed embeddings where rows ``visual_pos`` are the vision encoder's rows."""
    model = build_model("tiny-mllm", seed=3, dtype=F64, llm=SMALL, patch_dim=12, vision_hidden=8,
                        vision_heads=2, vision_ffn=16)
    ids, pos, cu = _packed([10, 6])
    grid = torch.tensor([[1, 2, 4]])
    pv = torch.randn(8, 12, dtype=F64)
    vpos, vidx = torch.tensor([3, 4]), torch.tensor([0, 1])
    out = model(ids, pos, cu, (0,), visual_pos=vpos, visual_index=vidx, pixel_values=pv, grid_thw=grid)
    emb = model.llm.embed(ids).clone()
    emb[vpos] = model.vision(pv, grid, vidx)
    torch.testing.assert_close(out, model.llm(ids, pos, cu, (0,), inputs_embeds=emb), rtol=0, atol=0)
    text_only = model(ids, pos, cu, (0,))
    torch.testing.assert_close(out[10:], text_only[10:], rtol=0, atol=0)  # the other document is unaffected
    assert not torch.allclose(out[3:10], text_only[3:10])


def test_build_model_is_deterministic():
    a = build_model("tiny-mllm", seed=5, dtype=F64)
    b = build_model("tiny-mllm", seed=5, dtype=F64)
    c = build_model("tiny-mllm", seed=6, dtype=F64)
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert p.dtype == F64 and torch.equal(p, q), n
    assert any(not torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))


def test_validation_errors():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        TinyLLMConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="even"):
        TinyLLMConfig(head_dim=7)
    with pytest.raises(ValueError, match="unknown model"):
        build_model("big-llm")
    model = build_model("tiny-llm", llm=SMALL)
    with pytest.raises(ValueError, match="idle rank"):
        model(torch.zeros(4, dtype=torch.long), torch.arange(4), torch.tensor([0, 4], dtype=torch.int32), ())


def _group_rows_worker(grid, parts, seed):
    """On every rank: the group's rows via the share + P2P exchange, and the all-reduced vision grads."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model("tiny-mllm", seed=2, dtype=F64, llm=SMALL, patch_dim=12, vision_hidden=8,
                        vision_heads=2, vision_ffn=16)
    grid = torch.tensor(grid)
    n_rows = int(frame_table(grid, 2)[:, 1].sum())
    pv = torch.randn(int(grid.prod(1).sum()), 12, dtype=F64, generator=torch.Generator().manual_seed(seed))
    weights = torch.randn(n_rows, SMALL.hidden, dtype=F64, generator=torch.Generator().manual_seed(seed + 1))
    idx = torch.tensor(parts[rank], dtype=torch.long)
    rows = model.vision.group_rows(pv, grid, idx, tuple(range(world)), rank)
    (rows * weights[idx]).sum().backward()
    grads = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=F64)
                       for p in model.vision.parameters()])
    dist.all_reduce(grads)
    return rows.detach(), grads


@pytest.mark.parametrize("grid,parts", [
    ([[3, 4, 4], [1, 2, 6], [2, 2, 2]], [[0, 1, 2, 9, 10, 16], [3, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15]]),
    ([[3, 4, 4], [1, 2, 6], [2, 2, 2]], [[15, 0, 9], [], [16, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14]]),
    ([[1, 2, 4]], [[1], [], [0]]),  # one frame, three ranks: two shares are empty
])
def test_vision_exchange_across_processes_is_exact(grid, parts):
    """Degree > 1: each rank encodes a contiguous share of frames and P2P routes rows to their token's rank
    and gradients back. Rows must equal a single-process encoding and the all-reduced gradient the
    single-process gradient (fp64, 1e-12) — including ranks with no visual token and ranks with an empty
    share. A failure (or a hang, bounded by the timeout) breaks tiny-mllm equivalence."""
    from fcp_exec.launch import launch

    results = launch(_group_rows_worker, len(parts), grid, parts, 0, timeout=180)
    model = build_model("tiny-mllm", seed=2, dtype=F64, llm=SMALL, patch_dim=12, vision_hidden=8,
                        vision_heads=2, vision_ffn=16)
    g = torch.tensor(grid)
    n_rows = int(frame_table(g, 2)[:, 1].sum())
    pv = torch.randn(int(g.prod(1).sum()), 12, dtype=F64, generator=torch.Generator().manual_seed(0))
    weights = torch.randn(n_rows, SMALL.hidden, dtype=F64, generator=torch.Generator().manual_seed(1))
    full = model.vision(pv, g, torch.arange(n_rows))
    (full * weights).sum().backward()
    ref = torch.cat([p.grad.reshape(-1) for p in model.vision.parameters()])
    for (rows, grads), part in zip(results, parts):
        torch.testing.assert_close(rows, full.detach()[torch.tensor(part, dtype=torch.long)], rtol=0, atol=1e-13)
        torch.testing.assert_close(grads, ref, rtol=1e-11, atol=1e-14)


def test_frame_shares_are_contiguous_and_balanced():
    """Shares are non-decreasing in frame order (contiguous) and balanced by patch count."""
    from fcp_exec.models import frame_shares

    tab = frame_table(torch.tensor([[8, 4, 4], [2, 8, 8]]), 2)  # 8 frames of 16 patches, 2 of 64
    for degree in (1, 2, 3, 4):
        share = frame_shares(tab, degree)
        assert share.tolist() == sorted(share.tolist()) and int(share.max()) <= degree - 1
        load = [int((tab[share == r, 3] * tab[share == r, 4]).sum()) for r in range(degree)]
        assert max(load) - min(load) <= 64 + 16, (degree, load)
