"""Qwen-VL positions: what the collator emits with ``position_fn=HFRopeIndex`` vs the installed transformers.

Reference: ``get_rope_index`` of a REAL model instance (``Qwen2VLModel(config)`` etc., tiny config built offline,
random weights) on the whole untruncated document, batch of one, with ``mm_token_type_ids`` and the image/video
grids written out by the test's own document builder (the processors' layouts: ``<|vision_start|>``
placeholders ``<|vision_end|>``; Qwen3-VL one ``"<t seconds>"`` + start/placeholders/end per frame group inside the
template's own start/end pair). The collator's shards of every cp_rank, reassembled with ``zigzag_unshard``, must
equal the reference cut to the kept tokens exactly (integers), pads continuing after the maximum + 1. A failure means
training positions differ from the positions the same model uses at inference.

A second test pins down where the collator's built-in rule agrees with the installed transformers — the statement
in the :mod:`fcp_data.collator` docstring — in both directions.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pickle

import pytest
from _requires import transformers_models
import torch

transformers = transformers_models()

from fcp_data.collator import FCPCollator, qwen_vl_mrope_positions  # noqa: E402
from fcp_data.sampler import SampleSlot  # noqa: E402
from fcp_exec.integrations.hf_positions import HFRopeIndex, hf_collator  # noqa: E402
from fcp_data.layout import zigzag_unshard  # noqa: E402

IMG, VID, VS, VE, PAD = 100, 101, 102, 103, 0
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
QWEN3 = ("qwen3_vl", "qwen3_vl_moe")  # one placeholder run per temporal frame group
TOKENS_PER_SECOND = 2  # Qwen2.5-VL's released value


@functools.lru_cache(maxsize=None)
def _config(family: str, image_token_id: int = IMG, video_token_id: int = VID, vs: int = VS, ve: int = VE):
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    text = dict(vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, bos_token_id=1, eos_token_id=2, rope_parameters=rope)
    ids = dict(image_token_id=image_token_id, video_token_id=video_token_id, vision_start_token_id=vs,
               vision_end_token_id=ve)
    if family == "qwen2_vl":
        return transformers.Qwen2VLConfig(text_config=text, vision_config=dict(
            depth=1, embed_dim=16, hidden_size=16, num_heads=2, spatial_merge_size=2), **ids)
    if family == "qwen2_5_vl":
        return transformers.Qwen2_5_VLConfig(text_config=text, vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16, spatial_merge_size=2,
            tokens_per_second=TOKENS_PER_SECOND, fullatt_block_indexes=[0]), **ids)
    text3 = dict(text, head_dim=8, rope_parameters=dict(rope, mrope_interleaved=True))
    if family == "qwen3_vl_moe":
        text3.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
    return (transformers.Qwen3VLMoeConfig if family == "qwen3_vl_moe" else transformers.Qwen3VLConfig)(
        text_config=text3, vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16, spatial_merge_size=2,
            num_position_embeddings=16, deepstack_visual_indexes=[]), **ids)


@functools.lru_cache(maxsize=None)
def _model(family: str):
    cls = {"qwen2_vl": transformers.Qwen2VLModel, "qwen2_5_vl": transformers.Qwen2_5_VLModel,
           "qwen3_vl": transformers.Qwen3VLModel, "qwen3_vl_moe": transformers.Qwen3VLMoeModel}[family]
    torch.manual_seed(0)
    return cls(_config(family)).eval()


# ---------------------------------------------------------------- documents, laid out as the processors do

def _text(n: int, seed: int) -> list[int]:
    return [10 + (seed * 7 + i) % 80 for i in range(n)]


def _doc(family: str, items) -> dict:
    """items: ("text", n) | ("image", (t, h, w)) | ("video", (t, h, w), second_per_grid_t).

    Returns the base sample (input_ids, grid_thw in order of appearance, second_per_grid_ts) and, for the
    reference only, the grids split by modality as a processor returns them."""
    ids: list[int] = []
    rows, images, videos, spg = [], [], [], []
    for k, it in enumerate(items):
        if it[0] == "text":
            ids += _text(it[1], k)
            continue
        t, h, w = it[1]
        rows.append(it[1])
        if it[0] == "image":
            images.append(it[1])
            ids += [VS] + [IMG] * (t * h * w // 4) + [VE]
            continue
        videos.append(it[1])
        spg.append(it[2])
        if family in QWEN3:  # Qwen3VLProcessor.replace_video_token inside the template's own pair
            ids.append(VS)
            for g in range(t):
                ids += _text(4, 100 + g) + [VS] + [VID] * (h * w // 4) + [VE]  # "<x.x seconds>" as 4 text tokens
            ids.append(VE)
        else:
            ids += [VS] + [VID] * (t * h * w // 4) + [VE]
    sample = {"input_ids": torch.tensor(ids, dtype=torch.long)}
    if rows:
        sample["grid_thw"] = torch.tensor(rows, dtype=torch.long)
    if spg:
        sample["second_per_grid_ts"] = torch.tensor(spg, dtype=torch.float32)
    return {"sample": sample, "images": images, "videos": videos, "spg": spg}


def _reference(family: str, doc: dict) -> torch.Tensor:
    """``[3, n]``: the installed get_rope_index of a real model instance on the whole document."""
    ids = doc["sample"]["input_ids"][None]
    kw = {"mm_token_type_ids": (ids == IMG).int() + 2 * (ids == VID).int(),
          "image_grid_thw": torch.tensor(doc["images"]) if doc["images"] else None,
          "video_grid_thw": torch.tensor(doc["videos"]) if doc["videos"] else None}
    if family == "qwen2_5_vl" and doc["videos"]:
        kw["second_per_grid_ts"] = torch.tensor(doc["spg"], dtype=torch.float32)
    with torch.no_grad():
        pos, _ = _model(family).get_rope_index(ids, **kw)
    return pos[:, 0]


IMAGE = [("text", 5), ("image", (1, 6, 8)), ("text", 4)]
VIDEOS = {g: [("text", 3), ("video", g, 1.0), ("text", 6)] for g in [(2, 4, 4), (6, 4, 4), (8, 2, 4)]}
MIXED = [("text", 4), ("image", (1, 4, 8)), ("text", 2), ("video", (6, 4, 4), 0.5), ("text", 3),
         ("image", (1, 8, 4)), ("video", (2, 4, 4), 2.0), ("text", 5), ("video", (8, 2, 4), 1.5), ("text", 2)]
SECONDS = [[("text", 2), ("video", (6, 4, 4), s), ("text", 3)] for s in (0.5, 1.5, 2.0)]


def _documents(family: str) -> list[list]:
    return [IMAGE, *VIDEOS.values(), MIXED, *(SECONDS if family == "qwen2_5_vl" else [])]


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_rope_index_equals_installed_model_on_whole_documents(family):
    """HFRopeIndex (weightless host, grids split from the sample's runs) == the real model's get_rope_index."""
    fn = HFRopeIndex(_config(family))
    for items in _documents(family) + [[("text", 7)]]:
        doc = _doc(family, items)
        ref = _reference(family, doc)
        got = fn(doc["sample"], doc["sample"]["input_ids"])
        assert got.dtype == torch.long and torch.equal(got, ref), items


def _slots(lengths, keep, degree, cp_rank, text):
    ranks = tuple(range(10, 10 + degree))
    return [SampleSlot(index=i, ranks=ranks, cp_rank=cp_rank, num_tokens=k, length=n,
                       num_tokens_global=sum(k - 1 for k in keep), epoch=0, global_batch=0, micro_batch=0,
                       num_micro_batches=1, num_text_labels_global=text)
            for i, (n, k) in enumerate(zip(lengths, keep))]


@pytest.mark.parametrize("family", FAMILIES)
def test_collator_shards_equal_installed_positions(family):
    """Every document of a micro-batch (image, videos, mixed, text-only; whole and truncated, including cuts inside
    a video) for degrees 1–3: the reassembled mrope_position_ids equal the untruncated reference cut to the kept
    tokens, and the pads continue from the document's maximum + 1 on all three axes."""
    docs = [_doc(family, items) for items in _documents(family)] + [_doc(family, [("text", 9)])]
    samples = [d["sample"] for d in docs]
    refs = [_reference(family, d) for d in docs]
    lengths = [int(s["input_ids"].numel()) for s in samples]
    keep_sets = [lengths, [max(1, (n * (k + 2)) // (k + 4)) for k, n in enumerate(lengths)]]  # whole, truncated
    collate = pickle.loads(pickle.dumps(hf_collator(_config(family), pad_token_id=PAD)))  # as DataLoader workers get it
    for keep in keep_sets:
        text = sum(n - 1 - int(torch.isin(s["input_ids"][1:n], torch.tensor([IMG, VID])).sum())
                   for s, n in zip(samples, keep))
        for degree in (1, 2, 3):
            cu = [0]
            for n in keep:
                cu.append(cu[-1] + n + (-n) % (2 * degree))
            outs = [collate(list(zip(samples, _slots(lengths, keep, degree, r, text)))) for r in range(degree)]
            full = zigzag_unshard([o["mrope_position_ids"].T for o in outs], cu, degree).T
            assert full.dtype == torch.long
            for k, (ref, n) in enumerate(zip(refs, keep)):
                seg = full[:, cu[k]:cu[k + 1]]
                assert torch.equal(seg[:, :n], ref[:, :n]), (family, degree, k, n)
                top = int(ref[:, :n].max()) + 1
                assert seg[:, n:].tolist() == [list(range(top, top + cu[k + 1] - cu[k] - n))] * 3


# ---------------------------------------------------------------- built-in rule vs the installed transformers

def _builtin_agrees(family: str, items) -> bool:
    """The fcp_data.mrope docstring's statement for transformers >= 5.3: equal iff every run has t <= max(h, w)/m
    (Qwen3-VL: one run per frame group, so always), and Qwen2.5-VL videos' temporal index is unscaled."""
    for it in items:
        if it[0] == "text" or family in QWEN3:
            continue
        t, h, w = it[1]
        if t > max(h, w) // 2:
            return False
        x = TOKENS_PER_SECOND * it[2] if (family == "qwen2_5_vl" and it[0] == "video") else 1.0
        if any(math.floor(i * x) != i for i in range(t)):
            return False
    return True


AGREEMENT_DOCS = [
    [("text", 2), ("image", (1, 4, 4)), ("text", 2)],
    [("text", 2), ("image", (1, 2, 2)), ("text", 2)],               # 1×1 tokens: t = max(h, w)/m = 1
    [("image", (1, 8, 4)), ("text", 3), ("image", (1, 2, 6))],
    *[[("text", 2), ("video", g, s), ("text", 2)]
      for g in [(2, 4, 4), (2, 2, 4), (3, 4, 8), (4, 4, 8), (6, 4, 4), (8, 2, 4), (5, 4, 8)]
      for s in (0.5, 1.0, 0.25, 1.5)],
    MIXED,
    [("text", 2), ("image", (1, 4, 8)), ("video", (2, 4, 4), 0.5), ("text", 2)],
]


@pytest.mark.parametrize("family", FAMILIES)
def test_builtin_rule_agrees_exactly_where_documented(family):
    """qwen_vl_mrope_positions == installed get_rope_index iff the documented predicate holds; both outcomes occur
    for Qwen2-VL and Qwen2.5-VL (so the installed version does differ from the original max + 1 rule), never
    differ for Qwen3-VL. A failure means the collator docstring's version statement is wrong for this install."""
    seen = set()
    for items in AGREEMENT_DOCS:
        doc = _doc(family, items)
        ids = doc["sample"]["input_ids"]
        builtin = qwen_vl_mrope_positions(ids, doc["sample"].get("grid_thw"), torch.tensor([IMG, VID]), 2)
        agree = torch.equal(builtin, _reference(family, doc))
        assert agree == _builtin_agrees(family, items), (family, items, agree)
        seen.add(agree)
    assert seen == ({True} if family in QWEN3 else {True, False})


def test_text_after_video_advances_by_max_hw_not_block_max():
    """The installed rule on one case: 3 text tokens + <|vision_start|> (positions 0–3), then a Qwen2-VL video
    (8, 2, 4) = 8 frame groups of 1×2 tokens starting at 4 (temporal 4..11); <|vision_end|> gets 4 + max(1, 2) = 6
    (transformers >= 5.3), where the original rule (and the built-in one) gives the block's maximum + 1 = 12."""
    doc = _doc("qwen2_vl", VIDEOS[(8, 2, 4)])
    ref = _reference("qwen2_vl", doc)
    first, end = 4, 4 + 16  # first placeholder, <|vision_end|>
    assert ref[:, first].tolist() == [4, 4, 4] and int(ref[:, first:end].max()) == 11
    assert ref[:, end].tolist() == [6, 6, 6]
    builtin = qwen_vl_mrope_positions(doc["sample"]["input_ids"], doc["sample"]["grid_thw"], torch.tensor([VID]), 2)
    assert torch.equal(builtin[:, :end], ref[:, :end]) and builtin[:, end].tolist() == [12, 12, 12]


# ---------------------------------------------------------------- errors, pickling, readers

def test_mismatches_are_clear_errors():
    """Wrong placeholder ids, grid rows that do not fit the runs, a Qwen2-layout video under Qwen3-VL, a wrong
    second_per_grid_ts count and an unsupported config are ValueErrors that say what to fix."""
    fn2, fn25, fn3 = (HFRopeIndex(_config(f)) for f in FAMILIES[:3])
    doc = _doc("qwen2_vl", VIDEOS[(2, 4, 4)])
    other = {"input_ids": torch.where(doc["sample"]["input_ids"] == VID, 201, doc["sample"]["input_ids"]),
             "grid_thw": doc["sample"]["grid_thw"]}
    with pytest.raises(ValueError, match="placeholder ids are not the model's"):
        fn2(other, other["input_ids"])
    bad = dict(doc["sample"], grid_thw=torch.tensor([[4, 4, 4]]))
    with pytest.raises(ValueError, match="disagree"):
        fn2(bad, bad["input_ids"])
    with pytest.raises(ValueError, match="frame group"):  # one contiguous video run is not Qwen3-VL's layout
        fn3(doc["sample"], doc["sample"]["input_ids"])
    with pytest.raises(ValueError, match="second_per_grid_ts has 2"):
        s = dict(doc["sample"], second_per_grid_ts=torch.tensor([1.0, 2.0]))
        fn25(s, s["input_ids"])
    with pytest.raises(ValueError, match="supports model_type"):
        HFRopeIndex(transformers.LlamaConfig())
    with pytest.raises(ValueError, match="position_fn needs visual_token_id"):
        FCPCollator(position_fn=fn2)
    slot = _slots([4], [4], 1, 0, None)[0]
    with pytest.raises(ValueError, match=r"shape \(3, 4\)"):
        FCPCollator(visual_token_id=IMG, position_fn=_wrong_shape)([({"input_ids": [1, 2, 3, 4]}, slot)])
    with pytest.raises(TypeError, match="sets visual_token_id"):
        hf_collator(_config("qwen2_vl"), visual_token_id=5)


def _wrong_shape(sample, input_ids):
    return torch.zeros((3, input_ids.numel() - 1), dtype=torch.long)


def test_from_model_and_pickle_round_trip():
    """from_model(ForConditionalGeneration) runs the inner model class's get_rope_index and keeps only the config;
    a pickled copy (fresh host) gives the same positions."""
    full = transformers.Qwen2_5_VLForConditionalGeneration(_config("qwen2_5_vl"))
    fn = HFRopeIndex.from_model(full)
    assert fn.model_type == "qwen2_5_vl" and "Qwen2_5_VLModel" in repr(fn)
    assert repr(HFRopeIndex.from_model(_model("qwen2_5_vl"))) == repr(fn)
    doc = _doc("qwen2_5_vl", MIXED)
    got = fn(doc["sample"], doc["sample"]["input_ids"])
    copy = pickle.loads(pickle.dumps(fn))
    assert copy._host is None and torch.equal(copy(doc["sample"], doc["sample"]["input_ids"]), got)
    assert torch.equal(got, _reference("qwen2_5_vl", doc))


def test_reader_second_per_grid_ts_matches_transformers_and_feeds_positions(tmp_path):
    """A Qwen2.5-VL video sample from the bundled shard carries second_per_grid_ts = temporal_patch_size /
    VideoMetadata.sampled_fps (transformers' own formula, Qwen2_5_VLProcessor), and hf_collator built from a config
    with the reader's placeholder ids reproduces the real model's positions for it."""
    pytest.importorskip("decord")
    pytest.importorskip("av")
    from transformers.video_utils import VideoMetadata

    from fcp_data._resources import data_path
    from fcp_data.index import KIND_VIDEO, build_index
    from fcp_data.readers import IndexedDataset
    from fcp_data.specs import plan_visual

    build_index([str(data_path("samples") / "wds" / "shard-000000.tar")], "qwen2.5-vl", tmp_path / "ix",
                progress=False, probe="av")
    ds = IndexedDataset(tmp_path / "ix")
    i = next(i for i in range(len(ds)) if ds.index.kind[i] == KIND_VIDEO)
    s = ds[i]
    ix = ds.index
    plan = plan_visual(ds.spec, "video", height=int(ix.height[i]), width=int(ix.width[i]),
                       num_frames=int(ix.num_frames[i]), fps=float(ix.fps[i]))
    meta = VideoMetadata(total_num_frames=int(ix.num_frames[i]), fps=float(ix.fps[i]),
                         frames_indices=list(plan.frame_indices))
    expect = ds.spec.vision["temporal_patch_size"] / meta.sampled_fps
    assert s["second_per_grid_ts"].dtype == torch.float32 and s["second_per_grid_ts"].tolist() == [expect]
    vs, ve = ds.spec.token_id("<|vision_start|>"), ds.spec.token_id("<|vision_end|>")
    config = _config("qwen2_5_vl", ds.image_token_id, ds.video_token_id, vs, ve)
    ids = s["input_ids"]
    types = (ids == ds.image_token_id).int() + 2 * (ids == ds.video_token_id).int()
    with torch.no_grad():
        ref, _ = transformers.Qwen2_5_VLModel(config).get_rope_index(
            ids[None], mm_token_type_ids=types[None], video_grid_thw=s["grid_thw"],
            second_per_grid_ts=s["second_per_grid_ts"])
    n = ids.numel()
    keep = n - 5
    slot = SampleSlot(index=i, ranks=(0, 1), cp_rank=0, num_tokens=keep, length=n, num_tokens_global=keep - 1,
                      epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1)
    collate = hf_collator(config, pad_token_id=ds.pad_token_id, mask_visual_labels=False)
    outs = [collate([(s, dataclasses.replace(slot, cp_rank=r))]) for r in range(2)]
    cu = [0, keep + (-keep) % 4]
    full = zigzag_unshard([o["mrope_position_ids"].T for o in outs], cu, 2).T
    assert torch.equal(full[:, :keep], ref[:, 0, :keep])


# Gap found by mutation testing in fcp_exec/integrations/hf_positions.py: a Qwen2.5-VL video sample WITHOUT
# ``second_per_grid_ts`` (a reader or dataset that does not record it). ``HFRopeIndex`` fills 1.0 per video, which is
# what the installed ``Qwen2_5_VLModel.get_rope_index`` itself assumes when it is given none; every test document in
# tests/exec/test_hf_positions.py carries the value, so a different default (mutation: 0.5) passed. Reference: the
# real model's ``get_rope_index`` on the same document with ``second_per_grid_ts=None``; integers, exact.
SPG_IMG, SPG_VID, SPG_VS, SPG_VE = 100, 101, 102, 103


def _spg_config():
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}
    text = dict(vocab_size=512, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, bos_token_id=1, eos_token_id=2, rope_parameters=rope)
    return transformers.Qwen2_5_VLConfig(
        text_config=text, vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                                             out_hidden_size=16, spatial_merge_size=2, tokens_per_second=2,
                                             fullatt_block_indexes=[0]),
        image_token_id=SPG_IMG, video_token_id=SPG_VID, vision_start_token_id=SPG_VS, vision_end_token_id=SPG_VE)


@pytest.mark.parametrize("grids", [[(4, 4, 4)], [(3, 4, 8), (2, 4, 4)]])
def test_video_without_second_per_grid_ts_matches_installed_model(grids):
    ids = [10, 11, 12]
    for t, h, w in grids:
        ids += [SPG_VS] + [SPG_VID] * (t * h * w // 4) + [SPG_VE] + [20, 21]
    ids = torch.tensor(ids)
    sample = {"input_ids": ids, "grid_thw": torch.tensor(grids)}  # no second_per_grid_ts
    config = _spg_config()
    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLModel(config).eval()
    with torch.no_grad():
        ref, _ = model.get_rope_index(ids[None], mm_token_type_ids=2 * (ids == SPG_VID).int()[None],
                                      video_grid_thw=torch.tensor(grids), second_per_grid_ts=None)
    got = HFRopeIndex(config)(sample, ids)
    assert torch.equal(got, ref[:, 0]), (got - ref[:, 0]).abs().max()
