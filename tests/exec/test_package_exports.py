"""``fcp_exec``'s package exports load on first access (``fcp_exec/__init__.py``), so the torch-free modules the
command line reads (``fcp_exec.names``, ``fcp_exec.train_config``) import without torch; every exported name is still
the object it was when the package imported them eagerly — ``fcp_exec.ring_attention`` the function, not the
submodule of the same name, whichever of the two was imported first. Checked in fresh interpreters (this process
has torch loaded)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_CHECK = textwrap.dedent("""
    import sys, types
    import fcp_exec.names, fcp_exec.train_config
    assert "torch" not in sys.modules, "a torch-free module of fcp_exec imported torch"
    if FIRST == "submodule":
        import fcp_exec.ring_attention
    from fcp_exec import ring_attention
    import fcp_exec
    from fcp_exec.ring_attention import ring_attention as function
    assert ring_attention is function and isinstance(function, types.FunctionType), ring_attention
    assert fcp_exec.ring_attention is function
    import fcp_exec.step, fcp_exec.vision_exchange, fcp_data.layout
    homes = {"step": fcp_exec.step, "vision_exchange": fcp_exec.vision_exchange, "layout": fcp_data.layout}
    for name in fcp_exec.__all__:
        value = getattr(fcp_exec, name)
        assert callable(value) and not isinstance(value, types.ModuleType), name
    assert fcp_exec.train_step is fcp_exec.step.train_step and fcp_exec.zigzag_index is fcp_data.layout.zigzag_index
    try:
        fcp_exec.no_such_name
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name resolved")
    print("ok")
""")


@pytest.mark.parametrize("first", ["package", "submodule"])
def test_exports_are_lazy_and_keep_their_objects(first):
    r = subprocess.run([sys.executable, "-c", f"FIRST = {first!r}\n" + _CHECK], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-2000:] + r.stderr[-3000:]
