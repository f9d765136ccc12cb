"""FCPCollator: turn one rank's share of a planned micro-batch into local, zigzag-sharded tensors.

Input: the list a DataLoader builds from ``FCPDataset`` — ``(sample, slot)`` pairs of one CP group, in
slot order (an idle rank's list is empty but still carries the micro-batch's metadata: the
:class:`fcp_data.slots.MicroBatchMeta` its list and slots share, read once). Per document, in slot order:

1. ``input_ids`` is cut to ``slot.num_tokens`` (the sampler's truncation); 2. padded with ``pad_token_id`` to 2·degree·k;
3. labels are already shifted: ``labels[t] = input_ids[t+1]`` inside the document, ``ignore_index`` at
   the document's last kept token and on every pad, so a document of ``n`` tokens has ``n − 1`` label
   tokens — exactly what ``slot.num_tokens_global`` counts over the global batch. With
   ``mask_visual_labels=True`` (the default; only with ``visual_token_id``) ``labels[t]`` is also
   ``ignore_index`` when ``input_ids[t+1]`` is a visual placeholder (MLLM recipes never train the LM to
   predict placeholders), and the batch's ``num_tokens_global`` is ``slot.num_text_labels_global``, the
   sampler's exact count of such label tokens (truncation included, see :mod:`fcp_data.visual_layout`); a batch
   with visual tokens whose sampler had no visual layout (plain lengths) is a ``ValueError``. A sample's own
   ``labels`` other than its ``input_ids`` are a ``ValueError`` unless ``sample_labels=True`` (below);
4. positions are ``0 .. P−1`` over the padded document (real tokens ``0 .. n−1``, pads continue the count;
   pads sit after the document's real tokens, so under a causal mask no real token sees them);
5. CP rank ``r`` keeps chunks ``r`` and ``2·degree−1−r`` of every padded document
   (:func:`fcp_data.layout.zigzag_index`), in document order.

Batch dict (all tensors on CPU, 1-D unless stated)::

    input_ids        LongTensor [L]       local tokens
    labels           LongTensor [L]       shifted labels, ignore_index on doc ends, pads (and visual targets)
    position_ids     LongTensor [L]       global position of each local token inside its document
    cu_seqlens       IntTensor  [D+1]     local padded document boundaries (global padded ones // degree)
    max_seqlen       int                  longest local padded document
    ranks            tuple[int, ...]      the CP group (global ranks, ring order); () on an idle rank
    cp_rank          int                  this rank's position in ``ranks``; -1 on an idle rank
    num_tokens_global int                 non-ignored labels of the whole global batch (loss denominator;
                                          None with ``sample_labels=True`` until train_step fills it in)
    num_label_tokens_local int            non-ignored local labels (only with ``sample_labels=True``)
    sample_indices   tuple[int, ...]      dataset indices of the documents, in packing order
    skipped_samples  tuple[dict, ...]     the documents that failed to read (``FCPDataset(on_error="skip")``:
                                          ``{"index", "key", "reason", "detail", "epoch", "global_batch", "rank"}``),
                                          packed as label-free pads of their planned length
    num_skipped_labels int                label tokens of the skipped documents that ``num_tokens_global``
                                          counted (on the group's cp_rank 0 only, so a SUM over ranks counts each
                                          once; 0 with ``sample_labels=True``, whose count is exact):
                                          :func:`fcp_exec.step.train_step` takes them out of the denominator
    read_status      tuple[int, ...]      per document: bits of :mod:`fcp_data.read_errors` (``SKIPPED`` here,
                                          ``LAYOUT_UNKNOWN``: skipped without a skeleton, ``VISUAL``: read with
                                          images/videos); the group's ranks agree on them before the forward
                                          (:func:`fcp_exec.skips.agree_skips`: a document that failed on *some*
                                          rank is then label-free on all of them)
    planned_labels   tuple[int, ...]      per document: the label tokens ``num_tokens_global`` counts for it
    sample_tokens    tuple[int, ...]      per document: its tokens kept (before the padding to 2·degree)
    epoch, global_batch, micro_batch, num_micro_batches   ints: where this micro-batch sits in the epoch
    plan_digest      int                  the global batch plan's digest (:func:`fcp_data.slots.plan_digest`),
                                          compared across ranks before a step (``fcp_exec.lockstep``), which also
    num_ranks, sampler_rank  int | None   compares the sampler's world and rank with the process group's
  multi-token prediction (``future_tokens=D``; :mod:`fcp_data.lookahead`):
    future_ids       LongTensor [D, L]    per local token, the token k = 1..D places ahead in its document
                                          (``pad_token_id`` past its end) — the depth-k MTP module's input
    future_labels    LongTensor [D, L]    that token's label (``ignore_index`` past the end): depth k's target
    future_valid     BoolTensor [D, L]    whether that token exists
  multimodal (``visual_token_id`` set):
    visual_pos       LongTensor [V]       local positions of visual placeholder tokens
    visual_index     LongTensor [V]       row of each in the group's visual embeddings, i.e. the order of
                                          the placeholder tokens of all documents (untruncated) in slot
                                          order — the vision tower runs on all of the group's images and
                                          the model scatters rows ``visual_index`` to ``visual_pos``
    pixel_values     Tensor               the group's pixel patches concatenated on dim 0 (only when
    grid_thw         LongTensor [n, 3]    samples carry them); grid_thw likewise
    mrope_position_ids LongTensor [3, L]  Qwen-VL 3-D rope positions (``mrope=True``), rule: fcp_data.mrope

Samples' own labels (``sample_labels=True``; SFT: ``ignore_index`` on the prompt): a sample's ``labels`` are
aligned with its ``input_ids`` (the Hugging Face convention, not shifted; without the key, ``input_ids``), and
``labels[t]`` above becomes the sample's label of token ``t+1`` (still ``ignore_index`` at the document's end, on
pads and, when masked, on visual targets). The sampler cannot count those, so the batch's ``num_tokens_global``
is ``None`` and ``num_label_tokens_local`` is this rank's count (its zigzag share; 0 on an idle rank):
:func:`fcp_exec.step.train_step` sums it over the global batch's micro-batches and all ranks (one all-reduce,
after reading the step's micro-batches) and fills ``num_tokens_global`` in before the first forward; a loop of
your own calls :func:`fcp_exec.step.fill_num_tokens_global` the same way.

3-D positions (``mrope=True``): :func:`fcp_data.mrope.qwen_vl_mrope_positions` (the rule and which transformers
versions agree with it, are in :mod:`fcp_data.mrope`); ``position_fn`` replaces it (below).

``position_fn`` replaces that rule: ``position_fn(sample, input_ids) -> LongTensor [3, n]`` gets the base
sample dict (``grid_thw``, optional ``second_per_grid_ts``, …) and the whole untruncated document's ids and
returns its 3-D positions; step 4's cut, the pads (continuing after the document's maximum + 1 on all three
axes) and step 5's zigzag take stay as above. :class:`fcp_exec.integrations.hf_positions.HFRopeIndex` is
such a function: it calls the installed transformers' own ``get_rope_index``, which is what a model computes
at inference. It must pickle (DataLoader workers receive the collator): a module-level function or a small
object, not a lambda.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from fcp_data.collator_inputs import (as_ids, check_pairs, check_sample_keys, grid_of, no_stop_iteration,
                                     pixels_of, sample_labels_of, token_ids)
from fcp_data.layout import local_positions, zigzag_index
from fcp_data.lookahead import lookahead
from fcp_data.mrope import qwen_vl_mrope_positions
from fcp_data.read_errors import LAYOUT_UNKNOWN, SKIPPED, VISUAL, SkippedSample
from fcp_data.strict import flag, token_id

__all__ = ["FCPCollator", "qwen_vl_mrope_positions"]

# the batch-dict entries taken from the micro-batch's MicroBatchMeta (num_text_labels_global: see _denominator)
_META = ("epoch", "global_batch", "micro_batch", "num_micro_batches", "num_tokens_global", "ranks", "cp_rank",
         "num_text_labels_global", "plan_digest", "num_ranks", "sampler_rank")


class FCPCollator:
    """Collate ``(sample, slot)`` pairs of one CP group into this rank's local batch dict.

    ``pad_token_id``: token used for padding; ``ignore_index``: label value the loss skips;
    ``visual_token_id``: the placeholder id (or ids, e.g. Qwen2-VL's image and video ids) of visual
    tokens, enabling ``visual_pos``/``visual_index``; ``spatial_merge_size``: patches merged per side into
    one visual token (Qwen-VL: 2; used by ``mrope``); ``mrope``: also return Qwen-VL 3-D rope positions;
    ``strict_lengths``: require every sample's ``input_ids`` length to equal the length the sampler planned
    with (``slot.length``) — a mismatch means the length index is stale; ``mask_visual_labels``: ignore
    labels whose target is a visual placeholder (module docstring; no effect without ``visual_token_id``);
    ``position_fn``: ``(sample, input_ids[n]) -> LongTensor [3, n]``, the 3-D positions of one whole
    untruncated document, replacing the built-in Qwen-VL rule (implies ``mrope=True``; module docstring);
    ``sample_labels``: train on each sample's own ``labels`` (SFT prompt masks; module docstring);
    ``signed_grids``: a grid row's first entry may be negative (LLaVA-OneVision marks an image's row ``(−crops, H, W)``,
    :mod:`fcp_exec.integrations.hf_llava`); ``future_tokens``: look-ahead depth for multi-token prediction (the
    ``future_*`` entries; 0: none).
    """

    def __init__(self, *, pad_token_id: int = 0, ignore_index: int = -100,
                 visual_token_id: int | Sequence[int] | None = None, spatial_merge_size: int = 2,
                 mrope: bool = False, strict_lengths: bool = True, mask_visual_labels: bool = True,
                 position_fn: Callable[[dict, torch.Tensor], torch.Tensor] | None = None,
                 sample_labels: bool = False, signed_grids: bool = False, future_tokens: int = 0) -> None:
        self.pad_token_id = token_id("pad_token_id", pad_token_id, minimum=0)  # a row of the embedding
        self.ignore_index = token_id("ignore_index", ignore_index)
        self.visual_ids: tuple[int, ...] = token_ids(visual_token_id)
        if isinstance(spatial_merge_size, bool) or not hasattr(spatial_merge_size, "__index__") or spatial_merge_size < 1:
            raise ValueError(f"spatial_merge_size must be an int >= 1, got {spatial_merge_size!r}")
        self.spatial_merge_size = int(spatial_merge_size)
        self.signed_grids = flag("signed_grids", signed_grids)
        if position_fn is not None and not callable(position_fn):
            raise TypeError(f"position_fn must be a callable (sample, input_ids) -> LongTensor [3, n], got {position_fn!r}")
        self.position_fn = position_fn
        mrope = flag("mrope", mrope) or position_fn is not None
        if mrope and not self.visual_ids:
            raise ValueError(f"{'position_fn' if position_fn is not None else 'mrope=True'} needs visual_token_id (the "
                             "placeholder id(s) of visual tokens)")
        self.mrope, self._rule = mrope, ({"mrope_rule": "fcp"} if mrope and position_fn is None else {})
        self.strict_lengths = flag("strict_lengths", strict_lengths)
        self.mask_visual_labels = flag("mask_visual_labels", mask_visual_labels) and bool(self.visual_ids)
        self.sample_labels = flag("sample_labels", sample_labels)
        if isinstance(future_tokens, bool) or not hasattr(future_tokens, "__index__") or future_tokens.__index__() < 0:
            raise ValueError(f"future_tokens must be an int >= 0 (the look-ahead depth), got {future_tokens!r}")
        self.future_tokens = future_tokens.__index__()

    def __repr__(self) -> str:
        return (f"FCPCollator(pad_token_id={self.pad_token_id}, ignore_index={self.ignore_index}, "
                f"visual_token_id={self.visual_ids or None}, mrope={self.mrope}, "
                f"mask_visual_labels={self.mask_visual_labels}, sample_labels={self.sample_labels}, "
                f"future_tokens={self.future_tokens}"
                + (f", position_fn={self.position_fn!r})" if self.position_fn is not None else ")"))

    # ------------------------------------------------------------------ helpers
    def _meta(self, batch: Sequence) -> dict[str, Any]:
        """The batch's micro-batch metadata as batch-dict entries, read once from the one
        :class:`~fcp_data.slots.MicroBatchMeta` its list (a ``SlotList`` from ``FCPDataset``) and slots share;
        a hand-built list of pairs uses its first slot's, and every slot must refer to the same one."""
        from fcp_data.slots import MicroBatchMeta

        meta = getattr(batch, "meta", None)
        if batch:
            meta = batch[0][1].meta if meta is None else meta
            for _, s in batch:
                if s.meta is not meta and s.meta != meta:  # shared by reference: equal only if built apart
                    if (s.ranks, s.cp_rank) != (meta.ranks, meta.cp_rank):
                        raise ValueError(f"all slots of one batch must belong to one CP group; got ranks {meta.ranks} "
                                         f"and {s.ranks} — use FCPSampler as the DataLoader's batch_sampler")
                    raise ValueError("slots of one batch come from different micro-batches")
        elif not isinstance(meta, MicroBatchMeta):
            raise ValueError(
                "an empty batch must carry the micro-batch metadata (an idle rank's SlotList); build the "
                "DataLoader with batch_sampler=FCPSampler(...) and dataset=FCPDataset(base)")
        return {k: getattr(meta, k) for k in _META} | self._rule

    def _denominator(self, meta: dict[str, Any], has_visual_target: bool) -> dict[str, Any]:
        """``meta`` with ``num_tokens_global`` = the non-ignored labels of the global batch."""
        text = meta.pop("num_text_labels_global")
        if self.sample_labels:  # counted from the labels themselves, over the global batch, by train_step
            meta["num_tokens_global"] = None
        elif self.mask_visual_labels:
            if text is not None:
                meta["num_tokens_global"] = int(text)
            elif has_visual_target:
                raise ValueError(
                    "FCPCollator(mask_visual_labels=True) got visual placeholder tokens, but the sampler knows no visual "
                    "layout, so num_tokens_global would count the masked labels: build FCPSampler from the LengthIndex "
                    "(not plain lengths), or pass FCPSampler(visual_layout=...), or FCPCollator(mask_visual_labels=False)")
        return meta

    def _empty(self, meta: dict[str, Any]) -> dict[str, Any]:
        z = torch.zeros(0, dtype=torch.long)
        out = {"input_ids": z, "labels": z.clone(), "position_ids": z.clone(),
               "cu_seqlens": torch.zeros(1, dtype=torch.int32), "max_seqlen": 0, "sample_indices": (),
               "skipped_samples": (), "num_skipped_labels": 0, "read_status": (), "planned_labels": (),
               "sample_tokens": ()}
        out.update(meta)
        if self.sample_labels:
            out["num_label_tokens_local"] = 0
        if self.visual_ids:
            out["visual_pos"], out["visual_index"] = z.clone(), z.clone()
        if self.mrope:
            out["mrope_position_ids"] = torch.zeros((3, 0), dtype=torch.long)
        if self.future_tokens:
            out.update({k: torch.zeros((self.future_tokens, 0), dtype=torch.bool if k == "future_valid" else torch.long)
                        for k in ("future_ids", "future_labels", "future_valid")})
        return out

    def _document_positions(self, sample: dict, full: torch.Tensor, grid: torch.Tensor | None,
                            visual_ids: torch.Tensor, index: int) -> torch.Tensor:
        """``[3, len(full)]`` positions of one untruncated document: ``position_fn`` or the built-in rule."""
        if self.position_fn is None:
            return qwen_vl_mrope_positions(full, grid, visual_ids, self.spatial_merge_size)
        out = self.position_fn(sample, full)
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (3, full.numel()) or \
                out.dtype.is_floating_point or out.dtype == torch.bool:
            got = f"shape {tuple(out.shape)} dtype {out.dtype}" if isinstance(out, torch.Tensor) else type(out).__name__
            raise ValueError(f"sample {index}: position_fn must return an integer tensor of shape (3, {full.numel()}) "
                             f"(the whole untruncated document), got {got}")
        return out.to(torch.long)

    # ------------------------------------------------------------------ main
    @no_stop_iteration
    def __call__(self, batch: Sequence) -> dict[str, Any]:
        check_pairs(batch)
        meta = self._meta(batch)
        if not batch:
            return self._empty(self._denominator(meta, False))
        degree, cp_rank = len(meta["ranks"]), meta["cp_rank"]
        acc = _Packed(multiple=2 * degree)
        visual_ids = torch.tensor(self.visual_ids, dtype=torch.long)
        for sample, slot in batch:
            self._pack(acc, sample, slot, visual_ids)
        cu = [0]
        for p in acc.padded_lens:
            cu.append(cu[-1] + p)
        input_ids = torch.cat(acc.ids_parts)
        positions, labels, has_vis_target = self._positions_labels(input_ids, cu, acc, visual_ids)
        meta = self._denominator(meta, has_vis_target)
        idx = None if degree == 1 else zigzag_index(cu, degree, cp_rank)
        take = (lambda x: x) if idx is None else (lambda x: x.index_select(-1, idx))
        out: dict[str, Any] = {
            "input_ids": take(input_ids),
            "labels": take(labels),
            "position_ids": take(positions),
            "cu_seqlens": torch.div(torch.tensor(cu, dtype=torch.int64), degree, rounding_mode="floor").to(torch.int32),
            "max_seqlen": max(acc.padded_lens) // degree,
            "sample_indices": tuple(int(s.index) for _, s in batch),
            "skipped_samples": tuple(acc.skipped),
            "num_skipped_labels": sum(p for p, st in zip(acc.planned, acc.status) if st & SKIPPED)
            if cp_rank == 0 and not self.sample_labels else 0,
            "read_status": tuple(acc.status),
            "planned_labels": tuple(acc.planned),
            "sample_tokens": tuple(acc.kept_lens),
        }
        out.update(meta)
        if self.sample_labels:
            out["num_label_tokens_local"] = int((out["labels"] != self.ignore_index).sum())
        if self.visual_ids:
            out["visual_pos"], out["visual_index"] = local_positions(torch.cat(acc.vis_global), torch.cat(acc.vis_rows),
                                                                         idx, acc.start)
            if self.mrope:
                out["mrope_position_ids"] = take(torch.cat(acc.mrope_parts, dim=1))
        if self.future_tokens:
            kept = torch.repeat_interleave(torch.tensor(acc.kept_lens), torch.tensor(acc.padded_lens))
            out["future_ids"], out["future_labels"], out["future_valid"] = lookahead(
                input_ids, labels, positions, kept, self.future_tokens, pad_token_id=self.pad_token_id,
                ignore_index=self.ignore_index, index=idx)
        if acc.pixel_values:
            out["pixel_values"] = torch.cat(acc.pixel_values, dim=0)
        if acc.grids:
            out["grid_thw"] = torch.cat(acc.grids, dim=0)
        return out

    def _planned_labels(self, slot) -> int:
        """The label tokens the sampler's ``num_tokens_global`` counts for the document of ``slot``."""
        return int(slot.num_tokens) - 1 - (int(slot.visual_targets) if self.mask_visual_labels else 0)

    def _pack(self, acc: "_Packed", sample, slot, visual_ids: torch.Tensor, status: int = 0) -> None:
        """Append one sample, cut to its slot's ``num_tokens`` and padded to a multiple of ``2·degree``; ``status``
        with ``SKIPPED``: none of its tokens is a target (a skipped sample's skeleton or pads)."""
        if isinstance(sample, SkippedSample):
            return self._pack_skipped(acc, sample, slot, visual_ids)
        if not isinstance(sample, dict) or "input_ids" not in sample:
            got = f"a dict with keys {sorted(sample)}" if isinstance(sample, dict) else type(sample).__name__
            raise ValueError(f"sample {slot.index}: expected a dict with 'input_ids', got {got}")
        full = as_ids(sample["input_ids"], slot.index)
        check_sample_keys(sample, full, slot.index, self.sample_labels)
        if self.strict_lengths and full.numel() != slot.length:
            raise ValueError(
                f"sample {slot.index} has {full.numel()} tokens but the sampler planned with {slot.length}; "
                "the length index is stale (rebuild it) or pass strict_lengths=False")
        if full.numel() < slot.num_tokens:
            raise ValueError(f"sample {slot.index} has {full.numel()} tokens, fewer than the slot's {slot.num_tokens}")
        n = int(slot.num_tokens)
        pad = (-n) % acc.multiple
        acc.ids_parts.append(full[:n])
        if pad:
            acc.ids_parts.append(full.new_full((pad,), self.pad_token_id))
        if self.sample_labels:
            acc.label_parts.append(sample_labels_of(sample, full, slot.index, self.ignore_index)[:n])
            acc.label_parts.append(full.new_full((pad,), self.ignore_index))
        acc.kept_lens.append(n)
        acc.live.append(not status & SKIPPED)
        acc.planned.append(self._planned_labels(slot))
        grid = grid_of(sample, slot.index, self.signed_grids)
        if grid is not None:
            acc.grids.append(grid)
        pixels = pixels_of(sample, slot.index)
        if pixels is not None:
            acc.pixel_values.append(pixels)
        if not status & SKIPPED and (grid is not None or pixels is not None):
            status |= VISUAL
        acc.status.append(status)
        if self.visual_ids:
            self._pack_visual(acc, sample, slot, full, grid, visual_ids, n, pad)
        acc.padded_lens.append(n + pad)
        acc.start += n + pad

    def _pack_skipped(self, acc: "_Packed", skipped: SkippedSample, slot, visual_ids: torch.Tensor) -> None:
        """A sample that failed to read, packed with no label: its skeleton (``IndexedDataset.skeleton``), else pad
        tokens of its planned length (text positions, no pixels); recorded in the batch with the label tokens the
        sampler counted for it."""
        acc.skipped.append(skipped.record(slot))
        sample, status = skipped.skeleton, SKIPPED
        if sample is None:
            sample = {"input_ids": torch.full((int(slot.length),), self.pad_token_id, dtype=torch.long)}
            status |= LAYOUT_UNKNOWN if self.visual_ids else 0
        self._pack(acc, sample, slot, visual_ids, status)

    def _pack_visual(self, acc: "_Packed", sample, slot, full: torch.Tensor, grid: torch.Tensor | None,
                     visual_ids: torch.Tensor, n: int, pad: int) -> None:
        """Record the kept visual tokens' packed positions and rows (and M-RoPE positions) of one sample."""
        is_vis = torch.isin(full, visual_ids)
        num_vis = int(is_vis.sum())
        if grid is not None and self.mrope:
            expect = int(grid.prod(dim=1).sum()) // self.spatial_merge_size ** 2
            if expect != num_vis:
                raise ValueError(
                    f"sample {slot.index} has {num_vis} visual placeholder tokens but its grid_thw "
                    f"implies {expect} (spatial_merge_size={self.spatial_merge_size})")
        kept = torch.nonzero(is_vis[:n]).flatten()
        acc.vis_global.append(kept + acc.start)
        acc.vis_rows.append(torch.arange(kept.numel(), dtype=torch.long) + acc.vis_offset)
        acc.vis_offset += num_vis
        if self.mrope:
            mr = self._document_positions(sample, full, grid, visual_ids, slot.index)[:, :n]
            top = int(mr.max()) + 1 if n else 0
            acc.mrope_parts.append(torch.cat([mr, torch.arange(top, top + pad).expand(3, pad)], dim=1))

    def _positions_labels(self, input_ids: torch.Tensor, cu: list[int], acc: "_Packed",
                          visual_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """Per token: its position inside its padded document, its label (the next token while inside the kept
        document, else ``ignore_index``; visual targets masked when asked) and whether a visual target exists."""
        plen = torch.tensor(acc.padded_lens, dtype=torch.long)
        positions = torch.arange(acc.start, dtype=torch.long) - torch.repeat_interleave(
            torch.tensor(cu[:-1], dtype=torch.long), plen)
        last = torch.repeat_interleave(torch.tensor(acc.kept_lens, dtype=torch.long) - 1, plen)
        nxt = torch.roll(input_ids, -1)
        target = (positions < last) & torch.repeat_interleave(torch.tensor(acc.live, dtype=torch.bool), plen)
        if self.sample_labels:  # the next token's own label (ignore_index there masks this target)
            nxt_label = torch.roll(torch.cat(acc.label_parts), -1)
        has_vis_target = False
        if self.mask_visual_labels:
            vis_target = target & torch.isin(nxt, visual_ids)
            target &= ~vis_target
            has_vis_target = bool(vis_target.any())
        labels = torch.where(target, nxt_label if self.sample_labels else nxt, self.ignore_index)
        return positions, labels, has_vis_target


@dataclass
class _Packed:
    """What :meth:`FCPCollator.__call__` accumulates over the samples of one batch (global, before sharding)."""

    multiple: int
    ids_parts: list = field(default_factory=list)
    label_parts: list = field(default_factory=list)  # the samples' own labels (sample_labels=True), padded
    mrope_parts: list = field(default_factory=list)
    padded_lens: list = field(default_factory=list)
    kept_lens: list = field(default_factory=list)
    live: list = field(default_factory=list)  # per document: False where it failed to read (label-free pads)
    skipped: list = field(default_factory=list)  # their records
    status: list = field(default_factory=list)  # per document: read_status bits (fcp_data.read_errors)
    planned: list = field(default_factory=list)  # per document: label tokens num_tokens_global counts for it
    vis_global: list = field(default_factory=list)  # packed (padded, global) positions of kept visual tokens
    vis_rows: list = field(default_factory=list)
    pixel_values: list = field(default_factory=list)
    grids: list = field(default_factory=list)
    vis_offset: int = 0
    start: int = 0
