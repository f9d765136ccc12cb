"""What :class:`fcp_data.sampler.FCPSampler` yields and takes (DESIGN.md §7): :class:`SampleSlot` (one
sample's place in a planned micro-batch, as one rank sees it), :class:`SlotList` (one rank's slots of one
micro-batch, with its metadata), :class:`FCPDataset` (carries the slots through DataLoader workers), and
the sampler's input checks (lengths, solver options, rank/world from ``torch.distributed``), and the
visual layouts that make the masked loss denominator exact (:class:`IndexVisualLayout`,
:class:`SpanVisualLayout`). All are re-exported by :mod:`fcp_data.sampler`.

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

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from fcp_data.cost import CostModel

__all__ = ["SampleSlot", "SlotList", "FCPDataset", "dist_rank_and_world", "check_lengths", "check_visual",
           "check_solver_options",
           "IndexVisualLayout", "SpanVisualLayout"]


def dist_rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` when it is initialised, else ``(0, 1)``."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


@dataclass(frozen=True, kw_only=True, slots=True)
class SampleSlot:
    """One sample's place in a planned micro-batch, as seen by one rank of its CP group.

    ``index``: dataset index; ``ranks``: the CP group's global ranks in ring order; ``cp_rank``: this
    rank's position in ``ranks``; ``num_tokens``: tokens to keep (< ``length`` when truncated);
    ``length``: the sample's length in the index; ``num_tokens_global``: label tokens of the whole global
    batch, Σ (num_tokens − 1) over all its sequences (the loss denominator); ``num_text_labels_global``:
    the same count without labels whose target is a visual placeholder (module docstring; ``None`` when
    the sampler has no visual layout); ``epoch``,
    ``global_batch`` (index in the epoch), ``micro_batch`` (index in the global batch) and
    ``num_micro_batches`` (in this global batch) locate the micro-batch.
    """

    index: int
    ranks: tuple[int, ...]
    cp_rank: int
    num_tokens: int
    length: int
    num_tokens_global: int
    epoch: int
    global_batch: int
    micro_batch: int
    num_micro_batches: int
    num_text_labels_global: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(int(r) for r in self.ranks))
        if not self.ranks or len(set(self.ranks)) != len(self.ranks) or min(self.ranks) < 0:
            raise ValueError(f"ranks must be distinct non-negative global ranks, got {self.ranks}")
        if not 0 <= self.cp_rank < len(self.ranks):
            raise ValueError(f"cp_rank must be in [0, {len(self.ranks)}), got {self.cp_rank}")
        if self.index < 0:
            raise ValueError(f"index must be >= 0, got {self.index}")
        if not 1 <= self.num_tokens <= self.length:
            raise ValueError(f"num_tokens must be in [1, length={self.length}], got {self.num_tokens}")
        if self.num_tokens_global < 0:
            raise ValueError(f"num_tokens_global must be >= 0, got {self.num_tokens_global}")
        if self.num_text_labels_global is not None and not 0 <= self.num_text_labels_global <= self.num_tokens_global:
            raise ValueError(f"num_text_labels_global must be in [0, num_tokens_global={self.num_tokens_global}], "
                             f"got {self.num_text_labels_global}")
        if not 0 <= self.micro_batch < self.num_micro_batches:
            raise ValueError(f"micro_batch must be in [0, {self.num_micro_batches}), got {self.micro_batch}")

    @property
    def degree(self) -> int:
        return len(self.ranks)

    @property
    def rank(self) -> int:
        return self.ranks[self.cp_rank]

    @property
    def truncated(self) -> bool:
        return self.num_tokens < self.length


class SlotList(list):
    """This rank's slots of one micro-batch (a plain ``list`` of :class:`SampleSlot`) plus the
    micro-batch metadata, so that an idle rank's empty list still says where it is and carries
    ``num_tokens_global``. Attributes: ``epoch``, ``global_batch``, ``micro_batch``, ``num_micro_batches``,
    ``num_tokens_global``, ``num_text_labels_global``, ``ranks`` (``()`` when idle) and ``cp_rank``
    (``-1`` when idle)."""

    def __init__(self, slots: Sequence[SampleSlot] = (), *, epoch: int, global_batch: int, micro_batch: int,
                 num_micro_batches: int, num_tokens_global: int, ranks: tuple[int, ...] = (), cp_rank: int = -1,
                 num_text_labels_global: int | None = None):
        super().__init__(slots)
        self.num_text_labels_global = num_text_labels_global
        self.epoch, self.global_batch, self.micro_batch = epoch, global_batch, micro_batch
        self.num_micro_batches, self.num_tokens_global = num_micro_batches, num_tokens_global
        self.ranks, self.cp_rank = tuple(ranks), cp_rank

    def __repr__(self) -> str:
        return (f"SlotList(epoch={self.epoch}, global_batch={self.global_batch}, micro_batch={self.micro_batch}"
                f"/{self.num_micro_batches}, ranks={self.ranks}, cp_rank={self.cp_rank}, "
                f"indices={[s.index for s in self]})")


class FCPDataset:
    """``FCPDataset(base)[slot] → (base[slot.index], slot)``: carries the plan through DataLoader workers.

    ``__getitems__`` (used by the DataLoader's fetcher for a whole batch) keeps the :class:`SlotList`
    metadata, so an idle rank's empty batch reaches the collator with its ``num_tokens_global``.
    """

    def __init__(self, base: Any) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, slot: SampleSlot) -> tuple[Any, SampleSlot]:
        if not isinstance(slot, SampleSlot):
            raise TypeError(f"FCPDataset is indexed by SampleSlot (from FCPSampler), got {type(slot).__name__}")
        return self.base[slot.index], slot

    def __getitems__(self, slots: Sequence[SampleSlot]) -> list:
        items = [self[s] for s in slots]
        if isinstance(slots, SlotList):
            out = SlotList(items, epoch=slots.epoch, global_batch=slots.global_batch,
                           micro_batch=slots.micro_batch, num_micro_batches=slots.num_micro_batches,
                           num_tokens_global=slots.num_tokens_global, ranks=slots.ranks, cp_rank=slots.cp_rank,
                           num_text_labels_global=slots.num_text_labels_global)
            return out
        return items


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
    map from the sampler's sample numbers to index rows (a filtered view of the index)."""

    def __init__(self, index: Any, keep: Any = None, spec: Any = None) -> None:
        self.index = index
        self.keep = None if keep is None else np.asarray(keep, dtype=np.int64)
        self._spec = spec
        self._vis = np.asarray(index.num_visual_tokens, dtype=np.int64)

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_spec"] = None  # reloaded on demand (a tokenizer does not always pickle)
        return d

    def spec(self) -> Any:
        if self._spec is None:
            from fcp_data.specs import load_spec

            m = self.index.manifest
            self._spec = load_spec(m["spec"]["name"])
            if self._spec.fingerprint != m["spec"]["fingerprint"]:
                raise ValueError(f"spec {self._spec.name!r} differs from the one the index was built with; the visual "
                                 "layout (and the masked loss denominator) cannot be derived — rebuild the index")
        return self._spec

    def __call__(self, i: int, n: int) -> int:
        row = int(i if self.keep is None else self.keep[i])
        total = int(self._vis[row])
        if total == 0:
            return 0
        from fcp_data.index.format import KIND_IMAGE, KIND_VIDEO
        from fcp_data.specs import plan_visual

        spec, ix = self.spec(), self.index
        kind = int(ix.kind[row])
        if kind == KIND_VIDEO:
            plan = plan_visual(spec, "video", height=int(ix.height[row]), width=int(ix.width[row]),
                               num_frames=int(ix.num_frames[row]), fps=float(ix.fps[row]))
        elif kind == KIND_IMAGE:
            plan = plan_visual(spec, "image", height=int(ix.height[row]), width=int(ix.width[row]))
        else:
            raise ValueError(f"index row {row} has {total} visual tokens but kind {kind} is neither image nor video")
        place = set(spec.placeholder_ids)
        pos = m = seen = 0
        for seg in plan.segments:
            if seg[0] == "text":
                pos += len(spec.encode(seg[1]))
                continue
            c = int(seg[2])
            if spec.token_id(seg[1]) in place:
                m += max(0, min(pos + c, n) - max(pos, 1))
                seen += c
            pos += c
        if seen != total:
            raise ValueError(f"index row {row}: the spec's layout has {seen} placeholder tokens, the index {total}; "
                             "the index is stale — rebuild it")
        return m


def check_lengths(lengths_or_index: Any, etas: Any) -> tuple[np.ndarray, np.ndarray | None]:
    src = lengths_or_index
    if hasattr(src, "num_tokens") and not isinstance(src, (np.ndarray, list, tuple)):
        lengths = src.num_tokens
        if etas is None:
            etas = getattr(src, "eta", None)
    else:
        lengths = src
    from fcp_data.plan.inputs import validate_etas, validate_lengths  # the one length / η check

    lengths = validate_lengths(lengths)
    if etas is not None:
        etas = validate_etas(etas, lengths)
        if not np.any(etas):
            etas = None
    return lengths, etas


def check_visual(lengths_or_index: Any, visual: Any, lengths: np.ndarray) -> np.ndarray | None:
    """Visual tokens per sample for the cost model (DESIGN §4.1): ``visual=`` when given, else a
    ``LengthIndex``'s ``num_visual_tokens``, else None (text). None as well when all are 0 (plans as text)."""
    if visual is None and not isinstance(lengths_or_index, (np.ndarray, list, tuple)):
        visual = getattr(lengths_or_index, "num_visual_tokens", None)
    from fcp_data.plan.inputs import validate_visual  # the one visual-token check (planner and sampler alike)

    v = validate_visual(visual, np.asarray(lengths))
    return v if v is not None and np.any(v) else None


_PLAN_ARGS = ("lengths", "num_ranks", "cost_model", "etas", "visual", "solver", "micro_batches")


def check_solver_options(options: Any, solver: str, num_ranks: int, cost_model: CostModel) -> dict[str, Any]:
    """A copy of ``options`` (JSON scalars keyed by str, so the state fingerprint survives a JSON round
    trip), tried once on a one-token batch so that an option the solver rejects fails here."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"solver_options must be a dict of keyword arguments for the solver, got {options!r}")
    out = {}
    for k in sorted(options):
        v = options[k]
        if not isinstance(k, str) or k in _PLAN_ARGS:
            raise ValueError(f"solver_options key {k!r} is not a solver option (reserved: {', '.join(_PLAN_ARGS)})")
        if isinstance(v, np.generic):
            v = v.item()
        if v is not None and not isinstance(v, (bool, int, float, str)):
            raise ValueError(f"solver_options[{k!r}] must be a JSON scalar (int, float, str, bool, None), got {v!r}")
        out[k] = v
    if out:
        from fcp_data.plan import plan_batch

        try:
            plan_batch([1], num_ranks=num_ranks, cost_model=cost_model, solver=solver, micro_batches=1, **out)
        except TypeError as exc:
            raise ValueError(f"solver {solver!r} does not accept solver_options {out}: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"solver_options {out} are invalid for solver {solver!r} on {num_ranks} ranks: "
                             f"{exc}") from None
    return out
