"""Input checks of the planning entry point :func:`~fcp_data.plan.solvers.plan_batch`: lengths, mask
factors ``η`` and the §4.1 visual tokens per sequence. Every problem is a ``ValueError`` naming the entry
and the fix.
"""

from __future__ import annotations

import numpy as np

from fcp_data.cost import MAX_RANKS, MAX_SEQUENCE_TOKENS, CostModel
from fcp_data.plan.bfd import bfd_groups

__all__ = ["validate_inputs", "validate_lengths", "validate_etas", "validate_visual", "does_not_fit", "MAX_ETA",
           "OptionError", "check_count_option", "check_seconds_option", "require_arrays"]

# η is the share of the key/query pairs attended beyond the causal half (DESIGN §4: 0 causal, 1 full attention),
# so 1 is the most a mask can add; a larger value is a unit or data error, not a mask
MAX_ETA = 1.0


class OptionError(ValueError):
    """A solver option's value is invalid: the micro-batch planner re-raises it instead of reading it as "this split
    does not fit" (and trying other splits)."""


def check_count_option(name: str, value, top: int | None = None, why: str = "") -> int:
    """``value`` as an int ``1 ≤ value ≤ top`` (a numpy int is fine, a bool, float, str or None is not); else one
    :class:`OptionError` naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1 or \
            (top is not None and value > top):
        limit = f"from 1 to {top}{why}" if top is not None else ">= 1"
        raise OptionError(f"{name} must be an int {limit}, got {value!r}")
    return int(value)


def check_seconds_option(name: str, value) -> float:
    """``value`` as a positive number of seconds (numpy numbers are fine, a bool is not); else :class:`OptionError`."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) or \
            not value > 0:
        raise OptionError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def require_arrays(name: str, lengths, etas, num_ranks, cost_model) -> None:
    """The one-micro-batch solvers (:func:`~fcp_data.plan.solvers.fcp_micro_batch`, the baselines) take what
    :func:`validate_inputs` returns: an int64 and a float64 array of one size, an int ``num_ranks`` and a
    :class:`CostModel`; anything else is one ``TypeError`` pointing at ``plan_batch`` (a cheap type check only)."""
    if not (isinstance(lengths, np.ndarray) and lengths.dtype.kind in "iu" and isinstance(etas, np.ndarray)
            and etas.shape == lengths.shape and isinstance(num_ranks, (int, np.integer))
            and isinstance(cost_model, CostModel)):
        raise TypeError(f"{name} plans one checked micro-batch: lengths an integer array, etas an array of the same "
                        "shape, num_ranks an int, cost_model a CostModel (as validate_inputs returns them); for raw "
                        "input call plan_batch")


def validate_lengths(lengths) -> np.ndarray:
    """Checked int64 token counts (1-D, non-empty, whole, ``0 < s ≤ MAX_SEQUENCE_TOKENS``); the one length
    check of the planner, the sampler and the CLI loaders. ``ValueError`` naming the offending entry."""
    if not hasattr(lengths, "__len__"):  # a generator or an iterator is a 0-d object array to numpy
        raise ValueError(f"lengths must be a 1-D sequence of token counts (a list or an array), got "
                         f"{type(lengths).__name__}")
    try:
        arr = np.asarray(lengths)
    except (ValueError, TypeError, OverflowError) as e:
        raise ValueError(f"lengths must be a 1-D sequence of integer token counts ({e})") from None
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D sequence of token counts, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("no sequences to plan: lengths is empty")
    _check_python_entries(lengths, arr)
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating) or \
            np.issubdtype(arr.dtype, np.timedelta64):  # durations are numbers to numpy, not token counts
        raise ValueError(f"lengths must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ValueError(f"lengths must be whole token counts; sequence {bad[0]} is {arr[bad[0]]}")
    wide = arr.astype(np.float64) if np.issubdtype(arr.dtype, np.floating) else arr  # float16 cannot hold the limit
    big = np.flatnonzero(wide > MAX_SEQUENCE_TOKENS)  # before the cast: uint64 / float values beyond int64 wrap
    if big.size:
        raise ValueError(f"sequence {big[0]} has {arr[big[0]]} tokens, more than any real sequence "
                         f"(at most {MAX_SEQUENCE_TOKENS}); check the lengths")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr <= 0)
    if bad.size:
        raise ValueError(f"lengths must be > 0; sequence {bad[0]} has {arr[bad[0]]} tokens (drop empty sequences)")
    return arr


def _check_python_entries(lengths, arr: np.ndarray) -> None:
    """A list's bools (numpy makes ``[True, 1]`` an int array; a bool array is refused) and ints beyond int64
    (numpy makes them an object array) are refused naming the entry."""
    if isinstance(lengths, (list, tuple)):
        for i, x in enumerate(lengths):
            if isinstance(x, (bool, np.bool_)):
                raise ValueError(f"lengths must be integer token counts; sequence {i} is {x!r} (a bool)")
    if arr.dtype == object:
        for i, x in enumerate(arr.tolist()):
            if isinstance(x, int) and not isinstance(x, bool) and x > MAX_SEQUENCE_TOKENS:
                raise ValueError(f"sequence {i} has {x} tokens, more than any real sequence "
                                 f"(at most {MAX_SEQUENCE_TOKENS}); check the lengths")
            if isinstance(x, int) and not isinstance(x, bool) and x <= 0:
                raise ValueError(f"lengths must be > 0; sequence {i} has {x} tokens (drop empty sequences)")


