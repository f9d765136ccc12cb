"""Every option of the planning commands (``fcp plan``, ``compare``, ``simulate``) and of ``fcp index``, read from their parsers — so an
option added later is fuzzed too — given hostile values one at a time on an otherwise valid command line: each run
ends in success or in one line on stderr with exit 2, never a traceback, a hang, another exit code or output on
stdout before the error (``fcp index`` may also exit 1: the error rate over ``--max-error-rate``, e.g. a
``--text-field`` no line has). ``benchmarks/fuzz_cli.py`` runs the same idea over ``train`` and ``profile`` too and
over damaged length indexes, in child processes with a time limit; it is too slow for the suite."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from fcp_cli.main import build_parser, main

HOSTILE = ["", "-1", "0", "nan", "inf", "1e400", "99999999999999999999", "abc", "MISSING", "DIR", "BIN",
           "BADJSON", "1.5", ",", "\x00", "é"]
COMMANDS = {
    "plan": ["--lengths", "L", "--ranks", "4", "--preset", "Qwen3-8B", "--hardware", "h100"],
    "compare": ["--lengths", "L", "--ranks", "4", "--preset", "Qwen3-8B", "--hardware", "h100"],
    "simulate": ["--lengths", "L", "--ranks", "4", "--preset", "Qwen3-8B", "--hardware", "h100",
                 "--global-batch-size", "4", "--steps", "2", "--no-progress"],
    "index": ["IN", "--spec", "text", "--out", "OUT", "--no-progress"],
}
SKIP = {"--help", "--debug", "--json", "--no-progress"}  # no value, or what only changes the output's format


def _value_options(command: str) -> list[str]:
    parser = build_parser(command).commands[command]
    return sorted(a.option_strings[-1] for a in parser._actions
                  if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction)
                  and a.option_strings[-1] not in SKIP)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "L.txt").write_text("100\n2000\n300\n5000\n")
    (d / "adir").mkdir()
    (d / "bin.dat").write_bytes(bytes(range(256)))
    (d / "bad.json").write_text('{"alpha1": ')
    (d / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": "a b c " * i}) + "\n" for i in range(1, 4)))
    # MISSING: a path in a folder that does not exist, inside the test's folder (removed before each run: as root,
    # `fcp index --out /nonexistent/x` rightly creates it, and a later run would find it there)
    return {"IN": str(d / "in.jsonl"), "OUT": str(d / "out"), "L": str(d / "L.txt"), "DIR": str(d / "adir"),
            "BIN": str(d / "bin.dat"), "BADJSON": str(d / "bad.json"), "MISSING": str(d / "missing" / "x"), "dir": d}


def _fresh(files, monkeypatch):
    """An empty working directory, an empty DIR and no MISSING for each run: what one run writes (``index --out abc``
    is ``./abc``; as root ``--out MISSING`` creates it) must not become a valid input of the next."""
    for d in (files["dir"] / "cwd", files["dir"] / "missing", files["DIR"]):
        shutil.rmtree(d, ignore_errors=True)
    (files["dir"] / "cwd").mkdir()
    (files["dir"] / "adir").mkdir()
    monkeypatch.chdir(files["dir"] / "cwd")
    return files["dir"] / "cwd"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_with_hostile_values(command, files, capsys, monkeypatch):
    monkeypatch.chdir(files["dir"])  # a value taken as an output path lands in the test's folder
    options = _value_options(command)
    assert len(options) >= 15, options  # the parser was read, not an empty list
    base = [files.get(a, a) for a in COMMANDS[command]]
    assert main([command, *base]) == 0  # the command line the values are put into is valid
    capsys.readouterr()
    bad, tried, outcomes = [], 0, {0: 0, 2: 0}
    for opt in options:
        for raw in HOSTILE:
            value = files.get(raw, raw)
            argv = [command, *base]
            if opt in argv:
                argv[argv.index(opt) + 1] = value
            else:
                argv += [opt, value]
            if opt == "--index":  # one workload source at a time
                i = argv.index("--lengths")
                del argv[i:i + 2]
            tried += 1
            cwd = _fresh(files, monkeypatch)
            try:
                rc = main(argv)
            except SystemExit as e:  # argparse's own usage errors
                rc = e.code
            except Exception as e:  # noqa: BLE001 — an exception out of main is what this test looks for
                rc = f"raised {type(e).__name__}: {e}"
            out, err = capsys.readouterr()
            lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
            if rc == 2 and (out or len(lines) != 1 or "Traceback" in err):
                bad.append((opt, raw, "exit 2 but not one line", err[-300:]))
            elif rc not in (0, 2) and not (command == "index" and rc == 1 and "exceeds --max-error-rate" in err):
                bad.append((opt, raw, f"exit {rc}", err[-300:]))
            else:
                outcomes[rc] = outcomes.get(rc, 0) + 1
            if (cwd / "manifest.json").exists():
                bad.append((opt, raw, "an index written into the working directory itself", ""))
    assert not bad, f"{len(bad)} of {tried} cases misbehaved: {bad[:5]}"
    assert tried == len(options) * len(HOSTILE) and min(outcomes.values()) >= 1, outcomes  # both ends reached
