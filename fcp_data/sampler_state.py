"""The resume state of an :class:`~fcp_data.sampler.FCPSampler`: position and configuration fingerprint.

The sampler is a cursor. Its position ``(epoch, global_batch, micro_batch)``
is that of the next list it yields; every list the current iterator yields moves it, so once a consumer
has received lists ``0 … k−1`` of an epoch (``break`` included), ``state_dict()`` resumes at list ``k``.
``iter()`` starts at the position: a second ``iter()`` (a DataLoader with workers calls it twice) continues
instead of restarting the epoch; only the most recent iterator moves the position and plans on the
sampler's window (an older one lets go of it). When every list of epoch ``e`` is yielded the position says so
(``global_batch == num_global_batches(e)``, ``micro_batch == 0``) and the next ``iter()`` starts epoch
``e + 1`` — an epoch is never replayed silently (a loop without ``set_epoch`` sees each epoch once, and a
``StatefulDataLoader`` restored at the end of an epoch continues with the next one). ``set_epoch(e)``
keeps the position if ``e`` is its epoch (so ``load_state_dict`` and then the usual
``set_epoch(saved_epoch)`` resume mid-epoch) and otherwise moves to the start of ``e``; to run an epoch
again from its start, load a state saved there. ``load_state_dict`` sets the position (``state_dict()``
then returns the loaded state): O(1) — the first iterator re-plans only that global batch and skips its
first ``micro_batch`` lists. States are strict: ``epoch``/``global_batch``/``micro_batch``/``version``
must be ints (``bool`` and ``"1"``/``1.7`` are a ``TypeError``), a position out of range or another
config is a ``ValueError``. Iterators are stateful too, which is what torchdata's ``StatefulDataLoader``
uses.

**Checkpoints with DataLoader workers.** A DataLoader with ``num_workers > 0`` takes lists from the sampler ahead of
the loop (``prefetch_factor`` per worker), so ``state_dict()`` after a step points past batches the loop has not
trained on yet (measured: 4 lists ahead with 2 workers), and a run resumed from it would skip them. Save
:func:`state_after` instead (``FCPSampler.state_after(last)``): the state right after the last micro-batch the loop
consumed — ``last`` is that batch dict (its ``epoch``/``global_batch``/``micro_batch``/``num_micro_batches``) or
:func:`fcp_exec.step.train_step`'s result (a whole global batch) — whatever the workers hold.

:func:`make_state`/:func:`check_state` define that state: the position ``(epoch, global_batch, micro_batch)`` of
the next list and the sampler's config fingerprint (:meth:`~fcp_data.sampler_config.SamplerConfig.fingerprint`
plus the data digest), loaded strictly (ints only: :func:`check_int`).
"""

from __future__ import annotations

import hashlib
import logging
import numbers
from typing import Any

import numpy as np

logger = logging.getLogger("fcp_data")

__all__ = ["STATE_VERSION", "make_state", "check_state", "check_int", "state_after"]

STATE_VERSION = 3  # 2: + "batches" (version-1 states still load, with an exact config match); 3: + "excluded_later"
_KEYS = {1: {"version", "epoch", "global_batch", "micro_batch", "config"},
         2: {"version", "epoch", "global_batch", "micro_batch", "config", "batches"},
         3: {"version", "epoch", "global_batch", "micro_batch", "config", "batches", "excluded_later"}}
_DATA_KEYS = ("num_samples", "data_digest")  # must match even when the planning config may differ


def _config(sampler: Any) -> dict[str, Any]:
    """The resume fingerprint: every fingerprint field of the sampler's :class:`SamplerConfig` plus the data."""
    return {**sampler.config.fingerprint(), "num_samples": int(sampler.lengths.size),
            "data_digest": sampler._data_digest}


