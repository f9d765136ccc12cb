"""The suite's runner of commands (``tests/_procs.py``) turns a hang into a failure that shows where every process
under the command waits — torchrun's ranks included, each in a session of its own."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from _procs import run as run_process


def test_a_hung_torchrun_fails_with_the_stacks_of_its_ranks(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time

        def wait_for_godot():
            time.sleep(600)

        # one write: under PYTHONUNBUFFERED=1 print("rank", r, "waits") writes each piece on its own, and the two
        # ranks' pieces interleave on the shared pipe ("rank rank 1 0 waits waits": a CI failure of this test)
        sys.stdout.write(f"rank {os.environ['RANK']} waits\\n")
        sys.stdout.flush()
        wait_for_godot()
    """))
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun) if torchrun.exists() else sys.executable, *([] if torchrun.exists() else
           ["-m", "torch.distributed.run"]), "--standalone", "--nproc-per-node", "2", str(script)]
    with pytest.raises(pytest.fail.Exception) as failed:
        run_process(cmd, timeout=15, cwd=tmp_path)
    report = str(failed.value)
    assert "did not finish within 15 s" in report
    # on a failure, the captured stdout (where the ranks print) and the end of the stderr (their stacks)
    stdout, _, stderr = report.partition("--- stderr ---")
    assert "rank 0 waits" in report and "rank 1 waits" in report, stdout[-3000:] + stderr[-1500:]
    assert report.count("in wait_for_godot") == 2, report  # both ranks' stacks, from faulthandler


def test_a_finished_command_is_returned_as_subprocess_run_would():
    r = run_process([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                    timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n")
