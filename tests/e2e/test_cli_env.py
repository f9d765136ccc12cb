"""``fcp env``: the report of this machine for bug reports (fcp_exec/commands/env.py).

Reference: what this interpreter itself says — torch's version and backends, the installed distributions' metadata,
the kernel ``default_kernel("cpu")`` builds — against ``fcp env --json`` run as a real subprocess; the notes rule on
versions (outside the supported range, not tested, the Qwen2.5-VL rope releases) on versions written out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from fcp_exec.commands.env import PACKAGES, _notes

ROOT = Path(__file__).resolve().parents[2]


def _fcp(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fcp_cli", *argv], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, "FCP_JIT": "0"})


def _meta(dist: str) -> str | None:
    for name in (dist, dist.replace("-", "_")):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def test_env_json_says_what_this_interpreter_says(capsys):
    import torch
    import torch.distributed as dist

    from fcp_exec.kernels import default_kernel

    r = _fcp("env", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    env = json.loads(r.stdout)
    assert env["torch"] == torch.__version__ and env["python"] == sys.version.split()[0]
    assert env["packages"] == {d: _meta(d) for d, *_ in PACKAGES}
    assert env["kernels"]["cpu"] == repr(default_kernel("cpu"))
    assert env["devices"]["backends"]["gloo"] == dist.is_gloo_available()
    assert (env["devices"]["cuda"] is None) == (not torch.cuda.is_available())
    assert isinstance(env["notes"], list) and env["settings"]["FCP_JIT"] == "0"  # set for the subprocess below
    assert env["settings"]["torch_threads"].isdigit()
    from fcp_cli.main import main  # the human form in this process (the subprocess above is the console entry)

    assert main(["env"]) == 0
    human = capsys.readouterr().out
    assert human.startswith(f"fcp {env['fcp']}  Python {env['python']}") and f"torch {torch.__version__}" in human
    for d, *_ in PACKAGES:
        assert any(line.split()[:2] == [d, env["packages"][d] or "-"] for line in human.splitlines()), d


@pytest.mark.parametrize("pkgs, want", [
    ({"transformers": "4.57.1"}, ["transformers 4.57.1 is outside the supported range >=5.18,<6"]),
    ({"transformers": "6.0.0"}, ["transformers 6.0.0 is outside the supported range >=5.18,<6"]),
    ({"transformers": "5.21.0"}, ["transformers 5.21.0 was not tested with fcp (tested: 5.18, 5.20, 5.23, 5.24, 5.25)"]),
    ({"transformers": "5.17.0"}, ["transformers 5.17.0 is outside the supported range >=5.18,<6"]),
    ({"transformers": "5.20.2"}, []),
    ({"transformers": "5.25.1"}, []),
    ({"megatron-core": "0.12.0"}, ["megatron-core 0.12.0 is outside the supported range >=0.13: expect errors"]),
    ({"megatron-core": "0.16.1"}, []),
    ({"flash-attn": "2.5.9"}, ["flash-attn 2.5.9 is outside the supported range >=2.6"]),
])
def test_notes_on_versions(pkgs, want):
    devices = {"cuda": None, "npu": None, "npu_error": "not installed"}
    notes = _notes({"numba": "0.60.0", **pkgs}, devices)
    assert len(notes) == len(want) and all(n.startswith(w) for n, w in zip(notes, want)), notes


def test_notes_on_missing_pieces():
    cuda = {"cuda": {"count": 1}, "npu": None, "npu_error": "ImportError: libhccl.so: cannot open shared object file"}
    notes = _notes({"torch-npu": "2.5.1", "numba": None}, cuda)
    assert [n.split(":")[0].split(" (")[0] for n in notes] == [
        "CUDA without flash-attn", "torch_npu is installed but does not load", "numba not installed"], notes
    assert "libhccl.so" in notes[1]


def test_a_bad_option_is_one_line(capsys):
    from fcp_cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["env", "--jsn"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and "unrecognized arguments: --jsn" in err
