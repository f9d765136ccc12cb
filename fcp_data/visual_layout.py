"""Visual layouts: how many label tokens of a sample's kept prefix target a visual placeholder, so that the
sampler's masked loss denominator (``num_text_labels_global``) is exact (used by :class:`fcp_data.sampler.FCPSampler`).

**Label tokens with visual masking.** A document of ``n`` kept tokens has ``n − 1`` label tokens
(``num_tokens_global`` sums these). With ``FCPCollator(mask_visual_labels=True)`` the label at position
``t`` is also ignored when token ``t + 1`` is a visual placeholder, so the document has
``n − 1 − m`` label tokens, ``m`` = placeholders among positions ``1 .. n−1`` of its *kept* tokens (a
placeholder at position 0 is never a target). ``num_text_labels_global`` sums these. Truncation cuts the
token sequence (the collator still hands the vision tower every image of the document whole, but only
the kept placeholders receive embeddings and only they can be targets), so ``m`` depends on where the
placeholders sit, not just on how many there are. A *visual layout* is a callable ``layout(i, n) → m``:

* :class:`IndexVisualLayout` (built by the sampler from a ``LengthIndex`` automatically): re-derives the
  token layout of sample ``i`` from its index columns and the index's spec with the same
  :func:`fcp_data.specs.plan_visual` call the reader makes (the visual block first, then caption + EOS,
  which hold no placeholder), and counts placeholders in ``[1, n)``. Text samples cost nothing; a visual
  sample costs one ``plan_visual`` (done per global batch, on the planning thread).
* :class:`SpanVisualLayout`: explicit placeholder spans ``(start, count)`` per sample, for datasets that
  are not read from an index (e.g. ``fcp_exec.train_data``'s synthetic video).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from fcp_data.text_tokens import block_text_ids

__all__ = ["SpanVisualLayout", "IndexVisualLayout", "row_plan", "segment_runs", "cut_through_placeholders"]


class SpanVisualLayout:
    """Visual layout from explicit placeholder spans: ``spans[i]`` is a sequence of ``(start, count)``
    runs of placeholder tokens in sample ``i`` (empty for text). ``layout(i, n)`` = placeholders in
    ``[1, n)``."""

    def __init__(self, spans: Sequence[Sequence[tuple[int, int]]]) -> None:
        self.spans = [tuple((int(a), int(c)) for a, c in sp) for sp in spans]
        for i, sp in enumerate(self.spans):
            if any(a < 0 or c < 0 for a, c in sp):
                raise ValueError(f"sample {i}: placeholder spans must have start >= 0 and count >= 0, got {sp}")

    def __call__(self, i: int, n: int) -> int:
        return sum(max(0, min(a + c, n) - max(a, 1)) for a, c in self.spans[i])


class IndexVisualLayout:
    """Visual layout of a ``LengthIndex`` sample, re-derived from its columns and the index's spec exactly
    as :class:`fcp_data.readers.IndexedDataset` builds ``input_ids`` (module docstring). ``keep``: optional
    map from the sampler's sample numbers to index rows (a filtered view of the index). A conversation's blocks are
    placed from its record, read by ``reader`` (an ``IndexedDataset``: pass ``FCPSampler`` the dataset itself to
    share its ``roots``), else by a reader of the index made on first use."""

    def __init__(self, index: Any, keep: Any = None, spec: Any = None, reader: Any = None) -> None:
        self.index = index
        self.keep = None if keep is None else np.asarray(keep, dtype=np.int64)
        self._spec = spec
        self._vis = np.asarray(index.num_visual_tokens, dtype=np.int64)
        self._reader, self._runs = reader, {}  # reader: the IndexedDataset whose records (and roots) to use

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_spec"] = None  # reloaded on demand (a tokenizer does not always pickle)
        return d

    def spec(self) -> Any:
        if self._spec is None:
            from fcp_data.readers import index_spec  # the spec and tokenizer the index recorded

            m = self.index.manifest
            self._spec = index_spec(m["spec"])
            if self._spec.fingerprint != m["spec"]["fingerprint"]:
                raise ValueError(f"spec {self._spec.name!r} differs from the one the index was built with; the visual "
                                 "layout (and the masked loss denominator) cannot be derived — rebuild the index")
        return self._spec

    def __call__(self, i: int, n: int) -> int:
        row = int(i if self.keep is None else self.keep[i])
        total = int(self._vis[row])
        if total == 0:
            return 0
        if self.index.manifest.get("chat_field"):  # a conversation: its blocks sit between rendered text
            return SpanVisualLayout([self._chat_runs(row)])(0, n)
        spec = self.spec()
        runs, _ = segment_runs(spec, row_plan(spec, self.index, row).segments, 0, at_start=True)  # a plain sample
        seen = sum(c for _, c in runs)
        if seen != total:
            raise ValueError(f"index row {row}: the spec's layout has {seen} placeholder tokens, the index {total}; "
                             "the index is stale — rebuild it")
        return SpanVisualLayout([runs])(0, n)

    def _chat_runs(self, row: int) -> tuple[tuple[int, int], ...]:
        """Placeholder runs of a conversation row, from its record (the reader's layout; no pixel is decoded),
        kept per row."""
        runs = self._runs.get(row)
        if runs is None:
            if self._reader is None:
                from fcp_data.readers import IndexedDataset

                self._reader = IndexedDataset(self.index, self.spec())
            runs = self._runs[row] = tuple(self._reader.placeholder_runs(row))
            if sum(c for _, c in runs) != int(self._vis[row]):
                raise ValueError(f"index row {row}: its conversation has {sum(c for _, c in runs)} placeholder tokens, "
                                 f"the index {int(self._vis[row])}; the index is stale — rebuild it")
        return runs


def row_plan(spec: Any, index: Any, row: int) -> Any:
    """The visual plan of index row ``row`` from its kind and geometry columns (the reader's and the layout's)."""
    from fcp_data.index.format import KIND_IMAGE, KIND_VIDEO
    from fcp_data.specs import plan_visual

    kind, h, w = int(index.kind[row]), int(index.height[row]), int(index.width[row])
    if kind == KIND_VIDEO:
        return plan_visual(spec, "video", height=h, width=w, num_frames=int(index.num_frames[row]),
                           fps=float(index.fps[row]))
    if kind == KIND_IMAGE:
        return plan_visual(spec, "image", height=h, width=w)
    raise ValueError(f"index row {row} has {int(index.num_visual_tokens[row])} visual tokens but kind {kind} is "
                     "neither image nor video")


def segment_runs(spec: Any, segments: Any, start: int, at_start: bool = False) -> tuple[list[tuple[int, int]], int]:
    """``(placeholder runs (position, count), length)`` of a visual block's segments placed at ``start``
    (``at_start``: the block opens its input, :func:`fcp_data.specs.segments_to_ids`)."""
    place = set(spec.placeholder_ids)
    pos, runs = start, []
    for k, seg in enumerate(segments):
        if seg[0] == "text":
            pos += len(block_text_ids(spec, seg[1], at_start and k == 0))
            continue
        c = int(seg[2])
        if spec.token_id(seg[1]) in place:
            runs.append((pos, c))
        pos += c
    return runs, pos - start


def cut_through_placeholders(layout: Any, samples: Sequence[int], n: int) -> list[int]:
    """The samples of ``samples`` whose cut to ``n`` tokens falls inside a run of visual placeholders (tokens
    ``n − 1`` and ``n`` both placeholders: the model then sees part of an image or video), from the layout's counts
    alone (any visual layout). A sample the layout cannot place (a stale index) is left to the planning thread,
    which reports it."""
    cut = []
    for i in samples:
        try:
            before, at, after = (layout(int(i), k) for k in (n - 1, n, n + 1))
        except ValueError:
            continue
        if n >= 2 and at - before >= 1 and after - at >= 1:
            cut.append(int(i))
    return cut

