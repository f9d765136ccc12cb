"""`fcp plan / compare / simulate / presets`: outputs and the one-line errors with exit code 2.

A failure means a user sees a traceback or a wrong exit code, or the JSON contracts of DESIGN §6 break.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from fcp_cli.main import main
from fcp_data.commands.plan import SOLVER_CHOICES
from fcp_data.plan import SOLVER_NAMES, Plan

PRESET = ["--preset", "Qwen3-8B", "--hardware", "h100"]


@pytest.fixture
def lengths_file(tmp_path):
    p = tmp_path / "lengths.txt"
    p.write_text("\n".join(map(str, [120000, 3000, 800, 45000, 200, 9000, 17000])) + "\n")
    return p


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_solver_choices_match_registry():
    """`fcp plan --solver` offers exactly the registered solvers, and the default --baselines of compare and
    simulate are the registry's baselines, i.e. the four systems of DESIGN §5."""
    from fcp_cli.main import build_parser
    from fcp_data.commands.plan import BASELINES

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    solver = next(a for a in sub.choices["plan"]._actions if a.dest == "solver")
    assert tuple(solver.choices) == tuple(SOLVER_CHOICES) == tuple(SOLVER_NAMES)
    assert SOLVER_NAMES[:4] == ("fcp", "fcp-dp", "ilp", "exhaustive")
    assert tuple(BASELINES) == ("static-cp", "ulysses", "megatron-dynamic", "fcp-pow2")


def test_top_level_help_and_version_import_no_command():
    """`fcp --help` and `fcp --version` list the commands from their summaries without importing any command's
    module (torch and the executor took 3 s there); a command whose module fails to import is an error when it is
    used, never dropped from the list."""
    script = ("import sys\n"
              "from fcp_cli.main import main\n"
              "for argv in (['--help'], ['--version']):\n"
              "    try:\n"
              "        main(argv)\n"
              "    except SystemExit:\n"
              "        pass\n"
              "print('torch' in sys.modules, 'fcp_exec.commands.train' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "train" in r.stdout and "simulate" in r.stdout and "fcp 0" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1] == "False False", r.stdout
    broken = ("import fcp_cli.main as m\n"
              "m.COMMANDS = m.COMMANDS + (('ghost', 'fcp_data.commands.no_such_module', 'a broken command'),)\n"
              "m._NAMES = m._NAMES | {'ghost'}\n"
              "m.main(['--help'])\n")
    r = subprocess.run([sys.executable, "-c", broken], capture_output=True, text=True, timeout=120)
    assert "ghost" in r.stdout and "a broken command" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-c", broken.replace("['--help']", "['ghost']")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "No module named 'fcp_data.commands.no_such_module'" in r.stderr, r.stderr[-2000:]


def test_plan_table_and_json(capsys, lengths_file):
    rc, out, _ = _run(capsys, ["plan", "--lengths", str(lengths_file), "--ranks", "16", *PRESET])
    assert rc == 0 and "⟨" in out and "makespan" in out and "solve" in out
    rc, out, _ = _run(capsys, ["plan", "--lengths", str(lengths_file), "--ranks", "16", *PRESET, "--json"])
    plan = Plan.from_dict(json.loads(out))
    assert rc == 0 and sorted(plan.seq_ids) == list(range(7)) and plan.num_ranks == 16


def test_plan_with_cost_json_and_micro_batches(capsys, lengths_file, tmp_path):
    from fcp_data.cost import CostModel

    cost = tmp_path / "cost.json"
    CostModel.preset("Qwen3-8B", "h100").replace(tokens_per_rank=16384).save(cost)
    rc, out, _ = _run(capsys, ["plan", "--lengths", str(lengths_file), "--ranks", "8", "--cost", str(cost),
                               "--micro-batches", "auto", "--json"])
    d = json.loads(out)
    assert rc == 0 and len(d["micro_batches"]) >= 2  # 194K tokens > 8 × 16384
    assert d["makespan"] == pytest.approx(sum(m["makespan"] for m in d["micro_batches"]))


def test_compare_json_keys(capsys, tmp_path):
    pytest.importorskip("cvxpy")
    p = tmp_path / "l.txt"
    p.write_text("60000\n3000\n800\n200\n")
    rc, out, _ = _run(capsys, ["compare", "--lengths", str(p), "--ranks", "8", *PRESET, "--ilp", "--exhaustive",
                               "--baselines", "static-cp,ulysses,megatron-dynamic,fcp-pow2", "--json"])
    d = json.loads(out)
    assert rc == 0 and set(d) == set(SOLVER_NAMES)
    assert d["ilp"]["optimal"] is True and d["exhaustive"]["optimal"] is True
    assert d["fcp"]["makespan"] >= d["ilp"]["makespan"] * (1 - 1e-6)
    rc, out, _ = _run(capsys, ["compare", "--lengths", str(p), "--ranks", "8", *PRESET, "--baselines", "static-cp"])
    assert rc == 0 and "static-cp" in out and "vs best" in out


def test_simulate_json_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "w.npy"
    np.save(p, np.random.default_rng(0).lognormal(7, 1.5, size=500).astype(np.int64) + 1)
    png = tmp_path / "sim.png"
    rc, out, err = _run(capsys, ["simulate", "--lengths", str(p), "--ranks", "16", "--global-batch-size", "32",
                                 "--steps", "2", "--seed", "1", *PRESET, "--plot", str(png), "--json"])
    d = json.loads(out)
    assert rc == 0 and set(d) == {"fcp", "static-cp", "ulysses", "megatron-dynamic", "fcp-pow2"}
    for v in d.values():
        assert len(v["steps"]) == 2 and v["mean_step_s"] == pytest.approx(sum(v["steps"]) / 2)
        assert d["fcp"]["mean_step_s"] <= v["mean_step_s"] * (1 + 1e-9) or v is d["ulysses"]
    assert png.stat().st_size > 1000 and "simulate" in err  # tqdm progress on stderr
    from PIL import Image

    with Image.open(png) as im:  # bars + FCP's first step + the fastest other solver's, side by side
        assert im.format == "PNG" and im.size[0] > 2.5 * im.size[1]


def test_compare_plot_shows_fcp_and_its_reference(capsys, tmp_path):
    """``fcp compare --plot``: the bars are every solver that planned; the second Gantt chart is the exact solver's
    plan when one ran (else the best baseline's). Read back: a PNG of three panels' width."""
    pytest.importorskip("matplotlib")
    from PIL import Image

    p = tmp_path / "w.txt"
    p.write_text("\n".join(str(n) for n in (900, 3000, 120, 4500, 60, 2000)))
    for extra in (["--ilp"], []):
        png = tmp_path / f"compare{len(extra)}.png"
        rc, out, _ = _run(capsys, ["compare", "--lengths", str(p), "--ranks", "4", *PRESET, *extra, "--plot", str(png)])
        assert rc == 0 and f"plot written to {png}" in out
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] > 2.5 * im.size[1]  # bars + two Gantt charts side by side


