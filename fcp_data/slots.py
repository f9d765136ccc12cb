"""What :class:`fcp_data.sampler.FCPSampler` yields (DESIGN.md §7) and how it crosses DataLoader workers.

Each fact is held once. :class:`MicroBatchMeta` holds what is the same for every sample of one rank's share of
a micro-batch — where the micro-batch sits (``epoch``, ``global_batch``, ``micro_batch``,
``num_micro_batches``), the loss denominators of its global batch (``num_tokens_global``,
``num_text_labels_global``) and this rank's CP group (``ranks``, ``cp_rank``). :class:`SampleSlot` holds one
sample's own facts (``index``, ``num_tokens``, ``length``) and a reference to that meta. :class:`SlotList`
(one rank's list for one micro-batch, possibly empty: an idle rank) holds the same meta object. The slots
and their list share one meta by reference — through pickling too (DataLoader workers), since pickle keeps
shared references — so :class:`FCPDataset` passes it on without copying fields and
:class:`fcp_data.collator.FCPCollator` reads it once, checking only that every slot refers to it.

The meta's fields read as attributes of a slot and of a list too (``slot.ranks``, ``lst.global_batch``, …,
read-only), and both still accept them as keyword arguments (a :class:`MicroBatchMeta` is then built), so code
written against the earlier flat classes keeps working.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Sequence

from fcp_data.strict import flag

logger = logging.getLogger("fcp_data")

__all__ = ["MicroBatchMeta", "SampleSlot", "SlotList", "FCPDataset", "MalformedSampleError", "StaleSampleError",
           "plan_digest", "rank_lists"]


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroBatchMeta:
    """One rank's view of one planned micro-batch, shared by its :class:`SlotList` and slots.

    ``epoch``, ``global_batch`` (index in the epoch), ``micro_batch`` (index in the global batch) and
    ``num_micro_batches`` (in this global batch) locate it; ``num_tokens_global``: label tokens of the whole
    global batch, Σ (num_tokens − 1) over all its sequences (the loss denominator); ``num_text_labels_global``:
    the same without labels whose target is a visual placeholder (:mod:`fcp_data.visual_layout`; ``None`` when
    the sampler has no visual layout); ``ranks``: this rank's CP group (global ranks in ring order, ``()`` when
    the rank is idle); ``cp_rank``: this rank's position in ``ranks`` (``-1`` when idle); ``plan_digest``: the
    global batch's :func:`plan_digest`, the same on every rank that planned it alike (0: not known);
    ``num_samples``: how many samples the sampler's lengths describe, which :class:`FCPDataset` checks against its
    dataset's size; ``num_ranks`` and ``sampler_rank``: the world the sampler planned for and its rank in it, which
    ``fcp_exec.lockstep`` checks against the process group (each ``None``: not known, e.g. a list built by hand).
    """

    epoch: int
    global_batch: int
    micro_batch: int
    num_micro_batches: int
    num_tokens_global: int
    num_text_labels_global: int | None = None
    ranks: tuple[int, ...] = ()
    cp_rank: int = -1
    plan_digest: int = 0
    num_samples: int | None = None
    num_ranks: int | None = None
    sampler_rank: int | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalise once (numpy integers become ints), here
        for name in ("epoch", "global_batch", "micro_batch", "num_micro_batches", "num_tokens_global", "cp_rank",
                     "plan_digest"):
            put(self, name, int(getattr(self, name)))
        for name in ("num_text_labels_global", "num_samples", "num_ranks", "sampler_rank"):
            if getattr(self, name) is not None:
                put(self, name, int(getattr(self, name)))
        put(self, "ranks", tuple(int(r) for r in self.ranks))
        if len(set(self.ranks)) != len(self.ranks) or (self.ranks and min(self.ranks) < 0):
            raise ValueError(f"ranks must be distinct non-negative global ranks, got {self.ranks}")
        if not (0 <= self.cp_rank < len(self.ranks) if self.ranks else self.cp_rank == -1):
            raise ValueError(f"cp_rank must be in [0, {len(self.ranks)}) (-1 when idle: no ranks), got {self.cp_rank}")
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
        """This rank's global rank (``-1`` when idle)."""
        return self.ranks[self.cp_rank] if self.ranks else -1


