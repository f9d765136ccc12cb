"""The benchmark scripts' command lines keep fcp's error contract: a bad value is one line on stderr and exit 2, before
any work starts (a missing workload file was a traceback, after minutes of planning in one script; ``--steps -1`` and
``--workers -1`` ran on, or began installing torch; ``--only nosuch`` printed nothing and exited 0), and an error
about the user's input found later is one line and exit 2 too (``benchmarks/_args.run``), not a traceback.

Every script of ``benchmarks/`` and ``benchmarks/paper/`` that runs as ``__main__`` is imported here, in this one
process (no subprocess per script), and its ``build_parser()`` read, so a new option is checked too: each value of
HOSTILE that the option's type cannot take must be refused, its help must say what the option is and its default.
Then the cases a review of the benchmarks reproduced, one by one. A script is skipped only where an optional
dependency of its module is missing here."""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.relative_to(BENCH).as_posix() for p in [*BENCH.glob("*.py"), *BENCH.glob("paper/*.py")]
                 if '__name__ == "__main__"' in p.read_text(encoding="utf-8"))
HOSTILE = ["", " ", "-1", "0", "nan", "inf", "-inf", "abc", "1e400", "99999999999999999999", "1.5"]
# what an option's type takes of HOSTILE (every other value must be refused); an option without one of these types or
# choices fails the test: a new type needs its line here
TAKES = {
    "positive_int": set(), "count": {"0"},
    "positive_float": {"1.5", "99999999999999999999"}, "nonnegative_float": {"0", "1.5", "99999999999999999999"},
    "existing_file": set(), "existing_dir": set(), "interpreter": set(),  # run in an empty folder: nothing exists
    "positive_int_list": set(), "count_list": {"0"}, "int_pairs": set(), "fraction_list": {"0"},
    "positive_float_list": {"1.5", "99999999999999999999"}, "name_list": set(), "model_preset": set(),
    "hardware_preset": set(), "releases": set(),
}
NONEMPTY = ("nonempty", "output_dir", "output_file")  # any path or name but an empty one
# options a script requires: a valid value of each, so that the option under test is what is refused or taken
REQUIRED = {
    "gpu_check.py": ["--out", "out"], "gpu_check_hf.py": ["--out", "out"], "gpu_check_window.py": ["--out", "out"],
    "_gpu_check_ring.py": ["--rank", "0", "--world", "2", "--init", "file:///tmp/x", "--backend", "gloo", "--device",
                           "cpu", "--result", "r.json"],
}

sys.path.insert(0, str(BENCH))  # the scripts' shared helpers (_args, _alternating) and each other (gpu_check)


@functools.cache
def _module(script: str):
    """The script imported from its path, once per session; a missing optional dependency skips it."""
    name = "_bench_" + script.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses of the module look it up while it executes
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as e:
        del sys.modules[name]
        pytest.importorskip(e.name or "", reason=f"{script} needs {e.name}")
        raise
    return module


def _load(script: str):
    return _module(script)


def _parse(module, argv: list[str]) -> argparse.Namespace:
    """The script's own parse (its checks after parsing included) where it has one, else its parser's."""
    return module.parse_args(argv) if hasattr(module, "parse_args") else module.build_parser().parse_args(argv)