def validate_etas(etas, lengths: np.ndarray) -> np.ndarray:
    """Checked float64 mask factors, one per sequence (None → zeros: causal)."""
    if etas is None:
        return np.zeros(lengths.size)
    try:
        e = np.asarray(etas, dtype=np.float64)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"etas must be numbers, one η per sequence (0 causal, 1 full attention): {exc}") from None
    if e.shape != lengths.shape:
        raise ValueError(f"etas has shape {e.shape} but lengths has {lengths.shape}; give one η per sequence")
    bad = np.flatnonzero(~(e >= 0) | ~(e <= MAX_ETA))  # NaN fails both
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"etas must be finite and >= 0 and at most {MAX_ETA:g} (the mask factor: 0 causal, 1 full "
                         f"attention, twice the causal work); sequence {i} has η={float(e[i])!r}")
    return e


def validate_inputs(lengths, etas, num_ranks: int, cost_model: CostModel) -> tuple[np.ndarray, np.ndarray]:
    """Checked int64 lengths and float64 etas; ``ValueError`` naming the offending entry otherwise."""
    if not isinstance(cost_model, CostModel):
        raise TypeError(f"cost_model must be a CostModel, got {type(cost_model).__name__}")
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) or num_ranks < 1:
        raise ValueError(f"num_ranks must be a positive int, got {num_ranks!r}")
    if num_ranks > MAX_RANKS:
        raise ValueError(f"num_ranks={num_ranks} is more than the planner supports ({MAX_RANKS}): stage 2 works on a "
                         "groups × ranks table; plan the context-parallel ranks of one data-parallel replica, not the "
                         "whole cluster")
    arr = validate_lengths(lengths)
    cap = int(num_ranks) * cost_model.tokens_per_rank
    over = np.flatnonzero(arr > cap)
    if over.size:
        i = int(over[np.argmax(arr[over])])
        raise ValueError(f"sequence {i} has {arr[i]} tokens but {num_ranks} ranks × {cost_model.tokens_per_rank} "
                         f"tokens_per_rank hold at most {cap} ({over.size} such sequence(s)); truncate or drop it "
                         "(--on-overlong truncate|drop) or add ranks")
    return arr, validate_etas(etas, arr)


def validate_visual(visual, lengths: np.ndarray) -> np.ndarray | None:
    """Checked float64 visual tokens per sequence (§4.1), or None for text-only input. A sequence's
    visual tokens are part of its tokens: ``0 ≤ v_k ≤ s_k``, whole numbers."""
    if visual is None:
        return None
    try:
        v = np.asarray(visual, dtype=np.float64)
    except (ValueError, TypeError) as e:
        raise ValueError(f"visual must be a 1-D sequence of visual-token counts, one per sequence ({e})") from None
    if v.shape != lengths.shape:
        raise ValueError(f"visual has shape {v.shape} but lengths has {lengths.shape}; give one visual-token count "
                         "per sequence (0 for text)")
    bad = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v != np.round(v)) | (v > lengths))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"visual tokens must be whole numbers with 0 <= v <= the sequence's length; sequence {i} has "
                         f"v={float(v[i]):g} and {int(lengths[i])} tokens")
    return v


def does_not_fit(lengths: np.ndarray, num_ranks: int, cost_model: CostModel, pow2: bool = False) -> ValueError:
    """The error for a micro-batch no candidate fits: how many ranks its stage-1 bins need (``pow2``: each a
    power-of-two group, as fcp-pow2 forms them; a sequence no power-of-two group on ``num_ranks`` holds is named)."""
    total, E = int(lengths.sum()), cost_model.tokens_per_rank
    top = 1 << (int(num_ranks).bit_length() - 1)  # the largest power of two <= num_ranks
    if pow2 and int(lengths.max()) > top * E:
        i = int(np.argmax(lengths))
        need = 1 << (cost_model.min_degree(float(lengths[i])) - 1).bit_length()
        return ValueError(f"sequence {i} ({int(lengths[i])} tokens) alone needs a power-of-two group of {need} ranks "
                          f"at tokens_per_rank={E}, but {num_ranks} ranks hold power-of-two groups of at most {top} "
                          f"({top * E} tokens); truncate or drop it, use {need} ranks, or a solver with any degree (fcp)")
    degrees = [cost_model.min_degree(float(lengths[g].sum())) for g in map(np.asarray, bfd_groups(lengths, E))]
    need = sum(1 << (d - 1).bit_length() for d in degrees) if pow2 else sum(degrees)
    kind = " power-of-two" if pow2 else ""
    return ValueError(f"the micro-batch ({lengths.size} sequences, {total} tokens) does not fit on {num_ranks} "
                      f"ranks: its{kind} groups need {need} ranks at tokens_per_rank={E}; "
                      "split it into more micro-batches (micro_batches='auto')")