def batches_digest(sampler: Any, epoch: int) -> str:
    """Which samples make up each global batch of ``epoch``, in order (a digest of the epoch's order and global
    batch bounds): what a position ``(epoch, g, 0)`` means whatever the world size, cost model or solver."""
    cache = sampler.__dict__.setdefault("_batch_digests", {})  # a StatefulDataLoader asks for a state every batch
    if epoch not in cache:
        order, bounds = sampler._epoch_layout(epoch)
        h = hashlib.blake2b(np.asarray(order, dtype=np.int64).tobytes(), digest_size=16)
        h.update(b"|" + np.asarray(bounds, dtype=np.int64).tobytes())
        while len(cache) >= 4:
            cache.pop(next(iter(cache)))
        cache[epoch] = h.hexdigest()
    return cache[epoch]


def make_state(sampler: Any, epoch: int, g: int, m: int) -> dict[str, Any]:
    """A sampler state: plain JSON types (position of the next list, config fingerprint, the epoch's batches)."""
    from fcp_data.sampler_exclude import late_to_state

    return {"version": STATE_VERSION, "epoch": int(epoch), "global_batch": int(g), "micro_batch": int(m),
            "config": _config(sampler), "batches": batches_digest(sampler, int(epoch)),
            "excluded_later": late_to_state(sampler._late)}


def check_int(name: str, value: Any, where: str) -> int:
    """``value`` as an ``int`` if it is an integer (Python or numpy, not ``bool``); else a ``TypeError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__} {value!r}; pass the integer "
                        "itself (a string, float or bool is refused rather than rounded or parsed)")
    return int(value)


def _same(a: Any, b: Any) -> bool:
    """``a == b`` with bools distinct from numbers (``True`` is not ``1``), recursively."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def check_state(sampler: Any, state: dict[str, Any]) -> tuple[int, int, int]:
    """Strictly validate ``state`` against ``sampler``; return ``(epoch, global_batch, micro_batch)``.

    A non-int ``version``/``epoch``/``global_batch``/``micro_batch`` (``bool``, ``"1"``, ``1.7``) is a
    ``TypeError``; unknown or missing keys, another version, a position out of range or a config difference is a
    ``ValueError`` listing every difference — except that a state at a global-batch boundary (``micro_batch`` 0,
    what :func:`state_after` gives after a step) resumes under another world size, rank, cost model or solver when
    the data is the same and its epoch's global batches are (:func:`batches_digest`): the plans of the remaining
    batches are this sampler's, the samples in them the saved run's.
    """
    if not isinstance(state, dict):
        raise TypeError(f"an FCPSampler state must be a dict (from FCPSampler.state_dict()), got "
                        f"{type(state).__name__}")
    where = "FCPSampler.load_state_dict"
    version = check_int("version", state["version"], where) if "version" in state else None
    if version not in _KEYS:
        raise ValueError(f"FCPSampler state version {version} is not one of {sorted(_KEYS)}")
    if set(state) != _KEYS[version]:
        raise ValueError(f"an FCPSampler state (version {version}) has keys {sorted(_KEYS[version])}; got {sorted(state)}")
    e, g, m = (check_int(k, state[k], where) for k in ("epoch", "global_batch", "micro_batch"))
    _check_late(sampler, state.get("excluded_later", []))
    mine, theirs = _config(sampler), state["config"]
    if not isinstance(theirs, dict) or set(theirs) != set(mine):
        got = sorted(theirs) if isinstance(theirs, dict) else theirs
        raise ValueError(f"FCPSampler state config has keys {got}, expected {sorted(mine)}")
    if not 0 <= e < 2**62:  # set_epoch's range: plan digests and seeds hold the epoch in an int64
        raise ValueError(f"FCPSampler state epoch {e} is out of range [0, 2**62)")
    num_g = sampler.num_global_batches(e)
    if not 0 <= g <= num_g or not 0 <= m < _max_micro_batches(sampler, e, g):
        raise ValueError(f"FCPSampler state position (epoch {e}, global batch {g}, micro-batch {m}) is out of range "
                         f"(epoch {e} has {num_g} global batches; a finished epoch is global batch {num_g}, "
                         "micro-batch 0): load a state saved by FCPSampler.state_dict() with this config")
    diffs = [k for k in mine if not _same(theirs[k], mine[k])]
    same_batches = version >= 2 and state["batches"] == batches_digest(sampler, e)
    if version >= 2 and not same_batches and not diffs:
        raise ValueError(f"the FCPSampler state's epoch {e} had other global batches than this sampler's with the "
                         "same configuration (a state edited by hand, or saved by an fcp version that ordered "
                         "epochs differently): resuming would skip or repeat samples")
    # another planning config (world size, rank, cost model, solver) resumes at a global-batch boundary when the
    # data and the epoch's global batches are the same
    if diffs and not (same_batches and m == 0 and not any(k in _DATA_KEYS for k in diffs)):
        listed = "; ".join(f"{k}: saved {theirs[k]!r}, this sampler {mine[k]!r}" for k in diffs)
        if "data_digest" in diffs:  # the digest covers lengths, η, visual tokens and excluded samples
            listed += " (other lengths, visual tokens or excluded samples: exclude= must be the same to resume)"
        raise ValueError("the FCPSampler state was saved with a different configuration — " + listed + ". Resume with "
                         "the same seed, data and batch size; a state at a global-batch boundary (state_after) also "
                         "resumes on another world size or cost model when the epoch's global batches are the same.")
    if diffs:
        logger.info("fcp: resuming at epoch %d, global batch %d under a new %s (the epoch's global batches are the "
                    "same)", e, g, ", ".join(diffs))
    return e, g, m


