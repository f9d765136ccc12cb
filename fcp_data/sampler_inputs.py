"""The sampler's inputs, resolved and checked once (used by :class:`fcp_data.sampler.FCPSampler` and
:class:`fcp_data.sampler_config.SamplerConfig`): the lengths / η / visual tokens of the data (from arrays or a
``LengthIndex``, with the planner's one length check), the solver options (JSON scalars a solver accepts), and
the default rank and world size (from ``torch.distributed``; the one rank/world helper, also used by the
executor), the over-long policy, the samples to leave out (``exclude=``) and the data digest a sampler state
is checked against.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

import numpy as np

from fcp_data.cost import CostModel

logger = logging.getLogger("fcp_data")

__all__ = ["dist_rank_and_world", "check_lengths", "check_visual", "check_solver_options", "load_exclusions",
           "resolve_exclusions", "data_digest", "apply_overlong"]


def dist_rank_and_world() -> tuple[int, int]:
    """``(rank, world_size)`` from ``torch.distributed`` when it is initialised, else ``(0, 1)``."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0, 1
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank()), int(dist.get_world_size())
    return 0, 1


def check_lengths(lengths_or_index: Any, etas: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """``(lengths, etas)`` from an array or a ``LengthIndex`` (its ``num_tokens``/``eta``), checked by the
    planner's one length / η check; ``etas`` is None when absent or all causal."""
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


def _read_exclusions(path: str) -> list[tuple[int, Any, str | None]]:
    """``(line, value, key)`` of each entry of a file: JSON lines with an ``"index"`` (the read-error records of
    ``FCPDataset(errors_path=...)`` / ``fcp train --read-errors-out``; ``key``: the record's ``"key"``, None when it
    names none), or one integer per line (key None); ``#`` comments and blank lines are ignored."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip() if not line.lstrip().startswith("{") else line.strip()
            if not text:
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise ValueError(f"exclude file {path}, line {n}: neither an integer nor a JSON record: "
                                 f"{text[:80]!r}") from None
            key = None
            if isinstance(value, dict):
                if "index" not in value:
                    raise ValueError(f"exclude file {path}, line {n}: a JSON record without \"index\"")
                key = None if value.get("key") is None else str(value["key"])
                value = value["index"]
            out.append((n, value, key))
    return out


class FileEntries(list):
    """The entries of an exclude file as sample indices, with where each came from (``source``, ``lines``): a bad
    entry's error names its file and line even after records were resolved by key."""

    def __init__(self, path: str, pairs: list[tuple[int, Any]]):
        super().__init__(value for _, value in pairs)
        self.source, self.lines = f"exclude file {path}", [n for n, _ in pairs]


def resolve_exclusions(exclude: Any, key_of: Any, index_of: Any) -> Any:
    """``exclude`` with the records of an exclude file that name their sample's ``"key"`` resolved by it, for data
    that names its samples (``key_of(i)``: sample ``i``'s key; ``index_of(key)``: the sample holding ``key`` — None
    when the data holds it but leaves it out, e.g. ``fcp train``'s ``--max-tokens`` view — or ``KeyError``). A
    record whose sample has its key keeps its index; one whose key sits elsewhere (a file written against another
    numbering of the same samples: another ``--max-tokens``, a filtered dataset, a reordered index) takes the key's
    sample, with one warning (a key whose sample the data leaves out is left out already: another warning); a key the
    data does not hold (a file of another data set), or holds more than once (``index_of`` a ``ValueError``: which
    sample is meant cannot be told), is a ``ValueError`` naming the line. Resolved records come back as
    :class:`FileEntries`; anything else as it is (for :func:`load_exclusions`)."""
    if not isinstance(exclude, (str, os.PathLike)) or not os.path.isfile(exclude):
        return exclude
    path, out, moved, outside = os.fspath(exclude), [], 0, 0
    entries = _read_exclusions(path)
    for n, value, key in entries:
        if key is None or _key_at(key_of, value) == key:
            out.append((n, value))
            continue
        try:
            at = index_of(key)
        except KeyError:
            raise ValueError(f"exclude file {path}, line {n}: no sample of this data has key {key!r} (the record's "
                             f"index is {value!r}): the file was written for another data set") from None
        except ValueError as e:
            raise ValueError(f"exclude file {path}, line {n}: {e}, and the record's index {value!r} holds another: "
                             "which sample it names cannot be told; write the file against this data's numbering "
                             "(or give the samples distinct keys)") from None
        if at is None:
            outside += 1
        else:
            moved += 1
            out.append((n, int(at)))
    if not moved and not outside:
        return exclude
    if moved:
        logger.warning("exclude file %s: %d record(s) name samples whose key is at another index here (written "
                       "against another numbering: another --max-tokens, a filtered or reordered dataset); their keys "
                       "were used", path, moved)
    if outside:
        logger.warning("exclude file %s: %d record(s) name samples this data leaves out already (outside its view, "
                       "e.g. fcp train's --max-tokens): nothing more to leave out for them", path, outside)
    return FileEntries(path, out)


def _key_at(key_of: Any, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    try:
        key = key_of(value)
    except (IndexError, KeyError, OverflowError):  # OverflowError: an index past int64 (numpy's view of a view)
        return None
    return None if key is None else str(key)


def load_exclusions(exclude: Any, num_samples: int) -> np.ndarray:
    """The sorted, distinct sample indices of ``exclude`` (None, an iterable of ints, or a file path: see
    :func:`_read_exclusions`), each in ``[0, num_samples)``; a bad entry is one ``ValueError`` naming it. The
    exclusions are part of the data digest: a sampler state saved with other exclusions is refused."""
    if exclude is None:
        return np.zeros(0, dtype=np.int64)
    if isinstance(exclude, (str, os.PathLike)):
        if not os.path.isfile(exclude):
            raise ValueError(f"exclude file {os.fspath(exclude)}: "
                             f"{'a directory, not a file' if os.path.isdir(exclude) else 'no such file'}")
        exclude = FileEntries(os.fspath(exclude), [(n, value) for n, value, _ in _read_exclusions(os.fspath(exclude))])
    source, lines = (exclude.source, exclude.lines) if isinstance(exclude, FileEntries) else ("exclude", None)
    if hasattr(exclude, "tolist") and not isinstance(exclude, (list, tuple)):  # a numpy array or torch tensor
        exclude = exclude.tolist()
        exclude = [exclude] if isinstance(exclude, int) else exclude
    try:
        values = list(exclude)
    except TypeError:
        raise ValueError(f"exclude must be sample indices or a file of them, got {type(exclude).__name__}") from None
    for k, v in enumerate(values):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 <= int(v) < num_samples:
            where = f"{source}, line {lines[k]}" if lines else source
            raise ValueError(f"{where}: {v!r} is not a sample index in [0, {num_samples})")
    return np.unique(np.asarray([int(v) for v in values], dtype=np.int64))


def data_digest(lengths: np.ndarray, etas: np.ndarray | None, visual: np.ndarray | None,
                excluded: np.ndarray) -> str:
    """The fingerprint of the data a sampler plans (a state from other data is refused): lengths, η, visual
    tokens and the excluded samples (left out of the hash when there are none, so older states stay valid)."""
    h = hashlib.blake2b(lengths.tobytes(), digest_size=16)
    if etas is not None:
        h.update(etas.tobytes())
    if visual is not None:
        h.update(b"visual" + visual.tobytes())
    if excluded.size:
        h.update(b"exclude" + excluded.tobytes())
    return h.hexdigest()


def apply_overlong(lengths: np.ndarray, on_overlong: str, num_ranks: int, tokens_per_rank: int,
                   solver_options: dict[str, Any], solver: str | None = None) -> tuple[int, np.ndarray, int, int]:
    """``(capacity, kept sample ids, num_truncated, num_dropped)`` under the ``on_overlong`` policy for samples over
    ``capacity`` tokens, the most one sequence's group holds: ``D·tokens_per_rank`` with ``D`` the largest degree
    the solver gives a group (:meth:`~fcp_data.plan.registry.SolverSpec.largest_degree`: ``num_ranks``, a fixed
    ``degree`` option, the largest power of two for fcp-pow2 / megatron-dynamic, the largest Ulysses degree dividing
    the head count). ``solver``: the sampler's solver (None: any degree up to ``num_ranks``). ``"error"`` raises naming the first, ``"drop"`` leaves them out, ``"truncate"`` keeps them (one
    warning logged for either)."""
    group = _largest_group(num_ranks, solver_options, solver)
    capacity = group[1] * tokens_per_rank
    over = np.flatnonzero(lengths > capacity)
    if not over.size:
        return capacity, np.arange(lengths.size, dtype=np.int64), 0, 0
    holds = {"degree": "group of that degree", "num_ranks": "micro-batch"}.get(group[0], f"group {group[2]}")
    what = (f"{over.size} sample(s) longer than {group[0]}·tokens_per_rank = {group[1]}·{tokens_per_rank} = {capacity} "
            f"tokens (the most one {holds} holds), first: sample {int(over[0])} with {int(lengths[over[0]])} tokens")
    if on_overlong == "error":
        raise ValueError(f"{what}; pass on_overlong='truncate' or 'drop', or raise tokens_per_rank")
    if on_overlong == "drop":
        logger.warning("FCPSampler drops %s", what)
        return capacity, np.flatnonzero(lengths <= capacity).astype(np.int64), 0, int(over.size)
    logger.warning("FCPSampler truncates %s", what)
    return capacity, np.arange(lengths.size, dtype=np.int64), int(over.size), 0


def _largest_group(num_ranks: int, options: dict[str, Any], solver: str | None) -> tuple[str, int, str]:
    """``(what, degree, description)`` of the largest group one sequence can get (:func:`apply_overlong`)."""
    if options.get("degree") is not None:  # None: no fixed degree (the solver picks the best)
        return "degree", int(options["degree"]), ""
    if solver is None:
        return "num_ranks", int(num_ranks), ""
    from fcp_data.plan.registry import get_solver

    d = get_solver(solver).largest_degree(int(num_ranks), options)
    if d >= num_ranks:
        return "num_ranks", int(num_ranks), ""
    return "D", d, f"of solver {solver!r} on {num_ranks} ranks (D = {d}, its largest degree)"


def check_epoch_possible(tokens: np.ndarray, *, drop_last: bool, global_batch_size: int | None,
                         global_batch_tokens: int | None, micro_batches: str | int, num_ranks: int,
                         tokens_per_rank: int) -> None:
    """Refuse at construction what every global batch would fail on later (in a DataLoader worker, mid-run).
    ``tokens``: the kept samples' planned tokens. ``drop_last`` with fewer samples / tokens than one batch (every
    epoch empty); an int ``micro_batches`` that even the ``global_batch_size`` shortest samples overflow: ``M``
    micro-batches hold at most ``M·num_ranks·tokens_per_rank`` tokens (a bound the plan's padding only tightens), so
    no batch of that size can be planned."""
    if drop_last and global_batch_size is not None and tokens.size < global_batch_size:
        raise ValueError(f"drop_last=True with global_batch_size={global_batch_size} but only {tokens.size} "
                         "samples: every epoch would be empty; lower global_batch_size or pass drop_last=False")
    total = int(tokens.sum())
    if drop_last and global_batch_tokens is not None and total < global_batch_tokens:
        raise ValueError(f"drop_last=True with global_batch_tokens={global_batch_tokens} but the data holds "
                         f"only {total} tokens: every epoch would be empty; lower it or pass drop_last=False")
    if micro_batches == "auto" or global_batch_size is None:
        return
    size = min(global_batch_size, tokens.size)
    m = min(int(micro_batches), size)  # the sampler plans min(M, batch size) micro-batches
    least = int(np.partition(tokens, size - 1)[:size].sum())
    if least > m * num_ranks * tokens_per_rank:
        need = -(-least // (num_ranks * tokens_per_rank))
        raise ValueError(f"micro_batches={micro_batches}: even the {size} shortest samples hold {least} tokens, more "
                         f"than {m} micro-batch(es) on {num_ranks} ranks × {tokens_per_rank} tokens_per_rank hold "
                         f"({m * num_ranks * tokens_per_rank}), so no global batch of {global_batch_size} could be "
                         f"planned; use micro_batches='auto' or at least {need}")


def warn_cut_visual(layout: Any, truncated: np.ndarray, capacity: int) -> None:
    """One warning naming how many truncated samples are cut inside an image's or video's placeholder run (the
    collator still hands the vision tower the whole image; only its first placeholders receive embeddings), and
    the first of them — ``on_overlong="truncate"`` alone says nothing of what it cut."""
    from fcp_data.visual_layout import cut_through_placeholders

    cut = cut_through_placeholders(layout, truncated, capacity)
    if cut:
        logger.warning("FCPSampler: %d of the %d truncated sample(s) are cut inside an image's or video's placeholder "
                       "tokens (the model sees part of it), first: sample %d; on_overlong='drop' leaves them out",
                       len(cut), truncated.size, cut[0])


def warn_drop_last(sampler: Any, epoch: int, order: np.ndarray, bounds: np.ndarray) -> None:
    """Once per sampler: how many samples (and tokens) ``drop_last=True`` leaves out of ``epoch`` — the samples after
    its last global batch; each epoch leaves others out (its own order)."""
    left = order[int(bounds[-1]):]
    if not left.size or getattr(sampler, "_warned_drop_last", False):
        return
    sampler._warned_drop_last = True
    logger.warning("FCPSampler(drop_last=True) leaves the last, incomplete global batch out of each epoch: %d of %d "
                   "samples (%d tokens) in epoch %d, other samples in other epochs", left.size, order.size,
                   int(sampler.num_tokens[left].sum()), epoch)
