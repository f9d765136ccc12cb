"""The one strict loader of JSON objects (cost models, plans): exactly the required keys plus optional ones."""

from __future__ import annotations

from typing import Any

__all__ = ["strict_keys"]


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