def _max_micro_batches(sampler: Any, epoch: int, g: int) -> int:
    """An upper bound on the micro-batches of global batch ``g`` (1 past the epoch's end: only micro-batch 0): its
    sequences, at most ``micro_batches`` when that is an int (exact then; ``"auto"`` would need its plan)."""
    _, bounds = sampler._epoch_layout(epoch)
    if g >= len(bounds) - 1:
        return 1
    size = int(bounds[g + 1] - bounds[g])
    return size if sampler.micro_batches == "auto" else min(size, int(sampler.micro_batches))


def _check_late(sampler: Any, value: Any) -> None:
    """The state's later exclusions must be the sampler's (``load_state_dict`` sets them before it checks)."""
    from fcp_data.sampler_exclude import late_from_state, late_to_state

    if late_to_state(late_from_state(value, int(sampler.lengths.size))) != late_to_state(sampler._late):
        raise ValueError("the FCPSampler state left other samples out of later epochs (excluded_later) than this "
                         "sampler: load it with load_state_dict, which takes them over")


def state_after(sampler: Any, last: Any) -> dict[str, Any]:
    """The state right after ``last`` (module docstring): a batch dict the loop consumed, or an object with ``epoch``
    and ``global_batch`` attributes (``train_step``'s ``StepResult``: that whole global batch was consumed)."""
    where = "FCPSampler.state_after"
    if isinstance(last, dict):
        missing = [k for k in ("epoch", "global_batch", "micro_batch", "num_micro_batches") if k not in last]
        if missing:
            raise ValueError(f"{where}: a batch of FCPCollator has epoch, global_batch, micro_batch and "
                             f"num_micro_batches; this one lacks {missing}")
        e, g, m, num_m = (check_int(k, last[k], where) for k in ("epoch", "global_batch", "micro_batch",
                                                                   "num_micro_batches"))
        if not 0 <= m < num_m:
            raise ValueError(f"{where}: micro_batch {m} is not in [0, num_micro_batches={num_m})")
        position = (e, g, m + 1) if m + 1 < num_m else (e, g + 1, 0)
    elif hasattr(last, "epoch") and hasattr(last, "global_batch"):
        e, g = check_int("epoch", last.epoch, where), check_int("global_batch", last.global_batch, where)
        position = (e, g + 1, 0)
    else:
        raise TypeError(f"{where}: pass the last batch dict the loop consumed or train_step's result, got "
                        f"{type(last).__name__}")
    state = make_state(sampler, *position)
    check_state(sampler, state)  # a position this sampler can resume at (epoch and global batch in range)
    return state
