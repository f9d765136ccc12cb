"""TRL's vision-language SFT lines: the images in an ``images`` column (paths, or Hugging Face ``Image`` cells
``{"bytes", "path"}`` in Parquet) and ``{"type": "image"}`` parts without a payload in the messages — or plain string
contents, the images then going before the first user turn's text — as TRL's ``prepare_multimodal_messages`` fills
them. Before, each such line was ``bad_messages`` ("an image part without a path"), and a line whose messages were
plain strings was indexed as text, its images silently dropped.

Reference: TRL's own ``prepare_multimodal_messages(messages, images)``, whose output (every image part holding its
file) is indexed in fcp's explicit spelling, which earlier tests hold equal to transformers' ``apply_chat_template``
(``test_chat_media.py``). Each TRL-form line must give the same sample as its TRL-filled spelling: ids, labels, pixel
values, grid, the index's counts and the sampler's visual layout. Counts that do not match are
``media_tag_mismatch`` (TRL raises on them too).
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_chat_media import _images
from test_index_sft import _write

from fcp_data import IndexedDataset
from fcp_data.index import build_index


def _rows(imgs: list[str]) -> list[dict]:
    """Placeholder parts (one image; two images in two turns), string contents (images prepended), ShareGPT-free."""
    q = lambda *parts: {"role": "user", "content": list(parts)}  # noqa: E731
    text = lambda s: {"type": "text", "text": s}  # noqa: E731
    a = {"role": "assistant", "content": [text("A cat.")]}
    return [{"id": "one", "images": [f"media/{imgs[0]}"], "messages": [q({"type": "image"}, text("What is it?")), a]},
            {"id": "two", "images": [f"media/{imgs[1]}", f"media/{imgs[0]}"],
             "messages": [q(text("Compare "), {"type": "image"}), a, q({"type": "image"}, text("and this?")),
                          {"role": "assistant", "content": [text("A dog.")]}]},
            {"id": "strings", "images": [f"media/{imgs[0]}"],
             "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is it?"},
                          {"role": "assistant", "content": "A cat."}]}]


def _trl_filled(row: dict) -> dict:
    """The line as TRL fills it: ``prepare_multimodal_messages`` puts each image into its part."""
    from trl.data_utils import prepare_multimodal_messages

    messages = prepare_multimodal_messages(copy.deepcopy(row["messages"]), list(row["images"]))
    return {"id": row["id"], "messages": messages}


def write_trl_rows(tmp_path, rows: list[dict], name: str) -> list[dict]:
    """``rows`` written to ``tmp_path / name``: jsonl, or Parquet in the Hub's form (Image cells with the bytes
    inline, message parts as structs; the lines whose contents are plain strings left out, one content type per
    column); returns the rows written."""
    if not name.endswith(".parquet"):
        _write(tmp_path / name, rows)
        return rows
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = [r for r in rows if r["id"] != "strings"]
    cells = [dict(r, images=[{"bytes": (tmp_path / p).read_bytes(), "path": None} for p in r["images"]]) for r in rows]
    pq.write_table(pa.Table.from_pylist(cells), tmp_path / name)
    return rows


@pytest.mark.parametrize("ext", ["jsonl", "parquet"])
def test_trl_image_lines_equal_their_trl_filled_spelling(tmp_path, ext):
    pytest.importorskip("trl")
    from fcp_data.visual_layout import IndexVisualLayout

    imgs = _images(tmp_path, [(60, 90), (112, 84)])
    rows = write_trl_rows(tmp_path, _rows(imgs), f"trl.{ext}")
    _write(tmp_path / "filled.jsonl", [_trl_filled(r) for r in rows])
    for name in (f"trl.{ext}", "filled.jsonl"):
        manifest, rc = build_index([str(tmp_path / name)], "qwen2.5-vl", tmp_path / f"idx-{name}",
                                   chat_field="messages", progress=False)
        assert rc == 0 and manifest["num_samples"] == len(rows), (name, manifest["errors_by_reason"])
    trl, ref = IndexedDataset(tmp_path / f"idx-trl.{ext}"), IndexedDataset(tmp_path / "idx-filled.jsonl")
    layout, vis = IndexVisualLayout(trl.index), torch.tensor(trl.placeholder_ids)
    for r in rows:
        i, j = (list(d.index.keys).index(r["id"]) for d in (trl, ref))
        a, b = trl[i], ref[j]
        assert a.keys() == b.keys() and int(trl.index.num_tokens[i]) == int(ref.index.num_tokens[j]), r["id"]
        for k in a:
            assert torch.equal(a[k], b[k]), (r["id"], k)
        assert int(trl.index.num_visual_tokens[i]) == int(torch.isin(a["input_ids"], vis).sum()) > 0
        n = len(a["input_ids"])
        assert all(layout(i, c) == int(torch.isin(a["input_ids"][1:c], vis).sum()) for c in range(1, n + 1, 13))


def test_trl_image_counts_that_do_not_match_are_recorded(tmp_path):
    """More image parts than images, fewer (some images unplaced), and ``image`` beside ``images``: one error each
    (``media_tag_mismatch``, ``bad_messages``), never a sample with an image lost or reused."""
    imgs = _images(tmp_path, [(60, 90), (112, 84)])
    part, text = {"type": "image"}, {"type": "text", "text": "What?"}
    a = {"role": "assistant", "content": "A cat."}
    rows = [{"id": "more_parts", "images": [f"media/{imgs[0]}"], "messages": [
                {"role": "user", "content": [part, part, text]}, a]},
            {"id": "fewer_parts", "images": [f"media/{imgs[0]}", f"media/{imgs[1]}"], "messages": [
                {"role": "user", "content": [part, text]}, a]},
            {"id": "both_keys", "image": f"media/{imgs[0]}", "images": [f"media/{imgs[1]}"], "messages": [
                {"role": "user", "content": [part, text]}, a]},
            {"id": "ok", "images": [f"media/{imgs[0]}"], "messages": [{"role": "user", "content": [part, text]}, a]}]
    _write(tmp_path / "trl.jsonl", rows)
    manifest, rc = build_index([str(tmp_path / "trl.jsonl")], "qwen2.5-vl", tmp_path / "idx", chat_field="messages",
                               progress=False, max_error_rate=1)
    assert rc == 0 and manifest["num_samples"] == 1
    assert manifest["errors_by_reason"] == {"media_tag_mismatch": 2, "bad_messages": 1}
