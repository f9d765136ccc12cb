"""The on-disk length index: ``manifest.json`` naming a data folder of columnar ``.npy`` files + ``errors.jsonl``.

Layout of ``DIR/`` (format version 2)::

    manifest.json          format/version, tool version, spec (name, fingerprint), inputs, sources, counts,
                           token percentiles, errors by reason, column dtypes and byte sizes, and ``data``:
                           the name of the data folder below. Replacing this file is the commit point.
    data-<hash>/           the columns and errors.jsonl of one complete build; <hash> = sha256 of their bytes
    errors.jsonl           symlink to data-<hash>/errors.jsonl (for people; the index reads its data folder)
    parts/                 per-shard parts of the last build (for --resume); .lock: held while a build runs

Columns, in the data folder (at the top level in format version 1, which still loads)::

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

A rebuild into an existing ``DIR`` writes a new data folder, then atomically replaces ``manifest.json``, then
removes the old data folder (``store.commit_index``): a reader, or a build killed at any point, sees either
the old index or the new one, never a mix. ``load`` checks every column's byte size against the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

__all__ = ["LengthIndex", "COLUMNS", "KIND_TEXT", "KIND_IMAGE", "KIND_VIDEO", "FORMAT_NAME", "FORMAT_VERSION",
           "READABLE_VERSIONS", "write_columns", "atomic_write_bytes", "fsync_dir", "KeyArray"]

FORMAT_NAME = "fcp-length-index"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
KIND_TEXT, KIND_IMAGE, KIND_VIDEO = 0, 1, 2

# per-sample columns (length n) and their dtypes; the ragged ones (member_*, key_*) are listed separately
COLUMNS = {
    "num_tokens": np.int64, "num_visual_tokens": np.int64, "eta": np.float32, "kind": np.uint8,
    "num_frames": np.int32, "fps": np.float64, "height": np.int32, "width": np.int32,
    "shard": np.int32, "offset": np.int64, "size": np.int64,
}
RAGGED = {"member_ptr": np.int64, "member_ext": np.int16, "member_offset": np.int64, "member_size": np.int64,
          "key_ptr": np.int64, "key_bytes": np.uint8}


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in folder ``path`` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync and ``os.replace``."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class _HashingWriter:
    def __init__(self, f, h):
        self._f, self._h, self.size = f, h, 0

    def write(self, b) -> int:
        self._h.update(b)
        self.size += len(b)
        return self._f.write(b)


def write_columns(out: Path, cols: dict[str, np.ndarray], digest=None, on_column=None) -> dict[str, int]:
    """Write every column as ``NAME.npy`` (each atomically, fsynced); returns ``{name: file bytes}``.

    ``digest`` (a hashlib object), when given, is updated with every file's bytes in order; ``on_column(name)``
    is called after each file (the commit's test hook).
    """
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, arr in cols.items():
        dtype = COLUMNS.get(name) or RAGGED[name]
        tmp = out / f".{name}.npy.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            w = _HashingWriter(f, digest if digest is not None else hashlib.sha256())
            np.lib.format.write_array(w, np.ascontiguousarray(arr, dtype=dtype), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out / f"{name}.npy")
        sizes[name] = w.size
        if on_column is not None:
            on_column(name)
    return sizes


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
        """Row of ``key``: ``KeyError`` when no sample has it, ``ValueError`` when several do (keys are the data's
        own and need not be distinct: two jsonl files that both number their lines from 0); the lookup table is
        built on first use."""
        if self._lookup is None:
            lookup: dict[str, int] = {}
            for i, k in enumerate(self):
                lookup[k] = -1 if k in lookup else i
            self._lookup = lookup
        row = self._lookup[key]
        if row < 0:
            raise ValueError(f"key {key!r} names several samples of this data")
        return row


_STR, _OPT_STR = (str,), (str, type(None))
_MANIFEST_TYPES = {"data": _STR, "text_field": _STR, "key_field": _STR, "prompt_field": _OPT_STR,
                   "chat_field": _OPT_STR, "media_root": _OPT_STR, "probe": _OPT_STR, "tools_field": _OPT_STR,
                   "template_kwargs_field": _OPT_STR, "assistant_only_loss": (bool,),
                   "chat_template": (str, dict, type(None)), "column_bytes": (dict,)}


def _check_manifest(m: dict, mf: Path) -> None:
    """The manifest fields the readers use have their types (an edited or damaged manifest.json is one
    ValueError naming the field, not a TypeError deep inside the first read)."""
    def bad(field: str, want: str):
        return ValueError(f"{mf}: {field} must be {want}, got {m.get(field)!r:.80}; the index is damaged, rebuild it")

    for field in ("num_samples", "num_errors"):
        v = m.get(field)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise bad(field, "an integer >= 0")
    for field, types in _MANIFEST_TYPES.items():
        if field in m and not isinstance(m[field], types):
            raise bad(field, " or ".join("null" if t is type(None) else t.__name__ for t in types))
    if "data" in m and (m["data"] in ("", "..") or "/" in m["data"] or "\\" in m["data"]):
        raise bad("data", "the name of the index's data folder")
    spec = m.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or \
            not all(isinstance(spec.get(k), _OPT_STR) for k in ("fingerprint", "path", "tokenizer_path")):
        raise bad("spec", "an object with a string name")
    sources = m.get("sources")
    if not isinstance(sources, list) or not all(isinstance(s, dict) and isinstance(s.get("path"), str)
                                                and isinstance(s.get("kind"), str) for s in sources):
        raise bad("sources", "a list of {path, kind} objects")
    if not isinstance(m.get("exts"), list) or not all(isinstance(e, str) for e in m["exts"]):
        raise bad("exts", "a list of strings")
    if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
               for k, v in m.get("column_bytes", {}).items()):
        raise bad("column_bytes", "an object of integers")


def _check_columns(cols: dict[str, np.ndarray], m: dict, p: Path) -> None:
    """Dtypes, the ragged pointers' ends and the columns that index into the manifest's lists, checked once at
    load: a damaged column is one ValueError here, not an IndexError or a wrong sample at some later read. Only
    what is cheap or read anyway (``num_tokens`` feeds the sampler; ``shard``/``member_ext`` are 4 and 2 bytes a
    row); a damaged offset or size fails the read of its own sample, which ``FCPDataset`` records and skips."""
    for name, dt in {**COLUMNS, **RAGGED}.items():
        if cols[name].dtype != np.dtype(dt) or cols[name].ndim != 1:
            raise ValueError(f"{p}: {name}.npy holds {cols[name].dtype}[{cols[name].ndim}-d], not {np.dtype(dt)}[n]; "
                             "the index is damaged, rebuild it")
    for ptr, data in (("key_ptr", "key_bytes"), ("member_ptr", "member_ext")):
        a = cols[ptr]
        if a.size == 0 or int(a[0]) != 0 or int(a[-1]) > len(cols[data]):
            raise ValueError(f"{p}: {ptr}.npy is not a pointer array into {data}.npy; the index is damaged, rebuild it")
    if len(cols["member_offset"]) != len(cols["member_ext"]) or len(cols["member_size"]) != len(cols["member_ext"]):
        raise ValueError(f"{p}: the member_* columns have different lengths; the index is damaged, rebuild it")
    for name, hi in (("shard", len(m["sources"])), ("member_ext", len(m["exts"])), ("num_tokens", None),
                     ("num_visual_tokens", None)):
        a = cols[name]
        if a.size and (int(a.min()) < 0 or (hi is not None and int(a.max()) >= hi)):
            raise ValueError(f"{p}: {name}.npy has values outside [0, {'∞' if hi is None else hi}); the index is "
                             "damaged, rebuild it")
    empty = np.flatnonzero(cols["num_tokens"] == 0)[:1]  # fcp index records an empty sample as an error, not a row
    if empty.size:
        raise ValueError(f"{p}: num_tokens.npy holds 0 tokens for sample {int(empty[0])}; the index is damaged, "
                         "rebuild it")


class LengthIndex:
    """A loaded length index (read-only, memory-mapped). See the module docstring for the columns."""

    def __init__(self, path: Path, manifest: dict, cols: dict[str, np.ndarray]):
        self.path, self.manifest, self._cols = Path(path), manifest, cols
        self.keys = KeyArray(cols["key_ptr"], cols["key_bytes"])
        self._errors: list[dict] | None = None
        self.data_path = self.path / manifest.get("data", ".")

    @classmethod
    def load(cls, path: str | Path, mmap: bool = True) -> "LengthIndex":
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise ValueError(f"a length index is the path of the folder `fcp index --out` wrote, got {path!r}")
        p = Path(path)
        mf = p / "manifest.json"
        if not mf.exists():
            raise FileNotFoundError(f"{p} is not a length index (no manifest.json); build one with `fcp index ... --out {p}`")
        try:
            manifest = json.loads(mf.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{mf} is not valid JSON ({e}); rebuild the index") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME \
                or manifest.get("version") not in READABLE_VERSIONS:
            got = (manifest.get("format"), manifest.get("version")) if isinstance(manifest, dict) else (None, None)
            raise ValueError(f"{mf}: format {got[0]!r} v{got[1]} is not {FORMAT_NAME} v{FORMAT_VERSION}; "
                             "rebuild the index with this fcp version")
        _check_manifest(manifest, mf)
        data = p / manifest.get("data", ".")
        if not data.is_dir():
            raise ValueError(f"{p}: the data folder {manifest.get('data')!r} named by manifest.json is missing; rebuild the index")
        sizes = manifest.get("column_bytes", {})
        for name, size in sizes.items():
            got = os.stat(data / f"{name}.npy").st_size
            if got != size:
                raise ValueError(f"{p}: {name}.npy has {got} bytes, manifest.json says {size}; the index is damaged, rebuild it")
        mode = "r" if mmap else None
        cols = {name: np.load(data / f"{name}.npy", mmap_mode=mode) for name in (*COLUMNS, *RAGGED)}
        n = len(cols["num_tokens"])
        if n != manifest["num_samples"] or len(cols["key_ptr"]) != n + 1 or len(cols["member_ptr"]) != n + 1 \
                or any(len(cols[c]) != n for c in COLUMNS):
            raise ValueError(f"{p}: columns disagree with manifest.json ({n} rows vs {manifest['num_samples']}); the index is incomplete, rebuild it")
        _check_columns(cols, manifest, p)
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
            ep = self.data_path / "errors.jsonl"
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
