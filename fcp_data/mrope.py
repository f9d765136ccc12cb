"""Qwen-VL 3-D rope positions of one document, the rule the collator applies when ``mrope=True``.

Qwen-VL 3-D positions (the public Qwen2-VL ``get_rope_index`` rule, re-derived): text tokens get the same
value on all three axes, counting on from the previous token's maximum + 1 (0 at the document start).
Placeholder tokens are matched to the document's ``grid_thw`` rows in order; image ``(t, h, w)`` with
spatial merge ``m`` has ``t`` frame groups of ``(h/m)·(w/m)`` tokens (t-major, then rows, then columns).
A run of consecutive placeholders takes as many whole frame groups of the current image as it holds
(Qwen2-VL: one run per image/video; Qwen3-VL: one run per frame group, timestamps text in between), and
token ``(i, j, k)`` of a run gets ``(s + i, s + j, s + k)``, ``s`` being the value the next text token
would have had; the following token continues from the run's maximum + 1. (Qwen2.5-VL's scaling of the
temporal index by seconds per grid is not applied: ``i`` is the frame group's number within the run.)
Pads continue after the document's maximum. Positions are computed on the untruncated document and
then cut, so truncation never changes them. ``grid_thw`` is checked against the placeholder count
(``Σ t·h·w / m²``) when ``mrope=True``.

``FCPCollator(position_fn=...)`` replaces this rule (the collator's docstring says how).

Which transformers versions agree with the built-in rule. It advances the text after a vision block to the
block's maximum + 1, the original Qwen2-VL rule, which ``get_rope_index`` kept up to transformers 5.2.0 (all
4.x included). transformers 5.3.0 ("Unify 3D position ids", huggingface/transformers#43972; 5.2.0 vs 5.3.0
outputs compared in #45381) advances it by ``max(h, w) / m`` instead. With the new rule (5.24 installed and
tested) the built-in positions equal ``get_rope_index``'s exactly when, for every placeholder run,
``t ≤ max(h, w) / m``:

- Qwen2-VL: always for images (t = 1); for a video exactly when ``t ≤ max(h, w) / m``.
- Qwen2.5-VL: as Qwen2-VL, and a video with t ≥ 2 also needs an unscaled temporal index,
  ``⌊i · tokens_per_second · second_per_grid_t⌋ = i`` for every frame group i < t (e.g. the product is 1). At
  the usual 2 fps sampling with ``tokens_per_second = 2`` the product is 2, so real videos disagree.
- Qwen3-VL (one run per frame group, t = 1 each): always, old rule or new.

With the old rule (≤ 5.2.0) the same holds without the ``t ≤ max(h, w) / m`` condition. Some Qwen2.5-VL
releases between 5.3 and 5.5.3 also offset temporal positions wrongly (#45381 → #45400; images: #45325, fixed
in 5.5.4), so they agree even less. ``tests/exec/test_hf_positions.py`` checks these statements in both directions
against the installed version. For exact parity with a transformers model, pass
``position_fn=HFRopeIndex(config)``, or use ``hf_collator``. Batches whose positions this rule made carry
``mrope_rule = "fcp"``; ``fcp_exec.integrations.hf.batch_inputs`` warns once when a Qwen2-VL / Qwen2.5-VL model
gets them.
"""

from __future__ import annotations

import torch

__all__ = ["qwen_vl_mrope_positions"]


def qwen_vl_mrope_positions(input_ids: torch.Tensor, grid_thw: torch.Tensor | None, visual_ids: torch.Tensor,
                            spatial_merge_size: int) -> torch.Tensor:
    """``[3, len(input_ids)]`` Qwen-VL rope positions of one document (rule in the module docstring)."""
    n = int(input_ids.numel())
    out = torch.empty((3, n), dtype=torch.long)
    is_vis = torch.isin(input_ids, visual_ids).tolist()
    m = spatial_merge_size
    grids = [] if grid_thw is None else [tuple(int(v) for v in g) for g in grid_thw.reshape(-1, 3).tolist()]
    for i, (t, h, w) in enumerate(grids):
        if h % m or w % m:
            raise ValueError(f"image {i} grid {(t, h, w)} is not divisible by spatial_merge_size={m}")
    img, frames_done = 0, 0
    nxt, pos = 0, 0
    while pos < n:
        end = pos
        while end < n and is_vis[end] == is_vis[pos]:
            end += 1
        if not is_vis[pos]:  # a run of text continues the count on all three axes
            out[:, pos:end] = torch.arange(nxt, nxt + end - pos)
            nxt += end - pos
            pos = end
            continue
        while pos < end:  # a run of placeholders: whole frame groups of the current image, in order
            if img >= len(grids):
                raise ValueError(f"document has more visual placeholder tokens than its grid_thw covers "
                                 f"({len(grids)} image(s)) — the reader's input_ids and grid_thw disagree")
            t, h, w = grids[img]
            gh, gw = h // m, w // m
            k = min((end - pos) // (gh * gw), t - frames_done)
            if k == 0:
                raise ValueError(f"a run of {end - pos} placeholder tokens at position {pos} is not a whole number of "
                                 f"frame groups of image {img} (grid {(t, h, w)}: {gh * gw} tokens each) — the reader's "
                                 "input_ids and grid_thw disagree")
            count = k * gh * gw
            out[0, pos:pos + count] = torch.arange(k).repeat_interleave(gh * gw) + nxt
            out[1, pos:pos + count] = torch.arange(gh).repeat_interleave(gw).repeat(k) + nxt
            out[2, pos:pos + count] = torch.arange(gw).repeat(k * gh) + nxt
            nxt += max(k, gh, gw)
            pos += count
            frames_done += k
            if frames_done == t:
                img, frames_done = img + 1, 0
    if img != len(grids):
        raise ValueError(f"document has {len(grids)} image(s) in grid_thw but placeholder tokens for only {img} — the "
                         "reader's input_ids and grid_thw disagree")
    return out
