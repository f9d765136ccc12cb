"""The architecture rules of docs/ARCHITECTURE.md, checked on the source (``ast``, no imports executed).

- Import contract: ``fcp_data`` never imports ``fcp_exec`` or ``fcp_cli``; ``fcp_exec`` never imports ``fcp_cli``.
  Every import statement counts, including the ones inside functions (a lazy import is still a dependency).
- Size: no module over 400 lines, no function over 60 lines in ``fcp_data/`` and ``fcp_exec/``.

The checkers are tested on small synthetic sources too, so a broken checker (one that finds nothing) fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {"fcp_data": ("fcp_exec", "fcp_cli"), "fcp_exec": ("fcp_cli",)}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` / ``from … import`` statement of ``source`` names (absolute imports)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def contract_violations(package: str, files: dict[str, str]) -> list[str]:
    """``path: imports X`` for every file of ``package`` importing a package it must not."""
    bad = []
    for path, source in sorted(files.items()):
        for mod in sorted(imported_modules(source)):
            top = mod.split(".")[0]
            if top in FORBIDDEN.get(package, ()):
                bad.append(f"{path}: imports {mod}")
    return bad


def size_violations(files: dict[str, str]) -> list[str]:
    """Modules over :data:`MAX_MODULE_LINES` lines and functions over :data:`MAX_FUNCTION_LINES` lines."""
    bad = []
    for path, source in sorted(files.items()):
        n = len(source.splitlines())
        if n > MAX_MODULE_LINES:
            bad.append(f"{path}: module has {n} lines (max {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    bad.append(f"{path}:{node.lineno}: function {node.name} has {length} lines "
                               f"(max {MAX_FUNCTION_LINES})")
    return bad


def _sources(package: str) -> dict[str, str]:
    files = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in sorted((ROOT / package).rglob("*.py"))}
    assert files, f"no sources found under {package}"
    return files


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_contract(package):
    bad = contract_violations(package, _sources(package))
    assert not bad, "layer violation (see docs/ARCHITECTURE.md):\n" + "\n".join(bad)


@pytest.mark.parametrize("package", ["fcp_data", "fcp_exec"])
def test_module_and_function_sizes(package):
    bad = size_violations(_sources(package))
    assert not bad, "split these (docs/ARCHITECTURE.md, Rules):\n" + "\n".join(bad)


def test_checkers_find_violations():
    """The checkers themselves: a lazy import inside a function, a ``from`` import and a long function are found;
    relative imports and clean code are not flagged."""
    lazy = "def f():\n    from fcp_exec.launch import launch\n    return launch\n"
    assert contract_violations("fcp_data", {"a.py": lazy}) == ["a.py: imports fcp_exec.launch"]
    assert contract_violations("fcp_data", {"b.py": "import fcp_cli.main as m\n"}) == ["b.py: imports fcp_cli.main"]
    assert contract_violations("fcp_exec", {"c.py": "from fcp_data.plan import plan_batch\nfrom . import x\n"}) == []
    long_fn = "def g():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "    return x\n"
    assert size_violations({"d.py": long_fn}) == [f"d.py:1: function g has {MAX_FUNCTION_LINES + 2} lines (max 60)"]
    assert size_violations({"e.py": "x = 1\n" * (MAX_MODULE_LINES + 1)}) == ["e.py: module has 401 lines (max 400)"]
    assert size_violations({"f.py": "def h():\n    return 1\n"}) == []