META_FIELDS = tuple(f.name for f in dataclasses.fields(MicroBatchMeta))


def _meta_of(meta: MicroBatchMeta | None, fields: dict[str, Any], who: str) -> MicroBatchMeta:
    """``meta``; one built from the flat keyword arguments (the earlier constructor); or ``meta`` with those
    fields replaced when both are given."""
    if meta is None:
        return MicroBatchMeta(**fields)
    if not isinstance(meta, MicroBatchMeta):
        raise TypeError(f"{who}: meta must be a MicroBatchMeta, got {type(meta).__name__}")
    return dataclasses.replace(meta, **fields) if fields else meta


def _delegate(cls: type, names: Sequence[str]) -> type:
    """Read-only properties ``cls.<name>`` → ``self.meta.<name>`` (the meta's fields read on a slot or a list)."""
    for name in names:
        setattr(cls, name, property(lambda self, _n=name: getattr(self.meta, _n),
                                    doc=f"``meta.{name}`` (:class:`MicroBatchMeta`)"))
    return cls


@dataclass(frozen=True, init=False)
class SampleSlot:
    """One sample's place in a planned micro-batch, as seen by one rank of its CP group (immutable).

    ``index``: dataset index; ``num_tokens``: tokens to keep (< ``length`` when truncated); ``length``: the
    sample's length in the index; ``visual_targets``: label positions of the kept tokens whose target is a visual
    placeholder, as the sampler counted them (0 without a visual layout; the collator needs it only to take a
    skipped sample out of the loss denominator); ``meta``: the micro-batch's :class:`MicroBatchMeta` (shared with the other
    slots and the list), whose fields read as attributes here too (``ranks``, ``cp_rank``,
    ``num_tokens_global``, …). ``SampleSlot(index=, num_tokens=, length=, ranks=, cp_rank=, epoch=, …)``
    builds the meta from the flat fields; with ``meta=`` too they replace those fields of it (so
    ``dataclasses.replace(slot, cp_rank=1)`` works as before).
    """

    __slots__ = ("index", "num_tokens", "length", "meta", "visual_targets")  # by hand: see dataclass(slots=True)
    index: int
    num_tokens: int
    length: int
    meta: MicroBatchMeta
    visual_targets: int

    def __init__(self, *, index: int, num_tokens: int, length: int, meta: MicroBatchMeta | None = None,
                 visual_targets: int = 0, **micro_batch: Any) -> None:
        meta = _meta_of(meta, micro_batch, "SampleSlot")
        if not meta.ranks:
            raise ValueError("a SampleSlot belongs to a CP group: its meta needs ranks (an idle rank has no slots)")
        if index < 0:
            raise ValueError(f"index must be >= 0, got {index}")
        if not 1 <= num_tokens <= length:
            raise ValueError(f"num_tokens must be in [1, length={length}], got {num_tokens}")
        if not 0 <= visual_targets < num_tokens:
            raise ValueError(f"visual_targets must be in [0, num_tokens={num_tokens}), got {visual_targets}")
        for name, value in (("index", int(index)), ("num_tokens", int(num_tokens)), ("length", int(length)),
                            ("meta", meta), ("visual_targets", int(visual_targets))):
            object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple:
        """Pickled by its values; the meta object stays shared with the list (pickle's memo)."""
        return _rebuild_slot, (self.index, self.num_tokens, self.length, self.meta, self.visual_targets)

    @property
    def truncated(self) -> bool:
        return self.num_tokens < self.length


def _rebuild_slot(index: int, num_tokens: int, length: int, meta: MicroBatchMeta, visual_targets: int = 0) -> SampleSlot:
    return SampleSlot(index=index, num_tokens=num_tokens, length=length, meta=meta, visual_targets=visual_targets)


_delegate(SampleSlot, META_FIELDS + ("degree", "rank"))


