"""Megatron indexed datasets (``.bin``/``.idx``) as FCP input (``fcp_data.megatron_indexed``).

Reference: megatron-core's own writer (``IndexedDatasetBuilder``) and reader (``IndexedDataset``) — every document's
token count and tokens equal what Megatron reads (its sequences concatenated), for token dtypes uint16 / int32 /
int64, documents of one and of several sequences, and empty documents (left out, counted in a warning). Then the
samples through FCPSampler → FCPDataset → FCPCollator come out as the documents' tokens, and ``load_lengths`` on the
``.idx`` (what ``fcp plan/compare/simulate --lengths`` read) equals the samples' counts. Hostile files (no megatron-core
needed: the bytes are written here): a wrong header, version or dtype code, a truncated ``.idx``, broken document
boundaries, a document whose sequences are not contiguous, a missing ``.bin`` — one clear error each; a truncated
``.bin`` — a warning naming the documents past its end, which fail to read and are skipped by ``FCPDataset``.
"""

from __future__ import annotations

import importlib.util
import struct

import numpy as np
import pytest
import torch

from fcp_data.megatron_indexed import MegatronIndexedDocuments, is_megatron_index, megatron_document_lengths
from fcp_data.workloads import load_lengths

HAVE_MEGATRON = importlib.util.find_spec("megatron") is not None


