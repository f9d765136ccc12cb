"""Map-style datasets over a :class:`~fcp_data.index.LengthIndex`: ``dataset[i]`` reads sample ``i`` straight
from its source by the recorded byte offset (no scan of a tar shard or jsonl file).

Sample dicts (the contract with :class:`~fcp_data.collator.FCPCollator`, DESIGN §7):

- text sample (jsonl line, or a text-only tar/folder sample): ``{"input_ids": LongTensor [L]}`` — the spec
  tokenizer's ids of the text, plus EOS when the spec says so. An index built with a prompt field (``fcp index
  --prompt-field``, SFT) gives ``input_ids`` = the prompt's ids, then the text's (the response) and EOS, and
  ``"labels"``: the same with -100 on the prompt (Hugging Face convention; ``dataset.has_labels``): train it with
  ``FCPCollator(sample_labels=True)``. With a chat field (``fcp index --chat-field``) the conversation (with its
  tools and template kwargs) is rendered by its template, the labels keep the assistant turns (:mod:`fcp_data.chat`).
  A chat line with images/videos (:mod:`fcp_data.chat_media`) is an image/video sample (below) whose
  ``input_ids`` are the rendered conversation's tokens with each media's visual block at its position (``grid_thw``
  one row per media, ``pixel_values`` concatenated), and whose ``labels`` keep the assistant turns only.
  ``IndexedDataset(..., caption_labels=True)`` does the same for image/video samples: ``labels`` = -100 on the
  whole visual block (markers, timestamps and placeholders), the caption's ids and EOS trained (a captioning
  recipe's caption-only loss).
- image or video sample:
  ``{"input_ids": LongTensor [L], "pixel_values": FloatTensor, "grid_thw": LongTensor [1, 3]}`` where
  ``input_ids`` = the visual block (markers, timestamps text, and exactly ``index.num_visual_tokens[i]``
  placeholder ids) followed by the caption's ids and EOS. ``pixel_values``/``grid_thw`` layout per family:
  Qwen-VL ``[t·h·w, 3·2·p·p]`` / ``[[t, h, w]]`` patches (tokens = t·h·w/4); InternVL
  ``[tiles, 3, 448, 448]`` / ``[[tiles, 32, 32]]``; LLaVA-Video ``[frames, 3, 384, 384]`` / ``[[frames, 14, 15]]``.
  Qwen-VL video samples also carry ``"second_per_grid_ts": FloatTensor [1]`` (one per video: seconds per temporal
  patch, ``temporal_patch_size / sampled fps`` as ``Qwen2_5_VLProcessor`` computes it), which Qwen2.5-VL's
  ``get_rope_index`` scales the temporal positions by.

Always ``len(input_ids) == index.num_tokens[i]`` and ``(input_ids ∈ placeholder_ids).sum() ==
index.num_visual_tokens[i]``. The collator finds visual positions with ``dataset.placeholder_ids`` (also
``image_token_id``/``video_token_id`` for Qwen-VL). ``dataset.pad_token_id``: the spec's pad, else the model's
(:mod:`fcp_data.text_tokens`).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fcp_data import text_tokens
from fcp_data.chat import line_template_inputs as line_inputs
from fcp_data.index.format import KIND_IMAGE, KIND_TEXT, KIND_VIDEO, LengthIndex
from fcp_data.index.limits import record_mismatch
from fcp_data.index.probe import IMAGE_EXTS, TEXT_EXTS, VIDEO_EXTS, member_path
from fcp_data.slots import StaleSampleError
from fcp_data.specs import Spec, load_spec, plan_visual, segments_to_ids
from fcp_data.strict import flag

__all__ = ["IndexedDataset"]


def index_spec(recorded: dict, spec: str | None = None, tokenizer: str | None = None) -> Spec:
    """The spec to read an index with: the one given, else the one it was built with — by name, else by the spec
    file it recorded — with the tokenizer given, else the bundled one, else the tokenizer.json it recorded (an
    index built with ``--tokenizer``, e.g. the model's own, reads back without passing it again; the fingerprint
    check that follows still catches a changed file)."""
    if spec is not None:
        return load_spec(spec, tokenizer)
    try:
        sp = load_spec(recorded["name"], tokenizer)
    except (ValueError, FileNotFoundError):
        if not recorded.get("path") or not Path(recorded["path"]).is_file():
            raise
        sp = load_spec(recorded["path"], tokenizer)
    own = recorded.get("tokenizer_path")
    if tokenizer is None and sp.fingerprint != recorded["fingerprint"] and own and Path(own).is_file():
        sp = load_spec(sp.path, own)
    return sp


def _check_locations(tokenizer: Any, roots: Any) -> tuple[str | None, dict[str, str]]:
    """``tokenizer`` (None or a path) and ``roots`` (None or ``{old_prefix: new_prefix}``, strings): an empty path or
    prefix, or another type, is refused instead of read as "none" (``tokenizer=""`` ran with the bundled tokenizer,
    ``roots=""`` relocated nothing)."""
    if tokenizer is not None and (not isinstance(tokenizer, (str, os.PathLike)) or not str(tokenizer)):
        raise TypeError(f"tokenizer must be None or the path of a tokenizer.json, got {tokenizer!r}")
    tokenizer = None if tokenizer is None else str(tokenizer)
    if roots is None:
        return tokenizer, {}
    if not isinstance(roots, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) and v
                                                 for k, v in roots.items()):
        raise TypeError(f"roots must be None or a dict {{old_prefix: new_prefix}} of non-empty strings, got {roots!r}")
    return tokenizer, dict(roots)


class IndexedDataset(torch.utils.data.Dataset):
    """Sample ``i`` of a length index as a dict of tensors (see the module docstring).

    index: a ``LengthIndex`` or its path. spec: the spec name/path/object (default: the spec the index was
    built with; its fingerprint must match). tokenizer: a tokenizer.json overriding the spec's (must be the
    one the index was built with). roots: ``{old_prefix: new_prefix}`` to relocate sources moved after indexing.
    max_open_files: shard handles kept open per process (least recently used closed first), so random access
    over thousands of shards stays under the process's file-descriptor limit. ``close()`` closes them all.
    caption_labels: image/video samples carry ``labels`` masking their visual block (module docstring).
    """

    def __init__(self, index: LengthIndex | str | Path, spec: Spec | str | None = None, *, tokenizer: str | None = None,
                 roots: dict[str, str] | None = None, check_fingerprint: bool = True, max_open_files: int = 64,
                 caption_labels: bool = False):
        if isinstance(max_open_files, bool) or not isinstance(max_open_files, int) or max_open_files < 1:
            raise ValueError(f"max_open_files must be an int >= 1, got {max_open_files!r}")
        self.max_open_files = max_open_files
        tokenizer, self._roots = _check_locations(tokenizer, roots)
        self.index = index if isinstance(index, LengthIndex) else LengthIndex.load(index)
        m = self.index.manifest
        self.spec = spec if isinstance(spec, Spec) else index_spec(m["spec"], spec, tokenizer)
        if flag("check_fingerprint", check_fingerprint) and self.spec.fingerprint != m["spec"]["fingerprint"]:
            raise ValueError(f"spec {self.spec.name!r} (fingerprint {self.spec.fingerprint[:12]}) differs from the one the index "
                             f"was built with ({m['spec']['name']!r}, {m['spec']['fingerprint'][:12]}); pass the same spec and "
                             "tokenizer, or rebuild the index")
        self.text_field = m.get("text_field", "text")
        self.prompt_field: str | None = m.get("prompt_field")
        self.chat_field, self.chat_template = m.get("chat_field"), m.get("chat_template") or "chatml"
        self.line_fields = (m.get("tools_field"), m.get("template_kwargs_field"))  # None: built before them, unread
        self.caption_labels = flag("caption_labels", caption_labels) and self.spec.is_multimodal
        # samples carry their own labels: train with FCPCollator(sample_labels=True)
        self.has_labels = bool(self.prompt_field or self.chat_field) or self.caption_labels
        self._files: OrderedDict[int, object] = OrderedDict()
        self._pid = os.getpid()
        self.placeholder_ids: tuple[int, ...] = self.spec.placeholder_ids if self.spec.is_multimodal else ()
        t = self.spec.vision.get("tokens", {})
        self.image_token_id = self.spec.token_id(t["image_pad"]) if "image_pad" in t else None
        self.video_token_id = self.spec.token_id(t["video_pad"]) if "video_pad" in t else None
        self.pad_token_id = text_tokens.pad_id(self.spec)  # the spec's, else the model's (fcp_data.text_tokens)
        self.eos_token_id = None if self.chat_field and not text_tokens.has_eos(self.spec) else self.spec.eos_id

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self):  # file handles do not cross process boundaries
        d = dict(self.__dict__)
        d["_files"] = OrderedDict()
        return d

    def close(self) -> None:
        """Close the shard handles this process opened (reading again reopens them)."""
        files, self._files = self._files, OrderedDict()
        if os.getpid() == self._pid:
            for f in files.values():
                f.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ raw bytes by recorded offset

    def _relocate(self, p: str) -> str:
        for old, new in self._roots.items():
            if p.startswith(old):
                return new + p[len(old):]
        return p

    def _source_path(self, shard: int) -> Path:
        return Path(self._relocate(self.index.sources[shard]["path"]))

    def _handle(self, shard: int, parquet: bool = False):
        """The open file of a tar/jsonl shard, or the row reader of a Parquet one (LRU, per process)."""
        if os.getpid() != self._pid:  # forked DataLoader worker: reopen (the parent's handles share offsets)
            self._files, self._pid = OrderedDict(), os.getpid()
        key = ("parquet", shard) if parquet else shard
        f = self._files.get(key)
        if f is None:
            while len(self._files) >= self.max_open_files:
                self._files.popitem(last=False)[1].close()
            if parquet:
                from fcp_data.index.parquet import ParquetRows, records_of

                f = self._files[key] = ParquetRows(self._source_path(shard), records_of(self.index.path, shard))
            else:
                f = self._files[key] = open(self._source_path(shard), "rb")
        else:
            self._files.move_to_end(key)
        return f

    def _record(self, i: int, members: dict) -> dict | None:
        """Sample ``i``'s record — its jsonl line or Parquet row as a dict — or None for a tar/folder sample."""
        if "jsonl" in members:
            obj, row = json.loads(self.read_member(i, "jsonl").decode("utf-8")), None
        elif "parquet" in members:
            row = members["parquet"][0]
            obj = self._handle(int(self.index.shard[i]), parquet=True).row(row)
        else:
            return None
        stem = Path(self.index.sources[int(self.index.shard[i])]["path"]).stem  # as indexed: the key's stem
        why = record_mismatch(obj, self.index.keys[i], self.index.manifest.get("key_field", "id"), stem, row)
        if why:
            raise StaleSampleError(f"sample {self.index.keys[i]!r}: the record at its offset is another one ({why}): "
                                   "the file changed since indexing")
        return obj

    def read_member(self, i: int, ext: str) -> bytes:
        """Bytes of member ``ext`` of sample ``i`` (a seek + read in a tar/jsonl; a file read in a folder)."""
        shard = int(self.index.shard[i])
        off, size = self.index.members(i)[ext]
        if self.index.sources[shard]["kind"] == "dir":
            return member_path(self._source_path(shard), self.index.keys[i], ext).read_bytes()
        f = self._handle(shard)
        f.seek(off)
        data = f.read(size)
        if len(data) != size:
            raise OSError(f"sample {self.index.keys[i]!r}: read {len(data)} of {size} bytes of .{ext} at {off}; the shard changed since indexing")
        return data

    # ------------------------------------------------------------------ samples

    def sample_key(self, i: int) -> str:
        """Sample ``i``'s key in the index (a tar member's stem, a jsonl id, a file's path)."""
        return str(self.index.keys[i])

    def skeleton(self, i: int) -> dict | None:
        """Sample ``i`` as the reader builds it but without decoding a pixel, for a read that failed: an image/video's
        visual block exactly (planned from the index), zero pixels of its shape (Qwen-VL: its patch grid and
        ``second_per_grid_ts``; InternVL: its tiles; LLaVA-Video: its frames); pads in place of a caption up to the
        indexed length, or a conversation's own text (its record read again; several media: their headers probed
        again). Every rank of a CP group then packs the same visual layout whether its own read failed or not, so
        the group's frame/tile exchange still matches. None for text (a failure there gives plain pads)."""
        kind = int(self.index.kind[i])
        if kind not in (KIND_VIDEO, KIND_IMAGE):
            return None
        if self.chat_field:
            out = self._media_chat_sample(i, kind, self._record(i, self.index.members(i)), decode=False)
            out.pop("labels")  # no label of a skipped sample is trained: the collator masks them all
            return out
        visual, out = self._vision(i, kind, None, decode=False, at_start=True)
        n = int(self.index.num_tokens[i])
        out["input_ids"] = torch.tensor(visual + [self.pad_token_id] * (n - len(visual)), dtype=torch.long)
        return out

    def _text_ids(self, text: str, after_block: bool = False) -> list[int]:  # a caption: text_tokens.encode_after
        ids = (text_tokens.encode_after(self.spec, text)[0] if after_block else self.spec.encode(text)) if text else []
        return ids + ([self.eos_token_id] if self.eos_token_id is not None else [])

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for an index of {len(self)} samples")
        kind = int(self.index.kind[i])
        members = self.index.members(i)
        record = self._record(i, members)
        if kind == KIND_TEXT:
            if record is not None and (self.prompt_field or self.chat_field):
                return self._sft_sample(record)
            text = (record[self.text_field] if record is not None
                    else self.read_member(i, next(e for e in TEXT_EXTS if e in members)).decode("utf-8"))
            return {"input_ids": torch.tensor(self._text_ids(text), dtype=torch.long)}
        if kind not in (KIND_VIDEO, KIND_IMAGE):
            raise ValueError(f"sample {i}: unknown kind {kind} in the index")
        if record is not None:
            return self._media_chat_sample(i, kind, record)
        txt = next((e for e in TEXT_EXTS if e in members), None)
        caption = self.read_member(i, txt).decode("utf-8") if txt else ""
        ext = next(e for e in (VIDEO_EXTS if kind == KIND_VIDEO else IMAGE_EXTS) if e in members)
        shard = int(self.index.shard[i])
        src = self.read_member(i, ext) if self.index.sources[shard]["kind"] != "dir" else \
            member_path(self._source_path(shard), self.index.keys[i], ext)
        visual, out = self._vision(i, kind, src, at_start=True)  # a plain sample: its block opens it
        text = self._text_ids(caption, after_block=True)
        out["input_ids"] = torch.tensor(visual + text, dtype=torch.long)
        if self.caption_labels:
            out["labels"] = torch.tensor([-100] * len(visual) + text, dtype=torch.long)
        return out

    def _vision(self, i: int, kind: int, src, decode: bool = True, at_start: bool = False) -> tuple[list[int], dict]:
        """Sample ``i``'s visual block ids and its vision inputs (pixel values, grid, Qwen-VL's seconds per grid)
        from the image/video ``src`` (bytes or a path), planned from the index's columns."""
        from fcp_data.visual_layout import row_plan

        geom = dict(kind=kind, num_frames=int(self.index.num_frames[i]), fps=float(self.index.fps[i]))
        return self._vision_of(row_plan(self.spec, self.index, i), geom, src, decode, at_start)

    def _vision_of(self, plan, geom: dict, src, decode: bool = True, at_start: bool = False) -> tuple[list[int], dict]:
        """The visual block ids and vision inputs of one image/video under its ``plan`` (``decode`` False: zero
        pixels of the plan's shape, nothing read)."""
        from fcp_data.video import vision_inputs, zero_vision_inputs

        if decode:  # a video's frame count as indexed: another count means the file changed
            frames = geom["num_frames"] if geom["kind"] == KIND_VIDEO else None
            pixel_values, grid_thw = vision_inputs(self.spec, plan, src, frames)
        else:
            pixel_values, grid_thw = zero_vision_inputs(self.spec, plan)
        out = {"pixel_values": pixel_values, "grid_thw": grid_thw}
        if geom["kind"] == KIND_VIDEO and self.spec.family == "qwen-vl":
            from fcp_data.video import qwen_second_per_grid

            out["second_per_grid_ts"] = torch.tensor(
                [qwen_second_per_grid(len(plan.frame_indices), geom["num_frames"], geom["fps"],
                                      int(self.spec.vision["temporal_patch_size"]))], dtype=torch.float32)
        return segments_to_ids(self.spec, plan.segments, at_start), out

    def _media_chat_sample(self, i: int, kind: int, obj: dict, decode: bool = True) -> dict:
        """A chat line with images/videos (:mod:`fcp_data.chat_media`): the texts between them and their visual
        blocks; labels on the assistant turns. One media is planned from the index's columns, several are probed
        again (their total visual tokens must still be the index's)."""
        from fcp_data.chat_completion import media_line
        from fcp_data.chat_media import media_path, token_labels

        media, pieces, spans, completion = media_line(obj, self.chat_field, self.chat_template,
                                                      self.line_fields, self.prompt_field)
        src, root = self.index.sources[int(self.index.shard[i])]["path"], self.index.manifest.get("media_root")
        paths = [self._resolve(media_path(m, src, root)) for m in media]  # as indexed, relocated once
        if len(media) == 1:
            blocks, outs = zip(self._vision(i, kind, paths[0], decode))
        else:
            blocks, outs = zip(*self._probed_vision(i, media, paths, decode))
        ids, labels = token_labels(self.spec, pieces, spans, list(blocks), completion)
        out = {k: torch.cat([o[k] for o in outs if k in o]) for k in ("pixel_values", "grid_thw", "second_per_grid_ts")
               if any(k in o for o in outs)}
        out["input_ids"], out["labels"] = torch.tensor(ids, dtype=torch.long), torch.tensor(labels, dtype=torch.long)
        return out

    def placeholder_runs(self, i: int) -> list[tuple[int, int]]:
        """``(position, count)`` of each placeholder run in sample ``i``'s ``input_ids``, computed without decoding
        a pixel: a conversation's text pieces are tokenised, its media planned (one: from the index's columns;
        several: from their headers). Used by :class:`~fcp_data.visual_layout.IndexVisualLayout`."""
        from fcp_data.chat_completion import media_line
        from fcp_data.chat_media import media_path, piece_tokens
        from fcp_data.visual_layout import row_plan, segment_runs

        record = self._record(i, self.index.members(i))
        if record is None or not self.chat_field or int(self.index.kind[i]) == KIND_TEXT:
            raise ValueError(f"sample {i} is not a conversation with images/videos")
        media, pieces, _, _ = media_line(record, self.chat_field, self.chat_template,
                                         self.line_fields, self.prompt_field)
        if len(media) == 1:
            plans = [row_plan(self.spec, self.index, i)]
        else:
            src = self.index.sources[int(self.index.shard[i])]["path"]
            images = sum(m.kind == "image" for m in media)
            plans = [self._header_plan(m, self._resolve(media_path(m, src, self.index.manifest.get("media_root"))),
                                       images)[0] for m in media]
        pos, runs = 0, []
        for k, text in enumerate(pieces):
            pos += len(piece_tokens(self.spec, text, k)[0]) if text else 0
            if k < len(plans):
                block, length = segment_runs(self.spec, plans[k].segments, pos)
                runs += block
                pos += length
        return runs

    def _resolve(self, path: Path | bytes) -> Path | bytes:
        """A media's bytes, or its file after ``roots`` relocation (applied once, to the path as indexed)."""
        return path if isinstance(path, bytes) else Path(self._relocate(str(path)))

    def _header_plan(self, m, path, images: int = 1) -> tuple[object, dict]:
        """``(plan, geometry)`` of one media from its header (``path``: its bytes or its relocated file; ``images``:
        the images of its sample)."""
        from fcp_data.index.probe import probe_image, probe_video

        src = path
        if m.kind == "video":
            h = probe_video(src, self.index.manifest.get("probe") or "av")
            geom = dict(kind=KIND_VIDEO, height=h.height, width=h.width, num_frames=h.num_frames, fps=h.fps)
            return plan_visual(self.spec, "video", height=h.height, width=h.width, num_frames=h.num_frames,
                               fps=h.fps), geom
        ih, iw = probe_image(src)
        return plan_visual(self.spec, "image", height=ih, width=iw, images_in_sample=images), \
            dict(kind=KIND_IMAGE, height=ih, width=iw, num_frames=1, fps=0.0)

    def _probed_vision(self, i: int, media: list, paths: list, decode: bool = True) -> list[tuple[list[int], dict]]:
        images = sum(x.kind == "image" for x in media)
        plans = [self._header_plan(x, p, images) for x, p in zip(media, paths)]
        if sum(p.num_visual_tokens for p, _ in plans) != int(self.index.num_visual_tokens[i]):
            raise ValueError(f"sample {self.index.keys[i]!r}: its images/videos changed since indexing (visual tokens "
                             f"{sum(p.num_visual_tokens for p, _ in plans)} != {int(self.index.num_visual_tokens[i])})")
        return [self._vision_of(plan, geom, p, decode) for (plan, geom), p in zip(plans, paths)]

    def _sft_sample(self, obj: dict) -> dict:
        """An SFT jsonl line: prompt then response tokens (tokenised apart, as the index counted them), labels
        masking the prompt; or a conversation (:mod:`fcp_data.chat`), labels on the assistant turns."""
        if self.chat_field:
            from fcp_data.chat_completion import sft_ids_and_mask  # with a prompt field: TRL's prompt-completion
            from fcp_data.chat_media import check_text_ids

            ids, mask = sft_ids_and_mask(self.spec.tokenizer(), obj, self.chat_field, self.chat_template,
                                         *line_inputs(obj, *self.line_fields), self.prompt_field,
                                         bool(self.index.manifest.get("assistant_only_loss")))
            check_text_ids(self.spec, ids)  # a visual placeholder in text-only chat: no pixels back it
            return {"input_ids": torch.tensor(ids, dtype=torch.long),
                    "labels": torch.tensor([t if m else -100 for t, m in zip(ids, mask)], dtype=torch.long)}
        prompt = obj[self.prompt_field]
        p = self.spec.tokenizer().encode(prompt, add_special_tokens=False).ids if prompt else []
        r = self._text_ids(obj[self.text_field])
        return {"input_ids": torch.tensor(p + r, dtype=torch.long),
                "labels": torch.tensor([-100] * len(p) + r, dtype=torch.long)}

    def num_visual_tokens(self, sample: dict) -> int:
        """Placeholder tokens in a sample's ``input_ids``."""
        if not self.placeholder_ids:
            return 0
        return int(np.isin(sample["input_ids"].numpy(), self.placeholder_ids).sum())
