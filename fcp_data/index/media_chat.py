"""Index side of chat lines with an image or a video (:mod:`fcp_data.chat_media`), and the probe → visual plan
step that folder/tar video and image samples share with them."""

from __future__ import annotations

from pathlib import Path

from fcp_data.index.format import KIND_IMAGE, KIND_VIDEO
from fcp_data.index.limits import Limits
from fcp_data.index.probe import ProbeError, probe_image, probe_video

__all__ = ["probe_plan", "index_media_chat"]


def _check_video(h, limits: Limits) -> None:
    if h.num_frames > limits.max_frames:
        raise ProbeError("too_many_frames", f"{h.num_frames} frames > --max-frames {limits.max_frames}")
    if h.num_frames / h.fps > limits.max_duration:
        raise ProbeError("video_too_long", f"{h.num_frames / h.fps:.1f} s > --max-duration {limits.max_duration:g}")
    if h.width * h.height > limits.max_image_pixels:
        raise ProbeError("frame_too_large", f"{h.width}x{h.height} = {h.width * h.height} pixels > "
                                            f"--max-image-pixels {limits.max_image_pixels}")


def probe_plan(kind: str, src, spec, probe: str, limits: Limits):
    """``(visual plan, index columns)`` of one video or image (bytes, path or member file) under ``spec``; a
    :class:`ProbeError` says why it cannot be a sample."""
    from fcp_data.specs import plan_visual

    if kind == "video":
        h = probe_video(src, probe, max_frames=limits.max_frames)
        _check_video(h, limits)
        try:
            plan = plan_visual(spec, "video", height=h.height, width=h.width, num_frames=h.num_frames, fps=h.fps)
        except ValueError as e:
            raise ProbeError("unsupported_video", str(e)) from None
        return plan, dict(kind=KIND_VIDEO, num_frames=h.num_frames, fps=h.fps, height=h.height, width=h.width)
    ih, iw = probe_image(src, limits.max_image_pixels)
    try:
        plan = plan_visual(spec, "image", height=ih, width=iw)
    except ValueError as e:
        raise ProbeError("unsupported_image", str(e)) from None
    return plan, dict(kind=KIND_IMAGE, num_frames=1, height=ih, width=iw)


def index_media_chat(key: str, start: int, size: int, obj: dict, cfg: dict, task: dict, spec, rows,
                     ext: str = "jsonl") -> None:
    """One chat line naming an image or a video: probe the file, count the rendered text around the visual block
    and the block itself, add the row (its member is the jsonl line; the file is found again from the line)."""
    from fcp_data.chat import ChatFormatError
    from fcp_data.chat_media import find_media, media_path, split_render
    from fcp_data.specs import count_segments

    if not spec.is_multimodal:
        raise ProbeError("bad_messages", f"the line has an image or video; index it with a multimodal --spec "
                                         f"(this one, {spec.name!r}, is text only)")
    try:
        media, messages = find_media(obj, cfg["chat_field"])
        path = media_path(media, task["path"], cfg.get("media_root"))
        before, after, _, _ = split_render(messages, cfg.get("chat_template") or "chatml")
    except ChatFormatError as e:
        raise ProbeError(e.reason, str(e)) from None
    if not isinstance(path, bytes) and not Path(path).is_file():
        raise ProbeError("missing_media", f"no {media.kind} file {str(path)!r}")
    plan, vals = probe_plan(media.kind, path, spec, cfg["probe"], Limits.from_dict(cfg.get("limits")))
    tok = spec.tokenizer()
    n_text = sum(len(tok.encode(t, add_special_tokens=False).ids) for t in (before, after) if t)
    rows.add(key, [(ext, start, size)], num_tokens=n_text + count_segments(spec, plan.segments), eta=spec.eta,
             shard=task["source"], offset=start, size=size, num_visual_tokens=plan.num_visual_tokens, **vals)
