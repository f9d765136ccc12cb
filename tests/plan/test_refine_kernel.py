"""The compiled move loop of refinement (``fcp_data.plan.refine_kernel``, numba when installed) makes exactly the
numpy path's moves: on random plans (v1 and v2 coefficients, visual tokens, causal and full masks, runs of equal
lengths, groups across nodes, memory-tight groups) both paths return the same groups, ranks and times, bit for bit.
The kernel also runs as plain Python, so the comparison holds without numba; with numba, the compiled kernel is
compared too (and must be what refinement uses from ``JIT_MIN_WORK`` on)."""

from __future__ import annotations

import numpy as np
import pytest

import fcp_data.plan.refine as refine
from fcp_data.cost import CostModel
from fcp_data.plan.bfd import group_terms_of
from fcp_data.jit import jit_enabled
from fcp_data.plan.placement import placed_times
from fcp_data.plan.refine_kernel import SIGNATURE, refine_loop
from _kernels import kernel_variants  # tests/plan/_kernels.py
from fcp_data.plan.types import CPGroup, MicroBatchPlan


def _instance(rng: np.random.Generator):
    """A random placed plan ``(mb, lengths, etas, cost_model, visual)``, or None when the draw does not fit."""
    R, E = int(rng.choice([1, 2, 4, 8, 16])), int(rng.choice([64, 512, 4096]))
    kw = dict(alpha1=10 ** rng.uniform(-12, -8), alpha2=10 ** rng.uniform(-7, -4), alpha3=float(rng.uniform(0, 4096)),
              beta1=float(rng.uniform(0, 1e-2)), beta2=float(rng.uniform(0, 1e-2)),
              bandwidth_intra=10 ** rng.uniform(9, 11.3), bandwidth_inter=10 ** rng.uniform(8, 10.5),
              ranks_per_node=R, tokens_per_rank=E)
    if rng.random() < 0.6:
        kw.update(gamma=float(rng.uniform(0, 1e-3)) * (rng.random() < 0.7),
                  alpha_blk=10 ** rng.uniform(-9, -6) * (rng.random() < 0.7),
                  alpha_vis=10 ** rng.uniform(-8, -5) * (rng.random() < 0.7))
    cm = CostModel(**kw)
    N = int(rng.integers(2, 40))
    perm = rng.permutation(N)
    cuts = np.sort(rng.choice(np.arange(1, N), size=int(rng.integers(1, min(N, 12))), replace=False))
    rank_groups = [sorted(g.tolist()) for g in np.split(perm, cuts)]
    n = int(rng.integers(2, 120))
    L = np.full(n, int(rng.integers(1, E))) if rng.random() < 0.3 else rng.integers(1, E + 1, n)
    if rng.random() < 0.15:
        L = L * rng.uniform(0.5, 1.0, n)  # float lengths
    etas = rng.choice([0.0, 1.0, 0.5], n) if rng.random() < 0.5 else np.zeros(n)
    visual = (rng.random(n) < 0.5) * rng.integers(0, 100, n).astype(np.float64) if rng.random() < 0.5 else None
    room, seqs = [len(g) * E for g in rank_groups], [[] for _ in rank_groups]
    for i in rng.permutation(n):
        fits = [j for j in range(len(room)) if room[j] >= L[i]]
        if not fits:
            return None
        j = fits[int(rng.integers(len(fits)))]
        room[j] -= L[i]
        seqs[j].append(int(i))
    keep = [j for j in range(len(seqs)) if seqs[j]]
    S, Q, B, V = group_terms_of([seqs[j] for j in keep], L, etas, visual)
    T = placed_times(S, Q, [rank_groups[j] for j in keep], cm, B, V)
    mb = MicroBatchPlan(groups=tuple(CPGroup(ranks=tuple(rank_groups[j]), seq_ids=tuple(seqs[j]), time=float(t))
                                     for j, t in zip(keep, T)), makespan=float(T.max()))
    return mb, L, etas, cm, visual


def _key(mb: MicroBatchPlan):
    return mb.makespan, [(g.ranks, g.seq_ids, g.time) for g in mb.groups]


def _kernels():
    return kernel_variants(refine_loop, SIGNATURE)


@pytest.mark.parametrize("name,kernel", _kernels(), ids=lambda x: x if isinstance(x, str) else "")
def test_kernel_makes_the_numpy_paths_moves(monkeypatch, name, kernel):
    rng = np.random.default_rng(11)
    count = moved = 0
    while count < (300 if name == "numba" else 200):
        drawn = _instance(rng)
        if drawn is None:
            continue
        mb, L, etas, cm, visual = drawn
        monkeypatch.setattr(refine, "refine_kernel", lambda: None)
        want = refine.refine_moves(mb, L, etas, cm, visual=visual)
        monkeypatch.setattr(refine, "refine_kernel", lambda: kernel)
        monkeypatch.setattr(refine, "JIT_MIN_WORK", 0)
        got = refine.refine_moves(mb, L, etas, cm, visual=visual)
        monkeypatch.undo()
        assert _key(got) == _key(want), (name, count)
        count += 1
        moved += want is not mb
    assert moved > count // 2  # the draws refine: most plans move


@pytest.mark.skipif(not jit_enabled(), reason="numba is not installed (pip install fcp[fast]) or FCP_JIT=0")
def test_refinement_uses_the_compiled_loop_from_jit_min_work(monkeypatch):
    """With numba, refinement of a plan of ``sequences × groups ≥ JIT_MIN_WORK`` (and ≥ 2 groups) runs the compiled
    loop, and a smaller one the numpy path (threshold lowered to what the random plans reach)."""
    compiled = refine.refine_kernel()
    assert compiled is not None
    calls = []

    def spy(*args):
        calls.append(args[0].size * args[2].size)  # label: sequences, T: groups
        return compiled(*args)

    monkeypatch.setattr(refine, "refine_kernel", lambda: spy)
    monkeypatch.setattr(refine, "JIT_MIN_WORK", 300)
    rng = np.random.default_rng(5)
    sizes = []
    while len(sizes) < 60:
        drawn = _instance(rng)
        if drawn is not None:
            mb, L, etas, cm, visual = drawn
            refine.refine_moves(mb, L, etas, cm, visual=visual)
            sizes.append(L.size * len(mb.groups) if len(mb.groups) > 1 else 0)
    assert sorted(calls) == sorted(s for s in sizes if s >= 300)
    assert 0 < len(calls) < len(sizes)


def test_fcp_jit_0_turns_the_kernels_off(monkeypatch):
    from fcp_data import jit

    monkeypatch.setenv("FCP_JIT", "0")
    monkeypatch.setattr(jit, "_CACHE", {})
    assert not jit.jit_enabled()
    assert jit.compiled(refine_loop, "int64()") is None


def test_compile_kernels_command_compiles_every_kernel(capsys):
    from fcp_data.plan import compile_kernels

    assert compile_kernels.main() == 0
    out = capsys.readouterr().out
    if jit_enabled():
        listed = out[out.index("(") + 1:out.index(")")].split(", ")  # in registration (import) order
        assert sorted(listed) == ["allocate_loop", "bfd_loop", "headroom_loop", "lpt_loop", "place_loop", "refine_loop",
                                "table_loop", "time_loop"], out
    else:
        assert "numpy path" in out, out
