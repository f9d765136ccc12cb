"""The command line every benchmark script shares: fcp's parser and value types (a bad option is one line on stderr and
exit 2, before any work starts), the types only benchmarks need (a file or folder that must exist, an interpreter,
comma-separated lists, preset names), a help formatter that states every option's default, and :func:`run`, which
makes an error about the user's input found later (a ValueError / OSError) one line and exit 2 too.

Cheap to import (no torch): ``tests/e2e/test_bench_args.py`` imports every script's ``build_parser`` in one process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: fcp_data of this checkout
    sys.path.insert(0, str(REPO))

from fcp_data.commands.argtypes import (ArgumentParser, check_output_dir, count, nonempty,  # noqa: E402
                                        nonnegative_float, one_line, output_dir, positive_float, positive_int)
from fcp_data.sampler_config import MAX_COUNT  # noqa: E402

__all__ = ["ArgumentParser", "HelpFormatter", "parser", "run", "positive_int", "count", "nonnegative_float",
           "positive_float", "nonempty", "output_dir", "output_file", "existing_file", "existing_dir", "interpreter",
           "positive_int_list", "count_list", "int_pairs", "fraction_list", "positive_float_list", "names",
           "model_preset", "hardware_preset", "WIKIPEDIA"]

WIKIPEDIA = REPO.parent / "shared" / "workloads" / "wikipedia_flexsp.txt"  # FlexSP's lengths, next to the repo


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstring's layout kept; every option's help ends with its default unless its text already names it (a
    flag's default is off, and ``default=None`` is described in the help itself)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
            return text
        shown = action.default
        if isinstance(shown, (list, tuple)):
            shown = " ".join(str(x) for x in shown)
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def parser(description: str | None, **kwargs) -> ArgumentParser:
    """fcp's :class:`ArgumentParser` (one line on stderr and exit 2 for a bad option) with :class:`HelpFormatter`."""
    return ArgumentParser(description=description, formatter_class=HelpFormatter, **kwargs)


def run(main: Callable[[], int | None], prog: str | None = None, bug_status: int | None = None) -> None:
    """Run a script's ``main`` and exit with its status, with fcp's error contract: a ValueError / OSError is
    ``prog: error: ...`` on one line and exit 2 (where torch is loaded, through ``fcp_exec.script.run_main``, which
    also knows fcp_exec's own user errors — a diverged loss, a missing dependency — and settles a gloo group),
    Ctrl-C exit 130; anything else is a bug and keeps its traceback (exit 1, or ``bug_status`` for a script whose exit 1
    means "a check failed"). Without torch loaded nothing imports it."""
    prog = prog or os.path.basename(sys.argv[0])
    try:
        status = main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - sorted below; a bug is re-raised with its traceback
        _exit_for(e, prog, bug_status)
    sys.exit(status or 0)


def _exit_for(e: Exception, prog: str, bug_status: int | None) -> None:
    if "torch" in sys.modules:
        try:
            from fcp_exec.script import run_main
        except ImportError:  # pragma: no cover - a broken install: the plain contract below
            run_main = None
        if run_main is not None:
            def again():
                raise e

            try:
                run_main(again, prog)  # a user error: one line and SystemExit(2), which passes through
            except Exception:  # noqa: BLE001 - run_main re-raised it: a bug, handled below
                pass
    if isinstance(e, (ValueError, OSError)):
        if os.environ.get("FCP_DEBUG", "") not in ("", "0"):
            import traceback

            traceback.print_exception(e)
        print(f"{prog}: error: {one_line(e)}", file=sys.stderr, flush=True)
        sys.exit(2)
    if bug_status is None:
        raise e
    import traceback

    traceback.print_exception(e)
    sys.exit(bug_status)


# ---------------------------------------------------------------------------------------------------- value types
def _path_text(text: str) -> str:
    if not text.strip() or "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a path (empty, or a NUL byte)")
    return text


def existing_file(text: str) -> str:
    """argparse type: a file that exists (a workload, a cost model, a config), checked before any work starts."""
    p = Path(_path_text(text))
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not p.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return text


