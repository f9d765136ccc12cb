"""Packaging (DESIGN §3): `tokenizers/` and `samples/` ship inside the wheel under `fcp_data/`, `data_path` finds
them from an installed wheel (not from the checkout or the current directory), and the repo's `tokenizers/`
folder never shadows HF `tokenizers`.

A failure means an installed fcp cannot find its specs/samples, or `import tokenizers` breaks in the repo.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_force_include_and_no_shadowing_package():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    inc = cfg["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert inc == {"tokenizers": "fcp_data/tokenizers", "samples": "fcp_data/samples"}
    assert not (REPO / "tokenizers" / "__init__.py").exists() and not (REPO / "tokenizers" / "tokenizers.py").exists()


def test_hf_tokenizers_imports_from_repo_root():
    pytest.importorskip("tokenizers")
    r = subprocess.run([sys.executable, "-c", "import tokenizers; print(tokenizers.__file__); tokenizers.Tokenizer"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "site-packages" in r.stdout and str(REPO / "tokenizers") not in r.stdout


@pytest.mark.slow
def test_wheel_contains_data_and_data_path_finds_it(tmp_path):
    """Build the wheel (pip, no deps; the build backend is fetched by pip), unzip it, and load a bundled spec from the unzipped copy
    with the current directory outside the checkout."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "-w", str(tmp_path), "--no-deps", "-q"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"wheel build unavailable here: {r.stderr.strip()[-200:]}")
    whl = next(tmp_path.glob("fcp-*.whl"))
    names = set(zipfile.ZipFile(whl).namelist())
    for need in ("fcp_data/tokenizers/tiny-bpe.json", "fcp_data/tokenizers/qwen2-vl.json",
                 "fcp_data/samples/text.jsonl", "fcp_data/samples/wds/shard-000000.tar"):
        assert need in names, need
    assert not any(n.startswith("tokenizers/") or n.startswith("samples/") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    code = ("import json, fcp_data._resources as r, fcp_data.specs as s; "
            "print(json.dumps([str(r.data_path('tokenizers')), str(r.data_path('samples')), s.load_spec('qwen2-vl').tokenizer_path]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    paths = json.loads(out.stdout)
    assert all(p.startswith(str(site / "fcp_data")) for p in paths), paths
