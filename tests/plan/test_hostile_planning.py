"""Hostile input to the planning commands (`fcp plan / compare / simulate`) and the planning core (issue 15).

Every case either succeeds (exit 0) or ends with exit 2 and one line ``fcp <cmd>: error: ...`` on stderr —
never a traceback, a kill by the OOM killer, or a hang. The cases are a table (:data:`CASES`): a lengths
file, a cost JSON and extra options, the expected exit code and a phrase the message must contain. The
resource cases (``--ranks 1000000``, the ILP with ``--micro-batches auto``) run in a subprocess with a
wall-clock and peak-memory bound. A failure names the case: that input reaches the user as a traceback,
a wrong exit code or a message that does not say what is wrong.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from fcp_cli.main import main
from fcp_data.cost import MAX_RANKS, CostModel

PRESET = ["--preset", "qwen3-8b", "--hardware", "h100"]
GOOD_COST = CostModel.preset("Qwen3-8B", "h100").to_dict()
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Case:
    """``argv`` may use {lengths} and {cost}; ``lengths``: text of a .txt file, or a name of :func:`_special`;
    ``cost``: a dict (written as JSON), a raw string, or None (then the preset is used)."""

    name: str
    argv: list[str]
    expect: int
    match: str = ""
    lengths: str | bytes = "100\n2000\n300\n45000\n"
    suffix: str = ".txt"
    cost: dict | str | None = None
    extra_files: dict = field(default_factory=dict)


def _cost(**changes):
    d = dict(GOOD_COST)
    d.update(changes)
    return {k: v for k, v in d.items() if v is not _DROP}


_DROP = object()
P = ["plan", "--lengths", "{lengths}"]
C = ["compare", "--lengths", "{lengths}"]
S = ["simulate", "--lengths", "{lengths}", "--no-progress"]

CASES = [
    # ---- lengths files
    Case("empty lengths file", P + ["--ranks", "8", *PRESET], 2, "empty", lengths=""),
    Case("only comments and blank lines", P + ["--ranks", "8", *PRESET], 2, "empty", lengths="# x\n\n  # y\n"),
    Case("negative length", P + ["--ranks", "8", *PRESET], 2, "must be > 0", lengths="100\n-5\n"),
    Case("zero length", P + ["--ranks", "8", *PRESET], 2, "must be > 0", lengths="0\n100\n"),
    Case("NaN length", P + ["--ranks", "8", *PRESET], 2, "not a whole token count", lengths="100\nnan\n"),
    Case("inf length", P + ["--ranks", "8", *PRESET], 2, "not a whole token count", lengths="inf\n"),
    Case("fractional length", P + ["--ranks", "8", *PRESET], 2, "not a whole token count", lengths="3.5\n"),
    Case("text garbage", P + ["--ranks", "8", *PRESET], 2, "is not a number", lengths="hello world\n"),
    Case("beyond int64 (was OverflowError)", P + ["--ranks", "8", *PRESET], 2, "not a plausible token count",
         lengths="100\n99999999999999999999999\n"),
    Case("1e400 (inf after parsing)", P + ["--ranks", "8", *PRESET], 2, "whole token count", lengths="1e400\n"),
    Case("binary garbage", P + ["--ranks", "8", *PRESET], 2, "not a text file", lengths=b"\xff\xfe\x00\x81"),
    Case("csv beyond int64", C + ["--ranks", "8", *PRESET], 2, "plausible",
         lengths="n\n5\n18446744073709551616\n", suffix=".csv"),
    Case("npy uint64 beyond int64", P + ["--ranks", "8", *PRESET], 2, "plausible", lengths="npy_uint64", suffix=".npy"),
    Case("npy 2-D", P + ["--ranks", "8", *PRESET], 2, "1-D", lengths="npy_2d", suffix=".npy"),
    Case("npy of pickled objects", P + ["--ranks", "8", *PRESET], 2, "npy", lengths="npy_object", suffix=".npy"),
    Case("npy float NaN", P + ["--ranks", "8", *PRESET], 2, "whole token count", lengths="npy_nan", suffix=".npy"),
    Case("huge file of one value (200k x 1000 tokens, one micro-batch)", P + ["--ranks", "8", *PRESET], 2,
         "does not fit", lengths="1000\n" * 200_000),
    Case("huge file of one value (100k x 1 token) plans", P + ["--ranks", "8", *PRESET], 0, "", lengths="1\n" * 100_000),
    Case("lengths file is a device", ["plan", "--lengths", "/dev/zero", "--ranks", "8", *PRESET], 2,
         "not a regular file"),
    Case("missing lengths file", ["plan", "--lengths", "/nonexistent/l.txt", "--ranks", "8", *PRESET], 2, "not found"),
    Case("--column on a .txt", P + ["--ranks", "8", "--column", "n", *PRESET], 2, "csv files only"),
    Case("overlong sequence, default error", P + ["--ranks", "1", *PRESET], 2, "on-overlong",
         lengths="10000000\n"),
    Case("overlong, drop leaves nothing", P + ["--ranks", "1", "--on-overlong", "drop", *PRESET], 2,
         "nothing left", lengths="10000000\n"),
    # ---- ranks
    Case("--ranks 0", P + ["--ranks", "0", *PRESET], 2, "--ranks must be >= 1"),
    Case("--ranks -1", P + ["--ranks", "-1", *PRESET], 2, "--ranks must be >= 1"),
    Case("--ranks huge (plan)", P + ["--ranks", "1000000", *PRESET], 2, "more than the planner supports"),
    Case("--ranks huge (compare)", C + ["--ranks", "1000000", *PRESET], 2, "more than the planner supports"),
    Case("--ranks huge (simulate)", S + ["--ranks", "1000000", "--global-batch-size", "2", *PRESET], 2,
         "more than the planner supports"),
    Case("--ranks at the maximum plans", P + ["--ranks", str(MAX_RANKS), *PRESET], 0, ""),
    Case("--ranks not a number", P + ["--ranks", "many", *PRESET], 2, "invalid int value"),
    # ---- cost JSON
    Case("tokens_per_rank 0", P + ["--ranks", "8", "--cost", "{cost}"], 2, "tokens_per_rank must be a positive",
         cost=_cost(tokens_per_rank=0)),
    Case("missing key", P + ["--ranks", "8", "--cost", "{cost}"], 2, "missing alpha2", cost=_cost(alpha2=_DROP)),
    Case("extra key", P + ["--ranks", "8", "--cost", "{cost}"], 2, "unknown gpu", cost=_cost(gpu="h100")),
    Case("string value", P + ["--ranks", "8", "--cost", "{cost}"], 2, "alpha1 must be a number",
         cost=_cost(alpha1="2e-9")),
    Case("bool value", P + ["--ranks", "8", "--cost", "{cost}"], 2, "ranks_per_node must be a number",
         cost=_cost(ranks_per_node=True)),
    Case("list value", P + ["--ranks", "8", "--cost", "{cost}"], 2, "beta1 must be a number", cost=_cost(beta1=[0.01])),
    Case("null value", P + ["--ranks", "8", "--cost", "{cost}"], 2, "beta2 must be a number", cost=_cost(beta2=None)),
    Case("alpha1 1e308 (was a misleading error later)", P + ["--ranks", "8", "--cost", "{cost}"], 2,
         "out of range.*alpha1", cost=_cost(alpha1=1e308)),
    Case("alpha1 1e100", C + ["--ranks", "8", "--cost", "{cost}"], 2, "out of range", cost=_cost(alpha1=1e100)),
    Case("bandwidth 1e-300", P + ["--ranks", "8", "--cost", "{cost}"], 2, "out of range.*bandwidth",
         cost=_cost(bandwidth_inter=1e-300)),
    Case("bandwidth 0", P + ["--ranks", "8", "--cost", "{cost}"], 2, "must be > 0", cost=_cost(bandwidth_intra=0)),
    Case("negative coefficient", P + ["--ranks", "8", "--cost", "{cost}"], 2, "must be >= 0", cost=_cost(beta1=-1)),
    Case("NaN coefficient", P + ["--ranks", "8", "--cost", "{cost}"], 2, "finite",
         cost=json.dumps({**GOOD_COST, "alpha3": float("nan")})),  # json writes the literal NaN
    Case("integer beyond float range", P + ["--ranks", "8", "--cost", "{cost}"], 2, "finite",
         cost=_cost(alpha2=10 ** 400)),
    Case("tokens_per_rank 1e15", P + ["--ranks", "8", "--cost", "{cost}"], 2, "tokens_per_rank",
         cost=_cost(tokens_per_rank=10 ** 15)),
    Case("fractional ranks_per_node", P + ["--ranks", "8", "--cost", "{cost}"], 2, "positive integer",
         cost=_cost(ranks_per_node=0.5)),
    Case("deeply nested JSON (was RecursionError)", P + ["--ranks", "8", "--cost", "{cost}"], 2, "nested too deeply",
         cost="[" * 100_000 + "]" * 100_000),
    Case("JSON array", P + ["--ranks", "8", "--cost", "{cost}"], 2, "JSON object", cost="[1, 2, 3]"),
    Case("empty cost file", P + ["--ranks", "8", "--cost", "{cost}"], 2, "not valid JSON", cost=""),
    Case("cost file of 2 MB", P + ["--ranks", "8", "--cost", "{cost}"], 2, "bytes", cost=" " * (2 << 20) + "{}"),
    Case("cost file is a device", P + ["--ranks", "8", "--cost", "/dev/zero"], 2, "regular file|not valid JSON"),
    Case("--cost and --preset", P + ["--ranks", "8", "--cost", "{cost}", *PRESET], 2, "not both", cost=_cost()),
    Case("no cost model", P + ["--ranks", "8"], 2, "a cost model is needed"),
    Case("unknown preset", P + ["--ranks", "8", "--preset", "gpt-9", "--hardware", "h100"], 2, "valid"),
    # ---- options
    Case("--micro-batches 0", P + ["--ranks", "8", "--micro-batches", "0", *PRESET], 2, "must be >= 1"),
    Case("--micro-batches beyond the sequences", P + ["--ranks", "8", "--micro-batches", "1000000000000", *PRESET], 2,
         "cannot split"),
    Case("--time-limit without ilp", P + ["--ranks", "8", "--time-limit", "5", *PRESET], 2,
         "--time-limit applies to ilp only"),
    # found by a review of the CLI: each of these options was silently ignored (exit 0)
    Case("compare --time-limit without the ilp", C + ["--ranks", "8", "--baselines", "static-cp", "--time-limit", "1",
                                                      *PRESET], 2, "--time-limit applies to ilp only"),
    Case("simulate --time-limit without the ilp", S + ["--ranks", "8", "--global-batch-size", "2", "--time-limit", "1",
                                                       *PRESET], 2, "--time-limit applies to ilp only"),
    Case("--robust-tol with a baseline", P + ["--ranks", "8", "--solver", "static-cp", "--robust-tol", "0.1", *PRESET],
         2, "--robust-tol applies to fcp / fcp-dp only"),
    Case("--column of a .npy", P + ["--ranks", "8", "--column", "foo", *PRESET], 2, "--column applies to .csv",
         lengths="npy_int", suffix=".npy"),
    Case("--visual count above its sequence (was clipped)", P + ["--ranks", "8", "--visual", "{visual}", *PRESET], 2,
         "entry 1 is 5000; a count is >= 0 and at most its sequence's 2000", lengths="1000\n2000\n",
         extra_files={"visual": "0\n5000\n"}),
    Case("--visual count inf", P + ["--ranks", "8", "--visual", "{visual}", *PRESET], 2, "entry 1 is inf",
         lengths="1000\n2000\n", extra_files={"visual": "0\ninf\n"}),
    Case("--visual-column past the columns (was \"'' is not a count\")", P + ["--ranks", "8", "--visual", "{visual}",
                                                                          "--visual-column", "9", *PRESET], 2,
         "no column '9'; the columns: a, b", lengths="1000\n2000\n", extra_files={"visual.csv": "a,b\n0,0\n5,5\n"}),
    Case("csv with an unterminated quote (was 'the file is empty')", P + ["--ranks", "8", *PRESET], 2,
         "not a valid CSV row", lengths='"a\n1000\n2000\n', suffix=".csv"),
    Case("compare --json where no solver plans (was exit 0)", C + ["--ranks", "8", "--solvers", "exhaustive", "--json",
                                                                   *PRESET], 2, "no solver could plan", lengths="100\n" * 9),
    Case("float16 npy", P + ["--ranks", "8", *PRESET], 0, "", lengths="npy_f16", suffix=".npy"),
    Case("--time-limit nan", C + ["--ranks", "8", "--time-limit", "nan", *PRESET], 2, "seconds"),
    Case("--time-limit inf", P + ["--ranks", "8", "--solver", "ilp", "--time-limit", "inf", *PRESET], 2, "finite"),
    Case("--heads 0", C + ["--ranks", "8", "--heads", "0", *PRESET], 2, "--heads must be >= 1"),
    Case("--heads not a multiple of --kv-heads", S + ["--ranks", "8", "--global-batch-size", "2", "--heads", "7",
                                                       "--kv-heads", "2", *PRESET], 2, "multiple"),
    Case("fcp-dp above its rank limit", P + ["--ranks", "1024", "--solver", "fcp-dp", *PRESET], 2, "fcp-dp"),
    Case("compare reports fcp-dp above its limit and succeeds", C + ["--ranks", "1024", "--baselines", "static-cp",
                                                                     *PRESET], 0, ""),
    Case("compare --exhaustive on too many sequences succeeds", C + ["--ranks", "8", "--exhaustive", *PRESET], 0, "",
         lengths="100\n" * 9),
    Case("exhaustive solver on too many sequences", P + ["--ranks", "8", "--solver", "exhaustive", *PRESET], 2,
         "at most 7", lengths="100\n" * 9),
    # ---- simulate
    Case("--global-batch-size 0", S + ["--ranks", "8", "--global-batch-size", "0", *PRESET], 2, "global-batch-size"),
    Case("--global-batch-size beyond the workload", S + ["--ranks", "8", "--global-batch-size", "50", *PRESET], 2,
         "exceeds"),
    Case("--steps 0", S + ["--ranks", "8", "--global-batch-size", "2", "--steps", "0", *PRESET], 2, "--steps"),
    Case("--steps 10^9", S + ["--ranks", "8", "--global-batch-size", "2", "--steps", "1000000000", *PRESET], 2,
         "--steps"),
    Case("--seed -1", S + ["--ranks", "8", "--global-batch-size", "2", "--seed", "-1", *PRESET], 2, "--seed"),
    Case("--cap 0", S + ["--ranks", "8", "--global-batch-size", "2", "--cap", "0", *PRESET], 2, "--cap"),
    Case("simulate with a bad cost JSON", S + ["--ranks", "8", "--global-batch-size", "2", "--cost", "{cost}"], 2,
         "out of range", cost=_cost(alpha1=1e308)),
]


def _special(name: str, path: Path) -> None:
    arrays = {"npy_uint64": np.array([5, 2 ** 64 - 1], dtype=np.uint64), "npy_2d": np.ones((2, 2), dtype=np.int64),
              "npy_nan": np.array([1.0, np.nan]), "npy_int": np.array([1000, 2000]),
              "npy_f16": np.array([1000, 60000], dtype=np.float16)}
    if name == "npy_object":
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    else:
        np.save(path, arrays[name])


def _materialise(case: Case, tmp: Path) -> list[str]:
    lengths = tmp / f"lengths{case.suffix}"
    if isinstance(case.lengths, bytes):
        lengths.write_bytes(case.lengths)
    elif case.lengths.startswith("npy_"):
        _special(case.lengths, lengths)
    else:
        lengths.write_text(case.lengths)
    cost = tmp / "cost.json"
    if case.cost is not None:
        cost.write_text(case.cost if isinstance(case.cost, str) else json.dumps(case.cost))
    extra = {}  # "{name}" in argv: the file name, or name.txt when it has no suffix
    for name, text in case.extra_files.items():
        extra[name.split(".")[0]] = tmp / (name if "." in name else f"{name}.txt")
        extra[name.split(".")[0]].write_text(text)
    return [a.format(lengths=lengths, cost=cost, **extra) for a in case.argv]


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_float16_npy_plans_without_warnings(tmp_path, capsys):
    """A float16 array compared with the plausibility limit overflowed in numpy: 4 RuntimeWarning lines on stderr."""
    case = next(c for c in CASES if c.name == "float16 npy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc, out, err = _run(_materialise(case, tmp_path), capsys)
    assert rc == 0 and err == "" and "makespan" in out, (rc, err)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case(case, tmp_path, capsys):
    """Exit 0, or exit 2 with one error line that says what is wrong (``case.match``, a regex)."""
    import re

    rc, out, err = _run(_materialise(case, tmp_path), capsys)
    assert "Traceback" not in err, err
    assert rc == case.expect, (rc, err[-2000:])
    if case.expect == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines and lines[-1].startswith(f"fcp {case.argv[0]}: error:"), err
        assert len(lines) == 1 or lines[0].startswith("usage:"), err  # argparse's usage line until the CLI's own
        assert re.search(case.match, lines[-1]), lines[-1]
        assert out == "", out


def test_case_count_and_limits():
    """The table holds at least 20 hostile cases (issue 15; the count is reported in docs/ROBUSTNESS.md), and
    the CLI's literal copy of MAX_RANKS (kept so that building the parser imports no numpy) is the real one."""
    from fcp_data.commands.plan import MAX_RANKS as CLI_MAX_RANKS

    assert len(CASES) >= 20
    assert CLI_MAX_RANKS == MAX_RANKS


