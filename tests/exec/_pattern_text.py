"""Twelve small text documents of fixed lengths and patterned token ids: a map-style dataset for one-process tests of
the step and the checkpoints (the same ids on every read, no tokenizer)."""

from __future__ import annotations

import torch

LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58]


class PatternText:
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": (torch.arange(LENGTHS[i]) * (i + 3)) % 40 + 2}
