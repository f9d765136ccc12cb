"""Drive a whole ``fcp index`` run: plan tasks, skip finished ones on ``--resume``, run an engine with a
progress bar, merge the per-shard parts (in task order) into the final columns and commit them with the
manifest and errors all-or-nothing (``store.commit_index``), holding the folder's build lock throughout.

A run writes its Parquet row copies into ``OUT/records.run/``; only a committed run's replace ``OUT/records/``
(moved in by ``commit_index``). A rejected or refused run removes its ``records.run/``; an interrupted or failed
one keeps it (with ``parts/``) for ``--resume``. The index already in ``OUT`` reads exactly its own rows throughout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from fcp_data.index.build import expand_inputs, make_tasks, part_path, task_fingerprint
from fcp_data.index.format import COLUMNS, FORMAT_NAME, FORMAT_VERSION, KIND_IMAGE, KIND_TEXT, KIND_VIDEO
from fcp_data.index.inputs import prepare_out, unreadable_reason
from fcp_data.index.limits import Limits
from fcp_data.index.store import RECORDS_RUN, build_lock, commit_index, recover_records

__all__ = ["build_index", "merge_parts", "summarize", "token_percentiles"]


def _read_part(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("meta").tobytes().decode())
    return meta, arrays


def _part_done(path: Path, fingerprint: str) -> bool:
    if not path.exists():
        return False
    try:
        meta, _ = _read_part(path)
    except Exception:  # a part from a killed writer never has its final name, but be safe
        return False
    return meta.get("fingerprint") == fingerprint


def token_percentiles(num_tokens: np.ndarray) -> dict:
    if len(num_tokens) == 0:
        return {"p50": 0, "p90": 0, "p99": 0, "max": 0, "sum": 0}
    q = np.percentile(num_tokens, [50, 90, 99], method="nearest")
    return {"p50": int(q[0]), "p90": int(q[1]), "p99": int(q[2]), "max": int(num_tokens.max()), "sum": int(num_tokens.sum())}


def merge_parts(out: Path, tasks: list[dict]) -> tuple[dict, dict[str, np.ndarray], list[dict], int]:
    """Concatenate the parts of ``tasks`` in task order; returns (info, columns, errors, seen)."""
    metas, parts = [], []
    for t in tasks:
        meta, arrays = _read_part(part_path(out, t["id"]))
        metas.append(meta)
        parts.append(arrays)
    exts = sorted({e for m in metas for e in m["exts"]})
    ext_id = {e: i for i, e in enumerate(exts)}
    cols = {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dt) for k, dt in COLUMNS.items()}
    key_bytes, key_ptr, mem_ptr, mem_ext, mem_off, mem_size = [], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)], [], [], []
    kb_total = mm_total = 0
    for meta, p in zip(metas, parts):
        key_bytes.append(p["key_bytes"])
        key_ptr.append(p["key_ptr"][1:] + kb_total)
        kb_total += len(p["key_bytes"])
        mem_ptr.append(p["member_ptr"][1:] + mm_total)
        mm_total += len(p["member_ext"])
        remap = np.asarray([ext_id[e] for e in meta["exts"]] or [0], dtype=np.int16)
        mem_ext.append(remap[p["member_ext"]] if len(p["member_ext"]) else p["member_ext"])
        mem_off.append(p["member_offset"])
        mem_size.append(p["member_size"])
    cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
    cols.update(key_ptr=cat(key_ptr, np.int64), key_bytes=cat(key_bytes, np.uint8), member_ptr=cat(mem_ptr, np.int64),
                member_ext=cat(mem_ext, np.int16), member_offset=cat(mem_off, np.int64), member_size=cat(mem_size, np.int64))
    errors = [e for m in metas for e in m["errors"]]
    kinds = np.bincount(np.asarray(cols["kind"], dtype=np.int64), minlength=3) if len(cols["kind"]) else np.zeros(3, int)
    by_kind = {name: int(kinds[k]) for k, name in ((KIND_VIDEO, "video"), (KIND_IMAGE, "image"), (KIND_TEXT, "text"))
               if kinds[k]}
    return ({"exts": exts, "num_tokens": cols["num_tokens"], "kinds": by_kind}, cols, errors,
            sum(m["seen"] for m in metas))


def _tokenizer_note(spec: dict) -> str:
    """``, tokenizer PATH`` when the index was counted with a tokenizer other than its spec's bundled one."""
    tok, path = spec.get("tokenizer_path"), spec.get("path")
    from fcp_data._resources import data_path

    if not tok or Path(tok).parent in (Path(path).parent if path else None, data_path("tokenizers")):
        return ""
    return f", tokenizer {tok}"


