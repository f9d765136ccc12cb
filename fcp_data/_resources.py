"""Locate the data that ships with the package (``tokenizers/``, ``samples/``).

In a wheel they are force-included under ``fcp_data/``; in an editable install or a source checkout
they sit at the repository root, next to ``fcp_data/``. Code never relies on the current directory.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["data_path", "bundled_path"]

_PKG = Path(__file__).resolve().parent


def data_path(name: str) -> Path:
    """Path of a bundled data folder or file, e.g. ``data_path("tokenizers")``."""
    for base in (_PKG, _PKG.parent):
        p = base / name
        if p.exists():
            return p
    raise FileNotFoundError(f"bundled data {name!r} not found under {_PKG} or {_PKG.parent}; reinstall fcp")


def bundled_path(name: str) -> Path:
    """Public name of :func:`data_path`: ``bundled_path("samples")`` is the folder of the bundled sample data
    (``text.jsonl``, ``wds/*.tar``), ``bundled_path("tokenizers")`` the token specs."""
    return data_path(name)