def _documents(seed: int, vocab: int) -> list[list[list[int]]]:
    """Documents as lists of sequences of token ids; some of several sequences, one empty, one of one token."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(24):
        parts = 1 if d % 3 else int(rng.integers(2, 5))
        docs.append([rng.integers(0, vocab, int(rng.integers(1, 60))).tolist() for _ in range(parts)])
    docs[5] = [[]]  # an empty document
    docs[7] = [[int(vocab - 1)]]  # one token, the largest id
    return docs


def _write_with_megatron(prefix, docs, dtype) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        flat = [t for seq in doc for t in seq]
        builder.add_document(torch.tensor(flat, dtype=torch.int64), [len(seq) for seq in doc])
    builder.finalize(f"{prefix}.idx")


@pytest.mark.skipif(not HAVE_MEGATRON, reason="needs megatron-core (the reference writer and reader)")
@pytest.mark.parametrize("dtype, vocab", [(np.uint16, 65_000), (np.int32, 150_000), (np.int64, 300_000)])
def test_documents_equal_what_megatron_reads(tmp_path, dtype, vocab):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    prefix = tmp_path / "corpus_text_document"
    docs = _documents(int(np.dtype(dtype).itemsize), vocab)
    _write_with_megatron(prefix, docs, dtype)
    ref = IndexedDataset(str(prefix))
    bounds = ref.document_indices
    want = [np.concatenate([ref[k] for k in range(bounds[d], bounds[d + 1])] or [np.zeros(0)]).astype(np.int64)
            for d in range(len(bounds) - 1)]
    assert [w.tolist() for w in want] == [[t for seq in doc for t in seq] for doc in docs]  # the reference itself
    with pytest.warns(UserWarning, match="1 empty document"):
        got = MegatronIndexedDocuments(prefix)
    assert len(got) == len(docs) - 1 and got.document_ids.tolist() == [d for d in range(len(docs)) if d != 5]
    for i, d in enumerate(got.document_ids):
        sample = got[i]["input_ids"]
        assert sample.dtype == torch.int64 and sample.tolist() == want[d].tolist(), d
        assert got.num_tokens[i] == len(want[d])
    assert megatron_document_lengths(prefix).tolist() == [len(w) for w in want]
    assert is_megatron_index(prefix) and is_megatron_index(f"{prefix}.idx") and not is_megatron_index(tmp_path / "x")


@pytest.mark.skipif(not HAVE_MEGATRON, reason="needs megatron-core (the reference writer)")
def test_samples_flow_through_the_sampler_and_collator(tmp_path):
    import pickle

    from torch.utils.data import DataLoader

    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler

    prefix = tmp_path / "c"
    docs = _documents(0, 1000)
    _write_with_megatron(prefix, docs, np.uint16)
    with pytest.warns(UserWarning, match="empty"):
        data = MegatronIndexedDocuments(prefix)
        lengths = load_lengths(f"{prefix}.idx")
    assert lengths.tolist() == data.num_tokens.tolist()
    clone = pickle.loads(pickle.dumps(data))  # a spawned DataLoader worker: maps the file again
    assert all(clone[i]["input_ids"].tolist() == data[i]["input_ids"].tolist() for i in range(len(data)))
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=128)
    seen = {}
    for rank in range(2):
        sampler = FCPSampler(data, num_ranks=2, rank=rank, global_batch_size=4, seed=0, cost_model=cost)
        for batch in DataLoader(FCPDataset(data), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0)):
            if batch["ranks"] == (rank,):  # a degree-1 group: this rank holds its documents whole, in order
                cu = batch["cu_seqlens"].tolist()
                for j, i in enumerate(batch["sample_indices"]):
                    seen[i] = batch["input_ids"][cu[j]:cu[j] + int(data.num_tokens[i])].tolist()
    assert seen and all(toks == data[i]["input_ids"].tolist() for i, toks in seen.items())


# ------------------------------------------------------------------ hostile files (bytes written here)

def _raw_index(seq_lengths, doc_bounds, *, code=8, version=1, header=b"MMIDIDX\x00\x00", size=2, pointers=None):
    seq = np.asarray(seq_lengths, dtype=np.int32)
    ptr = np.concatenate([[0], np.cumsum(seq.astype(np.int64) * size)[:-1]]) if pointers is None else pointers
    return (header + struct.pack("<QBQQ", version, code, len(seq), len(doc_bounds)) + seq.tobytes()
            + np.asarray(ptr, dtype=np.int64).tobytes() + np.asarray(doc_bounds, dtype=np.int64).tobytes())


def _write_raw(tmp_path, idx: bytes, bin_tokens: int = 100):
    prefix = tmp_path / "h"
    (tmp_path / "h.idx").write_bytes(idx)
    (tmp_path / "h.bin").write_bytes(np.arange(bin_tokens, dtype=np.uint16).tobytes())
    return prefix


GOOD = dict(seq_lengths=[10, 20, 5], doc_bounds=[0, 1, 3])
HOSTILE = {
    "header": (dict(GOOD, header=b"NOTANIDX\x00"), "no MMIDIDX header"),
    "version": (dict(GOOD, version=2), "index version 2"),
    "dtype code": (dict(GOOD, code=9), "dtype code 9"),
    "boundaries": (dict(seq_lengths=[10, 20, 5], doc_bounds=[0, 2, 1, 3]), "non-decreasing run from 0 to 3"),
    "last boundary": (dict(seq_lengths=[10, 20, 5], doc_bounds=[0, 1, 2]), "non-decreasing run from 0 to 3"),
    "not contiguous": (dict(GOOD, pointers=[0, 20, 100]), "not contiguous"),
    "negative length": (dict(seq_lengths=[10, -20, 5], doc_bounds=[0, 1, 3]), "negative"),
    # the ids would be cast (1.7 -> 1) or read across token boundaries (garbage), silently
    "float tokens": (dict(GOOD, code=7), "dtype code 7 is float32: token ids are integers"),
    "float64 tokens": (dict(GOOD, code=6), "dtype code 6 is float64"),
    "mid-token offset": (dict(seq_lengths=[3], doc_bounds=[0, 1], pointers=[1]), "not a multiple of the token size"),
    "offset overflow": (dict(seq_lengths=[10], doc_bounds=[0, 1], pointers=[2**63 - 4]), "offset beyond"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_broken_index_is_one_clear_error(tmp_path, case):
    kwargs, phrase = HOSTILE[case]
    prefix = _write_raw(tmp_path, _raw_index(**kwargs))
    with pytest.raises(ValueError, match=phrase) as err:
        MegatronIndexedDocuments(prefix)
    assert str(tmp_path / "h.idx") in str(err.value)
    with pytest.raises(ValueError, match=phrase):
        load_lengths(tmp_path / "h.idx")


def test_a_truncated_index_and_missing_files(tmp_path):
    full = _raw_index(**GOOD)
    prefix = _write_raw(tmp_path, full[:-5])
    with pytest.raises(ValueError, match="truncated"):
        MegatronIndexedDocuments(prefix)
    _write_raw(tmp_path, full)
    (tmp_path / "h.bin").unlink()
    with pytest.raises(FileNotFoundError, match="h.bin"):
        MegatronIndexedDocuments(prefix)
    with pytest.raises(FileNotFoundError, match="nothere.idx"):
        MegatronIndexedDocuments(tmp_path / "nothere")


def test_a_truncated_bin_skips_the_documents_past_its_end(tmp_path):
    from fcp_data import FCPDataset

    prefix = _write_raw(tmp_path, _raw_index(**GOOD), bin_tokens=22)  # document 0 (10 tokens) fits, document 1 not
    with pytest.warns(UserWarning, match="1 document.*past the end.*document 1"):
        data = MegatronIndexedDocuments(prefix)
    assert data[0]["input_ids"].tolist() == list(range(10))
    with pytest.raises(OSError, match="document 1 lies past the end"):
        data[1]
    from torch.utils.data import DataLoader

    from fcp_data import CostModel, FCPCollator, FCPSampler

    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=64)
    sampler = FCPSampler(data, num_ranks=1, rank=0, global_batch_size=2, seed=0, cost_model=cost)
    batches = list(DataLoader(FCPDataset(data), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0)))
    skipped = [r["index"] for b in batches for r in b.get("skipped_samples", ())]
    assert skipped == [1] and sorted(i for b in batches for i in b["sample_indices"]) == [0, 1]
    assert load_lengths(tmp_path / "h.idx").tolist() == [10, 25]  # the counts come from the .idx alone


def test_a_multimodal_index_and_odd_inputs_are_named(tmp_path):
    """megatron-core's multimodal layout (one mode byte per sequence after the counts) was read as text, an image
    sequence joined into its document; an index with other bytes after its counts reads with a warning; a prefix
    without ``.idx`` / the ``.bin`` / an index of empty documents given as lengths say what to pass; a sample index
    that is not an int (``docs[0.9]``, ``docs["1"]``, ``docs[True]``) is a TypeError, not a document."""
    full = _raw_index(**GOOD)
    prefix = _write_raw(tmp_path, full + bytes([0, 1, 0]))
    with pytest.raises(ValueError, match="a multimodal dataset: 3 sequence modes"):
        MegatronIndexedDocuments(prefix)
    _write_raw(tmp_path, full + b"\0" * 5)
    with pytest.warns(UserWarning, match="5 byte.*after what its counts describe"):
        data = MegatronIndexedDocuments(prefix)
    assert data[1]["input_ids"].tolist() == list(range(10, 35))  # document 1: sequences 1-2, tokens 10..34
    for bad in (0.9, "1", True):
        with pytest.raises(TypeError, match="indexed by an int sample index"):
            data[bad]
    assert data[np.int64(0)]["input_ids"].tolist() == list(range(10))
    with pytest.raises(FileNotFoundError, match=r"prefix\? pass h.idx"):
        load_lengths(tmp_path / "h")
    with pytest.raises(ValueError, match="its lengths are in h.idx"):
        load_lengths(tmp_path / "h.bin")
    _write_raw(tmp_path, _raw_index(seq_lengths=[0, 0], doc_bounds=[0, 1, 2]))
    with pytest.raises(ValueError, match=r"without tokens \(2 document\(s\), none with a token\)"):
        load_lengths(tmp_path / "h.idx")
