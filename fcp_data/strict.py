"""The one strict loader of JSON objects (cost models, plans): exactly the required keys plus optional ones; and the
checks of a flag and a token id that every constructor shares (``bool("no")`` is True, and a token id past int64
or a negative pad id fails deep inside a tensor op or an embedding, not where it was given)."""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["flag", "strict_keys", "token_id", "did_you_mean"]

_INT64 = 2**63


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: True/False (numpy's too) or the ints 0/1; anything else is a ``TypeError``."""
    if type(value).__name__ in ("bool", "bool_") or (hasattr(value, "__index__") and getattr(value, "ndim", 0) == 0
                                                    and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be True or False, got {value!r}")


def token_id(name: str, value: Any, *, minimum: int | None = None) -> int:
    """``value`` as an int that fits a token tensor (int64), and ``>= minimum`` when given; a bool, float, string or
    anything else is a ``TypeError``, an int out of range a ``ValueError``."""
    if isinstance(value, bool) or not hasattr(value, "__index__") or getattr(value, "ndim", 0) != 0:
        raise TypeError(f"{name} must be an int token id, got {value!r}")
    v = operator.index(value)
    lo = -_INT64 if minimum is None else minimum
    if not lo <= v < _INT64:
        raise ValueError(f"{name} must be an int in [{'-2**63' if minimum is None else lo}, 2**63), got {v}")
    return v


def strict_keys(d: Any, required: tuple[str, ...], optional: tuple[str, ...] = (), *,
                what: str = "the object") -> dict[str, Any]:
    """``{key: d[key]}`` for the required keys and the optional ones present. Anything else is one ``ValueError``
    naming ``what``, every missing and every unknown key, and the expected keys."""
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be a JSON object with keys {', '.join(required)}; got {type(d).__name__}")
    missing = [k for k in required if k not in d]
    unknown = sorted(str(k) for k in d if k not in required and k not in optional)
    if missing or unknown:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + \
                ([f"unknown {', '.join(unknown)}"] if unknown else [])
        expected = ", ".join(required) + (f"; optional: {', '.join(optional)}" if optional else "")
        raise ValueError(f"{what} keys: {'; '.join(parts)} (expected: {expected})")
    return {k: d[k] for k in (*required, *optional) if k in d}


def did_you_mean(name: Any, choices) -> str:
    """`` (did you mean 'X'?)`` for the choice closest to a misspelt ``name`` (case ignored), or ``""``: the hint an
    "unknown name; valid: ..." message ends with."""
    import difflib

    if not isinstance(name, str):
        return ""
    folded = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(name.lower(), folded, n=1, cutoff=0.6)
    return f" (did you mean {folded[close[0]]!r}?)" if close else ""
