"""The shape of a token spec JSON: :func:`fcp_data.specs.load_spec` checks every spec with :func:`check_spec`.

A spec's values go straight into the token formulas of :mod:`fcp_data.specs`, so a wrong one does not fail where
it is written: ``"text": [1]`` crashed the loader with a TypeError, ``patch_size: 0`` failed every sample of a run
(ZeroDivisionError), and ``merge_size: -1`` or a misspelt key gave other counts without a word. So the whole spec
is checked when it loads — each section and key its family reads (the bundled ``tokenizers/*.json`` are the
reference), their types and ranges, no unknown keys — and every problem is named, with its key, in the one
ValueError (one line from ``fcp``, exit 2). Keys named ``description`` or ``reference`` and keys ending in
``_note`` are comments (strings), anywhere. The checks live beside ``fcp index``, which loads a spec first.
"""

from __future__ import annotations

import math

__all__ = ["check_spec", "FAMILIES"]

FAMILIES = ("qwen-vl", "internvl", "llava-video", "text")

# A value's kind: ("int", lo) a whole number >= lo; ("num", lo, hi, lo_open) a finite number in its range; ("bool",);
# ("str",) a non-empty string; ("enum", choices[, what they mean]); ("rgb", lo_open) three numbers; ("pinpoints",)
# LLaVA's [height, width] pairs. A dict is a section: key -> (kind, required).
INT1 = ("int", 1)
POS = ("num", 0, math.inf, True)
BOOL, STR = ("bool",), ("str",)
MEAN, STD = ("rgb", False), ("rgb", True)

ETA = ("enum", (0, 1), "0 (causal) or 1 (full attention)")
TOP = {"name": (STR, False), "family": (("enum", FAMILIES), True), "eta": (ETA, False),
       "text": ({"tokenizer": (STR, False), "append_eos": (BOOL, False), "eos_token": (STR, False),
                 "pad_token": (STR, False)}, False)}

VISION = {
    "qwen-vl": {
        "patch_size": (INT1, True), "merge_size": (INT1, True), "temporal_patch_size": (INT1, True),
        "image": ({"min_pixels": (POS, True), "max_pixels": (POS, True),
                   "max_ratio": (("num", 1, math.inf, False), False),
                   "resize": (("enum", ("transformers", "qwen-vl-utils")), False)}, True),
        "video": ({"fps": (POS, True), "frame_factor": (INT1, False), "min_frames": (INT1, True),
                   "max_frames": (INT1, True), "min_pixels": (POS, True), "max_pixels": (POS, True),
                   "total_pixels": (POS, True)}, True),
        "timestamps": (BOOL, False), "video_outer_markers": (BOOL, False), "mrope": (STR, False),
        "image_mean": (MEAN, True), "image_std": (STD, True),
        "tokens": ({k: (STR, True) for k in ("vision_start", "vision_end", "image_pad", "video_pad")}, True)},
    "internvl": {
        "tile_size": (INT1, True), "patch_size": (INT1, True), "tokens_per_tile": (INT1, True),
        "downsample_ratio": (("num", 0, 1, True), False),
        "image": ({"min_tiles": (INT1, True), "max_tiles": (INT1, True), "use_thumbnail": (BOOL, False)}, True),
        "video": ({"num_frames": (INT1, True),
                   "tiles_per_frame": (("enum", (1,), "1 (one tile per frame: the only layout modelled)"), False)}, True),
        "image_mean": (MEAN, True), "image_std": (STD, True),
        "tokens": ({k: (STR, True) for k in ("img_start", "img_end", "img_context")}, True)},
    "llava-video": {
        "image_size": (INT1, True), "tokens_per_frame": (INT1, True), "patch_size": (INT1, False),
        "image": ({"tokens_per_image": (INT1, False),
                   "anyres": ({"grid_pinpoints": (("pinpoints",), True), "max_patches": (INT1, True)}, False)}, True),
        "video": ({"fps": (POS, True), "max_frames": (INT1, True), "force_sample": (BOOL, False),
                   "newline": (BOOL, False)}, True),
        "image_mean": (MEAN, True), "image_std": (STD, True),
        "tokens": ({"image": (STR, True), "video": (STR, False)}, True)},
}


def _show(value) -> str:
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _kind_problem(kind: tuple, v) -> str | None:
    """What is wrong with ``v`` as a value of ``kind`` (None: nothing)."""
    name = kind[0]
    if name == "int":
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= kind[1]):
            return f"must be a whole number >= {kind[1]}"
    elif name == "num":
        lo, hi, lo_open = kind[1], kind[2], kind[3]
        if not (_is_num(v) and (v > lo if lo_open else v >= lo) and v <= hi):
            upper = f" and <= {hi:g}" if math.isfinite(hi) else ""
            return f"must be a number {'>' if lo_open else '>='} {lo:g}{upper}"
    elif name == "bool":
        if not isinstance(v, bool):
            return "must be true or false"
    elif name == "str":
        if not (isinstance(v, str) and v):
            return "must be a non-empty string"
    elif name == "enum":
        if isinstance(v, bool) or v not in kind[1]:
            return f"must be {kind[2]}" if len(kind) > 2 else f"must be one of {', '.join(map(str, kind[1]))}"
    elif name == "rgb":
        if not (isinstance(v, list) and len(v) == 3 and all(_is_num(x) and (x > 0 if kind[1] else x >= 0) for x in v)):
            return f"must be a list of 3 numbers (R, G, B) {'> 0' if kind[1] else '>= 0'}"
    elif name == "pinpoints":
        def pair(x) -> bool:
            return isinstance(x, list) and len(x) == 2 and all(_kind_problem(INT1, n) is None for n in x)

        if not (isinstance(v, list) and v and all(pair(x) for x in v)):
            return "must be a non-empty list of [height, width] pairs of whole numbers >= 1"
    return None


