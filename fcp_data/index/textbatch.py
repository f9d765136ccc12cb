"""Batched tokenisation of one jsonl shard's texts for the index builder (:mod:`fcp_data.index.build`)."""

from __future__ import annotations

from fcp_data.index.format import KIND_TEXT

__all__ = ["TextBatch", "TOKENIZE_BATCH", "TOKENIZE_BATCH_BYTES"]

TOKENIZE_BATCH = 512  # jsonl texts tokenised together, at most TOKENIZE_BATCH_BYTES of them
TOKENIZE_BATCH_BYTES = 32 * 2**20


class TextBatch:
    """Texts of one jsonl shard tokenized in batches (``TOKENIZE_BATCH`` lines or ``TOKENIZE_BATCH_BYTES``); a
    text the tokenizer rejects is recorded as ``tokenize_failed`` and the rest of its batch is kept."""

    def __init__(self, task: dict, spec, rows, *, eos: bool = True, ext: str = "jsonl") -> None:
        self.task, self.spec, self.rows, self.path, self.ext = task, spec, rows, str(task["path"]), ext
        self.tok, self.extra = spec.tokenizer(), (1 if eos and spec.eos_id is not None else 0)
        self.pending: list[tuple[str, int, int, str]] = []
        self.bytes = 0

    def add(self, key: str, start: int, size: int, text: str | tuple[str, ...]) -> None:
        """One sample; ``text`` may be parts tokenised apart (an SFT prompt and its response): tokens are summed."""
        self.pending.append((key, start, size, text))
        self.bytes += size
        if len(self.pending) >= TOKENIZE_BATCH or self.bytes >= TOKENIZE_BATCH_BYTES:
            self.flush()

    def _counts(self, texts: list[str]) -> list:
        try:
            return [len(e.ids) for e in self.tok.encode_batch(texts, add_special_tokens=False)]
        except Exception:  # one bad text fails the batch: encode one by one, record the failures
            counts: list = []
            for t in texts:
                try:
                    counts.append(len(self.tok.encode(t, add_special_tokens=False).ids))
                except Exception as e:
                    counts.append(f"{type(e).__name__}: {e}")
            return counts

    def _sample_counts(self) -> list:
        """Per pending sample: its tokens over all its parts, or the first part's tokenizer error."""
        parts = [(p[3],) if isinstance(p[3], str) else tuple(p[3]) for p in self.pending]
        flat = iter(self._counts([t for ps in parts for t in ps]))
        out: list = []
        for ps in parts:
            got = [next(flat) for _ in ps]
            out.append(next((c for c in got if isinstance(c, str)), None) or sum(got))
        return out

    def flush(self) -> None:
        rows, spec, shard = self.rows, self.spec, self.task["source"]
        for (key, start, size, _), c in zip(self.pending, self._sample_counts()):
            if isinstance(c, str):
                rows.error(key, "tokenize_failed", c, self.path)
            else:
                rows.guard(key, self.path, lambda: rows.add(key, [(self.ext, start, size)], offset=start, size=size,
                                                             shard=shard, kind=KIND_TEXT, eta=spec.eta,
                                                             num_tokens=c + self.extra))  # noqa: B023 - runs now
        self.pending, self.bytes = [], 0
