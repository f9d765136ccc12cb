"""Parquet inputs (``fcp index data.parquet``): a row is read as the same record in a jsonl line would be.

Reference: the same records written as jsonl (media as files) and indexed the same way — every sample's key,
counted tokens, visual tokens, ids, labels and pixel values must be equal, in any read order, with several row
groups per file, from DataLoader worker processes too. A failure means a Hugging Face dataset in Parquet would
train on other tokens than its jsonl export, or plan with lengths that are not the samples'.
"""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from test_index_sft import WORDS, _conversations, _rows, _write

from fcp_data import IndexedDataset
from fcp_data._resources import data_path
from fcp_data.index import build_index, summarize

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _both(tmp_path, name: str, rows: list[dict], jsonl_rows: list[dict] | None = None, spec: str = "text", **kw):
    """Index ``rows`` as Parquet (row groups of 5) and as jsonl; return both datasets."""
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet", row_group_size=5)
    _write(tmp_path / f"{name}.jsonl", jsonl_rows or rows)
    out = []
    for ext in ("parquet", "jsonl"):
        manifest, rc = build_index([str(tmp_path / f"{name}.{ext}")], spec, tmp_path / f"{name}-{ext}",
                                   progress=False, **kw)
        assert rc == 0 and not manifest["errors_by_reason"], manifest["errors_by_reason"]
        out.append(IndexedDataset(tmp_path / f"{name}-{ext}"))
    return out


def _assert_same(a: IndexedDataset, b: IndexedDataset) -> None:
    assert len(a) == len(b) > 0
    assert list(a.index.keys) == list(b.index.keys)
    for col in ("num_tokens", "num_visual_tokens", "kind"):
        np.testing.assert_array_equal(getattr(a.index, col), getattr(b.index, col))
    order = np.random.default_rng(0).permutation(len(a))  # random access across row groups
    for i in order:
        x, y = a[int(i)], b[int(i)]
        assert set(x) == set(y), a.index.keys[i]
        for k in x:
            assert torch.equal(x[k], y[k]), (a.index.keys[i], k)
        assert len(x["input_ids"]) == int(a.index.num_tokens[i])


def test_text_prompt_and_chat_rows_equal_their_jsonl(tmp_path):
    """Plain text, prompt/response SFT and chat conversations — role/content and ShareGPT turns mixed in one file,
    so Arrow gives every turn every field (None where absent)."""
    rng = np.random.default_rng(1)
    text = [{"id": f"t{i}", "text": " ".join(rng.choice(WORDS, int(rng.integers(1, 80))))} for i in range(17)]
    _assert_same(*_both(tmp_path, "text", text))
    _assert_same(*_both(tmp_path, "sft", _rows(13, seed=3), text_field="response", prompt_field="prompt"))
    chats = _conversations(14, seed=9)
    for r in chats[::2]:
        r["messages"] = [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]), "value": m["content"]}
                         for m in r["messages"]]
    a, b = _both(tmp_path, "chat", chats, chat_field="messages")
    _assert_same(a, b)
    assert a.has_labels


def test_media_rows_with_embedded_bytes_equal_jsonl_with_files(tmp_path):
    """LLaVA rows as a Hugging Face dataset stores them: the image/video cell ``{"bytes", "path"}`` (and a few rows
    naming a file instead; a text-only row with null cells), against jsonl lines naming the same files."""
    from PIL import Image

    (tmp_path / "media").mkdir()
    with tarfile.open(data_path("samples") / "wds" / "shard-000000.tar") as t:
        clips = [m for m in t.getnames() if m.endswith(".mp4")][:3]
        for m in clips:
            (tmp_path / "media" / m).write_bytes(t.extractfile(m).read())
    rng = np.random.default_rng(2)
    imgs = []
    for k, (h, w) in enumerate([(60, 90), (224, 224), (33, 300), (120, 80)]):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
        (tmp_path / "media" / f"i{k}.png").write_bytes(buf.getvalue())
        imgs.append(f"i{k}.png")
    files = [("video", c) for c in clips] + [("image", i) for i in imgs]
    pq_rows, js_rows = [], []
    for k, (kind, name) in enumerate(files):
        turns = [{"from": "human", "value": f"<{kind}>\n" + " ".join(rng.choice(WORDS, 4))},
                 {"from": "gpt", "value": " ".join(rng.choice(WORDS, int(rng.integers(2, 9))))}]
        cell = {"bytes": (tmp_path / "media" / name).read_bytes(), "path": name} if k % 3 else \
            {"bytes": None, "path": f"media/{name}"}
        other = "image" if kind == "video" else "video"
        pq_rows.append({"id": f"m{k}", kind: cell, other: None, "conversations": turns})
        js_rows.append({"id": f"m{k}", kind: f"media/{name}", "conversations": turns})
    talk = [{"from": "human", "value": "hello"}, {"from": "gpt", "value": "hi there"}]  # no media: null cells
    pq_rows.append({"id": "talk", "video": None, "image": None, "conversations": talk})
    js_rows.append({"id": "talk", "conversations": talk})
    a, b = _both(tmp_path, "media", pq_rows, js_rows, spec="qwen2.5-vl", chat_field="conversations")
    _assert_same(a, b)
    assert a.index.manifest["kinds"] == {"video": 3, "image": 4, "text": 1}
    # DataLoader workers (forked) read the Parquet rows themselves
    loader = torch.utils.data.DataLoader(a, batch_size=None, num_workers=2)
    assert [x["input_ids"].tolist() for x in loader] == [a[i]["input_ids"].tolist() for i in range(len(a))]