def test_presets_listing(capsys):
    rc, out, _ = _run(capsys, ["presets"])
    assert rc == 0 and "InternVL3-8B" in out and "ascend-910c" in out
    rc, out, _ = _run(capsys, ["presets", "--json", "--model", "Llama3-8B"])
    assert rc == 0 and {r["hardware"] for r in json.loads(out)} == {"ascend-910c", "h100", "h200", "a100"}


@pytest.mark.parametrize("content,extra,match", [
    ("", [], "empty"),
    ("12\nfoo\n", [], "not a number"),
    ("12\n0\n", [], "must be > 0"),
    ("12\n999999999\n", [], r"sequence 1 has 999999999 tokens.*--on-overlong"),
    ("12\n30\n", ["--micro-batches", "5"], "cannot split 2 sequences into 5"),
    ("12\n", ["--preset", "Nope-1B", "--hardware", "h100"], "valid: Qwen3-1.7B"),
    ("12\n", ["--cost", "COST"], "cost model keys: missing"),
    ("12\n", ["--cost", "BADJSON"], "not valid JSON"),
    ("12\n", [], "a cost model is needed"),
])
def test_plan_errors_are_one_line_exit_2(capsys, tmp_path, content, extra, match):
    p = tmp_path / "l.txt"
    p.write_text(content)
    (tmp_path / "cost.json").write_text('{"alpha1": 1}')
    (tmp_path / "bad.json").write_text("{not json")
    extra = [{"COST": str(tmp_path / "cost.json"), "BADJSON": str(tmp_path / "bad.json")}.get(x, x) for x in extra]
    cost = [] if any(x in ("--cost", "--preset") for x in extra) or match.startswith("a cost") else PRESET
    rc, out, err = _run(capsys, ["plan", "--lengths", str(p), "--ranks", "4", *cost, *extra])
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("fcp plan: error:")
    assert __import__("re").search(match, err), err


