"""Bad inputs to `fcp plan / compare / simulate / presets / index` found in review: each must print one line
`fcp <cmd>: error: ...` on stderr, nothing on stdout, and exit 2 — never a traceback.

A failure means a user hits a traceback, a silently wrong result, or an unhelpful message for that input.
"""

from __future__ import annotations

import re

import pytest

from fcp_data.cli import main

PRESET = ["--preset", "qwen3-8b", "--hardware", "h100"]


def _run(capsys, argv):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(capsys, argv, match):
    rc, out, err = _run(capsys, argv)
    assert rc == 2, (rc, out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith(f"fcp {argv[0]}: error:"), err
    assert re.search(match, err), err
    return err


@pytest.fixture
def lengths(tmp_path):
    p = tmp_path / "l.txt"
    p.write_text("100\n200\n300\n")
    return p


def test_cost_json_that_is_a_directory(capsys, tmp_path, lengths):
    """--cost pointing at a folder was an IsADirectoryError traceback."""
    _one_line_error(capsys, ["plan", "--lengths", str(lengths), "--ranks", "4", "--cost", str(tmp_path)],
                    "is a directory")


def test_lengths_that_are_a_directory_or_binary(capsys, tmp_path):
    """A folder was reported as 'not found'; a binary file gave a bare codec error without the file name."""
    bad = tmp_path / "bin.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    for cmd in ("plan", "compare"):
        _one_line_error(capsys, [cmd, "--lengths", str(tmp_path), "--ranks", "4", *PRESET], "is a directory")
        _one_line_error(capsys, [cmd, "--lengths", str(bad), "--ranks", "4", *PRESET], r"bin\.txt: not a text file")


def test_simulate_plot_path_checked_before_simulating(capsys, tmp_path, lengths):
    """A bad --plot target used to fail only after every solver had run (or, for a folder, wrote FOLDER.png and
    claimed to have written FOLDER)."""
    base = ["simulate", "--lengths", str(lengths), "--ranks", "4", "--global-batch-size", "2", "--steps", "1",
            "--no-progress", *PRESET, "--plot"]
    _one_line_error(capsys, base + [str(tmp_path / "missing" / "x.png")], "does not exist")
    _one_line_error(capsys, base + [str(tmp_path)], "is a directory")
    _one_line_error(capsys, base + [str(tmp_path / "x.txt")], "needs an image suffix")


def test_presets_unknown_filter_and_case(capsys):
    """`fcp presets --model nope --json` printed [] with exit 0 while the table form failed; both now list names."""
    for extra in ([], ["--json"]):
        _one_line_error(capsys, ["presets", "--model", "nope", *extra], "valid: Qwen3-1.7B")
        _one_line_error(capsys, ["presets", "--hardware", "tpu", *extra], "valid: ascend-910c")
    rc, out, _ = _run(capsys, ["presets", "--model", "QWEN3-8B", "--hardware", "H100", "--json"])
    assert rc == 0 and [r["model"] for r in __import__("json").loads(out)] == ["Qwen3-8B"]


def test_compare_time_limit_must_be_positive(capsys, lengths):
    """--time-limit -1 reached HiGHS and came back as an 'infeasible' ILP row."""
    with pytest.raises(SystemExit) as e:
        main(["compare", "--lengths", str(lengths), "--ranks", "4", *PRESET, "--ilp", "--time-limit", "-1"])
    assert e.value.code == 2 and "must be > 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["plan", "compare", "simulate", "presets", "index"])
def test_help_has_examples(capsys, cmd):
    """Every planning/index command's --help ends with worked examples."""
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    assert "examples:" in capsys.readouterr().out


def test_index_bad_inputs(capsys, tmp_path):
    """fcp index: an explicit --tokenizer that does not exist was silently replaced by the spec's own (wrong
    counts); a broken tokenizer.json, --out naming a file, and an empty folder gave tracebacks or an empty
    index with exit 0; a missing single input exited 1 as a 100 % error rate; spec names were case-sensitive."""
    from fcp_data._resources import data_path

    text = str(data_path("samples") / "text.jsonl")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": 1')
    afile = tmp_path / "afile"
    afile.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    base = ["--out", str(tmp_path / "idx"), "--no-progress"]
    _one_line_error(capsys, ["index", text, "--spec", "text", "--tokenizer", str(tmp_path / "nope.json"), *base],
                    "tokenizer .*nope.json not found")
    _one_line_error(capsys, ["index", text, "--spec", "text", "--tokenizer", str(bad), *base], "not a valid HF tokenizer")
    _one_line_error(capsys, ["index", text, "--spec", str(bad), *base], "bad.json is not valid JSON")
    _one_line_error(capsys, ["index", text, "--spec", str(tmp_path / "x.json"), *base], "spec file .* not found")
    _one_line_error(capsys, ["index", text, "--spec", "text", "--out", str(afile), "--no-progress"], "is a file")
    _one_line_error(capsys, ["index", str(empty), "--spec", "text", *base], "no samples found")
    _one_line_error(capsys, ["index", str(tmp_path / "missing.jsonl"), "--spec", "text", *base], "none of the inputs exist")
    _one_line_error(capsys, ["index", text, "--spec", "nope", *base], "unknown spec 'nope': use one of .*qwen2-vl")
    from fcp_data.specs import load_spec

    assert load_spec("QWEN2-VL").name == load_spec("qwen2-vl").name


def test_lengths_with_utf8_bom(capsys, tmp_path):
    """A lengths file saved by Excel/Windows starts with a UTF-8 BOM: '\\ufeff100' was 'not a number' and a
    csv header 'len' did not match --column len."""
    from fcp_data.workloads import load_lengths

    (tmp_path / "l.txt").write_bytes(b"\xef\xbb\xbf100\r\n200\r\n")
    (tmp_path / "l.csv").write_bytes(b"\xef\xbb\xbflen,x\r\n100,1\r\n200,2\r\n")
    assert load_lengths(tmp_path / "l.txt").tolist() == [100, 200]
    assert load_lengths(tmp_path / "l.csv", "len").tolist() == [100, 200]


def test_index_crashed_worker_is_one_line(tmp_path):
    """A worker that dies (OOM-killed) used to end `fcp index --workers 2` with a BrokenProcessPool traceback;
    now one line says to rerun with --resume, and exit code 2."""
    import os
    import subprocess
    import sys

    from fcp_data._resources import data_path
    from fcp_data.index.build import EXIT_AFTER_ENV

    shards = str(data_path("samples") / "wds" / "shard-{000000..000003}.tar")
    r = subprocess.run([sys.executable, "-m", "fcp_data.cli", "index", shards, "--spec", "text", "--out",
                        str(tmp_path / "ix"), "--workers", "2", "--no-progress"],
                       env={**os.environ, EXIT_AFTER_ENV: "1"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().endswith("--resume") and r.stderr.count("\n") == 1, r.stderr


def test_json_stdout_is_pure_with_reports(capsys, tmp_path):
    """--json output must be the only thing on stdout even when an overlong report or progress would print."""
    import json

    p = tmp_path / "l.txt"
    p.write_text("100\n999999999\n3000\n700\n")
    common = ["--lengths", str(p), "--ranks", "4", *PRESET, "--on-overlong", "truncate"]
    for argv in (["plan", *common, "--micro-batches", "auto", "--json"],
                 ["compare", *common, "--micro-batches", "auto", "--baselines", "static-cp", "--json"],
                 ["simulate", *common, "--global-batch-size", "3", "--steps", "2", "--baselines", "static-cp", "--json"],
                 ["presets", "--json"]):
        rc, out, _ = _run(capsys, argv)
        assert rc == 0 and out.endswith("\n") and out.count("\n") == 1, (argv[0], out[:200])
        json.loads(out)


def test_version_flag(capsys):
    """`fcp --version` prints the installed package version (the same as fcp_data.__version__)."""
    import fcp_data

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fcp {fcp_data.__version__}"


def test_index_summary_shows_an_example_per_error_reason(capsys, tmp_path):
    """A wrong --text-field made every sample an error; the summary gave only 'missing_field 320' and the user
    had to open errors.jsonl to learn which field was missing. Now the first error of each reason is shown."""
    from fcp_data._resources import data_path

    rc, out, err = _run(capsys, ["index", str(data_path("samples") / "text.jsonl"), "--spec", "text", "--out",
                                 str(tmp_path / "ix"), "--text-field", "body", "--no-progress"])
    assert rc == 1 and "exceeds --max-error-rate" in err
    assert "missing_field: " in out and "no string field 'body'" in out