def summarize(manifest: dict) -> str:
    t = manifest["tokens"]
    kinds = manifest.get("kinds") or {}
    mix = f" ({', '.join(f'{n} {k}' for k, n in kinds.items())})" if len(kinds) > 1 or set(kinds) - {"text"} else ""
    lines = [f"indexed {manifest['num_samples']} samples{mix} of {manifest['num_seen']} seen, {manifest['num_errors']} "
             f"errors ({manifest['error_rate']:.2%}); spec {manifest['spec']['name']}{_tokenizer_note(manifest['spec'])}",
             f"tokens: p50 {t['p50']}  p90 {t['p90']}  p99 {t['p99']}  max {t['max']}  total {t['sum']}"]
    if manifest.get("chat_field"):
        from fcp_data.chat import template_label

        tools = f", tools in {manifest['tools_field']!r}" if manifest.get("tools_field") not in (None, "tools") else ""
        if manifest.get("template_kwargs_field") not in (None, "chat_template_kwargs"):
            tools += f", template kwargs in {manifest['template_kwargs_field']!r}"
        what, trained = f"conversations in {manifest['chat_field']!r}", "the assistant turns"
        if manifest.get("prompt_field"):
            what = f"prompt {manifest['prompt_field']!r} + completion {manifest['chat_field']!r} (messages)"
            trained = "the completion (TRL's completion-only loss)"
        if manifest.get("assistant_only_loss"):
            trained = ("the completion's assistant turns (TRL's completion-only and assistant-only loss)"
                       if manifest.get("prompt_field") else "the assistant turns (TRL's assistant-only loss)")
        lines.append(f"SFT: {what} ({template_label(manifest['chat_template'])} template{tools}), labels on "
                     f"{trained}: train with FCPCollator(sample_labels=True)")
    elif manifest.get("prompt_field"):
        lines.append(f"SFT: prompt {manifest['prompt_field']!r} + response {manifest['text_field']!r}, labels mask the "
                     "prompt: train with FCPCollator(sample_labels=True)")
    if manifest["errors_by_reason"]:
        lines.append("errors by reason: " + ", ".join(f"{r} {n}" for r, n in sorted(manifest["errors_by_reason"].items())))
    return "\n".join(lines)


