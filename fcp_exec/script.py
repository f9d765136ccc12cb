"""What a training script built on fcp needs around its own code (the examples use it, a user's trainer may too):
the CLI's argument parser and value types (:mod:`fcp_data.commands.argtypes`: a bad option is one line on stderr
and exit 2, before any process group, model or loader exists) and :func:`run_main`, which makes fcp's errors about
the user's input (a missing index, a bad cost file, a diverged loss, a dataset too damaged to train on) one line and
exit 2 instead of a traceback. ``FCP_DEBUG=1`` keeps the traceback."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from fcp_data.commands.argtypes import (ArgumentParser, both_or_neither, check_output_dir, count, hardware_or_cost,
                                        nonempty, nonnegative_float, one_line, output_dir, positive_float,
                                        positive_int)
from fcp_data.read_errors import SampleReadError
from fcp_exec.compat import MissingDependency
from fcp_exec.devices import settle_collectives
from fcp_exec.optim import TrainingDiverged

__all__ = ["ArgumentParser", "positive_int", "count", "nonnegative_float", "positive_float", "nonempty",
           "output_dir", "check_output_dir", "both_or_neither", "hardware_or_cost", "one_line", "run_main"]


def _user_error(e: BaseException) -> bool:
    """An error about the user's input or data, not a bug: its message is the whole story."""
    return isinstance(e, (ValueError, OSError, TrainingDiverged, SampleReadError, MissingDependency))


def run_main(main: Callable[[], object], prog: str | None = None) -> None:
    """Run a script's ``main`` with fcp's error contract and exit: a ValueError / OSError / ``TrainingDiverged`` /
    ``SampleReadError`` / ``MissingDependency`` (transformers that does not run on this torch) is one line on stderr
    (``prog: error: ...``, with the rank when a process group of more than one rank is up) and exit 2; Ctrl-C is
    exit 130; anything else keeps its traceback (a bug). Under torchrun each rank prints its own line and torchrun
    ends the others."""
    prog = prog or os.path.basename(sys.argv[0])
    try:
        main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - sorted below; a bug is re-raised with its traceback
        if not _user_error(e):
            raise
        if os.environ.get("FCP_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        print(f"{prog}: error{_rank_suffix()}: {one_line(e)}", file=sys.stderr, flush=True)
        settle_collectives(barrier=False)  # gloo: no collective's cleanup left for the interpreter's finalisation
        sys.exit(2)


def _rank_suffix() -> str:
    torch_dist = sys.modules.get("torch.distributed")
    if torch_dist is None or not (torch_dist.is_available() and torch_dist.is_initialized()):
        return ""
    return f" on rank {torch_dist.get_rank()}" if torch_dist.get_world_size() > 1 else ""
