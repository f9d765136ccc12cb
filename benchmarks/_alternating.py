"""Side-by-side timing of two settings of one run: pairs of runs, the order flipped every pair (so a host that
speeds up or slows down during the benchmark weighs on both alike)."""

from __future__ import annotations

import statistics
from typing import Callable


def alternating_pairs(run_once: Callable[[bool], list[float]], pairs: int, label: Callable[[bool], str]) -> dict:
    """``{False: [...], True: [...]}``: per run, the total of its step times after the first (step 0 warms up).
    ``run_once(setting)`` returns one run's step times (s); each run prints one line, named by ``label(setting)``."""
    totals: dict[bool, list[float]] = {False: [], True: []}
    for i in range(pairs):
        for setting in ((False, True) if i % 2 == 0 else (True, False)):
            times = run_once(setting)
            totals[setting].append(sum(times[1:]))
            print(f"  pair {i + 1} {label(setting)}: steps 1..{len(times) - 1} total {totals[setting][-1]:.2f} s, "
                  f"median step {statistics.median(times[1:]) * 1e3:.0f} ms", flush=True)
    return totals
