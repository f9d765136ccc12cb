"""Preloaded by the forkserver ``fcp train`` starts (:func:`fcp_exec.forkserver.start`), imported by nothing else: a
process the server forks whose start-up failed because its launcher went away meanwhile exits without a traceback.

A forked process first reads what to run from its launcher (``multiprocessing.spawn._main``). A Ctrl-C while the
ranks start ends the launcher in the middle: the process finds the launcher's semaphores already removed
(FileNotFoundError) or its pipe closed (EOFError) and multiprocessing printed that traceback under
``fcp train: interrupted``. Such a failure — an OSError or EOFError before the process's own code ran — is left
silent; a launcher still there sees the process end without reporting (:class:`fcp_exec.launch.WorkerFailure`).
Everything else keeps its traceback, and ``FCP_DEBUG=1`` shows these too.
"""

from __future__ import annotations

import os
import sys

_default = sys.excepthook


def _abandoned_start(kind, tb) -> bool:
    """Whether the exception is an OSError / EOFError raised while the process was still being set up."""
    if not issubclass(kind, (OSError, EOFError)):
        return False
    names = set()
    while tb is not None:
        code = tb.tb_frame.f_code
        names.add((os.path.basename(code.co_filename), code.co_name))
        tb = tb.tb_next
    return ("spawn.py", "_main") in names and ("process.py", "_bootstrap") not in names


def _hook(kind, value, tb) -> None:
    if _abandoned_start(kind, tb) and os.environ.get("FCP_DEBUG", "") in ("", "0"):
        return
    _default(kind, value, tb)


sys.excepthook = _hook