# ---------------------------------------------------------------- resource bounds, in a subprocess
_CHILD = r"""
import resource, sys, time
from fcp_cli.main import main
t = time.perf_counter()
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
try:  # the peak of this process's own memory: ru_maxrss survives exec and would report the pytest worker's
    kb = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except OSError:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{rc} {time.perf_counter() - t:.3f} {kb}")
"""


def _bounded(argv, timeout):
    r = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=timeout,
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    rc, secs, kb = r.stdout.strip().splitlines()[-1].split()
    return int(rc), float(secs), int(kb) / 1024, r.stderr


def test_huge_ranks_ends_fast_and_small(tmp_path):
    """`fcp plan --ranks 1000000` on 512 sequences grew to 22 GB and was killed (exit 137, no message): now exit 2
    within 10 s and 2 GB (the planner's time table is groups × ranks; --ranks is checked first)."""
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(v) for v in np.random.default_rng(0).integers(100, 30000, 512)))
    start = time.perf_counter()
    rc, _, mb, err = _bounded(["plan", "--lengths", str(lengths), "--ranks", "1000000", *PRESET], timeout=60)
    assert rc == 2 and "more than the planner supports" in err, err
    assert time.perf_counter() - start < 10 and mb < 2048, (time.perf_counter() - start, mb)
    # and the largest allowed size plans within the same bounds
    rc, secs, mb, err = _bounded(["plan", "--lengths", str(lengths), "--ranks", str(MAX_RANKS), *PRESET], timeout=60)
    assert rc == 0 and secs < 10 and mb < 2048, (rc, secs, mb, err)


