"""The forms every kernel test runs a kernel in: as plain Python (so the comparison holds without numba) and, when
numba is installed, compiled for its signature — ``[(name, function), ...]`` for ``pytest.mark.parametrize``."""

from __future__ import annotations

from fcp_data.jit import compiled


def kernel_variants(fn, signature: str) -> list:
    out = [("python", fn)]
    fast = compiled(fn, signature)
    if fast is not None:
        out.append(("numba", fast))
    return out
