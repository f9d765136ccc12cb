"""Megatron's indexed datasets (``PREFIX.bin`` + ``PREFIX.idx``, written by Megatron-LM's
``tools/preprocess_data.py``) as FCP input: per-document token counts read straight from the ``.idx``, documents read
from the ``.bin`` by memory map. No tokenizing, no copy, no megatron-core needed.

    docs = MegatronIndexedDocuments("my-corpus_text_document")
    sampler = FCPSampler(docs, cost_model=cost, global_batch_size=512)   # docs.num_tokens: the lengths
    loader = DataLoader(FCPDataset(docs, vocab_size=V), batch_sampler=sampler, collate_fn=FCPCollator())
    # vocab_size: a document with an id the model has no embedding row for is recorded and skipped

``fcp plan/compare/simulate --lengths my-corpus_text_document.idx`` plans on the same counts
(:func:`fcp_data.workloads.load_lengths`).

Format (megatron-core's ``_IndexWriter``, version 1): the header ``MMIDIDX\\0\\0``, a little-endian u64 version (1),
a u8 dtype code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16), u64 sequence count
S, u64 document count D, then ``int32[S]`` sequence lengths, ``int64[S]`` sequence byte offsets into the ``.bin``,
``int64[D]`` document boundaries (document ``d`` = sequences ``[b[d], b[d+1])``; ``b[0] = 0``, ``b[-1] = S``).
A sample here is a **document** (its sequences concatenated — one sequence per document unless the data was
preprocessed with ``--split-sentences``), tokens as stored (the EOD token too, where ``--append-eod`` added it).
Multimodal datasets (a ``sequence_modes`` array) are not read.

Hostile files: a wrong header, version or dtype code (a float dtype too: token ids are integers), an ``.idx`` shorter
than its counts (longer: a warning; longer by one mode byte per sequence: a multimodal dataset, refused), boundaries
that are not a non-decreasing run from 0 to S, negative lengths, offsets that are not whole tokens or lie beyond any
file: one ``ValueError`` naming the file when opened. Documents whose
bytes lie past the end of the ``.bin`` (a truncated copy, an empty file) are counted and named in one warning when
opened, and reading one raises ``OSError``, which ``FCPDataset`` records as a failed read and skips. A ``.bin`` longer
than its ``.idx`` describes is read, with a warning naming both sizes. Empty documents (0 tokens)
are left out of the samples (``document_ids`` maps a sample to its document) and counted in a warning.
"""

from __future__ import annotations

import struct
import warnings
from pathlib import Path

import numpy as np

__all__ = ["MegatronIndexedDocuments", "is_megatron_index", "megatron_document_lengths"]

_HEADER = b"MMIDIDX\x00\x00"
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
           8: np.uint16}
_FLOAT_CODES = (6, 7)
_FIXED = len(_HEADER) + 8 + 1 + 8 + 8
_MAX_OFFSET = 1 << 56  # bytes; ~64 PiB, far beyond any .bin, far below int64 overflow with any int32 length


def _paths(path_prefix: str | Path) -> tuple[Path, Path]:
    p = Path(path_prefix)
    if p.suffix in (".idx", ".bin"):
        p = p.with_suffix("")
    return p.with_name(p.name + ".idx"), p.with_name(p.name + ".bin")


def is_megatron_index(path: str | Path) -> bool:
    """True for a ``.idx`` file (or a prefix with one) that starts with Megatron's index header."""
    idx, _ = _paths(path)
    try:
        with idx.open("rb") as f:
            return f.read(len(_HEADER)) == _HEADER
    except OSError:
        return False


def _map(path: Path) -> np.ndarray:
    """The bytes of ``path`` by memory map; an empty file (which ``mmap`` refuses) as an empty array."""
    return np.memmap(path, mode="r", dtype=np.uint8) if path.stat().st_size else np.zeros(0, dtype=np.uint8)