def _is_comment(key: str) -> bool:
    return key in ("description", "reference") or key.endswith("_note")


def _section(d, schema: dict, path: str, problems: list[str]) -> None:
    """Check the object ``d`` (at ``path``) against ``schema``, nested sections too; append each problem."""
    if not isinstance(d, dict):
        problems.append(f"{path or 'the spec'} must be a JSON object, got {_show(d)}")
        return
    at = lambda k: f"{path}.{k}" if path else k  # noqa: E731
    for k, v in d.items():
        if _is_comment(k):
            if not isinstance(v, str):
                problems.append(f"{at(k)} is a comment and must be a string, got {_show(v)}")
        elif k not in schema:
            known = ", ".join(sorted(schema)) or "none"
            problems.append(f"unknown key {at(k)} (known keys here: {known}; comments: description, reference, *_note)")
    for k, (kind, required) in schema.items():
        if k not in d:
            if required:
                problems.append(f"{at(k)} is missing")
        elif isinstance(kind, dict):
            _section(d[k], kind, at(k), problems)
        else:
            why = _kind_problem(kind, d[k])
            if why:
                problems.append(f"{at(k)} {why}, got {_show(d[k])}")


def _ranges(raw: dict, problems: list[str]) -> None:
    """The checks that relate two values (run on a spec whose values have the right types)."""
    text, v, fam = raw.get("text") or {}, raw.get("vision") or {}, raw["family"]
    if text.get("append_eos") and "eos_token" not in text:
        problems.append("text.eos_token is missing (text.append_eos is true)")
    if "eos_token" not in text and "pad_token" not in text:
        problems.append("text needs eos_token or pad_token (the reader pads with pad_token, else eos_token)")

    def at_most(lo: str, hi: str, a, b) -> None:
        if a > b:
            problems.append(f"vision.{lo} must be <= vision.{hi}, got {a:g} > {b:g}")

    if fam == "qwen-vl":
        im, vv, factor = v["image"], v["video"], v["patch_size"] * v["merge_size"]
        at_most("image.min_pixels", "image.max_pixels", im["min_pixels"], im["max_pixels"])
        at_most("video.min_pixels", "video.max_pixels", vv["min_pixels"], vv["max_pixels"])
        at_most("video.min_frames", "video.max_frames", vv["min_frames"], vv["max_frames"])
        at_most("video.frame_factor", "video.max_frames", vv.get("frame_factor", 2), vv["max_frames"])
        for key, px in (("image.max_pixels", im["max_pixels"]), ("video.max_pixels", vv["max_pixels"])):
            if px < factor * factor:
                problems.append(f"vision.{key} must be >= (patch_size * merge_size)^2 = {factor * factor} (one merged "
                                f"patch), got {px:g}")
    elif fam == "internvl":
        at_most("image.min_tiles", "image.max_tiles", v["image"]["min_tiles"], v["image"]["max_tiles"])
        at_most("patch_size", "tile_size", v["patch_size"], v["tile_size"])
    elif fam == "llava-video":
        im = v["image"]
        if ("anyres" in im) == ("tokens_per_image" in im):
            problems.append("vision.image needs one of tokens_per_image (a fixed count) or anyres (LLaVA-OneVision)")
        if "anyres" in im and "patch_size" not in v:
            problems.append("vision.patch_size is missing (vision.image.anyres counts patches)")
        if "patch_size" in v:
            at_most("patch_size", "image_size", v["patch_size"], v["image_size"])


def check_spec(raw: dict, where) -> None:
    """ValueError naming ``where`` (the spec file) and every key of ``raw`` that is missing, unknown, of the wrong
    type or out of range; nothing when the spec is sound."""
    problems: list[str] = []
    fam, body = raw.get("family"), dict(raw)
    known = isinstance(fam, str) and fam in FAMILIES
    if known and fam != "text":
        top = dict(TOP, vision=(VISION[fam], True))
    else:  # a text spec reads no vision section; an unknown family's cannot be checked (the family is the error)
        top, vision = TOP, body.pop("vision", None)
        if fam == "text" and vision not in (None, {}):
            problems.append("vision: a text spec has no vision section (use family qwen-vl, internvl or llava-video)")
    _section(body, top, "", problems)
    if not problems:  # the relations only mean something between values of the right types
        _ranges(raw, problems)
    if problems:
        raise ValueError(f"spec {where}: " + "; ".join(problems))