class SlotList(list):
    """This rank's slots of one micro-batch (a plain ``list`` of :class:`SampleSlot`) plus its
    :class:`MicroBatchMeta` (``meta``), so that an idle rank's empty list still says where it is and carries
    ``num_tokens_global``. The meta's fields read as attributes (``epoch``, ``global_batch``, ``micro_batch``,
    ``num_micro_batches``, ``num_tokens_global``, ``num_text_labels_global``, ``ranks`` — ``()`` when idle —
    and ``cp_rank`` — ``-1`` when idle). ``SlotList(slots, epoch=, …)`` builds the meta from the flat fields."""

    def __init__(self, slots: Sequence[Any] = (), *, meta: MicroBatchMeta | None = None, **micro_batch: Any):
        super().__init__(slots)
        self.meta = _meta_of(meta, micro_batch, "SlotList")

    def __repr__(self) -> str:
        m = self.meta
        return (f"SlotList(epoch={m.epoch}, global_batch={m.global_batch}, micro_batch={m.micro_batch}"
                f"/{m.num_micro_batches}, ranks={m.ranks}, cp_rank={m.cp_rank}, "
                f"indices={[s.index if isinstance(s, SampleSlot) else s[1].index for s in self]})")


_delegate(SlotList, META_FIELDS)


class FCPDataset:
    """``FCPDataset(base)[slot] → (base[slot.index], slot)``: carries the plan through DataLoader workers.

    ``__getitems__`` (used by the DataLoader's fetcher for a whole batch) returns a :class:`SlotList` of the
    pairs with the same meta object, so an idle rank's empty batch reaches the collator with its
    ``num_tokens_global``.

    A sample whose ``base[i]`` raises is tried ``retries`` more times, then (``on_error="skip"``, the default)
    recorded and replaced by a :class:`fcp_data.read_errors.SkippedSample`, which the collator packs as
    label-free padding of the planned length and :func:`fcp_exec.step.train_step` takes out of the loss
    denominator; ``max_consecutive_errors``/``max_error_rate`` end the run when the dataset itself is broken;
    ``errors_path`` appends one JSON line per skipped sample (:mod:`fcp_data.read_errors`). ``on_error="raise"``
    ends the run at the first sample that still fails with a ``SampleReadError`` naming it (the exception chained).
    ``strict_lengths`` (as :class:`fcp_data.collator.FCPCollator`'s): a sample whose ``input_ids`` do not have the
    length the sampler planned with (a file edited since indexing) is a failed read too (``StaleSampleError``), not
    the collator's error that would end the run; pass False together with the collator's ``strict_lengths=False``.
    So is a tokenized sample (a dict with ``input_ids``) that the model cannot take (``MalformedSampleError``): ids
    that are not 1-D integers, ``labels`` of another length, or — with ``vocab_size`` (the model's) — a token id or label
    outside ``[0, vocab_size)``, which would otherwise end the run inside the embedding (on a GPU, as a device-side
    assert), a negative label other than ``ignore_index`` (the collator's: pass the same value to both), fewer tokens
    than the sampler planned to keep (also with ``strict_lengths=False``), a ``grid_thw`` that is not rows of three
    integers or ``pixel_values`` that are not an array, and ``None`` in place of a sample. A sample that passes reaches
    the collator as it was read.
    """

    def __init__(self, base: Any, *, on_error: str = "skip", retries: int = 1, max_consecutive_errors: int = 8,
                 max_error_rate: float = 0.01, errors_path: Any = None, strict_lengths: bool = True,
                 vocab_size: int | None = None, ignore_index: int = -100) -> None:
        from fcp_data.read_errors import ON_ERROR, ReadErrorBudget
        from fcp_data.strict import token_id

        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        strict_lengths = flag("strict_lengths", strict_lengths)
        if isinstance(base, (str, bytes)) or not hasattr(base, "__getitem__"):
            raise TypeError(f"base must be a map-style dataset (base[i] is sample i), got {type(base).__name__}")
        if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1):
            raise ValueError(f"vocab_size must be an int >= 1 or None, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.ignore_index = token_id("ignore_index", ignore_index)
        self.base = base
        self.on_error = on_error
        self.strict_lengths = strict_lengths
        self.retries = retries
        self._size_checked = False  # the sampler's number of samples compared with len(base) (_check_size)
        self.budget = ReadErrorBudget(max_consecutive_errors=max_consecutive_errors, max_error_rate=max_error_rate,
                                      errors_path=errors_path)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, slot: SampleSlot) -> tuple[Any, SampleSlot]:
        if not isinstance(slot, SampleSlot):
            hint = (" — a whole micro-batch: pass FCPSampler as the DataLoader's batch_sampler=, not sampler="
                    if isinstance(slot, SlotList) else "")
            raise TypeError(f"FCPDataset is indexed by SampleSlot (from FCPSampler), got {type(slot).__name__}{hint}")
        error: Exception | None = None
        for _ in range(self.retries + 1):
            try:
                sample = _checked(self.base[slot.index], slot, self.strict_lengths, self.vocab_size, self.ignore_index)
            except Exception as e:  # noqa: BLE001 - any failure of one sample is that sample's, within the budget
                error = e
                continue
            self.budget.ok()
            return sample, slot
        from fcp_data.read_errors import SampleReadError, SkippedSample, sample_key, sample_skeleton

        if self.on_error == "raise":
            skipped = SkippedSample.of(slot.index, sample_key(self.base, slot.index), error)
            raise SampleReadError(f"{skipped.describe()} failed to read (FCPDataset(on_error='raise'))") from error
        skipped = SkippedSample.of(slot.index, sample_key(self.base, slot.index), error,
                                   sample_skeleton(self.base, slot.index))
        self.budget.failed(skipped, slot)
        return skipped, slot

    def __getitems__(self, slots: Sequence[SampleSlot]) -> list:
        if isinstance(slots, SlotList):
            _check_size(self, slots.meta.num_samples)
        items = [self[s] for s in slots]
        return SlotList(items, meta=slots.meta) if isinstance(slots, SlotList) else items