def test_bad_parquet_inputs_are_recorded(tmp_path, monkeypatch):
    """A file that is not Parquet is one unreadable_shard error and the other inputs are indexed; a row past
    --max-text-bytes and a row without the text field are one error each; without pyarrow, one clear error."""
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 this is not parquet")
    rows = [{"id": "a", "text": "hello there"}, {"id": "big", "text": "x " * 5000}, {"id": "none", "text": None}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "ok.parquet")
    manifest, rc = build_index([str(tmp_path / "junk.parquet"), str(tmp_path / "ok.parquet")], "text",
                               tmp_path / "idx", progress=False, max_error_rate=1.0, limits={"max_text_bytes": 4096})
    assert manifest["num_samples"] == 1 and manifest["num_seen"] == 4
    assert manifest["errors_by_reason"] == {"missing_field": 1, "text_too_large": 1, "unreadable_shard": 1}
    assert "indexed 1 samples of 4 seen" in summarize(manifest)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "pyarrow" else real(n, *a))
    with pytest.raises(ValueError, match=r"reading \.parquet/\.arrow needs pyarrow"):
        build_index([str(tmp_path / "ok.parquet")], "text", tmp_path / "x", progress=False)


def _corrupt_row_group(path, rg: int) -> None:
    """Flip the bytes of row group ``rg``'s text column (snappy then fails to decode it)."""
    c = pq.ParquetFile(path).metadata.row_group(rg).column(1)
    off = c.dictionary_page_offset or c.data_page_offset
    b = bytearray(path.read_bytes())
    for k in range(off + 20, off + c.total_compressed_size - 4):
        b[k] ^= 0x5A
    path.write_bytes(bytes(b))


def test_rows_are_read_from_the_index_records_file(tmp_path):
    """The index keeps an Arrow copy of the rows (random access without decoding a row group per sample): reads
    equal the jsonl reference with the Parquet file gone; without the copy, they come from the Parquet file again.
    A row group that cannot be decoded is one error per row, and the rows after it still read as theirs."""
    rng = np.random.default_rng(4)
    rows = [{"id": f"r{i}", "text": " ".join(rng.choice(WORDS, int(rng.integers(3, 40))))} for i in range(40)]
    a, b = _both(tmp_path, "t", rows)
    rec = tmp_path / "t-parquet" / "records" / "000000-000000000000.arrow"
    assert rec.is_file()
    (tmp_path / "t.parquet").rename(tmp_path / "t.parquet.bak")
    _assert_same(IndexedDataset(tmp_path / "t-parquet"), b)
    (tmp_path / "t.parquet.bak").rename(tmp_path / "t.parquet")
    rec.unlink()
    _assert_same(IndexedDataset(tmp_path / "t-parquet"), b)
    _corrupt_row_group(tmp_path / "t.parquet", 1)  # rows 5..9
    manifest, rc = build_index([str(tmp_path / "t.parquet")], "text", tmp_path / "bad", progress=False,
                               max_error_rate=1.0)
    assert manifest["errors_by_reason"] == {"unreadable_member": 5} and manifest["num_samples"] == 35
    bad = IndexedDataset(tmp_path / "bad")
    assert [k for k in bad.index.keys] == [f"r{i}" for i in range(40) if not 5 <= i < 10]
    for i, k in enumerate(bad.index.keys):
        assert torch.equal(bad[i]["input_ids"], b[list(b.index.keys).index(k)]["input_ids"]), k