def existing_dir(text: str) -> Path:
    """argparse type: a folder that exists (a workload folder), as a Path."""
    p = Path(_path_text(text))
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return p


def output_file(text: str) -> Path:
    """argparse type: a file that can be written (not a folder; its folder exists or can be created), as a Path."""
    p = Path(_path_text(text))
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    try:
        check_output_dir(p.parent if str(p.parent) else ".", "its folder")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return p


def interpreter(text: str) -> str:
    """argparse type: a program to run: a path to an executable file, or a name found on ``PATH``."""
    _path_text(text)
    if os.sep in text or (os.altsep and os.altsep in text):
        if not os.path.isfile(text):
            raise argparse.ArgumentTypeError(f"{text}: no such file")
        if not os.access(text, os.X_OK):
            raise argparse.ArgumentTypeError(f"{text} is not executable")
        return text
    found = shutil.which(text)
    if found is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a program on PATH (give its path)")
    return found


def _list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",")]
    if not text.strip() or any(not x for x in items):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _int_list(text: str, least: int) -> list[int]:
    out = []
    for x in _list(text):
        try:
            v = int(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
        if not least <= v <= MAX_COUNT:
            raise argparse.ArgumentTypeError(f"every value must be an integer in [{least}, {MAX_COUNT}], got {x}")
        out.append(v)
    return out


def positive_int_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 1 (sizes, window lengths, frame counts)."""
    return _int_list(text, 1)


def count_list(text: str) -> list[int]:
    """argparse type: comma-separated integers >= 0 (look-ahead depths)."""
    return _int_list(text, 0)


def int_pairs(text: str) -> list[tuple[int, int]]:
    """argparse type: comma-separated pairs ``AxB`` of integers >= 1 (``512x64,2048x256``: sequences x ranks)."""
    out = []
    for x in _list(text):
        a, sep, b = x.lower().partition("x")
        try:
            pair = (int(a), int(b)) if sep else None
        except ValueError:
            pair = None
        if pair is None or not all(1 <= v <= MAX_COUNT for v in pair):
            raise argparse.ArgumentTypeError(f"expected comma-separated AxB pairs of integers >= 1, got {x!r}")
        out.append(pair)
    return out


def _float_list(text: str, ok: Callable[[float], bool], what: str) -> list[float]:
    out = []
    for x in _list(text):
        try:
            v = float(x)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
        if not ok(v):
            raise argparse.ArgumentTypeError(f"every value must be {what}, got {x}")
        out.append(v)
    return out


def fraction_list(text: str) -> list[float]:
    """argparse type: comma-separated numbers in [0, 1) (noise levels)."""
    return _float_list(text, lambda v: 0 <= v < 1, "in [0, 1)")


def positive_float_list(text: str) -> list[float]:
    """argparse type: comma-separated finite numbers > 0 (tolerances)."""
    return _float_list(text, lambda v: 0 < v < float("inf"), "a finite number > 0")


def names(valid: Iterable[str], what: str = "name") -> Callable[[str], list[str]]:
    """argparse type: comma-separated names, each one of ``valid`` (sections, areas, models); the list, in order."""
    valid = tuple(valid)

    def parse(text: str) -> list[str]:
        items = _list(text)
        unknown = [x for x in items if x not in valid]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, unknown))}; "
                                             f"valid: {', '.join(valid)}")
        return items

    parse.__name__ = "name_list"
    return parse


def model_preset(text: str) -> str:
    """argparse type: a model preset of ``fcp presets`` (any case) or ``hf:PATH`` (a config that must load)."""
    from fcp_data.presets import resolve_model

    try:
        resolve_model(_path_text(text))
    except (ValueError, OSError) as e:
        raise argparse.ArgumentTypeError(one_line(e)) from None
    return text


def hardware_preset(text: str) -> str:
    """argparse type: a hardware preset of ``fcp presets`` (any case)."""
    from fcp_data.presets import HARDWARE

    if text.lower() not in {k.lower() for k in HARDWARE}:
        raise argparse.ArgumentTypeError(f"unknown hardware preset {text!r}; valid: {', '.join(HARDWARE)}")
    return text
