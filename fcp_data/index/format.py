"""The on-disk length index: a directory of columnar ``.npy`` files, ``manifest.json`` and ``errors.jsonl``.

Layout of ``DIR/``::

    manifest.json          format/version, tool version, spec (name, fingerprint), inputs, sources, counts,
                           token percentiles, errors by reason, column dtypes
    num_tokens.npy         int64  [n]  tokens the model sees for the sample: text + visual + markers (+ EOS)
    num_visual_tokens.npy  int64  [n]  placeholder tokens the vision encoder fills (0 for text)
    eta.npy                float32[n]  mask factor of DESIGN §4 (0 causal, 1 full attention)
    kind.npy               uint8  [n]  0 text, 1 image, 2 video
    num_frames.npy         int32  [n]  source frames in the video header (1 for images, 0 for text)
    fps.npy                float64[n]  average fps of the video header (0 otherwise)
    height.npy, width.npy  int32  [n]  source size in pixels (0 for text)
    shard.npy              int32  [n]  index into manifest["sources"] (the jsonl file, tar shard or folder)
    offset.npy, size.npy   int64  [n]  byte range of the primary member (jsonl line, video, image or txt)
    member_ptr.npy         int64  [n+1] sample i's members are member_*[member_ptr[i]:member_ptr[i+1]]
    member_ext.npy         int16  [m]  index into manifest["exts"] ("mp4", "txt", "jsonl", ...)
    member_offset.npy, member_size.npy  int64 [m]
    key_ptr.npy            int64  [n+1] key i is key_bytes[key_ptr[i]:key_ptr[i+1]] (UTF-8)
    key_bytes.npy          uint8  [total key bytes]

A member's file name is ``key + "." + ext`` (webdataset convention); in a folder source it is that path
under the folder, in a tar shard its data sits at ``offset`` (``TarInfo.offset_data``) for ``size`` bytes.
``LengthIndex.load`` memory-maps every column, so loading is O(1) in the number of rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["LengthIndex", "COLUMNS", "KIND_TEXT", "KIND_IMAGE", "KIND_VIDEO", "FORMAT_NAME", "FORMAT_VERSION",
           "write_columns", "atomic_write_bytes", "KeyArray"]

FORMAT_NAME = "fcp-length-index"
FORMAT_VERSION = 1
KIND_TEXT, KIND_IMAGE, KIND_VIDEO = 0, 1, 2

# per-sample columns (length n) and their dtypes; the ragged ones (member_*, key_*) are listed separately
COLUMNS = {
    "num_tokens": np.int64, "num_visual_tokens": np.int64, "eta": np.float32, "kind": np.uint8,
    "num_frames": np.int32, "fps": np.float64, "height": np.int32, "width": np.int32,
    "shard": np.int32, "offset": np.int64, "size": np.int64,
}
RAGGED = {"member_ptr": np.int64, "member_ext": np.int16, "member_offset": np.int64, "member_size": np.int64,
          "key_ptr": np.int64, "key_bytes": np.uint8}


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_columns(out: Path, cols: dict[str, np.ndarray]) -> None:
    """Write every column as ``NAME.npy`` (each atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, arr in cols.items():
        dtype = COLUMNS.get(name) or RAGGED[name]
        tmp = out / f".{name}.npy.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(arr, dtype=dtype))
        os.replace(tmp, out / f"{name}.npy")


class KeyArray:
    """Sample keys stored as offsets + UTF-8 bytes; indexing decodes one key, ``index_of`` builds a dict once."""

    __slots__ = ("_ptr", "_bytes", "_lookup")

    def __init__(self, ptr: np.ndarray, data: np.ndarray):
        self._ptr, self._bytes, self._lookup = ptr, data, None

    def __len__(self) -> int:
        return len(self._ptr) - 1

    def __getitem__(self, i: int) -> str:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"key index {i} out of range for {n} samples")
        i %= n
        return bytes(self._bytes[self._ptr[i]:self._ptr[i + 1]]).decode("utf-8")

    def __iter__(self):
        raw = bytes(self._bytes)
        ptr = self._ptr.tolist()
        for a, b in zip(ptr[:-1], ptr[1:]):
            yield raw[a:b].decode("utf-8")

    def tolist(self) -> list[str]:
        return list(self)

    def index_of(self, key: str) -> int:
        """Row of ``key`` (first occurrence); the lookup table is built on first use."""
        if self._lookup is None:
            lookup: dict[str, int] = {}
            for i, k in enumerate(self):
                lookup.setdefault(k, i)
            self._lookup = lookup
        return self._lookup[key]


