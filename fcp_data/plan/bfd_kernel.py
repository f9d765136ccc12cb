"""Best-fit decreasing (:func:`fcp_data.plan.bfd.bfd_groups`) as one kernel, compiled by numba when it is installed
(:mod:`fcp_data.jit`).

The same bins: sequences in the caller's order (longest first), one at a time (the numpy path's runs of equal
lengths are a shortcut to exactly these choices); the open bins' headroom kept ascending, a new headroom inserted
before equal ones (``bisect_left``), the chosen bin the first whose headroom holds the sequence; the same float
operations for capacities and headroom. ``tests/plan/test_bfd_kernel.py`` holds the two paths to the same bins.
"""

from __future__ import annotations

import numpy as np

__all__ = ["bfd_loop", "SIGNATURE"]

# lengths (float64, in visiting order), unit, bin (out, per position) -> number of bins
SIGNATURE = "int64(float64[:], float64, int64[:])"


def bfd_loop(values, unit, bin_of):
    """``bin_of[p]``: the bin of the ``p``-th sequence visited; returns the number of bins opened."""
    n = values.size
    rooms = np.empty(n, dtype=np.float64)  # headroom of the bins that have some, ascending
    ids = np.empty(n, dtype=np.int64)      # their bin ids, parallel to rooms
    size = 0
    bins = 0
    for p in range(n):
        s = values[p]
        pos = size if s > unit else np.searchsorted(rooms[:size], s, side="left")  # bisect_left
        if s > unit:
            room, b = np.ceil(s / unit) * unit - s, bins
            bins += 1
        elif pos < size:
            room, b = rooms[pos] - s, ids[pos]
            for i in range(pos, size - 1):  # close the gap (in place: no temporary per sequence)
                rooms[i] = rooms[i + 1]
                ids[i] = ids[i + 1]
            size -= 1
        else:
            room, b = unit - s, bins
            bins += 1
        bin_of[p] = b
        if room > 0:
            lo = np.searchsorted(rooms[:size], room, side="left")  # bisect_left: before the equal ones
            for i in range(size, lo, -1):  # open a slot at lo
                rooms[i] = rooms[i - 1]
                ids[i] = ids[i - 1]
            rooms[lo], ids[lo] = room, b
            size += 1
    return bins