def test_ilp_auto_keeps_one_time_budget(tmp_path):
    """`--solver ilp --micro-batches auto` on 512 sequences printed nothing for 300 s: each micro-batch of each
    candidate split got the full --time-limit. Now the limit is the budget of the whole call: the command ends
    within it (plus model-building overhead) with a plan or one error line."""
    pytest.importorskip("cvxpy")
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(v) for v in np.random.default_rng(1).integers(100, 30000, 512)))
    start = time.perf_counter()
    rc, secs, _, err = _bounded(["plan", "--lengths", str(lengths), "--ranks", "64", "--solver", "ilp",
                                 "--micro-batches", "auto", "--time-limit", "4", *PRESET], timeout=120)
    assert rc in (0, 2), err
    assert rc == 0 or (err.count("\n") == 1 and "error:" in err), err
    assert secs < 4 + 20, secs
    assert time.perf_counter() - start < 60


# ---------------------------------------------------------------- the planning API (what the sampler calls)
API_CASES = [  # (kwargs for plan_batch, message regex)
    ({"num_ranks": 1_000_000}, "more than the planner supports"),
    ({"num_ranks": 0}, "positive int"),
    ({"num_ranks": True}, "positive int"),
    ({"lengths": [100, 2 ** 40]}, "more than any real sequence"),
    ({"lengths": np.array([5, 2 ** 64 - 1], dtype=np.uint64)}, "more than any real sequence"),
    ({"lengths": [[100, 200]]}, "1-D"),
    ({"lengths": ["100", "x"]}, "integers"),
    ({"lengths": [100, float("nan")]}, "whole token counts"),
    ({"lengths": []}, "empty"),
    ({"solver": "fcp-dp", "num_ranks": 1024}, "fcp-dp"),
    ({"solver": "ilp", "time_limit": -1}, "time_limit"),
    ({"solver": "ilp", "time_limit": float("nan")}, "time_limit"),
    ({"solver": "ilp", "num_ranks": 256, "lengths": [100] * 40}, "binary variables"),
    ({"micro_batches": 0}, "positive int"),
    ({"etas": [0, -1, 0]}, "etas"),
]


