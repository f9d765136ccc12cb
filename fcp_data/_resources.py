"""Locate the data that ships with the package (``tokenizers/``, ``samples/``).

In a wheel they are force-included under ``fcp_data/``; in an editable install or a source checkout
they sit at the repository root, next to ``fcp_data/``. Code never relies on the current directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["data_path", "bundled_path", "bundled_index"]

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


def bundled_index(spec: str = "text", cache_dir: str | os.PathLike | None = None) -> Path:
    """Length index of the bundled samples for ``spec`` (``"text"``: ``samples/text.jsonl``; a vision spec such as
    ``"qwen2.5-vl"``: the video/image shards ``samples/wds/*.tar``), what ``fcp index`` would build, built on first use
    and reused after.

    Call it on **every rank**, no barrier needed: it lives under ``cache_dir`` (default ``$FCP_CACHE``, else a
    per-user folder in the temporary directory) in a folder named by a digest of the inputs (their locations and
    sizes) and the spec; ranks that
    find it missing each build a private copy and rename it into place, the first rename wins (so every node of a
    multi-node job gets its own copy, and an interrupted build never leaves a half index behind).
    """
    import hashlib
    import shutil

    from fcp_data.index import build_index

    root = Path(cache_dir or os.environ.get("FCP_CACHE") or Path(tempfile.gettempdir()) / f"fcp-cache-{os.getuid()}")
    samples = data_path("samples")
    inputs = [samples / "text.jsonl"] if spec == "text" else sorted((samples / "wds").glob("*.tar"))
    # the index records where its samples are: two copies of fcp (clones, venvs) sharing a cache each get their own,
    # so removing one copy cannot leave the other reading a stale index of files that are gone
    # ... and its spec's fingerprint: an index built before the spec (or its tokenizer) changed is not reused
    from fcp_data.specs import load_spec

    digest = hashlib.blake2b(repr([(str(p.resolve()), p.stat().st_size) for p in inputs]
                                  + [spec, load_spec(spec).fingerprint]).encode(), digest_size=6).hexdigest()
    out = root / f"index-{spec}-{digest}"
    if not (out / "manifest.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".{out.name}.{os.getpid()}"
        _, rc = build_index([str(p) for p in inputs], spec, str(tmp), progress=False)
        if rc:
            raise RuntimeError(f"indexing the bundled samples into {tmp} reported too many errors")
        try:
            os.rename(tmp, out)
        except OSError:  # another rank finished first (or something else sits at ``out``)
            shutil.rmtree(tmp, ignore_errors=True)
            if not (out / "manifest.json").exists():
                raise RuntimeError(f"{out} exists but holds no fcp index (no manifest.json): remove it, or pass "
                                   "another cache_dir") from None
    return out