def _template_tokenizer(chat_template) -> str | None:
    """A model folder's tokenizer.json when ``--chat-template`` names that folder (or a file in it): the template's
    special tokens are in it, so its counts are the model's (the spec's bundled tokenizer would split them)."""
    if not isinstance(chat_template, str) or not Path(chat_template).exists():
        return None
    folder = Path(chat_template) if Path(chat_template).is_dir() else Path(chat_template).parent
    return str(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None


def _check_sft(prompt_field, chat_field, chat_template, media_root, text_field: str, key_field: str,
               tools_field: str | None = None, kwargs_field: str | None = None):
    """The SFT options checked (one ValueError each); returns ``(chat_field, chat template (a model's read once,
    here), media root (an absolute path), tools field, template kwargs field)`` by their manifest names (with
    ``chat_field``, ``tools`` and ``chat_template_kwargs`` by default: the columns TRL's SFTTrainer reads)."""
    if prompt_field is not None and (not isinstance(prompt_field, str) or not prompt_field or prompt_field in
                                     (text_field, key_field)):
        raise ValueError(f"--prompt-field must be a jsonl/Parquet field name other than --text-field {text_field!r} and "
                         f"--key-field {key_field!r}, got {prompt_field!r}")
    if chat_field is None and chat_template is not None:  # even chatml, the default: given alone it would do nothing
        raise ValueError("--chat-template is the template of --chat-field conversations; give both")
    if chat_field is not None:
        from fcp_data.chat import resolve_template

        if prompt_field == chat_field:  # both: TRL's conversational prompt-completion (fcp_data/chat_completion.py)
            raise ValueError(f"--prompt-field and --chat-field name the same field {chat_field!r}: give the prompt's "
                             "messages and the completion's (or --chat-field alone for whole conversations)")
        if not isinstance(chat_field, str) or not chat_field or chat_field == key_field:
            raise ValueError(f"--chat-field must be a jsonl/Parquet field name other than --key-field, got {chat_field!r}")
        chat_template = resolve_template("chatml" if chat_template is None else chat_template)
        tools_field = "tools" if tools_field is None else tools_field
        kwargs_field = "chat_template_kwargs" if kwargs_field is None else kwargs_field
        for option, field in (("--tools-field", tools_field), ("--template-kwargs-field", kwargs_field)):
            if not isinstance(field, str) or not field or field in (chat_field, key_field):
                raise ValueError(f"{option} must be a jsonl/Parquet field name other than --chat-field and "
                                 f"--key-field, got {field!r}")
        if tools_field == kwargs_field or prompt_field in (tools_field, kwargs_field):
            raise ValueError(f"--prompt-field, --tools-field and --template-kwargs-field name one field twice "
                             f"({prompt_field!r}, {tools_field!r}, {kwargs_field!r})")
    elif tools_field is not None:
        raise ValueError("--tools-field is the tool definitions of --chat-field conversations; give both")
    elif kwargs_field is not None:
        raise ValueError("--template-kwargs-field is for the template variables of --chat-field conversations; "
                         "give both")
    if media_root is not None:
        if not chat_field:
            raise ValueError("--media-root is for the images and videos of --chat-field conversations; give both")
        if not Path(media_root).is_dir():
            raise ValueError(f"--media-root {media_root} is not a folder")
        media_root = str(Path(media_root).resolve())
    return {"chat_field": chat_field, "chat_template": chat_template, "media_root": media_root,
            "tools_field": tools_field, "template_kwargs_field": kwargs_field}


def _load_tokenizer(sp, chat_field, chat_template, sources: list[dict]) -> None:
    """The spec's tokenizer loaded (a broken tokenizer.json fails here, once, not in every worker) and its EOS / pad
    found (:func:`fcp_data.text_tokens.check_tokens`: one error before ``--out`` is made; the EOS unless every input
    is a conversation file — tar shards and folders hold text and captions, which end in one); one line on
    stderr when it spells the chat template's markers out in ordinary tokens (no --tokenizer, or another model's):
    the index is consistent, but not in the model's format."""
    from fcp_data.chat import split_markers, template_label
    from fcp_data.text_tokens import check_tokens

    tok = sp.tokenizer()
    check_tokens(sp, eos=chat_field is None or any(s["kind"] in ("tar", "dir") for s in sources))
    split = split_markers(chat_template, tok) if chat_field is not None else []
    if split:
        print(f"fcp index: warning: tokenizer {Path(sp.tokenizer_path).name} has no token for "
              f"{', '.join(split[:4])}{' ...' if len(split) > 4 else ''} of the {template_label(chat_template)} "
              "chat template: each is indexed as several ordinary tokens, which the model never saw; give --tokenizer "
              "the model's tokenizer.json (or --chat-template its folder)", file=sys.stderr)


def build_index(inputs: list[str], spec: str, out: str | Path, *, tokenizer: str | None = None, workers: int = 1,
                engine: str = "local", address: str | None = None, resume: bool = False, probe: str = "av",
                text_field: str = "text", key_field: str = "id", max_error_rate: float = 0.01,
                progress: bool = True, dir_chunk: int | None = None, limits: Limits | dict | None = None,
                prompt_field: str | None = None, chat_field: str | None = None, chat_template: str | dict | None = None,
                media_root: str | None = None, tools_field: str | None = None,
                template_kwargs_field: str | None = None, assistant_only_loss: bool = False) -> tuple[dict, int]:
    """Build (or resume) the index of ``inputs`` into ``out``; returns (manifest, exit code 0/1).

    ``limits``: per-sample ingestion limits (:class:`~fcp_data.index.limits.Limits`, or a dict of its fields);
    a sample past one is an error record. The index in ``out`` is replaced all-or-nothing. ``prompt_field``: jsonl
    SFT samples — a sample is the tokens of its prompt then of its ``text_field`` (the response), and
    :class:`~fcp_data.readers.IndexedDataset` gives it ``labels`` that mask the prompt. ``chat_field``: jsonl
    conversations rendered by ``chat_template`` (:mod:`fcp_data.chat`; ``chatml`` when None, and refused without
    ``chat_field``) with the line's ``tools_field`` and ``template_kwargs_field`` (default ``tools``,
    ``chat_template_kwargs``: TRL's), trained on the assistant turns; they may
    name images and videos (:mod:`fcp_data.chat_media`) under ``media_root`` (default: the jsonl file's folder).
    ``assistant_only_loss``: TRL's ``SFTTrainer(assistant_only_loss=True)`` (:mod:`fcp_data.chat_trl`).
    """
    from fcp_data import __version__
    from fcp_data.chat_trl import assistant_only
    from fcp_data.index.build import DIR_CHUNK
    from fcp_data.specs import load_spec

    _check_run(engine, address, workers, max_error_rate, out, tokenizer)
    tokenizer = _template_tokenizer(chat_template) if tokenizer is None and chat_field is not None else tokenizer
    chat = _check_sft(prompt_field, chat_field, chat_template, media_root, text_field, key_field, tools_field,
                      template_kwargs_field)
    limits = limits if isinstance(limits, Limits) else Limits.from_dict(limits)
    sp = load_spec(spec, tokenizer)
    sources = expand_inputs(list(inputs))
    if assistant_only_loss:  # TRL's SFTTrainer(assistant_only_loss=True): fcp_data/chat_trl.py
        chat = assistant_only(chat, sp.tokenizer_path)
    _load_tokenizer(sp, chat_field, chat["chat_template"], sources)
    if any(s["kind"] == "parquet" for s in sources) and importlib.util.find_spec("pyarrow") is None:
        raise ValueError("reading .parquet/.arrow needs pyarrow: pip install 'fcp[parquet]' (or pyarrow)")
    if not any(Path(s["path"]).exists() for s in sources):
        raise ValueError("none of the inputs exist: " + ", ".join(f"{s['path']} ({unreadable_reason(s['path'])})"
                                                                 for s in sources[:3])
                         + (" ..." if len(sources) > 3 else ""))
    new_top = _first_missing(Path(out))  # the first folder this run creates: removed again if it is refused
    before = set(os.listdir(out)) if Path(out).is_dir() else set()
    out = prepare_out(Path(out), sources)
    try:
        with build_lock(out):
            return _build_locked(inputs, sources, sp, out, probe=probe, text_field=text_field, key_field=key_field,
                                 prompt_field=prompt_field, chat=chat, limits=limits, resume=resume, engine=engine,
                                 address=address, workers=workers, progress=progress, dir_chunk=dir_chunk or DIR_CHUNK,
                                 max_error_rate=max_error_rate, version=__version__)
    except NothingToIndex:
        _undo_refused(out, new_top, before)
        raise


def _check_run(engine: str, address, workers: int, max_error_rate: float, out, tokenizer) -> None:
    """The options of the run itself (one ValueError each)."""
    from fcp_data.index.engines import ENGINES

    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if not 0 <= max_error_rate <= 1:
        raise ValueError(f"--max-error-rate must be in [0, 1], got {max_error_rate}")
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if address is not None and engine != "ray":
        raise ValueError(f"--address {address!r} is a Ray cluster's address; it needs --engine ray")
    if not str(out).strip():  # Path("") is the working directory: never write an index there by accident
        raise ValueError("--out must name the index folder, got an empty path")
    if tokenizer is not None and not str(tokenizer).strip():
        raise ValueError("--tokenizer must name a tokenizer.json file, got an empty path")


class NothingToIndex(ValueError):
    """The inputs hold no sample at all (empty folders, empty or blank files): the run is refused, nothing kept."""


def _first_missing(out: Path) -> Path | None:
    """The topmost folder of the path ``out`` that does not exist yet (None when ``out`` exists)."""
    top = None
    for p in [out.absolute(), *out.absolute().parents]:
        if os.path.lexists(p):
            break
        top = p
    return top


def _undo_refused(out: Path, new_top: Path | None, before: set[str]) -> None:
    """Take back what a refused run wrote: the folder it created (with any parents it created), else the entries
    it added to an existing ``out`` (its lock, ``parts/``); an index already there is not touched."""
    if new_top is not None:
        shutil.rmtree(new_top, ignore_errors=True)
        return
    for name in set(os.listdir(out)) - before:
        if name in (".lock", "parts", RECORDS_RUN):
            p = out / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _prepare_run(out: Path, resume: bool) -> None:
    """Clear ``parts/`` and ``records.run/`` (this run's Arrow copies of Parquet rows, index/parquet.py) unless
    resuming; ``records/``, the committed index's copies, is never touched here."""
    for d in ("parts", RECORDS_RUN):
        if not resume and (out / d).exists():
            shutil.rmtree(out / d)
        for stale in (out / d).glob(".*.tmp*"):  # a killed run's half-written temp files (we hold the lock)
            stale.unlink(missing_ok=True)
    (out / "parts").mkdir(parents=True, exist_ok=True)


def _build_locked(inputs, sources, sp, out: Path, *, probe, text_field, key_field, prompt_field, chat, limits, resume,
                  engine, address, workers, progress, dir_chunk, max_error_rate, version) -> tuple[dict, int]:
    from fcp_data.index.engines import run_local, run_ray
    from fcp_data.index.parquet import records_ready

    tasks = make_tasks(sources, dir_chunk)
    if not tasks:
        raise NothingToIndex(f"no samples found in {', '.join(s['path'] for s in sources[:3])}: the folders are empty")
    cfg = {"spec_path": sp.path, "tokenizer": sp.tokenizer_path, "spec_fingerprint": sp.fingerprint, "probe": probe,
           "text_field": text_field, "key_field": key_field, "prompt_field": prompt_field, **chat,
           "out": str(out.resolve()), "limits": limits.to_dict()}
    recover_records(out)  # a build killed inside the swap of records/: put back the committed index's
    _prepare_run(out, resume)
    todo = [t for t in tasks if not (resume and _part_done(part_path(out, t["id"]), task_fingerprint(t, cfg))
                                     and records_ready(out, t))]

    from tqdm import tqdm

    bar = tqdm(total=len(tasks), initial=len(tasks) - len(todo), unit="shard", file=sys.stderr, disable=not progress,
               desc="fcp index", dynamic_ncols=True)
    stats = {"samples": 0, "errors": 0, "t0": time.perf_counter()}

    def on_done(res: dict) -> None:
        stats["samples"] += res["seen"]
        stats["errors"] += res["errors"]
        rate = stats["samples"] / max(time.perf_counter() - stats["t0"], 1e-9)
        bar.set_postfix(samples=stats["samples"], errors=stats["errors"], rate=f"{rate:.0f}/s", refresh=False)
        bar.update(1)

    try:
        if engine == "ray":
            run_ray(todo, cfg, on_done, address=address)
        else:
            run_local(todo, cfg, workers, on_done)
    finally:
        bar.close()
    info, cols, errors, seen = merge_parts(out, tasks)
    if not seen:  # empty or blank files, empty shards: no sample, not even a bad one (nothing is committed)
        shutil.rmtree(out / RECORDS_RUN, ignore_errors=True)  # (an empty file's empty copy); records/ is untouched
        raise NothingToIndex(f"no samples found in {', '.join(s['path'] for s in sources[:3])}"
                             f"{' ...' if len(sources) > 3 else ''}: the inputs are empty")
    by_reason = Counter(e["reason"] for e in errors)
    n = len(info["num_tokens"])
    manifest = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION, "tool": f"fcp {version}",
        "spec": {"name": sp.name, "family": sp.family, "fingerprint": sp.fingerprint, "eta": sp.eta,
                 "tokenizer": Path(sp.tokenizer_path).name, "path": sp.path, "tokenizer_path": sp.tokenizer_path},
        "probe": probe, "text_field": text_field, "key_field": key_field, "prompt_field": prompt_field, **chat,
        "limits": limits.to_dict(),
        "inputs": list(inputs), "sources": sources,
        "num_tasks": len(tasks), "exts": info["exts"], "num_samples": n, "num_errors": len(errors), "num_seen": seen,
        "error_rate": len(errors) / seen if seen else 0.0, "errors_by_reason": dict(sorted(by_reason.items())),
        "tokens": token_percentiles(np.asarray(info["num_tokens"])), "kinds": info["kinds"],
        "columns": {k: np.dtype(v).name for k, v in COLUMNS.items()},
    }
    if n + len(errors) != seen:
        raise AssertionError(f"accounting broken: {n} indexed + {len(errors)} errors != {seen} seen")
    return _commit_or_keep(out, cols, errors, manifest, max_error_rate)


