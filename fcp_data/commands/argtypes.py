"""The command-line contract every fcp parser shares (the ``fcp`` CLI and the training scripts through
:mod:`fcp_exec.script`): an :class:`ArgumentParser` whose every refusal is one line on stderr and exit 2, and value
types that refuse a bad number or an empty path at the command line, before any work starts. No torch."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from fcp_data.sampler_config import MAX_COUNT

__all__ = ["ArgumentParser", "positive_int", "count", "nonnegative_float", "positive_float", "nonempty",
           "output_dir", "check_output_dir", "both_or_neither", "one_line"]


def one_line(text: object) -> str:
    """A message's lines joined with "; " (an error is one line on stderr)."""
    return "; ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())


class ArgumentParser(argparse.ArgumentParser):
    """argparse with fcp's error contract: a bad option is one line on stderr and exit 2 (not usage + error)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see `{self.prog} --help`)\n")


def _integer(text: str, least: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < least or v > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be an integer in [{least}, {MAX_COUNT}], got {text}")
    return v


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (steps, batch sizes, token budgets)."""
    return _integer(text, 1)


def count(text: str) -> int:
    """argparse type: an integer >= 0 (0 usually means "off": every N steps, warm-up steps)."""
    return _integer(text, 0)


def _finite(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return v


def nonnegative_float(text: str) -> float:
    """argparse type: a finite number >= 0 (a learning rate, a clipping norm where 0 is "off")."""
    v = _finite(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return v


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    v = _finite(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def nonempty(text: str) -> str:
    """argparse type: a path or name that is not empty (an unset shell variable would otherwise mean the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty value")
    return text


def check_output_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """``path`` as a folder fcp can create or write into, else a ValueError naming why: a NUL byte, a file there
    already, or a nearest existing ancestor that is a file or not writable. Checked before a run starts, so a
    checkpoint folder that cannot be written is not found at the first save, hours in."""
    text = os.fspath(path)
    what = f"{what} " if what else ""
    if not text.strip() or "\x00" in text:
        raise ValueError(f"{what}{text!r}: not a path (empty, or a NUL byte)")
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{what}{p} exists and is not a folder")
    ancestor = p
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{what}{p} cannot be created: {ancestor} is not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{what}{p} cannot be created: {ancestor} is not writable")
    return p


def output_dir(text: str) -> str:
    """argparse type: a folder that can be created or written into (:func:`check_output_dir`)."""
    try:
        check_output_dir(text, "")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def both_or_neither(parser: argparse.ArgumentParser, args: argparse.Namespace, first: str, second: str) -> None:
    """``parser.error`` when exactly one of two options that only work together is given (``--checkpoint DIR``
    without ``--checkpoint-every N`` would save nothing)."""
    a, b = getattr(args, first), getattr(args, second)
    if bool(a) != bool(b):
        flag = "--" + (second if a else first).replace("_", "-")
        given = "--" + (first if a else second).replace("_", "-")
        parser.error(f"{given} needs {flag} too")


def hardware_or_cost(parser: argparse.ArgumentParser, args: argparse.Namespace, default: str = "h100") -> None:
    """``parser.error`` when ``--hardware`` is given beside ``--cost`` (the cost-model file would be used and the
    hardware dropped without a word); otherwise ``args.hardware`` defaults to ``default`` (declare the option with
    ``default=None`` so that a given one can be told apart)."""
    if args.cost and args.hardware is not None:
        parser.error(f"--hardware {args.hardware} has no effect with --cost {args.cost} (the cost-model file holds the "
                     "hardware's coefficients): give one of them")
    if args.hardware is None:
        args.hardware = default