def _refused(module, argv: list[str], capsys) -> str:
    """The one stderr line of a refused command line (asserts exit 2 and one line)."""
    with pytest.raises(SystemExit) as e:
        _parse(module, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{Path(sys.argv[0]).name}: error: "), (argv, err)
    return lines[0]


def _options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The options a user gives (not --help, not the hidden ones a script passes to its own children)."""
    return [a for a in parser._actions if a.option_strings and a.dest != "help" and a.help != argparse.SUPPRESS]


def _accepts(action: argparse.Action, value: str) -> bool:
    if action.choices is not None:
        return value in action.choices
    type_name = getattr(action.type, "__name__", "str")
    if type_name in NONEMPTY:
        return bool(value.strip())
    assert type_name in TAKES, f"{action.option_strings}: type {type_name} is not fcp's nor benchmarks/_args'"
    return value in TAKES[type_name]


def test_every_script_with_a_command_line_is_found():
    assert len(SCRIPTS) >= 40 and "paper/run_all.py" in SCRIPTS and "bench_planner.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_refuses_what_it_cannot_take(script, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a value taken as a relative path names nothing that exists
    module = _load(script)
    parser = module.build_parser()
    from fcp_data.commands.argtypes import ArgumentParser

    assert isinstance(parser, ArgumentParser), f"{script}: not fcp's ArgumentParser (one line, exit 2)"
    base = REQUIRED.get(Path(script).name, [])
    for action in (a for a in _options(parser) if a.nargs != 0):
        opt = action.option_strings[-1]
        for value in HOSTILE:
            argv = [*base, f"{opt}={value}"]  # verbatim: "-inf" after a space would be read as an option
            if _accepts(action, value):
                assert getattr(parser.parse_args(argv), action.dest) is not None, (script, argv)
            else:
                assert opt in _refused(module, argv, capsys), (script, argv)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_says_what_it_is_and_its_default(script):
    parser = _load(script).build_parser()
    formatter = parser._get_formatter()
    bare = [a.option_strings[-1] for a in _options(parser) if not (a.help or "").strip()]
    assert not bare, f"{script}: options without --help text: {bare}"
    silent = [a.option_strings[-1] for a in _options(parser)
              if a.nargs != 0 and not a.required and "default" not in formatter._get_help_string(a).lower()]
    assert not silent, f"{script}: options whose --help does not state the default: {silent}"
    assert all(a.option_strings[-1] in parser.format_help() for a in _options(parser))


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_defaults_are_a_valid_command_line(script, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    module = _load(script)
    try:
        _parse(module, REQUIRED.get(Path(script).name, []))
    except SystemExit:
        err = capsys.readouterr().err
        if "wikipedia_flexsp.txt" in err or "shared/workloads" in err:
            pytest.skip(f"the shared workloads are not next to the repository here: {err.strip()}")
        raise AssertionError(f"{script} refuses its own defaults: {err}") from None


@pytest.mark.parametrize("script", SCRIPTS)
def test_main_runs_with_the_error_contract(script):
    """``if __name__ == "__main__":`` hands ``main`` to ``benchmarks/_args.run`` (a late ValueError/OSError is one line
    and exit 2), and the script has ``build_parser`` (read above)."""
    tree = ast.parse((BENCH / script).read_text(encoding="utf-8"))
    blocks = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert len(blocks) == 1, script
    calls = [ast.unparse(c.func) for c in ast.walk(blocks[0]) if isinstance(c, ast.Call)]
    assert any(re.search(r"(^|\.)run$", c) for c in calls), f"{script}: __main__ calls {calls}, not _args.run"


NOFILE, NODIR = "/nonexistent.txt", "/nonexistent"

# found by a review of the benchmarks: each a traceback, a silent long run, or an exit 0 that did nothing
REVIEWED = [
    # a missing file: a traceback (bench_placement_packing.py after minutes of planning)
    ("bench_planner.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("bench_sampler.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("bench_sampler_len.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("bench_collator.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("bench_placement_packing.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("bench_plan_robustness.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("bench_hf_presets.py", ["--workload", NOFILE], "--workload: /nonexistent.txt: no such file"),
    ("e2e_cpu.py", ["--cost", "/nonexistent.json"], "--cost: /nonexistent.json: no such file"),
    ("bench_worker_start.py", ["--config", "/nonexistent.json"], "--config: /nonexistent.json: no such file"),
    ("fork_deadlock.py", ["--python", "/nonexistent/python"], "--python: /nonexistent/python: no such file"),
    ("paper/run_all.py", ["--workload-dir", NODIR], "--workload-dir: /nonexistent: no such folder"),
    ("paper/video_workloads.py", ["--video-dir", NODIR], "--video-dir: /nonexistent: no such folder"),
    # an unknown name: a traceback (a bare KeyError in bench_hf_presets.py)
    ("bench_sampler.py", ["--model", "nosuch"], "unknown model preset 'nosuch'"),
    ("bench_sampler.py", ["--hardware", "nosuch"], "unknown hardware preset 'nosuch'"),
    ("bench_hf_presets.py", ["--models", "nosuch"], "--models: unknown model"),
    ("gpu_overhead.py", ["--preset", "nosuch"], "--preset: invalid choice: 'nosuch'"),
    ("bench_compile.py", ["--backend", "nosuch"], "--backend: invalid choice: 'nosuch'"),
    ("hsdp_probe.py", ["--dtypes", "nosuch"], "--dtypes: unknown dtype 'nosuch'"),
    ("fuzz_cli.py", ["--areas", "nosuch"], "--areas: unknown area 'nosuch'"),
    ("fuzz_cli.py", ["--commands", "nosuch"], "--commands: unknown command 'nosuch'"),
    ("exit_probe.py", ["--example", "nosuch.py"], "--example: invalid choice: 'nosuch.py'"),
    ("gpu_check.py", ["--out", "out", "--sections", "nosuch"], "--sections: unknown section 'nosuch'"),
    # negative or zero counts: tracebacks, or long runs (torch_compat.py began installing torch)
    *[(script, argv, f"argument {argv[0]}: must be an integer in [") for script, argv in [
        ("bench_planner.py", ["--reps", "-1"]), ("bench_auto_tight.py", ["--instances", "-1"]),
        ("bench_index.py", ["--num-videos", "-1"]), ("bench_index.py", ["--workers", "0"]),
        ("bench_groups.py", ["--world", "-1"]), ("bench_ring.py", ["--tokens", "-1"]), ("bench_ring.py", ["--iters", "-1"]),
        ("bench_window.py", ["--tokens", "-5"]), ("bench_window_halo.py", ["--tokens", "-5"]),
        ("bench_hf_presets.py", ["--steps", "-1"]), ("bench_hf_trainer.py", ["--nproc", "0"]),
        ("bench_megatron_data.py", ["--docs", "-1"]), ("bench_processor_samples.py", ["--rows", "-1"]),
        ("bench_sft_index.py", ["--conversations", "-1"]), ("bench_sft_step.py", ["--nproc", "-1"]),
        ("bench_skip_agreement.py", ["--docs", "-1"]), ("bench_sampler.py", ["--steps", "-1"]),
        ("paper/run_all.py", ["--steps", "-1"]), ("torch_compat.py", ["--workers", "-1"]),
        ("bench_hf_step.py", ["--nproc", "-1"]), ("e2e_cpu.py", ["--rounds", "-1"]), ("bench_compile.py", ["--steps", "-1"]),
    ]],
    ("bench_collator.py", ["--future-tokens", "-1"], "--future-tokens: every value must be an integer in [0, "),
    # an unknown section: exit 0 with nothing done, or an empty report
    ("bench_planner.py", ["--only", "nosuch"], "--only: unknown section 'nosuch'; valid: latency, scaling, quality"),
    ("paper/run_all.py", ["--only", "nosuchexp", "--out", "r.md"], "'nosuchexp' matches no experiment"),
    # an option that --collator-only ignored (exit 0)
    ("bench_collator.py", ["--model", "nosuch", "--collator-only"], "unknown model preset 'nosuch'"),
    ("bench_collator.py", ["--model", "Qwen3-8B", "--collator-only"], "--model set the DataLoader part, which "
                                                                       "--collator-only skips"),
    # a smoke run overwrote the committed report docs/EVALUATION.md
    ("paper/run_all.py", ["--quick"], "--quick needs --out FILE: the default is the committed report docs/EVALUATION.md"),
    ("paper/run_all.py", ["--only", "Figure 5"], "--only needs --out FILE"),
]


@pytest.mark.parametrize("script, argv, says", REVIEWED, ids=[f"{s} {' '.join(a)}" for s, a, _ in REVIEWED])
def test_what_the_review_found_is_one_line(script, argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert says in _refused(_load(script), argv, capsys)


def test_run_all_takes_a_smoke_run_with_its_own_out_and_keeps_the_default_for_the_report(tmp_path):
    module = _load("paper/run_all.py")
    args = module.parse_args(["--quick", "--only", "figure 5,tables 4", "--out", str(tmp_path / "e.md")])
    assert args.out == tmp_path / "e.md"
    assert module._selected(args.only) == ["Figure 5 (scaling)", "Tables 4-5 (robustness)"]
    assert module.parse_args([]).out == ROOT / "docs" / "EVALUATION.md"
    assert module._selected(None) == list(module.NAMES)


def test_the_profiler_options_beside_a_cost_file_are_refused(tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text("{}")
    line = _refused(_load("e2e_cpu.py"), ["--cost", str(cost), "--profile-reps", "2"], capsys)
    assert "--profile-reps set the profiler, which --cost" in line
    args = _load("e2e_cpu.py").parse_args([])
    assert (args.profile_lens, args.profile_reps) == ([256, 512, 1024, 2048, 4096], 3)


def test_a_later_user_error_is_one_line_and_a_bug_keeps_its_traceback(capsys):
    run = _load("bench_planner.py").run  # benchmarks/_args.run, as every script's __main__ calls it

    def user_error():
        raise ValueError("bad lengths file\nline 3: 'x'")

    with pytest.raises(SystemExit) as e:
        run(user_error, prog="bench_x.py")
    assert e.value.code == 2
    assert capsys.readouterr().err == "bench_x.py: error: bad lengths file; line 3: 'x'\n"
    with pytest.raises(SystemExit) as e:
        run(lambda: 0, prog="bench_x.py")
    assert e.value.code == 0
    with pytest.raises(KeyError):
        run(lambda: {}["bug"], prog="bench_x.py")
    with pytest.raises(SystemExit) as e:  # the GPU checks: exit 1 is a failed check, a bug of the script exit 2
        run(lambda: {}["bug"], prog="bench_x.py", bug_status=2)
    assert e.value.code == 2 and "KeyError: 'bug'" in capsys.readouterr().err


# scripts whose module did not import torch before (their heavy imports are inside main): importing stays cheap
NO_TORCH = ["bench_auto_tight.py", "bench_compile.py", "bench_frozen_heap.py", "bench_hf_presets.py", "bench_hf_step.py",
            "bench_hf_trainer.py", "bench_host_memory.py", "bench_placement_packing.py", "bench_plan_quality.py",
            "bench_plan_robustness.py", "bench_planner.py", "bench_router_loss.py", "bench_sampler.py",
            "bench_sampler_len.py", "bench_search_escalation.py", "bench_sft_step.py", "bench_skip_agreement.py",
            "bench_vision_split.py", "bench_worker_start.py", "e2e_cpu.py", "exit_probe.py", "fork_deadlock.py",
            "fuzz_cli.py", "ring_vs_dp_check.py", "torch_compat.py", "paper/run_all.py", "paper/video_workloads.py"]


def test_importing_a_script_and_building_its_parser_does_not_import_torch():
    """One interpreter for all of them (torch once loaded would hide the next one's import)."""
    code = ("import importlib.util, sys\nsys.path.insert(0, sys.argv[1])\nfor i, s in enumerate(sys.argv[2:]):\n"
            "    spec = importlib.util.spec_from_file_location(f'_b{i}', f'{sys.argv[1]}/{s}')\n"
            "    m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m)\n"
            "    m.build_parser().format_help()\n"
            "    assert 'torch' not in sys.modules, s\n")
    r = subprocess.run([sys.executable, "-c", code, str(BENCH), *NO_TORCH], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