@pytest.mark.parametrize("kwargs,match", API_CASES, ids=[str(k)[:60] for k, _ in API_CASES])
def test_plan_batch_rejects_with_value_error(kwargs, match):
    """plan_batch raises ValueError (never OverflowError, MemoryError or a hang) naming the problem."""
    from fcp_data.plan import plan_batch

    kw = {"lengths": [100, 2000, 300], "num_ranks": 8, "cost_model": CostModel.preset("Qwen3-8B", "h100"), **kwargs}
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        plan_batch(kw.pop("lengths"), **kw)
    assert time.perf_counter() - start < 5


def test_ilp_time_limit_is_one_budget_for_all_micro_batches():
    """The ILP's time_limit covers the whole call: three micro-batches with time_limit=3 end in about 3 s
    (plus model building), where each used to get 3 s of its own."""
    pytest.importorskip("cvxpy")
    from fcp_data.plan import plan_batch

    L = np.random.default_rng(4).integers(2000, 40000, 36)
    start = time.perf_counter()
    try:
        plan = plan_batch(L, num_ranks=16, cost_model=CostModel.preset("Qwen3-8B", "h100"), solver="ilp",
                          micro_batches=3, time_limit=3)
        assert len(plan.micro_batches) == 3
    except ValueError as e:
        assert "time limit" in str(e) or "no solution" in str(e), e
    assert time.perf_counter() - start < 3 + 10
