"""Index side of chat lines with images and videos (:mod:`fcp_data.chat_media`), and the probe → visual plan
step that folder/tar video and image samples share with them."""

from __future__ import annotations

from pathlib import Path

from fcp_data.index.format import KIND_IMAGE, KIND_VIDEO
from fcp_data.index.limits import Limits
from fcp_data.index.probe import ProbeError, check_image_data, check_video_frames, probe_image, probe_video

__all__ = ["probe_plan", "index_media_chat"]


def _check_video(h, limits: Limits) -> None:
    if h.num_frames > limits.max_frames:
        raise ProbeError("too_many_frames", f"{h.num_frames} frames > --max-frames {limits.max_frames}")
    if h.num_frames / h.fps > limits.max_duration:
        raise ProbeError("video_too_long", f"{h.num_frames / h.fps:.1f} s > --max-duration {limits.max_duration:g}")
    if h.width * h.height > limits.max_image_pixels:
        raise ProbeError("frame_too_large", f"{h.width}x{h.height} = {h.width * h.height} pixels > "
                                            f"--max-image-pixels {limits.max_image_pixels}")


def probe_plan(kind: str, src, spec, probe: str, limits: Limits, images_in_sample: int = 1):
    """``(visual plan, index columns)`` of one video or image (bytes, path or member file) under ``spec``
    (``images_in_sample``: the images of its sample); a :class:`ProbeError` says why it cannot be a sample."""
    from fcp_data.specs import plan_visual

    if kind == "video":
        h = probe_video(src, probe, max_frames=limits.max_frames)
        _check_video(h, limits)
        try:
            plan = plan_visual(spec, "video", height=h.height, width=h.width, num_frames=h.num_frames, fps=h.fps)
        except ValueError as e:
            raise ProbeError("unsupported_video", str(e)) from None
        if probe == "decode":
            check_video_frames(src, plan.frame_indices, h.num_frames)
        return plan, dict(kind=KIND_VIDEO, num_frames=h.num_frames, fps=h.fps, height=h.height, width=h.width)
    ih, iw = probe_image(src, limits.max_image_pixels)
    try:
        plan = plan_visual(spec, "image", height=ih, width=iw, images_in_sample=images_in_sample)
    except ValueError as e:
        raise ProbeError("unsupported_image", str(e)) from None
    check_image_data(src)  # the reader decodes it at every epoch: a damaged file is an error now, not then
    return plan, dict(kind=KIND_IMAGE, num_frames=1, height=ih, width=iw)


def media_plans(media: list, jsonl_path, cfg: dict, spec) -> list[tuple[object, dict]]:
    """``(visual plan, columns)`` of each image/video of a conversation, probed from its file or bytes."""
    from fcp_data.chat_media import media_path

    from fcp_data.index.probe import IMAGE_EXTS

    limits, out = Limits.from_dict(cfg.get("limits")), []
    images = sum(m.kind == "image" for m in media)
    for m in media:
        if m.kind == "video" and Path(m.path).suffix.lower().lstrip(".") in IMAGE_EXTS:
            raise ProbeError("corrupt_video", f"{m.path!r} is an image file: give it as an image")
        path = media_path(m, jsonl_path, cfg.get("media_root"))
        if not isinstance(path, bytes) and not Path(path).is_file():
            raise ProbeError("missing_media", f"no {m.kind} file {str(path)!r}")
        out.append(probe_plan(m.kind, path, spec, cfg["probe"], limits, images))
    return out


def index_media_chat(key: str, start: int, size: int, obj: dict, cfg: dict, task: dict, spec, rows,
                     ext: str = "jsonl") -> None:
    """One chat line naming images or videos: probe each, count the rendered text around their visual blocks and
    the blocks, add the row (its member is the record; the files are found again from it). The index's kind and
    geometry columns are the first media's (video if the line has one); ``num_visual_tokens`` is the total. A
    prompt-completion line: its prompt's media, the completion's text apart (:func:`fcp_data.chat_completion.media_line`)."""
    from fcp_data.chat import ChatFormatError
    from fcp_data.chat_completion import media_line
    from fcp_data.chat_media import check_text_ids, piece_tokens
    from fcp_data.specs import count_segments

    if not spec.is_multimodal:
        raise ProbeError("bad_messages", f"the line has an image or video; index it with a multimodal --spec "
                                         f"(this one, {spec.name!r}, is text only)")
    try:
        if cfg.get("prompt_field") and cfg.get("assistant_only_loss"):  # TRL's vision collator raises on it
            raise ChatFormatError("unsupported_media", "images/videos in a prompt-completion line with "
                                                       "--assistant-only-loss (TRL's vision collator refuses that)")
        media, pieces, spans, completion = media_line(
            obj, cfg["chat_field"], cfg.get("chat_template") or "chatml",
            (cfg.get("tools_field"), cfg.get("template_kwargs_field")), cfg.get("prompt_field"))
        plans = media_plans(media, task["path"], cfg, spec)
        if cfg.get("assistant_only_loss") and not any(b > a for s in spans for a, b in s):  # TRL stops on it
            raise ChatFormatError("no_trained_tokens", "no assistant text to train (--assistant-only-loss: the "
                                                       "template's {% generation %} blocks hold none)")
        texts = [piece_tokens(spec, t, k)[0] for k, t in enumerate(pieces) if t]
        texts += [piece_tokens(spec, completion, 0)[0]] if completion else []
        for ids in texts:
            check_text_ids(spec, ids)  # a placeholder in the text: one more visual position than the pixels give
    except ChatFormatError as e:
        raise ProbeError(e.reason, str(e)) from None
    n_text = sum(len(ids) for ids in texts)
    n_blocks = sum(count_segments(spec, plan.segments) for plan, _ in plans)
    first = next((v for _, v in plans if v["kind"] == KIND_VIDEO), plans[0][1])
    rows.add(key, [(ext, start, size)], num_tokens=n_text + n_blocks, eta=spec.eta, shard=task["source"],
             offset=start, size=size, num_visual_tokens=sum(p.num_visual_tokens for p, _ in plans), **first)