class LengthIndex:
    """A loaded length index (read-only, memory-mapped). See the module docstring for the columns."""

    def __init__(self, path: Path, manifest: dict, cols: dict[str, np.ndarray]):
        self.path, self.manifest, self._cols = Path(path), manifest, cols
        self.keys = KeyArray(cols["key_ptr"], cols["key_bytes"])
        self._errors: list[dict] | None = None

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True) -> "LengthIndex":
        p = Path(path)
        mf = p / "manifest.json"
        if not mf.exists():
            raise FileNotFoundError(f"{p} is not a length index (no manifest.json); build one with `fcp index ... --out {p}`")
        manifest = json.loads(mf.read_text(encoding="utf-8"))
        if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
            raise ValueError(f"{mf}: format {manifest.get('format')!r} v{manifest.get('version')} is not "
                             f"{FORMAT_NAME} v{FORMAT_VERSION}; rebuild the index with this fcp version")
        mode = "r" if mmap else None
        cols = {name: np.load(p / f"{name}.npy", mmap_mode=mode) for name in (*COLUMNS, *RAGGED)}
        n = len(cols["num_tokens"])
        if n != manifest["num_samples"] or len(cols["key_ptr"]) != n + 1 or len(cols["member_ptr"]) != n + 1:
            raise ValueError(f"{p}: columns disagree with manifest.json ({n} rows vs {manifest['num_samples']}); the index is incomplete, rebuild it")
        return cls(p, manifest, cols)

    def __len__(self) -> int:
        return len(self._cols["num_tokens"])

    def __repr__(self) -> str:
        return f"LengthIndex({str(self.path)!r}, samples={len(self)}, spec={self.manifest['spec']['name']!r}, errors={self.manifest['num_errors']})"

    def __getattr__(self, name: str) -> np.ndarray:
        cols = self.__dict__.get("_cols", {})
        if name in cols:
            return cols[name]
        raise AttributeError(f"LengthIndex has no attribute {name!r}")

    @property
    def spec_name(self) -> str:
        return self.manifest["spec"]["name"]

    @property
    def sources(self) -> list[dict]:
        """``[{"path", "kind"}]``; ``.shard[i]`` indexes this list."""
        return self.manifest["sources"]

    @property
    def errors(self) -> list[dict]:
        """Every bad sample as ``{"key", "reason", ...}`` (read from errors.jsonl once)."""
        if self._errors is None:
            ep = self.path / "errors.jsonl"
            self._errors = [json.loads(line) for line in ep.read_text(encoding="utf-8").splitlines() if line] if ep.exists() else []
        return self._errors

    def members(self, i: int) -> dict[str, tuple[int, int]]:
        """``{ext: (offset, size)}`` of sample ``i``'s members in its source."""
        a, b = int(self._cols["member_ptr"][i]), int(self._cols["member_ptr"][i + 1])
        exts = self.manifest["exts"]
        return {exts[int(e)]: (int(o), int(s)) for e, o, s in zip(self._cols["member_ext"][a:b],
                                                                 self._cols["member_offset"][a:b], self._cols["member_size"][a:b])}

    def row(self, i: int) -> dict:
        """One sample as a plain dict (for printing and debugging)."""
        d = {name: self._cols[name][i].item() for name in COLUMNS}
        d["key"] = self.keys[i]
        d["source"] = self.sources[d["shard"]]["path"]
        d["members"] = self.members(i)
        return d