REJECTED_ERRORS = "errors-rejected.jsonl"  # beside a kept index: the errors of the run that did not replace it


def _commit_or_keep(out: Path, cols: dict, errors: list[dict], manifest: dict, max_error_rate: float
                    ) -> tuple[dict, int]:
    """Commit the run's index (exit code 1 when its error rate exceeds ``max_error_rate``) — unless it exceeds the
    rate and ``out`` holds an index already: a failed run (a wrong ``--text-field``, a missing mount: every sample an
    error) must not destroy a good index. That one is kept; the run's errors go to :data:`REJECTED_ERRORS` in
    ``out`` and its manifest comes back with ``"kept_previous": True`` (and no ``data``)."""
    from fcp_data.index.format import atomic_write_bytes

    if manifest["error_rate"] > max_error_rate and (out / "manifest.json").is_file():
        atomic_write_bytes(out / REJECTED_ERRORS, "".join(json.dumps(e) + "\n" for e in errors).encode())
        shutil.rmtree(out / RECORDS_RUN, ignore_errors=True)  # its row copies; records/ stays the kept index's
        return {**manifest, "kept_previous": True}, 1
    (out / REJECTED_ERRORS).unlink(missing_ok=True)  # an earlier rejected run's: this index replaces it
    manifest = commit_index(out, cols, errors, manifest, records=out / RECORDS_RUN)
    return manifest, (1 if manifest["error_rate"] > max_error_rate else 0)