def _check_size(dataset: "FCPDataset", num_samples: int | None) -> None:
    """The sampler's lengths and the dataset must describe the same samples: with fewer samples than the sampler
    plans, every read past the end would fail (as if the data were damaged) — an error; with more, the rest is never
    read — one warning (per process: DataLoader workers say it too), since lengths of a prefix may be on purpose."""
    try:
        size = len(dataset.base)
    except TypeError:  # a dataset without len(): nothing to compare
        return
    if num_samples is None or size == num_samples or dataset._size_checked:
        return
    dataset._size_checked = True
    what = (f"FCPDataset: the sampler plans {num_samples} samples but the dataset has {size}: the lengths given to "
            "FCPSampler must be the dataset's, one per sample in order")
    if size < num_samples:
        raise ValueError(what)
    logger.warning("%s; samples %d..%d are never read (for a subset, pass torch.utils.data.Subset(dataset, indices) "
                   "with the lengths of those samples)", what, num_samples, size - 1)


def rank_lists(plan: Any, epoch: int, g: int, ids: Any, toks: Any, lengths: Any, visual_layout: Any, *, rank: int,
               num_ranks: int, num_samples: int) -> list[SlotList]:
    """``rank``'s :class:`SlotList` for each micro-batch of global batch ``g``'s ``plan`` (``ids``: its dataset
    indices, ``toks``: tokens kept, ``lengths``: their index lengths; ``num_ranks``: the plan's world,
    ``num_samples``: the sampler's): one shared meta per micro-batch."""
    import numpy as np

    total = int(np.maximum(toks - 1, 0).sum())
    text_total, vis = None, np.zeros(len(ids), dtype=np.int64)
    if visual_layout is not None:
        vis = np.array([int(visual_layout(int(i), int(n))) for i, n in zip(ids, toks)], dtype=np.int64)
        text_total = total - int(vis.sum())
    num_mb, digest, out = len(plan.micro_batches), plan_digest(epoch, g, ids, toks, plan), []
    for m, mb in enumerate(plan.micro_batches):
        group = mb.group_of_rank(rank)
        ranks = () if group is None else tuple(group.ranks)
        meta = MicroBatchMeta(epoch=epoch, global_batch=g, micro_batch=m, num_micro_batches=num_mb,
                              num_tokens_global=total, num_text_labels_global=text_total, ranks=ranks,
                              cp_rank=ranks.index(rank) if ranks else -1, plan_digest=digest, num_samples=num_samples,
                              num_ranks=num_ranks, sampler_rank=rank)
        seqs = () if group is None else group.seq_ids
        slots = [SampleSlot(index=int(ids[s]), num_tokens=int(toks[s]), length=int(lengths[s]), meta=meta,
                            visual_targets=int(vis[s])) for s in seqs]
        out.append(SlotList(slots, meta=meta))
    return out