def test_overlong_truncate_and_drop(capsys, tmp_path):
    p = tmp_path / "l.txt"
    p.write_text("12\n999999999\n40\n")
    rc, out, _ = _run(capsys, ["plan", "--lengths", str(p), "--ranks", "4", *PRESET, "--on-overlong", "drop", "--json"])
    assert rc == 0 and sorted(Plan.from_dict(json.loads(out)).seq_ids) == [0, 2]  # the input's (DESIGN §6), not [0, 1]
    rc, out, _ = _run(capsys, ["plan", "--lengths", str(p), "--ranks", "4", *PRESET, "--on-overlong", "truncate",
                               "--micro-batches", "auto"])
    assert rc == 0 and "truncated" in out


def test_console_entry_point_exit_code(tmp_path):
    """The real process: exit code 2 and no traceback on bad input."""
    p = tmp_path / "l.txt"
    p.write_text("-3\n")
    r = subprocess.run([sys.executable, "-m", "fcp_cli", "plan", "--lengths", str(p), "--ranks", "2", *PRESET],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "must be > 0" in r.stderr


def test_plan_identical_across_processes(tmp_path):
    """Two processes with different hash seeds print the same plan (only solve_ms may differ): the
    sampler plans independently on every rank and the plans must match bit for bit."""
    import os

    p = tmp_path / "l.npy"
    np.save(p, np.random.default_rng(3).lognormal(7, 1.6, size=300).astype(np.int64) + 1)
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-m", "fcp_cli", "plan", "--lengths", str(p), "--ranks", "24",
                            *PRESET, "--micro-batches", "auto", "--json"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        d = json.loads(r.stdout)
        d.pop("solve_ms")
        outs.append(d)
    assert outs[0] == outs[1]


def test_cost_model_version_of_presets(tmp_path, capsys):
    """`--cost-model v1|v2` picks the preset's cost model (v2 default = CostModel.preset; v1 = v2=False); the JSON
    plan's makespan equals plan_batch with that model; with --cost it is a usage error."""
    import json as _json

    from fcp_data.cost import CostModel
    from fcp_data.plan import plan_batch

    p = tmp_path / "l.txt"
    lengths = [30000, 9000, 4000, 700, 300, 12000]
    p.write_text("\n".join(map(str, lengths)))
    for version, v2 in (("v1", False), ("v2", True)):
        assert main(["plan", "--lengths", str(p), "--ranks", "8", "--preset", "qwen3-8b", "--hardware", "h100",
                     "--cost-model", version, "--json"]) == 0
        got = _json.loads(capsys.readouterr().out)["makespan"]
        want = plan_batch(lengths, num_ranks=8, cost_model=CostModel.preset("qwen3-8b", "h100", v2=v2)).makespan
        assert got == pytest.approx(want, rel=1e-12)
    cost = tmp_path / "c.json"
    CostModel.preset("qwen3-8b", "h100").save(cost)
    assert main(["plan", "--lengths", str(p), "--ranks", "8", "--cost", str(cost), "--cost-model", "v1"]) == 2


def test_plan_robust_tol_reaches_the_planner(capsys, lengths_file):
    """`--robust-tol` is the robust mode of fcp (fcp_data.plan.robust): the CLI's plan equals plan_batch(...,
    robust_tol=0.05) on the same inputs group for group, and out-of-range values are one line and exit 2."""
    from fcp_data.plan import plan_batch
    from fcp_data.presets import preset_cost_model

    rc, out, _ = _run(capsys, ["plan", "--lengths", str(lengths_file), "--ranks", "16", *PRESET, "--json",
                               "--robust-tol", "0.05"])
    assert rc == 0
    got = Plan.from_dict(json.loads(out))
    lengths = np.loadtxt(lengths_file, dtype=np.int64)
    ref = plan_batch(lengths, num_ranks=16, cost_model=preset_cost_model("Qwen3-8B", "h100"), robust_tol=0.05)
    strip = [[(g.ranks, g.seq_ids, g.time) for g in mb.groups] for mb in ref.micro_batches]
    assert [[(g.ranks, g.seq_ids, g.time) for g in mb.groups] for mb in got.micro_batches] == strip
    for bad in ("-0.1", "1", "x"):
        with pytest.raises(SystemExit) as exc:  # argparse's own exit for a bad option value
            main(["plan", "--lengths", str(lengths_file), "--ranks", "16", *PRESET, "--robust-tol", bad])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "--robust-tol" in err and err.count("\n") == 1 and err.startswith("fcp plan: error:")
