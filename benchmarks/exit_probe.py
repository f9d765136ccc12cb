"""How often a training script that stops on a user error exits with something else than its one line and exit 2.

A gloo worker thread destroys a finished collective's tensors after the caller's ``wait()`` returned, which takes
the GIL. When that is still pending as the interpreter finalises, Python ends the thread inside C++ that cannot
unwind and the process aborts ("terminate called without an active exception", exit 134) after having printed
its error. ``fcp_exec.script.run_main`` pauses on a gloo group before it exits (``settle_collectives(barrier=False)``).

This runs one example with an input error found after the process group is up (default: the Megatron example
resumed from a folder, one rank as plain ``python``) ``--runs`` times, with the pause (``after``) and with it
patched out (``before``), alternating, and prints the exit codes of each::

    .venv/bin/python benchmarks/exit_probe.py --runs 60          # about 8 minutes on 2 cores

A rare event: a count of 0 is evidence, not proof.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _args import parser, positive_int, run

ROOT = Path(__file__).resolve().parent.parent

# the example run as __main__, with run_main's pause patched out for "before"
RUNNER = """
import runpy, sys
import fcp_exec.script as script
if sys.argv[1] == "before":
    script.settle_collectives = lambda **kw: None
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


EXAMPLES = tuple(sorted(p.name for p in (ROOT / "examples").glob("*.py")))


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--runs", type=positive_int, default=60, help="runs of each variant (default 60)")
    ap.add_argument("--example", choices=EXAMPLES, default="train_megatron_gpt.py", metavar="SCRIPT",
                    help=f"a script in examples/: {', '.join(EXAMPLES)}")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    codes: dict[str, collections.Counter] = {"before": collections.Counter(), "after": collections.Counter()}
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="fcp-exit-probe-") as d:
        folder = Path(d) / "not-a-checkpoint"
        folder.mkdir()
        cmd = [str(ROOT / "examples" / args.example), "--steps", "2", "--resume", str(folder)]
        for i in range(args.runs):
            for variant in ("before", "after"):
                r = subprocess.run([sys.executable, "-c", RUNNER, variant, *cmd], capture_output=True, text=True,
                                   timeout=300, cwd=d)
                codes[variant][r.returncode] += 1
            print(f"\r[{time.time() - start:5.0f} s] run {i + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(f"\n\n{args.example} --resume FOLDER, one rank, {args.runs} runs each ({time.time() - start:.0f} s)\n")
    print("| variant | exit 2 (one line) | exit 134 (abort) | other |\n|---|---:|---:|---:|")
    for variant, c in codes.items():
        other = sum(n for rc, n in c.items() if rc not in (2, -6, 134))
        print(f"| {variant} | {c[2]} | {c[-6] + c[134]} | {other} |")
    return 0


if __name__ == "__main__":
    run(main)