class StaleSampleError(ValueError):
    """A sample read fine but its length is not the one the sampler planned with (its file changed since indexing)."""


def plan_digest(epoch: int, global_batch: int, ids: Any, num_tokens: Any, plan: Any) -> int:
    """A 63-bit digest of one global batch's plan as every rank must hold it: where it sits (epoch, index), its
    samples (dataset indices, tokens kept) and each micro-batch's CP groups (ranks, sequences). Ranks that planned
    differently — other data or lengths, batch size, seed, cost model, planner — hold different digests, which
    ``fcp_exec.lockstep.check_plan_agreement`` compares before a step's first collective."""
    import hashlib

    import numpy as np

    h = hashlib.blake2b(np.asarray([epoch, global_batch, len(ids)], dtype=np.int64).tobytes(), digest_size=8)
    h.update(np.asarray(ids, dtype=np.int64).tobytes())
    h.update(np.asarray(num_tokens, dtype=np.int64).tobytes())
    for mb in plan.micro_batches:
        for g in mb.groups:
            h.update(np.asarray([-1, len(g.ranks), *g.ranks, len(g.seq_ids), *g.seq_ids], dtype=np.int64).tobytes())
        h.update(b"|")
    return int.from_bytes(h.digest(), "little") >> 1


class MalformedSampleError(ValueError):
    """A sample read fine but is not a tokenized sample the model can take (:class:`FCPDataset`)."""


def _checked(sample: Any, slot: SampleSlot, strict_lengths: bool, vocab_size: int | None, ignore_index: int) -> Any:
    """``sample`` unchanged, or the exception that makes it a failed read: :class:`MalformedSampleError`,
    :class:`StaleSampleError` (FCPDataset's docstring). A custom collator still gets the types it was read with."""
    from fcp_data.collator_inputs import as_ids, grid_of, pixels_of

    if sample is None:
        raise MalformedSampleError("is None (the dataset returned no sample)")
    if not isinstance(sample, dict) or "input_ids" not in sample:
        return sample  # not a tokenized sample: the collator's to read (FCPDataset serves any base)
    try:
        if sample["input_ids"] is None:
            raise ValueError("input_ids is None")
        ids = as_ids(sample["input_ids"], slot.index)
        labels = None if sample.get("labels") is None else as_ids(sample["labels"], slot.index, "labels")
        grid_of(sample, slot.index, signed=True)  # rows the collator can read (without signed_grids it wants t >= 1)
        pixels_of(sample, slot.index)
    except ValueError as e:
        raise MalformedSampleError(str(e).removeprefix(f"sample {slot.index}: ")) from None
    if labels is not None and labels.shape != ids.shape:
        raise MalformedSampleError(f"has {len(labels)} labels for {len(ids)} input_ids (they must align)")
    if labels is not None and bool(((labels < 0) & (labels != ignore_index)).any()):
        bad = labels[(labels < 0) & (labels != ignore_index)]
        raise MalformedSampleError(f"has label {int(bad[0])}: labels are token ids >= 0 or the ignore index "
                                   f"{ignore_index} (FCPDataset(ignore_index=...), the collator's)")
    if vocab_size is not None:  # negative labels other than the ignore index are refused above
        for key, bad in (("input_ids", ids[(ids < 0) | (ids >= vocab_size)]),
                         ("labels", None if labels is None else labels[labels >= vocab_size])):
            if bad is not None and len(bad):
                raise MalformedSampleError(f"has {key} {int(bad[0])} outside the model's vocabulary [0, {vocab_size})"
                                           + (f" (or the ignore index {ignore_index})" if key == "labels" else ""))
    if strict_lengths and len(ids) != slot.length:
        raise StaleSampleError(f"has {len(ids)} tokens but the sampler planned it with {slot.length}: its data "
                               "changed since the length index was built (rebuild the index if many samples say so; "
                               "lengths that are estimates on purpose need FCPDataset(strict_lengths=False) and "
                               "FCPCollator(strict_lengths=False))")
    if len(ids) < slot.num_tokens:
        raise StaleSampleError(f"has {len(ids)} tokens, fewer than the {slot.num_tokens} the sampler planned to keep "
                               "(lengths that are estimates must not exceed the samples' real lengths)")
    return sample
