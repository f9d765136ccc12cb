"""Suite-wide scheduling: run the test files that take longest first.

``make test`` runs ``pytest -n auto --dist loadfile --no-loadscope-reorder``: each file goes whole to one xdist
worker (its module fixtures, e.g. a process pool or a cached multi-process launch, are paid once), and a worker
takes the next file from the front of the collection order when it runs dry. Ordering the files longest first
is the LPT rule for two machines: the long multi-process files start at once and the short files fill the gaps,
instead of one long file starting last while the other worker idles.

The per-file seconds come from ``tests/durations.json`` (measured; a file missing from it counts as the median).
``FCP_RECORD_DURATIONS=PATH pytest ...`` writes the measured per-file seconds of a run to ``PATH`` (on the xdist
controller, summing setup, call and teardown of every test), which is how that file is refreshed.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

# Workers forked by fcp's launcher unpickle functions defined in test modules, which import pytest: the forkserver
# imports it once instead (fcp_exec/forkserver.py).
os.environ.setdefault("FCP_FORKSERVER_PRELOAD", "pytest")

_DURATIONS = Path(__file__).with_name("durations.json")
_measured: dict[str, float] = defaultdict(float)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def _weights() -> dict[str, float]:
    try:
        data = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def pytest_collection_modifyitems(session, config, items) -> None:
    """Stable sort of the collected items by their file's recorded seconds, longest first (tests inside a file
    keep their order)."""
    weights = _weights()
    if not weights:
        return
    default = statistics.median(weights.values())
    position = {}
    for i, item in enumerate(items):
        position.setdefault(_file_of(item.nodeid), i)
    items.sort(key=lambda it: (-weights.get(_file_of(it.nodeid), default), position[_file_of(it.nodeid)]))


def pytest_runtest_logreport(report) -> None:
    if os.environ.get("FCP_RECORD_DURATIONS"):
        _measured[_file_of(report.nodeid)] += float(report.duration)


def pytest_sessionfinish(session, exitstatus) -> None:
    path = os.environ.get("FCP_RECORD_DURATIONS")
    if not path or not _measured or hasattr(session.config, "workerinput"):  # only the controller writes
        return
    Path(path).write_text(json.dumps({k: round(v, 2) for k, v in sorted(_measured.items(), key=lambda kv: -kv[1])},
                                     indent=1) + "\n")
