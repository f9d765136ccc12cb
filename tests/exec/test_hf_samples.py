"""Qwen-VL samples in a Hugging Face processor's format, made into FCP's (``fcp_exec.integrations.hf_samples``).

Reference: samples written out here in FCP's format — one ``grid_thw`` row per image/video in order of appearance,
their patches in that order, each row's patches holding distinct values — and split into the processor's format by
this file's own code (images and videos apart). Converting back must give the reference exactly, for Qwen2/2.5-VL
layouts (one placeholder run per image or video) and Qwen3-VL's (a video as one run per frame group, timestamp text
between), images and videos interleaved in every order. Placeholder runs are checked against a plain Python scan, on
lists and on a ``datasets.Dataset`` (Arrow), rows that begin and end with placeholders included. A sample whose
grids, patches and placeholders disagree is a ``MalformedSampleError`` naming it, and inside ``FCPDataset`` a
skipped sample, not the end of the run. The training equivalence (FCPTrainer on such samples against the stock model
called on them) is ``test_hf_trainer.py::test_processor_format_samples_train_like_the_stock_model_on_them``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from _requires import transformers_models
import torch

from fcp_data.slots import FCPDataset, MalformedSampleError, MicroBatchMeta, SampleSlot
from fcp_exec.integrations.hf_samples import HFSamples, fcp_sample, placeholder_spans, strip_padding

IMG, VID, VS, VE, MERGE, DIM = 4, 5, 2, 3, 2, 6
ROOT = Path(__file__).resolve().parents[2]
CONFIG = SimpleNamespace(image_token_id=IMG, video_token_id=VID, vision_config=SimpleNamespace(spatial_merge_size=MERGE))


def _build(items, frame_groups: bool = False) -> tuple[dict, dict]:
    """items: ("text", n) | ("image", (t, h, w)) | ("video", (t, h, w), seconds). ``(FCP's sample, processor's)``."""
    ids, rows, chunks, spg = [], [], [], []
    split = {"image": ([], []), "video": ([], [])}
    for k, it in enumerate(items):
        if it[0] == "text":
            ids += [10 + (k + i) % 50 for i in range(it[1])]
            continue
        t, h, w = it[1]
        tok, per = (IMG, t * h * w // MERGE ** 2) if it[0] == "image" else (VID, h * w // MERGE ** 2)
        if it[0] == "video" and frame_groups:
            for g in range(t):
                ids += [60 + g, VS] + [tok] * per + [VE]
        else:
            ids += [VS] + [tok] * (t * h * w // MERGE ** 2) + [VE]
        patch = torch.arange(t * h * w * DIM, dtype=torch.float64).reshape(-1, DIM) + 1000.0 * len(rows)
        rows.append([t, h, w])
        chunks.append(patch)
        split[it[0]][0].append([t, h, w])
        split[it[0]][1].append(patch)
        if it[0] == "video":
            spg.append(it[2])
    fcp = {"input_ids": torch.tensor(ids), "grid_thw": torch.tensor(rows).reshape(-1, 3), "pixel_values": torch.cat(chunks)}
    proc = {"input_ids": ids, "attention_mask": [1] * len(ids)}
    for kind, (pix, grid) in (("image", ("pixel_values", "image_grid_thw")), ("video", ("pixel_values_videos",
                                                                                      "video_grid_thw"))):
        if split[kind][0]:
            proc[grid] = torch.tensor(split[kind][0])
            proc[pix] = torch.cat(split[kind][1])
    if spg:
        fcp["second_per_grid_ts"] = torch.tensor(spg, dtype=torch.float64)
        proc["second_per_grid_ts"] = spg
    return fcp, proc


ORDERS = [
    [("text", 3), ("video", (2, 4, 4), 1.0), ("text", 2), ("image", (1, 4, 6))],
    [("image", (1, 2, 2)), ("video", (4, 2, 4), 0.5), ("image", (1, 4, 4)), ("text", 1), ("video", (2, 2, 2), 2.0)],
    [("text", 2), ("image", (1, 4, 4)), ("image", (1, 2, 4)), ("text", 2)],
    [("video", (2, 4, 4), 1.5), ("video", (6, 2, 2), 1.0), ("text", 4)],
]


@pytest.mark.parametrize("frame_groups", [False, True], ids=["qwen2-layout", "qwen3-frame-groups"])
@pytest.mark.parametrize("order", range(len(ORDERS)))
def test_a_processor_sample_becomes_the_fcp_sample_in_order_of_appearance(order, frame_groups):
    want, proc = _build(ORDERS[order], frame_groups)
    got = fcp_sample(proc, image_token_id=IMG, video_token_id=VID, merge=MERGE)
    assert got["grid_thw"].tolist() == want["grid_thw"].tolist()
    assert torch.equal(got["pixel_values"], want["pixel_values"])
    assert list(got["input_ids"]) == want["input_ids"].tolist()
    if "second_per_grid_ts" in want:
        assert torch.equal(got["second_per_grid_ts"], want["second_per_grid_ts"])
    assert not {"attention_mask", "image_grid_thw", "video_grid_thw", "pixel_values_videos"} & set(got)


def test_pixel_values_as_a_list_of_per_image_arrays_are_concatenated():
    """Some pipelines keep one patch array per image or video: the same sample as with one concatenated array."""
    want, proc = _build(ORDERS[1])
    sizes = [t * h * w for t, h, w in proc["image_grid_thw"].tolist()]
    split = dict(proc, pixel_values=[c.numpy() for c in torch.split(proc["pixel_values"], sizes)],
                 pixel_values_videos=list(torch.split(proc["pixel_values_videos"], [32, 8])))
    got = fcp_sample(split, image_token_id=IMG, video_token_id=VID, merge=MERGE)
    assert got["grid_thw"].tolist() == want["grid_thw"].tolist()
    assert torch.equal(got["pixel_values"], want["pixel_values"])


def test_text_and_fcp_samples_pass_unchanged():
    fcp, _ = _build(ORDERS[0])
    text = {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1]}
    for sample in (fcp, text, [1, 2, 3]):
        assert fcp_sample(sample, image_token_id=IMG, video_token_id=VID, merge=MERGE) is sample


def _broken(change):
    _, proc = _build(ORDERS[1])
    change(proc)
    return proc


@pytest.mark.parametrize("change, message", [
    (lambda p: p.update(image_grid_thw=torch.cat([p["image_grid_thw"], torch.tensor([[1, 2, 2]])]),
                        pixel_values=torch.cat([p["pixel_values"], torch.zeros(4, DIM)])),
     r"has 3 image grid row\(s\) but placeholder tokens for 2"),
    (lambda p: p.update(image_grid_thw=p["image_grid_thw"][:1], pixel_values=p["pixel_values"][:4]),
     r"has more image placeholder tokens than its 1 image grid row\(s\) hold"),
    (lambda p: p.update(pixel_values_videos=p["pixel_values_videos"][:-1]),
     r"video pixel values of shape \(39, 6\) do not hold the 40 patch rows"),
    (lambda p: p.update(video_grid_thw=torch.tensor([[4, 2, 4], [1, 4, 4]]), pixel_values_videos=torch.zeros(48, DIM)),
     r"has a video grid row \[1, 4, 4\] .* = 4 placeholder tokens\) that does not match its placeholders"),
    (lambda p: p.update(video_grid_thw=torch.tensor([[5, 2, 4], [2, 2, 2]]), pixel_values_videos=torch.zeros(48, DIM)),
     r"has a video grid row \[5, 2, 4\] .* = 10 placeholder tokens\) that does not match its placeholders from "
     r"visual token 1 on"),  # 10 video tokens where the 9th is an image's
    (lambda p: p.update(video_grid_thw=torch.tensor([[2, 2, 4], [1, 2, 4]]), pixel_values_videos=torch.zeros(24, DIM)),
     r"has more video placeholder tokens than its 2 video grid row\(s\) hold"),
    (lambda p: p.update(input_ids=[p["input_ids"]]), r"has input_ids of shape \(1, \d+\); a sample's ids are 1-D"),
    (lambda p: p.update(grid_thw=[[1, 2, 2]]), "has both grid_thw"),
    (lambda p: p.pop("pixel_values"), r"has 2 image grid row\(s\) but no image pixel values"),
    (lambda p: p.update(image_grid_thw=None), r"has image pixel values \(20 rows\) but no image grid rows"),
])
def test_a_sample_whose_grids_and_placeholders_disagree_is_malformed(change, message):
    with pytest.raises(MalformedSampleError, match=message):
        fcp_sample(_broken(change), image_token_id=IMG, video_token_id=VID, merge=MERGE)


def test_inside_fcp_dataset_a_malformed_processor_sample_is_skipped_not_fatal():
    good, bad = _build(ORDERS[0])[1], _broken(lambda p: p.pop("pixel_values"))
    ds = FCPDataset(HFSamples([good, bad], CONFIG), vocab_size=100)
    meta = MicroBatchMeta(ranks=(0,), cp_rank=0, epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1,
                          num_tokens_global=1)
    ok, _ = ds[SampleSlot(index=0, num_tokens=len(good["input_ids"]), length=len(good["input_ids"]), meta=meta)]
    assert ok["grid_thw"].tolist() == [[2, 4, 4], [1, 4, 6]]
    sk, _ = ds[SampleSlot(index=1, num_tokens=len(bad["input_ids"]), length=len(bad["input_ids"]), meta=meta)]
    assert type(sk).__name__ == "SkippedSample" and sk.reason == "MalformedSampleError", sk


def _scan(ids: list[int]) -> tuple[tuple[int, int], ...]:
    runs, k = [], 0
    while k < len(ids):
        if ids[k] in (IMG, VID):
            start = k
            while k < len(ids) and ids[k] in (IMG, VID):
                k += 1
            runs.append((start, k - start))
        else:
            k += 1
    return tuple(runs)


def test_placeholder_runs_of_lists_and_arrow_datasets_equal_a_plain_scan():
    """Random rows drawn hard: rows that start or end with a placeholder next to rows that do too (a run must not
    cross two samples), rows of placeholders only, single-token rows, image and video tokens adjacent."""
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    rows = [[int(v) for v in rng.choice([IMG, VID, 7, 8], size=int(rng.integers(1, 12)), p=[.35, .35, .15, .15])]
            for _ in range(300)]
    rows += [[IMG] * 5, [VID], [7], [IMG, 7, VID], [7, IMG], [VID, 7]]
    want = [_scan(r) for r in rows]
    assert any(r[0] in (IMG, VID) and p[-1] in (IMG, VID) for p, r in zip(rows, rows[1:]))
    assert placeholder_spans([{"input_ids": r} for r in rows], (IMG, VID)) == want
    arrow = datasets.Dataset.from_dict({"input_ids": rows, "other": list(range(len(rows)))})
    assert placeholder_spans(arrow, (IMG, VID)) == want
    assert placeholder_spans(arrow.select(range(len(rows) - 1, -1, -1)), (IMG, VID)) == want[::-1]


@pytest.mark.parametrize("fmt", [None, "numpy", "torch"])
def test_a_datasets_row_without_images_or_videos_converts_in_every_format(fmt, tmp_path):
    """A ``datasets.Dataset`` with ``Array2D`` pixel columns (how a processor's output is usually stored) reads a
    missing image or video as NaN (a float, a 0-d array or tensor, by format), not None: text rows, image-only and
    video-only rows convert to the reference all the same, in the default, ``numpy`` and ``torch`` formats."""
    datasets = pytest.importorskip("datasets")
    docs = [[("text", 6)], ORDERS[2], ORDERS[3], ORDERS[1]]
    built = [_build(d) if len(d) > 1 else ({"input_ids": torch.tensor(_text_ids(6))}, {"input_ids": _text_ids(6)})
             for d in docs]
    features = datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int64")),
        "pixel_values": datasets.Array2D(shape=(None, DIM), dtype="float64"),
        "image_grid_thw": datasets.Sequence(datasets.Sequence(datasets.Value("int64"), length=3)),
        "pixel_values_videos": datasets.Array2D(shape=(None, DIM), dtype="float64"),
        "video_grid_thw": datasets.Sequence(datasets.Sequence(datasets.Value("int64"), length=3)),
        "second_per_grid_ts": datasets.Sequence(datasets.Value("float64"))})
    columns = {k: [None if p.get(k) is None else np.asarray(p[k]).tolist() if k != "input_ids" else list(p[k])
                   for _, p in built] for k in features}
    ds = datasets.Dataset.from_dict(columns, features=features)
    ds = ds if fmt is None else ds.with_format(fmt)
    for (want, _), row in zip(built, HFSamples(ds, CONFIG)):
        assert [int(t) for t in row["input_ids"]] == want["input_ids"].tolist()
        if "grid_thw" not in want:
            assert not {"grid_thw", "pixel_values", "pixel_values_videos"} & set(row), sorted(row)
            continue
        assert row["grid_thw"].tolist() == want["grid_thw"].tolist()
        assert torch.equal(torch.as_tensor(row["pixel_values"]), want["pixel_values"])


def _text_ids(n: int) -> list[int]:
    return [10 + i for i in range(n)]


@pytest.mark.parametrize("sample, want", [
    ({"input_ids": [5, 6, 7, 0, 0], "attention_mask": [1, 1, 1, 0, 0], "labels": [5, 6, 7, 0, 0]},
     {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [5, 6, 7]}),  # right padding, pads in labels
    ({"input_ids": [0, 0, 5, 6], "attention_mask": [0, 0, 1, 1], "text": "kept"},
     {"input_ids": [5, 6], "attention_mask": [1, 1], "text": "kept"}),  # left padding; other keys untouched
    ({"input_ids": torch.tensor([5, 6, 0]), "attention_mask": torch.tensor([1, 1, 0]),
      "token_type_ids": torch.tensor([0, 1, 0])},
     {"input_ids": [5, 6], "attention_mask": [1, 1], "token_type_ids": [0, 1]}),  # tensors
])
def test_padding_is_stripped_to_the_attended_tokens(sample, want):
    got = strip_padding(sample)
    assert {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in got.items()} == want
    unpadded = {"input_ids": [5, 6], "attention_mask": [1, 1]}
    assert strip_padding(unpadded) is unpadded and strip_padding({"input_ids": [5]}) == {"input_ids": [5]}


@pytest.mark.parametrize("sample, message", [
    ({"input_ids": [5, 6, 7, 8], "attention_mask": [1, 0, 1, 1]}, "whose ones are not one run"),
    ({"input_ids": [5, 6, 7], "attention_mask": [1, 1]}, r"has an attention_mask of 2 for 3 input_ids"),
])
def test_a_mask_that_is_not_padding_is_malformed(sample, message):
    with pytest.raises(MalformedSampleError, match=message):
        strip_padding(sample)


def test_counts_and_placeholder_runs_of_a_padded_dataset_are_those_of_its_attended_tokens():
    """Token counts (what the sampler plans with) and placeholder runs of padded rows — Arrow and list, left and right
    padding, a visual sample among them — equal those of the same rows unpadded."""
    datasets = pytest.importorskip("datasets")
    from fcp_exec.integrations.hf_trainer_data import count_lengths

    plain = [[7, 8, IMG, IMG, 9], [10, 11], [VID, VID, VID, 12, 13, 14]]
    rows, width = [], 8
    for k, ids in enumerate(plain):
        pad = [0] * (width - len(ids))
        ids_p, mask = (ids + pad, [1] * len(ids) + [0] * len(pad)) if k % 2 == 0 else \
            (pad + ids, [0] * len(pad) + [1] * len(ids))
        rows.append({"input_ids": ids_p, "attention_mask": mask})
    want_counts, want_runs = [len(r) for r in plain], [_scan(r) for r in plain]
    arrow = datasets.Dataset.from_list(rows)
    for data in (rows, arrow):
        assert list(count_lengths(data)) == want_counts
        assert placeholder_spans(data, (IMG, VID)) == want_runs


def test_the_real_image_processors_output_gives_the_stock_models_logits():
    """Two images through transformers' own Qwen2-VL image processor (``Qwen2VLImageProcessorPil``), the text
    expanded as ``Qwen2_5_VLProcessor`` expands it (its video processor needs torchvision, absent here): the stock
    Qwen2.5-VL called on those keys and the model fed FCP's converted sample (``hf_data._doc_forward``, the
    one-document path of the training references) give the same logits exactly."""
    tr = transformers_models()
    from fcp_exec.integrations.hf import build_model, load_config
    from fcp_exec.integrations.hf_data import _doc_forward

    config = load_config(ROOT / "examples" / "configs" / "qwen2_5_vl-tiny.json")
    proc = tr.Qwen2VLImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)
    rng = np.random.default_rng(0)
    images = proc(images=[(rng.random((56, 84, 3)) * 255).astype(np.uint8),
                          (rng.random((84, 56, 3)) * 255).astype(np.uint8)], return_tensors="pt")
    ids = [12, 13, VS]
    for k, g in enumerate(images["image_grid_thw"].tolist()):
        ids += [config.image_token_id] * (g[0] * g[1] * g[2] // MERGE ** 2) + [VE] + ([14, VS] if k == 0 else [15])
    ids = torch.tensor(ids)
    sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids), **images,
              "mm_token_type_ids": (ids == config.image_token_id).long()}
    model = build_model(config, dtype=torch.float64, seed=0)
    with torch.no_grad():
        want = model(input_ids=ids[None], pixel_values=sample["pixel_values"], use_cache=False,
                     image_grid_thw=sample["image_grid_thw"], mm_token_type_ids=sample["mm_token_type_ids"][None]).logits[0]
        got = _doc_forward(model, HFSamples([sample], config)[0], True)
    assert images["image_grid_thw"].tolist() == [[1, 4, 6], [1, 6, 4]]
    assert torch.equal(got, want)
