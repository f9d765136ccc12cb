"""One optimizer step's worth of forward/backward over the plan-annotated micro-batches of a global batch,
for any ``nn.Module``, with the gradient synchronisation of the trainer's choice.

``train_step(model, micro_batches, loss_fn, reducer)`` runs every micro-batch of one global batch on this rank
and leaves the gradients of the *global-batch mean loss* in the parameters (``.grad``; sharded DTensors under
FSDP2), exactly as one process that saw the whole global batch would (DESIGN §8). The rules that make this
hold under DDP and FSDP2, whose collectives must run in lock-step on every rank:

* **Every rank runs every micro-batch.** A rank that has no CP group in a micro-batch (the plan left it idle,
  ``batch["ranks"] == ()``) runs a *zero-contribution* forward/backward on a two-token dummy document
  (:func:`idle_batch`, a degree-1 group of itself) whose loss is multiplied by 0. Its gradients are exact
  zeros, but FSDP2's all-gathers/reduce-scatters and DDP's buffer broadcasts and bucket all-reduces run
  exactly as often as on the busy ranks, so nothing hangs.
* **SUM semantics.** ``loss_fn`` returns this rank's share of the global mean (local label-token loss sum /
  ``num_tokens_global``; with the samples' own labels, ``FCPCollator(sample_labels=True)``, train_step first
  reads the step's micro-batches and counts it, :func:`fill_num_tokens_global`); the reducer *sums* gradients
  over ranks (DDP: a SUM comm hook instead of DDP's average; FSDP2: ``set_gradient_divide_factor(1.0)`` on
  *every* FSDP module; all-reduce: ``SUM``).
* **Sync once.** Gradients are synchronised only after the last micro-batch (DDP ``no_sync``, FSDP2
  ``set_requires_gradient_sync(False)`` before it; the all-reduce reducer reduces once at the end).

Reducers (:mod:`fcp_exec.reducers`; :func:`make_reducer` builds one by name and wraps the model, :func:`reducer_for`
picks the one for a model something else wrapped, e.g. ``accelerate``'s ``prepare``):

============  ==========================================================================================
``allreduce``  plain module; one flat all-reduce SUM of every gradient after the last micro-batch
``ddp``        ``DistributedDataParallel``; SUM comm hook; ``no_sync`` for all but the last micro-batch
``fsdp2``      ``fully_shard`` (each transformer block, then the root); divide factor 1 on every module
============  ==========================================================================================

Gradient checkpointing works with all three (use non-reentrant checkpointing, e.g. HF
``gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})``).

fp16 mixed precision: pass ``grad_scaler=`` (a ``torch.amp.GradScaler``; Accelerate's ``accelerator.scaler``) and
every micro-batch's backward runs on the scaled loss; the caller then steps through the scaler as usual
(``scaler.step(opt); scaler.update()``, or Accelerate's optimizer). The gradients the reducers sum are the scaled
ones (a sum commutes with the scale); an overflow on any rank reaches every rank — the all-reduce and DDP sums
carry an ``inf`` to all ranks, FSDP2's sharded gradients are DTensors whose ``inf`` check torch all-reduces — so
every rank skips the same steps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from fcp_data.sampler_inputs import dist_rank_and_world
from fcp_exec.grads import holds_grads
from fcp_exec.lockstep import check_plan_agreement
from fcp_exec.reducers import (REDUCER_NAMES, AllReduceReducer, DDPReducer, FSDP2Reducer,  # noqa: F401 - re-exported
                               make_reducer, mixed_precision, reducer_for)
from fcp_exec.skips import agree_skips
from fcp_exec.step_checks import EpochEnded, autocast_active, check_loss, in_step, next_micro_batch

__all__ = ["REDUCER_NAMES", "AllReduceReducer", "DDPReducer", "EpochEnded", "FSDP2Reducer", "StepResult",
           "autocast_loss", "denominator", "eval_step", "fill_num_tokens_global", "idle_batch", "is_idle",
           "make_reducer", "reducer_for", "mixed_precision", "next_global_batch", "padding_mask", "prepare_micro_batch",
           "rescale_skipped", "train_step"]

def is_idle(batch: dict) -> bool:
    """True when the plan gave this rank no CP group (or no token) in this micro-batch."""
    ids, ranks = batch.get("input_ids"), batch.get("ranks")  # ranks: a tuple, list or tensor (never its truth value)
    return ranks is None or len(ranks) == 0 or ids is None or ids.numel() == 0


def idle_batch(batch: dict, *, pad_token_id: int = 0, ignore_index: int = -100) -> dict:
    """A two-token dummy micro-batch for an idle rank: one document of two pad tokens, no label, run as a
    degree-1 group of this rank. Keeps every metadata key of ``batch``; 3-D positions when it has them."""
    rank, _ = dist_rank_and_world()
    out = dict(batch)
    out.update(input_ids=torch.full((2,), int(pad_token_id), dtype=torch.long),
               labels=torch.full((2,), int(ignore_index), dtype=torch.long),
               position_ids=torch.arange(2, dtype=torch.long), cu_seqlens=torch.tensor([0, 2], dtype=torch.int32),
               max_seqlen=2, ranks=(rank,), cp_rank=0, sample_indices=(), idle=True)
    if "mrope_position_ids" in batch:
        out["mrope_position_ids"] = torch.arange(2, dtype=torch.long).expand(3, 2).clone()
    for key in ("visual_pos", "visual_index"):
        if key in batch:
            out[key] = torch.zeros(0, dtype=torch.long)
    if "future_ids" in batch:  # multi-token prediction (fcp_data.lookahead): no token ahead, no target
        depth = int(batch["future_ids"].shape[0])
        out.update(future_ids=torch.full((depth, 2), int(pad_token_id), dtype=torch.long),
                   future_labels=torch.full((depth, 2), int(ignore_index), dtype=torch.long),
                   future_valid=torch.zeros((depth, 2), dtype=torch.bool))
    for key in ("pixel_values", "grid_thw", "second_per_grid_ts"):
        out.pop(key, None)
    return out


def padding_mask(batch: dict) -> torch.Tensor:
    """``[tokens]`` bool, True where a token of ``batch`` is no token of the data: the pads after each document
    (position past its kept tokens), every token of a document that failed to read, and all of an idle rank's dummy.
    Mixture-of-experts routers leave them out of their token counts (Megatron's ``GPTModel(padding_mask=...)``, the
    Hugging Face load-balancing loss of :mod:`fcp_exec.integrations.hf_router`), so they count what one process
    training on the same documents counts."""
    from fcp_data.read_errors import SKIPPED

    pos = batch["position_ids"]
    if batch.get("idle"):
        return torch.ones(pos.shape[-1], dtype=torch.bool)
    cu = torch.as_tensor(batch["cu_seqlens"], dtype=torch.long)
    kept = torch.tensor([0 if status & SKIPPED else int(n) for n, status in zip(batch["sample_tokens"],
                                                                                 batch["read_status"])],
                        dtype=torch.long)
    return pos >= torch.repeat_interleave(kept, cu[1:] - cu[:-1])


# ---------------------------------------------------------------------------------------------- reducers

# ---------------------------------------------------------------------------------------------- the step

@dataclass(slots=True)
class StepResult:
    """``loss``: the global-batch mean loss (identical on every rank); ``num_tokens``: its denominator;
    ``groups``: this rank's CP group per micro-batch (``()`` where idle); ``num_idle``: idle micro-batches;
    ``skipped``: the records of the samples this rank's batches skipped (failed reads, ``FCPDataset``), whose label
    tokens ``num_tokens`` no longer counts; ``epoch``, ``global_batch``: the global batch the step consumed
    (``FCPSampler.state_after(result)`` is the checkpoint's resume state); ``num_skipped_global``: the skip records
    of every rank summed (0: nothing skipped anywhere; from the step's own all-reduce)."""

    loss: float
    num_tokens: int
    groups: list[tuple[int, ...]] = field(default_factory=list)
    num_idle: int = 0
    skipped: list[dict] = field(default_factory=list)
    epoch: int = -1
    global_batch: int = -1
    num_skipped_global: int = 0


def fill_num_tokens_global(batches: Sequence[dict], device: torch.device | None = None) -> int:
    """The loss denominator of a global batch whose labels came from the samples (``FCPCollator(sample_labels=True)``:
    each batch's ``num_tokens_global`` is None and ``num_label_tokens_local`` is this rank's count): the sum over
    ``batches`` — *all* of this rank's micro-batches of one global batch — and over every rank (one all-reduce
    SUM on ``device``, so every rank must call it), written into each batch's ``num_tokens_global``. Returns it."""
    local = 0
    for b in batches:
        if b.get("num_label_tokens_local") is None:
            raise ValueError("a micro-batch without num_label_tokens_local: fill_num_tokens_global is for batches of "
                             "FCPCollator(sample_labels=True); other batches carry num_tokens_global already")
        local += int(b["num_label_tokens_local"])
    total = torch.tensor([local], dtype=torch.int64, device=device)
    if dist_rank_and_world()[1] > 1:
        dist.all_reduce(total)
    n = int(total[0])
    for b in batches:
        b["num_tokens_global"] = n
    return n


def denominator(batch: dict) -> int:
    """``batch["num_tokens_global"]`` (at least 1), the loss denominator; a clear error where it is still None."""
    n = batch.get("num_tokens_global")
    if n is None:
        raise ValueError("num_tokens_global is None: the batch comes from FCPCollator(sample_labels=True), whose label "
                         "count spans the global batch; run the step with train_step, or call "
                         "fcp_exec.step.fill_num_tokens_global(<all micro-batches of the step>) first")
    return max(int(n), 1)


def prepare_micro_batch(batch: dict, device: torch.device | str, *, pad_token_id: int = 0,
                        ignore_index: int = -100) -> dict:
    """One collator batch made ready for a forward of the trainer's own (a loop without :func:`train_step`): on a
    global batch's first micro-batch the ranks' plans are compared (:func:`fcp_exec.lockstep.check_plan_agreement`),
    a failed read is agreed within the CP group (:func:`fcp_exec.skips.agree_skips`) and an idle micro-batch becomes
    :func:`idle_batch`. ``device``: the model's. Every rank calls it for the same micro-batch."""
    if int(batch["micro_batch"]) == 0:
        check_plan_agreement(batch, device)
    batch = agree_skips(batch, device, ignore_index=ignore_index)
    return idle_batch(batch, pad_token_id=pad_token_id, ignore_index=ignore_index) if is_idle(batch) else batch


def next_global_batch(batches: Iterator[dict], device: torch.device | str, *, pad_token_id: int = 0,
                      ignore_index: int = -100) -> list[dict]:
    """This rank's micro-batches of the next global batch from an ``FCPSampler`` DataLoader iterator, each made ready
    by :func:`prepare_micro_batch`. Every rank calls it for the same global batch."""
    first = next_micro_batch(batches, 0, 1)
    num_mb = int(first["num_micro_batches"])
    return [prepare_micro_batch(first if m == 0 else next_micro_batch(batches, m, num_mb), device,
                                pad_token_id=pad_token_id, ignore_index=ignore_index) for m in range(num_mb)]


def autocast_loss(loss_fn: Callable[[nn.Module, dict], torch.Tensor], device_type: str,
                  dtype: torch.dtype) -> Callable[[nn.Module, dict], torch.Tensor]:
    """``loss_fn`` with its forward and loss under ``torch.autocast(device_type, dtype)`` (mixed precision over
    float32 parameters); :func:`train_step` runs the backward afterwards, outside autocast, as torch recommends."""
    def run(model: nn.Module, batch: dict) -> torch.Tensor:
        with torch.autocast(device_type, dtype=dtype):
            return loss_fn(model, batch)

    return run


def train_step(model: nn.Module, micro_batches: Iterable[dict], loss_fn: Callable[[nn.Module, dict], torch.Tensor],
               reducer, *, pad_token_id: int = 0, ignore_index: int = -100,
               to_device: Callable[[dict], dict] | None = None, grad_scaler=None) -> StepResult:
    """Forward/backward every micro-batch of one global batch and synchronise gradients (module docstring).

    ``micro_batches``: this rank's batches of one global batch, in order (the next ``num_micro_batches``
    batches of an ``FCPSampler`` DataLoader; an iterator is consumed exactly that far). ``loss_fn(model,
    batch)``: this rank's loss for one micro-batch, already divided by ``batch["num_tokens_global"]``; it is
    called on :func:`idle_batch` for idle micro-batches and its result multiplied by 0. ``reducer``: from
    :func:`make_reducer`. The caller zeroes gradients before and steps the optimizer after. Batches of
    ``FCPCollator(sample_labels=True)`` (``num_tokens_global`` None) are all read first and their labels counted
    over the global batch (:func:`fill_num_tokens_global`). A document that failed to read on some ranks of its CP
    group loses its labels on all of them before its forward (:func:`fcp_exec.skips.agree_skips`; ``ignore_index``:
    the collator's). ``grad_scaler``: fp16's loss scaler (module docstring); the result's loss is unscaled.

    Gradient accumulation: several ``train_step`` calls (global batches) before one ``opt.step()`` leave the *sum* of
    their gradients, as ``loss.backward()`` per batch would (divide the learning rate, or the gradients, by their
    number for their mean). The gradients already in ``.grad`` when a step starts are set aside, the step reduces
    only its own and adds them back (:mod:`fcp_exec.grads`; the all-reduce, DDP and FSDP2 reducers; FSDP1 adds its
    reduced shards itself, and its failed reads leave the denominator before the first forward; DeepSpeed
    accumulates in its engine: step it once per ``train_step``). A step inside ``torch.autocast`` clears autocast's
    weight-cast cache around every micro-batch (:func:`fcp_exec.step_checks.autocast_active`); :func:`autocast_loss`
    is the usual way. The loader's epoch ending is :class:`EpochEnded`."""
    backward = getattr(reducer, "backward", None)  # DeepSpeed: through the engine
    if grad_scaler is not None and backward is not None:
        raise ValueError("train_step: grad_scaler with a DeepSpeed engine; DeepSpeed scales fp16 losses itself "
                         "(its config's \"fp16\" section)")
    if grad_scaler is not None and hasattr(reducer, "check_grad_scaler"):  # FSDP1: a scaler that sees every shard
        reducer.check_grad_scaler(grad_scaler)
    exact = bool(getattr(reducer, "exact_denominator", False)) or _whole_step_loss(model) or holds_grads(model, reducer)
    first, it, num_mb = _open_step(micro_batches, model, ignore_index, exact=exact)
    res, totals = StepResult(loss=0.0, num_tokens=0), torch.zeros(3, dtype=torch.float64)
    amp = autocast_active(model)
    with in_step(model, reducer):  # gradients of earlier steps set aside, added back at the end
        for m, run, idle in _runs(model, first, it, num_mb, res, totals, pad_token_id, ignore_index, to_device, amp):
            with reducer.sync_context(model, last=m == num_mb - 1):
                loss = loss_fn(model, run)
                check_loss(loss, grads=True)
                if idle:
                    loss = loss * 0.0
                if backward is not None:
                    backward(model, loss)
                else:
                    (loss if grad_scaler is None else grad_scaler.scale(loss)).backward()
            totals[0] += loss.detach().to(device="cpu", dtype=torch.float64)
        reducer.finish(model)
        return _close_step(model, totals, first, res, grads=True)


def eval_step(model: nn.Module, micro_batches: Iterable[dict], loss_fn: Callable[[nn.Module, dict], torch.Tensor], *,
              pad_token_id: int = 0, ignore_index: int = -100,
              to_device: Callable[[dict], dict] | None = None) -> StepResult:
    """The global-batch mean loss of one global batch, without gradients (validation): :func:`train_step`'s
    forwards under ``torch.no_grad()`` — every micro-batch on every rank, idle ranks on :func:`idle_batch`, so
    FSDP2's all-gathers stay in lock-step — no backward, no gradient synchronisation, one all-reduce of the loss
    (samples' own labels counted first; skipped samples taken out of the denominator). The same arguments as
    :func:`train_step` without the reducer; the model keeps its mode (call ``model.eval()`` first as usual).
    Build the validation loader with its own ``FCPSampler`` (every rank computes its plans, like training's)."""
    first, it, num_mb = _open_step(micro_batches, model, ignore_index, exact=_whole_step_loss(model))
    res, totals = StepResult(loss=0.0, num_tokens=0), torch.zeros(3, dtype=torch.float64)
    with torch.no_grad(), in_step(model):
        for _, run, idle in _runs(model, first, it, num_mb, res, totals, pad_token_id, ignore_index, to_device,
                                  autocast_active(model)):
            loss = loss_fn(model, run)
            check_loss(loss, grads=False)
            if not idle:
                totals[0] += loss.detach().to(device="cpu", dtype=torch.float64)
    return _close_step(model, totals, first, res, grads=False)


def _whole_step_loss(model: nn.Module) -> bool:
    """True for a model (or the model inside its wrappers) whose loss holds a term over all tokens of a micro-batch on
    every rank (a Hugging Face MoE load-balancing loss, :mod:`fcp_exec.integrations.hf_router`): its gradient cannot be
    rescaled afterwards, so failed reads leave the denominator before the step's first forward."""
    seen: nn.Module | None = model
    while seen is not None:
        if getattr(seen, "fcp_exact_denominator", False):
            return True
        seen = getattr(seen, "module", None) or getattr(seen, "_orig_mod", None)
    return False


def _open_step(micro_batches: Iterable[dict], model: nn.Module, ignore_index: int,
               exact: bool = False) -> tuple[dict, Iterator[dict], int]:
    """The step's first micro-batch, an iterator over the rest and their count; batches of
    ``FCPCollator(sample_labels=True)`` are read at once and their labels counted (:func:`fill_num_tokens_global`);
    so are all batches with ``exact`` (a reducer whose gradients cannot be rescaled afterwards), whose failed reads
    then leave the denominator before the first forward (:func:`_take_out_skipped`)."""
    it = iter(micro_batches)
    first = next_micro_batch(it, 0, 1)
    num_mb = int(first["num_micro_batches"])
    listed = isinstance(micro_batches, (list, tuple))  # an iterator (a DataLoader's) is read num_mb batches far
    if num_mb < 1 or (listed and len(micro_batches) != num_mb):  # a list's other batches went untrained, silently
        got = f"{len(micro_batches)} batches" if listed else "batches"
        raise ValueError(f"micro_batches holds {got} of a global batch of num_micro_batches={num_mb}: a step takes "
                         "exactly one global batch (fcp_exec.step.next_global_batch reads one from the loader)")
    dev = next(model.parameters()).device
    check_plan_agreement(first, dev)  # before any collective of the step: ranks that planned apart would hang
    labelled = first.get("num_tokens_global") is None
    if labelled or exact:  # count over the global batch first
        buffered = [first] + [next_micro_batch(it, m, num_mb) for m in range(1, num_mb)]
        # a document that failed to read on some rank of its group loses its labels everywhere before the count
        buffered = [agree_skips(b, dev, ignore_index=ignore_index) for b in buffered]
        if labelled:
            fill_num_tokens_global(buffered, dev)
        else:
            buffered = _take_out_skipped(buffered, dev)
        first, it = buffered[0], iter(buffered[1:])
    return first, it, num_mb


def _check_denominator(batch: dict, ignore_index: int) -> None:
    """``num_tokens_global`` below 0, or 0 while the batch holds labels, is refused: :func:`denominator` divides by at
    least 1, so such a step trained on the un-normalised loss sum (gradients tens of times too large)."""
    n, labels = batch.get("num_tokens_global"), batch.get("labels")
    if n is not None and (int(n) < 0 or (int(n) == 0 and labels is not None and bool((labels != ignore_index).any()))):
        raise ValueError(f"num_tokens_global={int(n)} but micro-batch {batch['micro_batch']} holds label tokens: it "
                         "counts the global batch's labels (the sampler's, or fill_num_tokens_global's)")


def _take_out_skipped(batches: list[dict], device) -> list[dict]:
    """The batches with the step's skipped label tokens (summed over ranks: one all-reduce) taken out of
    ``num_tokens_global`` and ``num_skipped_labels`` zeroed: the denominator of the labels that were read."""
    gone = torch.tensor([sum(int(b.get("num_skipped_labels", 0)) for b in batches)], dtype=torch.int64, device=device)
    if dist_rank_and_world()[1] > 1:
        dist.all_reduce(gone)
    n = int(gone[0])
    if not n:
        return batches
    return [dict(b, num_tokens_global=int(b["num_tokens_global"]) - n, num_skipped_labels=0) for b in batches]


def _runs(model: nn.Module, first: dict, it: Iterator[dict], num_mb: int, res: StepResult, totals: torch.Tensor,
          pad_token_id: int, ignore_index: int, to_device, amp: bool = False) -> Iterator[tuple[int, dict, bool]]:
    """``(m, batch to run, idle)`` for every micro-batch (an idle rank's dummy in its place), recording the groups,
    idle micro-batches and skipped samples in ``res``, the skipped label tokens in ``totals[1]``, the skip records in
    ``totals[2]``. ``amp``: inside ``torch.autocast``, whose weight-cast cache is cleared before every micro-batch
    and after the last (a later micro-batch would reuse the casts of an earlier one's parameters)."""
    dev = next(model.parameters()).device
    for m in range(num_mb):
        if amp:
            torch.clear_autocast_cache()
        batch = first if m == 0 else next_micro_batch(it, m, num_mb)
        batch = agree_skips(batch, dev, ignore_index=ignore_index)  # the group agrees on its failed reads
        _check_denominator(batch, ignore_index)
        res.groups.append(tuple(batch["ranks"]))
        res.skipped.extend(batch.get("skipped_samples", ()))
        totals[1] += int(batch.get("num_skipped_labels", 0))
        totals[2] += len(batch.get("skipped_samples", ()))
        idle = is_idle(batch)
        res.num_idle += idle
        run = idle_batch(batch, pad_token_id=pad_token_id) if idle else batch
        yield m, (to_device(run) if to_device is not None else run), idle
    if amp:
        torch.clear_autocast_cache()


def _close_step(model: nn.Module, totals: torch.Tensor, first: dict, res: StepResult, grads: bool) -> StepResult:
    """Sum ``totals`` = [loss, skipped label tokens, skip records] over ranks (one all-reduce) and take the skipped
    labels out of the denominator: the loss (and, with ``grads``, the gradients) times D / (D − skipped)."""
    if dist_rank_and_world()[1] > 1:
        from fcp_exec.launch import collective_dtype

        dev = next(model.parameters()).device
        totals = totals.to(device=dev, dtype=collective_dtype(torch.float64))  # fp64 where the backend has it
        dist.all_reduce(totals)
    res.loss, res.num_tokens = float(totals[0]), int(first["num_tokens_global"])
    res.epoch, res.global_batch = int(first["epoch"]), int(first["global_batch"])
    gone, res.num_skipped_global = int(round(float(totals[1]))), int(round(float(totals[2])))
    if gone:
        d = res.num_tokens
        scale = rescale_skipped(model, d, gone) if grads else _skip_factor(d, gone)
        res.loss, res.num_tokens = res.loss * scale, d - gone
        if res.num_tokens == 0:  # every label token was a failed read's: loss 0 is not a result (a review)
            logging.getLogger("fcp_exec").warning("fcp: epoch %d global batch %d: every labelled sample failed to read "
                                                  "(%d skips on all ranks): nothing %s", res.epoch, res.global_batch,
                                                  res.num_skipped_global, "trained" if grads else "evaluated")
    return res


def rescale_skipped(model: nn.Module, num_tokens_global: int, skipped_labels: int) -> float:
    """Gradients divided by ``num_tokens_global`` become those of the mean over the labels that were read: every
    ``.grad`` times ``num_tokens_global / (num_tokens_global - skipped_labels)`` (FSDP2's sharded gradients
    scale shard by shard). ``skipped_labels``: the SUM over all ranks of the batches' ``num_skipped_labels`` (the
    label tokens of samples that failed to read, :mod:`fcp_data.read_errors`). :func:`train_step` calls it; a loop
    of your own all-reduces that sum and calls it after the last backward, before clipping and the optimizer (it
    scales every ``.grad``: accumulating global batches, call it before the next batch's backward). Returns the factor (1 when nothing was skipped or nothing is left)."""
    scale = _skip_factor(num_tokens_global, skipped_labels)
    if scale == 1.0:
        return scale
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
    return scale


def _skip_factor(num_tokens_global: int, skipped_labels: int) -> float:
    """D / (D − S): from the planned denominator to the labels that were read (1 when none or all were skipped)."""
    return num_tokens_global / (num_tokens_global - skipped_labels) if 0 < skipped_labels < num_tokens_global else 1.0
