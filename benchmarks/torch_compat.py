"""The test suite on older torch and transformers releases: does fcp keep its ``torch>=2.4`` and
``transformers>=5.18`` promises?

Ascend's torch_npu pins a torch release (2.4 and 2.5 are common on MindSpeed clusters) and many CUDA images lag
behind, so users run fcp on a torch older than the 2.13 the suite runs on. For each ``--torch`` release this makes a
virtual environment (``--venv-dir``; kept, so a rerun only tests), installs that torch from PyPI (a CUDA build of
several GB: the CPU-only builds are not on PyPI; the tests run on the CPU anyway), fcp itself (editable) with
the extras the suite uses, pinned to that torch by a constraint, and runs pytest over ``--tests`` (default: the
whole suite), then prints one row per release — passed, failed, skipped — and the failures, and writes
``--out`` (JSON).

What a test cannot run on an older torch is a skip with its reason, not a failure: transformers 5 disables its
models below torch 2.6 (the Hugging Face test modules skip), FSDP2 runs on the CPU from 2.7 (its CPU runs skip or
leave the run matrices; ``--reducer fsdp2`` on the CPU is refused in one line); two FCPTrainer runs with
Accelerate's FSDP2 are expected failures below 2.8 (``xfail(strict=True)``: measured off the stock Trainer on
2.7.1). Megatron-core, torchtitan, DeepSpeed, TRL and torchdata are not installed there, so their tests skip too.
Everything else must pass::

    .venv/bin/python benchmarks/torch_compat.py       # 2.4.1 ... 2.8.0: ~2 min to install, 3-7 min each

``--transformers 5.18.0,5.20.2`` pins those transformers releases too, one venv per (torch, transformers) pair, e.g.
with ``--torch 2.13.0`` and ``--tests`` the Hugging Face test files (BENCHMARKS.md "Older transformers releases")::

    .venv/bin/python benchmarks/torch_compat.py --torch 2.13.0 --transformers 5.18.0,5.20.2,5.23.0,5.24.0 --tests hf

(``--tests hf``: the test files that mention transformers.)

Needs the package registry (PyPI). Exit code 0 when no test failed, 1 otherwise, 2 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from _args import nonempty, output_dir, output_file, parser, positive_int, run

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = "ilp,video,text,parquet,plot,hf,fast"
TEST_DEPS = ("pytest-xdist", "hypothesis", "pytest-timeout", "peft", "datasets")


def releases(text: str) -> list:
    """argparse type: comma-separated releases ``X.Y.Z``."""
    out = [x.strip() for x in text.split(",")]
    for x in out:
        if not re.fullmatch(r"\d+\.\d+\.\d+", x):
            raise argparse.ArgumentTypeError(f"releases like 2.4.1,2.5.1, got {x!r}")
    return out


def _run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)


def install(venv: Path, release: str, transformers: str | None = None) -> None:
    """A venv with torch==release (and transformers==``transformers`` when given) and fcp (editable), every other
    package pinned to them."""
    py = venv / "bin" / "python"
    if not py.exists():
        _check(_run([sys.executable, "-m", "venv", venv]), f"python -m venv {venv}")
    want = f"{release} {transformers or ''}".strip()
    if (venv / ".fcp-installed").exists() and (venv / ".fcp-installed").read_text() == want:
        return
    constraint = venv / "constraint.txt"
    constraint.write_text(f"torch=={release}\n" + (f"transformers=={transformers}\n" if transformers else ""))
    print(f"[{_label(release, transformers)}] installing into {venv} (torch from PyPI: a CUDA build of several GB "
          "unless a local CPU build is found)", flush=True)
    _check(_run([py, "-m", "pip", "install", "-q", "-c", constraint, f"torch=={release}"]), "pip install torch")
    _check(_run([py, "-m", "pip", "install", "-q", "-c", constraint, "-e", f"{ROOT}[{EXTRAS}]", *TEST_DEPS],
                cwd=ROOT), "pip install fcp")
    (venv / ".fcp-installed").write_text(want)


def _label(release: str, transformers: str | None) -> str:
    return f"torch {release}" + (f" + transformers {transformers}" if transformers else "")


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail))


def hf_test_files() -> list:
    """The test files that mention transformers (``--tests hf``), relative to the repository."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "transformers" in p.read_text())


def run_suite(venv: Path, tests: list, workers: int) -> dict:
    """pytest over ``tests`` in the venv: counts, the failed test ids and the skip reasons (counted)."""
    py = venv / "bin" / "python"
    version = _run([py, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    tf = _run([py, "-c", "import transformers; print(transformers.__version__)"]).stdout.strip() or None
    start = time.monotonic()
    proc = _run([py, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "-n", str(workers), "--dist",
                 "loadfile", *tests], cwd=ROOT)
    out = proc.stdout + proc.stderr
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|errors?)\b",
                                               out.splitlines()[-1])}
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.M)))
    skips: dict = {}
    for n, reason in re.findall(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", out, re.M):  # a module-level skip: 1
        skips[reason] = skips.get(reason, 0) + int(n)
    return {"torch": version, "transformers": tf, "exit": proc.returncode,
            "seconds": round(time.monotonic() - start, 1),
            "passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
            "errors": counts.get("errors", counts.get("error", 0)), "skipped": counts.get("skipped", 0),
            "xfailed": counts.get("xfailed", 0),
            "failures": failed, "skip_reasons": dict(sorted(skips.items(), key=lambda kv: -kv[1]))}


def build_parser():
    ap = parser(__doc__.split("\n\n")[0], epilog=__doc__)
    ap.add_argument("--torch", type=releases, default=["2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0"],
                    help="comma-separated torch releases (default 2.4.1,2.5.1,2.6.0,2.7.1,2.8.0)")
    ap.add_argument("--transformers", type=releases, default=None,
                    help="comma-separated transformers releases, each run with each --torch release (default: the "
                         "newest pip resolves)")
    ap.add_argument("--venv-dir", type=output_dir, default="/tmp/fcp-torch-compat",
                    help="where the venvs live (one per release, kept between runs)")
    ap.add_argument("--tests", type=nonempty, nargs="*", default=["tests"],
                    help="pytest paths (default: the whole suite); 'hf': the files that mention transformers")
    ap.add_argument("--workers", type=positive_int, default=2, help="pytest-xdist workers (default 2)")
    ap.add_argument("--out", type=output_file, default=None,
                    help="write the results as JSON here (default: not written)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.tests == ["hf"]:
        args.tests = hf_test_files()
    results = []
    for release, tf in [(r, t) for r in args.torch for t in (args.transformers or [None])]:
        venv = Path(args.venv_dir) / (f"torch-{release}" + (f"-transformers-{tf}" if tf else ""))
        try:
            install(venv, release, tf)
        except RuntimeError as e:
            print(f"torch_compat.py: error: {e}", file=sys.stderr)
            return 2
        res = run_suite(venv, args.tests, args.workers)
        results.append(res)
        print(f"{_label(res['torch'], res['transformers']):<38} passed {res['passed']:5d}  "
              f"failed {res['failed'] + res['errors']:3d}  skipped {res['skipped']:4d}  "
              f"expected failures {res['xfailed']}  {res['seconds']:7.1f} s", flush=True)
        for name in res["failures"]:
            print(f"    FAILED {name}")
        for reason, n in list(res["skip_reasons"].items())[:8]:
            print(f"    skipped {n:4d}: {reason[:110]}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 1 if any(r["failed"] or r["errors"] or r["exit"] not in (0, 1) for r in results) else 0


if __name__ == "__main__":
    run(main)