@pytest.mark.parametrize("fmt", ["stream", "file"])
def test_hugging_face_arrow_files_equal_their_jsonl(tmp_path, fmt):
    """``.arrow`` files as Hugging Face datasets write them (``save_to_disk``: the IPC stream format; also the IPC
    file format), several record batches: the same samples as the records in jsonl, from the index's copy and, with
    the copy gone, from the Arrow file itself."""
    rows = _conversations(23, seed=6)
    table = pa.Table.from_pylist(rows)
    new = pa.ipc.new_stream if fmt == "stream" else pa.ipc.new_file
    with new(str(tmp_path / "data-00000-of-00001.arrow"), table.schema) as w:
        for b in table.to_batches(max_chunksize=4):
            w.write_batch(b)
    _write(tmp_path / "c.jsonl", rows)
    kw = dict(chat_field="messages", progress=False)
    build_index([str(tmp_path / "data-00000-of-00001.arrow")], "text", tmp_path / "a", **kw)
    build_index([str(tmp_path / "c.jsonl")], "text", tmp_path / "j", **kw)
    ref = IndexedDataset(tmp_path / "j")
    _assert_same(IndexedDataset(tmp_path / "a"), ref)
    (tmp_path / "a" / "records" / "000000-000000000000.arrow").unlink()
    _assert_same(IndexedDataset(tmp_path / "a"), ref)


def test_a_big_file_is_indexed_by_several_tasks(tmp_path, monkeypatch):
    """Tasks of whole row groups (TASK_ROWS lowered to 10: 4 tasks over 10 row groups of 4 rows), run by 2 worker
    processes: the same samples as the jsonl, one copy per task; a deleted copy's rows come from the file again."""
    import fcp_data.index.parquet as pqmod

    monkeypatch.setattr(pqmod, "TASK_ROWS", 10)
    rng = np.random.default_rng(8)
    rows = [{"id": f"r{i}", "text": " ".join(rng.choice(WORDS, int(rng.integers(2, 30))))} for i in range(40)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "big.parquet", row_group_size=4)
    assert pqmod.parquet_pieces(tmp_path / "big.parquet") == [(0, 3, 0), (3, 6, 12), (6, 9, 24), (9, 10, 36)]
    _write(tmp_path / "big.jsonl", rows)
    manifest, _ = build_index([str(tmp_path / "big.parquet")], "text", tmp_path / "p", progress=False, workers=2)
    build_index([str(tmp_path / "big.jsonl")], "text", tmp_path / "j", progress=False)
    assert manifest["num_tasks"] == 4
    copies = pqmod.records_of(tmp_path / "p", 0)
    assert [f for f, _ in copies] == [0, 12, 24, 36]
    ref = IndexedDataset(tmp_path / "j")
    _assert_same(IndexedDataset(tmp_path / "p"), ref)
    copies[1][1].unlink()
    _assert_same(IndexedDataset(tmp_path / "p"), ref)


def test_a_null_typed_field_inside_a_list_of_structs_indexes(tmp_path):
    """A field that is null in every row (pyarrow writes it with type ``null``: a turn's ``name``, an Image cell's
    ``path`` when its bytes are inline) inside a list of structs: pyarrow's Parquet reader returns that child shorter
    than its struct, and the records copy's cast refused the whole row group — the file was one ``shard_failed``.
    Now every row is a sample, read back equal to the jsonl spelling of the same lines."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": f"question {i}", "name": None},
                                         {"role": "assistant", "content": "answer " * (i + 1), "name": None},
                                         {"role": "user", "content": "more?", "name": None},
                                         {"role": "assistant", "content": "no", "name": None}][: 2 + 2 * (i % 2)]}
            for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    assert str(pq.read_schema(tmp_path / "chat.parquet").field("messages").type.value_type.field("name").type) == "null"
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for ext in ("parquet", "jsonl"):
        manifest, rc = build_index([str(tmp_path / f"chat.{ext}")], "text", tmp_path / f"idx-{ext}",
                                   chat_field="messages", progress=False)
        assert rc == 0 and manifest["num_samples"] == 5, (ext, manifest["errors_by_reason"])
    a, b = IndexedDataset(tmp_path / "idx-parquet"), IndexedDataset(tmp_path / "idx-jsonl")
    for i in range(5):
        assert a[i]["input_ids"].tolist() == b[i]["input_ids"].tolist(), i
        assert a[i]["labels"].tolist() == b[i]["labels"].tolist(), i
