"""What a process forked by a forkserver finds already imported (tests/exec/test_forkserver.py). Kept free of
imports beyond the standard library, so unpickling it in a child loads nothing the probe would then see."""

import os
import sys


def seen(names) -> tuple[dict[str, bool], int]:
    """Which of ``names`` are imported in this process, and its parent's pid (a forked child's: its server's)."""
    return {n: n in sys.modules for n in names}, os.getppid()


def probe(results, names) -> None:
    results.put(seen(names))


def wait(release) -> None:
    """Stay alive until something is put on ``release``."""
    release.get()