class _Index:
    """The parsed, validated ``.idx`` (module docstring)."""

    def __init__(self, idx: Path) -> None:
        if not idx.is_file():
            raise FileNotFoundError(f"Megatron index not found: {idx} (pass the prefix of PREFIX.bin / PREFIX.idx)")
        raw = _map(idx)
        where = f"{idx}: not a readable Megatron indexed dataset"
        if raw.size < _FIXED or bytes(raw[:len(_HEADER)]) != _HEADER:
            raise ValueError(f"{where} (no MMIDIDX header)")
        version, code, seqs, docs = struct.unpack("<QBQQ", bytes(raw[len(_HEADER):_FIXED]))
        if version != 1:
            raise ValueError(f"{where} (index version {version}; version 1 is read)")
        if code not in _DTYPES:
            raise ValueError(f"{where} (token dtype code {code} is none of {sorted(_DTYPES)})")
        if code in _FLOAT_CODES:  # a float array, not token ids: casting would truncate them silently
            raise ValueError(f"{where} (token dtype code {code} is {np.dtype(_DTYPES[code]).name}: token ids are "
                             "integers)")
        need = _FIXED + seqs * 4 + seqs * 8 + docs * 8
        if seqs > raw.size or docs > raw.size or raw.size < need:
            raise ValueError(f"{where} (truncated: {raw.size} bytes, its counts need {need})")
        if seqs and raw.size == need + seqs:  # one mode byte per sequence follows: megatron-core's multimodal layout
            raise ValueError(f"{where} (a multimodal dataset: {seqs} sequence modes follow its counts; fcp reads "
                             "text datasets)")
        if raw.size > need:
            warnings.warn(f"{idx}: {raw.size - need} byte(s) after what its counts describe ({need} bytes), ignored",
                          stacklevel=3)
        self.dtype = np.dtype(_DTYPES[code])
        off = _FIXED
        self.seq_lengths = np.frombuffer(raw, dtype=np.int32, count=seqs, offset=off)
        self.seq_pointers = np.frombuffer(raw, dtype=np.int64, count=seqs, offset=off + seqs * 4)
        self.doc_bounds = np.frombuffer(raw, dtype=np.int64, count=docs, offset=off + seqs * 12)
        b = self.doc_bounds
        if docs == 0 or b[0] != 0 or b[-1] != seqs or np.any(np.diff(b) < 0):
            raise ValueError(f"{where} (document boundaries are not a non-decreasing run from 0 to {seqs})")
        if np.any(self.seq_lengths < 0) or np.any(self.seq_pointers < 0):
            raise ValueError(f"{where} (negative sequence lengths or offsets)")
        if np.any(self.seq_pointers % self.dtype.itemsize):  # mid-token: every id read would be garbage
            raise ValueError(f"{where} (a sequence offset that is not a multiple of the token size, "
                             f"{self.dtype.itemsize} bytes)")
        if np.any(self.seq_pointers > _MAX_OFFSET):  # no file is this large; its end would overflow int64
            raise ValueError(f"{where} (a sequence offset beyond {_MAX_OFFSET} bytes)")
        inner = np.ones(max(int(seqs) - 1, 0), dtype=bool)  # pairs (k, k+1) inside one document
        starts = b[1:-1][(b[1:-1] > 0) & (b[1:-1] < seqs)]
        inner[starts - 1] = False
        step = self.seq_pointers[1:] - self.seq_pointers[:-1]
        if np.any(step[inner] != self.seq_lengths[:-1][inner].astype(np.int64) * self.dtype.itemsize):
            raise ValueError(f"{where} (the sequences of a document are not contiguous in the .bin)")

    def document_lengths(self) -> np.ndarray:
        """Tokens per document (its sequences summed), int64."""
        csum = np.concatenate([[0], np.cumsum(self.seq_lengths, dtype=np.int64)])
        return csum[self.doc_bounds[1:]] - csum[self.doc_bounds[:-1]]


def megatron_document_lengths(path_prefix: str | Path) -> np.ndarray:
    """Tokens per document of a Megatron indexed dataset (from the ``.idx`` alone), empty documents included."""
    idx, _ = _paths(path_prefix)
    return _Index(idx).document_lengths()


class MegatronIndexedDocuments:
    """A map-style dataset of the non-empty documents of ``PREFIX.bin``/``PREFIX.idx`` (module docstring):
    ``docs[i]`` is ``{"input_ids": LongTensor}``, ``docs.num_tokens`` their token counts (what ``FCPSampler``
    plans with), ``docs.document_ids`` the Megatron document of each sample."""

    def __init__(self, path_prefix: str | Path) -> None:
        idx, bin_path = _paths(path_prefix)
        self.path_prefix = str(idx.with_suffix(""))
        index = _Index(idx)
        if not bin_path.is_file():
            raise FileNotFoundError(f"Megatron data file not found: {bin_path} (next to {idx})")
        self._bin = _map(bin_path)  # empty: every document lies past its end (warned below, skipped when read)
        lengths = index.document_lengths()
        self.document_ids = np.flatnonzero(lengths > 0)
        self.num_tokens = lengths[self.document_ids]
        self.dtype = index.dtype
        # each sample's first byte in the .bin (its sequences follow contiguously; checked when parsed)
        self._starts = np.array(index.seq_pointers[index.doc_bounds[:-1][self.document_ids]], dtype=np.int64)
        ends = self._starts + self.num_tokens * self.dtype.itemsize
        self._beyond = set(np.flatnonzero(ends > self._bin.size).tolist())
        empty = lengths.size - self.document_ids.size
        if empty:
            warnings.warn(f"{idx}: {empty} empty document(s) of {lengths.size} left out of the samples", stacklevel=2)
        if self._beyond:
            first = min(self._beyond)
            warnings.warn(f"{bin_path}: {len(self._beyond)} document(s) lie past the end of the file ({self._bin.size} "
                          f"bytes; a truncated copy?), first: sample {first} (document {self.document_ids[first]}); "
                          "reading them fails (FCPDataset skips them)", stacklevel=2)
        used = int((index.seq_pointers + index.seq_lengths.astype(np.int64) * self.dtype.itemsize).max(initial=0))
        if self._bin.size > used:
            warnings.warn(f"{bin_path}: {self._bin.size} bytes, but {idx} describes {used}: {self._bin.size - used} "
                          "bytes no document points to (a .bin of another .idx?)", stacklevel=2)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_bin")  # a DataLoader worker started by spawn maps the file itself, not a pickled copy of it
        # (the rest is O(documents): counts, ids, offsets; the .idx is not kept)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._bin = _map(Path(self.path_prefix + ".bin"))

    def __len__(self) -> int:
        return int(self.num_tokens.size)

    def __getitem__(self, i: int) -> dict:
        import torch

        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"MegatronIndexedDocuments is indexed by an int sample index, got {type(i).__name__} "
                            f"{i!r}")
        n = len(self)
        if not -n <= int(i) < n:
            raise IndexError(f"sample {i} out of range for {n} documents")
        i = int(i) % n
        if i in self._beyond:
            raise OSError(f"{self.path_prefix}.bin: document {self.document_ids[i]} lies past the end of the file")
        tokens = np.frombuffer(self._bin, dtype=self.dtype, count=int(self.num_tokens[i]), offset=int(self._starts[i]))
        return {"input_ids": torch.from_numpy(tokens.astype(np.int64))}

    def __repr__(self) -> str:
        return f"MegatronIndexedDocuments({self.path_prefix!r}, {len(self)} documents, {int(self.num_tokens.sum())} tokens)"
