"""The solver registry (issue 12): a solver added with ``register_solver`` — in-process or by a plugin module named
in ``FCP_SOLVER_PLUGINS`` — reaches ``plan_batch``, ``fcp plan``, ``fcp compare``, ``fcp simulate`` (its degree
sweep too), ``fcp train --planner`` and ``FCPSampler``, and every plan it returns is checked.

The toy solvers here are references themselves: "one-ring" puts the whole micro-batch on one ring of all ranks,
so its time is the §4 formula computed by hand below; "round-robin" deals sequences to ``N/d`` rings of degree
``d``. A failure means adding a solver needs edits outside the registry again, a plugin is not seen by a
command, or a broken plugin plan (a sequence lost, memory exceeded, ranks overlapping, times off the cost
model) could reach the executor without an error naming the solver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fcp_cli.main import main
from fcp_data.cost import CostModel
from fcp_data.plan import (CPGroup, InvalidPlanError, MicroBatchPlan, SOLVER_NAMES, SOLVERS, get_solver, plan_batch,
                           register_solver, solver_names, unregister_solver)
from fcp_data.plan.placement import placed_times

CM = CostModel(alpha1=2e-9, alpha2=1e-4, alpha3=3e5, beta1=0.01, beta2=0.02, bandwidth_intra=1e11,
               bandwidth_inter=1.2e10, ranks_per_node=4, tokens_per_rank=8192)
LENGTHS = [9000, 4000, 2500, 700, 300, 60]

# The plugin module, as a user would write it: one function and one register_solver call.
PLUGIN = textwrap.dedent('''
    import numpy as np
    from fcp_data.cost import sequence_terms
    from fcp_data.plan import CPGroup, MicroBatchPlan, register_solver
    from fcp_data.plan.placement import placed_times

    def one_ring(lengths, etas, num_ranks, cost_model, *, visual=None):
        """Every sequence of the micro-batch on one ring of all ranks (0..N-1)."""
        s, q, b, v = sequence_terms(lengths, etas, visual)
        if s.sum() > num_ranks * cost_model.tokens_per_rank:
            raise ValueError("the micro-batch does not fit on one ring")
        ranks = tuple(range(num_ranks))
        t = float(placed_times([s.sum()], [q.sum()], [ranks], cost_model, [b.sum()], [v.sum()])[0])
        return MicroBatchPlan(groups=(CPGroup(ranks=ranks, seq_ids=range(len(s)), time=t),), makespan=t), None

    register_solver("one-ring", one_ring, help="toy: every sequence on one ring of all ranks")
''')


def _hand_time(lengths, num_ranks: int, etas=None) -> float:
    """DESIGN §4 on one ring of ranks 0..N-1, written out (v2 terms are 0 in CM)."""
    s = np.asarray(lengths, dtype=np.float64)
    e = np.zeros_like(s) if etas is None else np.asarray(etas, dtype=np.float64)
    d, S, Q = num_ranks, s.sum(), ((1 + e) * s * s).sum()
    v = CM.bandwidth_intra if num_ranks <= CM.ranks_per_node else CM.bandwidth_inter
    A = CM.alpha1 * Q / d
    C = A + CM.alpha2 * S / d + CM.beta1
    X = 0.0 if d == 1 else CM.alpha3 * S * (d - 1) / d / v
    M = 0.0 if d == 1 else X + CM.beta2
    return C + M - min(A, X)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """``toy_fcp_plugin`` importable and named in FCP_SOLVER_PLUGINS; unregistered and forgotten afterwards."""
    (tmp_path / "toy_fcp_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("FCP_SOLVER_PLUGINS", "toy_fcp_plugin")
    yield tmp_path
    monkeypatch.delenv("FCP_SOLVER_PLUGINS")
    if "one-ring" in SOLVER_NAMES:
        unregister_solver("one-ring")
    sys.modules.pop("toy_fcp_plugin", None)


@pytest.fixture
def toys():
    """Register solvers for one test; every name registered through it is unregistered afterwards."""
    names: list[str] = []

    def add(name, fn, **kw):
        spec = register_solver(name, fn, help=kw.pop("help", f"toy {name}"), **kw)
        names.append(name)
        return spec

    yield add
    for n in names:
        if n in SOLVER_NAMES:
            unregister_solver(n)


def _files(tmp_path):
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(map(str, LENGTHS)) + "\n")
    cost = tmp_path / "cost.json"
    CM.save(cost)
    return str(lengths), str(cost)


def test_plugin_solver_in_fcp_compare_subprocess(tmp_path):
    """A fresh `fcp compare` process imports the plugin named in FCP_SOLVER_PLUGINS: "one-ring" runs by
    default next to fcp (neither exact nor a baseline) and its makespan is the hand-computed §4 time (rel. 1e-9)."""
    (tmp_path / "toy_fcp_plugin.py").write_text(PLUGIN)
    lengths, cost = _files(tmp_path)
    env = {**os.environ, "FCP_SOLVER_PLUGINS": "toy_fcp_plugin",
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, "-m", "fcp_cli", "compare", "--lengths", lengths, "--ranks", "4",
                        "--cost", cost, "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert list(d)[:3] == ["fcp", "fcp-dp", "one-ring"] and "static-cp" in d
    (mb,) = d["one-ring"]["micro_batches"]
    assert [g["ranks"] for g in mb["groups"]] == [[0, 1, 2, 3]]
    assert d["one-ring"]["makespan"] == pytest.approx(_hand_time(LENGTHS, 4), rel=1e-9)
    assert d["fcp"]["makespan"] <= d["one-ring"]["makespan"] * (1 + 1e-9)  # one ring is in FCP's search space


def test_plugin_solver_in_plan_simulate_and_help(plugin, capsys):
    """In-process through `main`: the plugin loads before the parser, so `--solver one-ring` is a valid choice,
    `--help` lists it, and `fcp simulate --solvers one-ring` reports, for every drawn step, the sum over
    micro-batches of the hand-computed one-ring time (rel. 1e-9)."""
    from fcp_data.workloads import draw_batches

    lengths, cost = _files(plugin)
    assert main(["plan", "--lengths", lengths, "--ranks", "8", "--cost", cost, "--solver", "one-ring", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["solver"] == "one-ring" and d["makespan"] == pytest.approx(_hand_time(LENGTHS, 8), rel=1e-9)
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "toy: every sequence on one ring of all ranks" in capsys.readouterr().out
    argv = ["simulate", "--lengths", lengths, "--ranks", "4", "--global-batch-size", "4", "--steps", "3", "--seed", "5",
            "--cost", cost, "--solvers", "one-ring,static-cp", "--json", "--no-progress"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["fcp", "one-ring", "static-cp"]
    L = np.array(LENGTHS)
    for step, ids in zip(out["one-ring"]["steps"], draw_batches(len(L), 4, 3, 5)):
        plan = plan_batch(L[ids], num_ranks=4, cost_model=CM, solver="one-ring", micro_batches="auto")
        want = sum(_hand_time(L[ids][list(mb.seq_ids)], 4) for mb in plan.micro_batches)
        assert step == pytest.approx(want, rel=1e-9)


def test_fixed_degree_solver_sweep_and_train_planner(toys, tmp_path, capsys):
    """A fixed-degree toy ("round-robin": sequences dealt to N/d rings of degree d) gets simulate's degree sweep
    (the reported degree is the argmin of the per-degree means computed here with plan_batch) and
    `fcp train --planner round-robin:2` syntax; a flexible solver with a degree is refused."""
    from fcp_exec.train import parse_planner
    from fcp_data.workloads import draw_batches

    def round_robin(lengths, etas, num_ranks, cost_model, *, degree=1, visual=None):
        k = num_ranks // degree
        rings = [tuple(range(g * degree, (g + 1) * degree)) for g in range(k)]
        ids = [tuple(range(g, len(lengths), k)) for g in range(k)]
        keep = [(r, i) for r, i in zip(rings, ids) if i]
        S = [float(np.sum(np.asarray(lengths)[list(i)])) for _, i in keep]
        if max(S) > degree * cost_model.tokens_per_rank:
            raise ValueError("a ring runs out of memory")
        Q = [float(np.sum(np.asarray(lengths, dtype=float)[list(i)] ** 2 * (1 + np.asarray(etas)[list(i)]))) for _, i in keep]
        t = placed_times(np.array(S), np.array(Q), [r for r, _ in keep], cost_model)
        groups = tuple(CPGroup(ranks=r, seq_ids=i, time=x) for (r, i), x in zip(keep, t))
        return MicroBatchPlan(groups=groups, makespan=float(max(t))), None

    toys("round-robin", round_robin, fixed_degree=True, options=("degree",), degree_choices=lambda n, o: (1, 2, 4))
    assert get_solver("round-robin").degrees(8) == (1, 2, 4) and "round-robin" in solver_names(fixed_degree=True)
    assert parse_planner("round-robin:2") == ("round-robin", 2)
    with pytest.raises(ValueError, match="only applies to static-cp and ulysses and round-robin"):
        parse_planner("fcp:2")
    lengths, cost = _files(tmp_path)
    assert main(["simulate", "--lengths", lengths, "--ranks", "4", "--global-batch-size", "5", "--steps", "2",
                 "--cost", cost, "--solvers", "round-robin", "--no-progress"]) == 0
    out = capsys.readouterr().out
    L, batches = np.array(LENGTHS), draw_batches(len(LENGTHS), 5, 2, 0)
    means = {}
    for d in (1, 2, 4):
        try:
            means[d] = sum(plan_batch(L[i], num_ranks=4, cost_model=CM, solver="round-robin", micro_batches="auto",
                                      degree=d).makespan for i in batches)
        except ValueError:
            pass
    assert f"(best fixed degree {min(means, key=means.get)})" in out.splitlines()[-1]


def test_sampler_takes_a_registered_solver_and_refuses_a_non_deterministic_one(toys):
    """FCPSampler(solver="one-ring"): every rank gets, per micro-batch, all of its sequences on ranks 0..3 at
    its own cp_rank. A solver registered deterministic=False is refused like the ILP (ranks plan on their own)."""
    from fcp_data.sampler import FCPSampler

    exec(compile(PLUGIN.replace('register_solver("one-ring", one_ring, ', 'toys("one-ring", one_ring, '),
                 "toy", "exec"), {"toys": toys})
    lengths = np.array([3000, 500, 1200, 800, 6000, 40, 700, 2100])
    for rank in range(4):
        s = FCPSampler(lengths, num_ranks=4, rank=rank, cost_model=CM, global_batch_size=8, solver="one-ring",
                       micro_batches=1)
        (lst,) = list(s)
        assert sorted(x.index for x in lst) == list(range(8))
        assert {(x.ranks, x.cp_rank) for x in lst} == {((0, 1, 2, 3), rank)}
    toys("coin", get_solver("one-ring").solve, deterministic=False)
    with pytest.raises(ValueError, match="'coin' is registered as non-deterministic"):
        FCPSampler(lengths, num_ranks=4, rank=0, cost_model=CM, global_batch_size=8, solver="coin")
    with pytest.raises(ValueError, match="time-limited"):
        FCPSampler(lengths, num_ranks=4, rank=0, cost_model=CM, global_batch_size=8, solver="ilp")


def _ring_time(lengths, ranks) -> float:
    s = np.asarray(lengths, dtype=np.float64)
    return float(placed_times([s.sum()], [(s * s).sum()], [tuple(ranks)], CM)[0])


def _missing(lengths, etas, num_ranks, cost_model, *, visual=None):  # drops the last sequence
    ids = tuple(range(len(lengths) - 1))
    t = _ring_time(np.asarray(lengths)[list(ids)], range(num_ranks))
    return MicroBatchPlan(groups=(CPGroup(ranks=range(num_ranks), seq_ids=ids, time=t),), makespan=t), None


def _overfull(lengths, etas, num_ranks, cost_model, *, visual=None):  # everything on rank 0
    t = _ring_time(lengths, (0,))
    return MicroBatchPlan(groups=(CPGroup(ranks=(0,), seq_ids=range(len(lengths)), time=t),), makespan=t), None


def _overlap(lengths, etas, num_ranks, cost_model, *, visual=None):  # two groups share rank 1
    groups = (CPGroup(ranks=(0, 1), seq_ids=(0,), time=1.0), CPGroup(ranks=(1, 2), seq_ids=range(1, len(lengths)), time=1.0))
    return MicroBatchPlan(groups=groups, makespan=1.0), None


def _no_rank(lengths, etas, num_ranks, cost_model, *, visual=None):  # a rank that does not exist
    t = _ring_time(lengths, range(1, num_ranks + 1))
    return MicroBatchPlan(groups=(CPGroup(ranks=range(1, num_ranks + 1), seq_ids=range(len(lengths)), time=t),),
                          makespan=t), None


def _fast_clock(lengths, etas, num_ranks, cost_model, *, visual=None):  # reports half the cost model's time
    t = _ring_time(lengths, range(num_ranks)) / 2
    return MicroBatchPlan(groups=(CPGroup(ranks=range(num_ranks), seq_ids=range(len(lengths)), time=t),), makespan=t), None


def _bare(lengths, etas, num_ranks, cost_model, *, visual=None):  # forgets the (plan, optimal) pair
    return _fast_clock(lengths, etas, num_ranks, cost_model)[0]


@pytest.mark.parametrize("fn,why", [
    (_missing, "sequence 5 is missing"),
    (_overfull, "more than its memory 1 × tokens_per_rank = 8192"),
    (_overlap, r"appear in two CP groups"),
    (_no_rank, "rank 8 does not exist"),
    (_fast_clock, "but the cost model gives"),
    (_bare, r"expected \(MicroBatchPlan, True\|False\|None\), got MicroBatchPlan"),
], ids=["missing", "memory", "overlap", "no-rank", "times", "bare"])
@pytest.mark.parametrize("micro_batches", [1, "auto"])
def test_invalid_plans_are_errors_naming_the_solver(toys, fn, why, micro_batches):
    """Each broken plan is a ValueError that names the solver and the broken invariant, also with
    micro_batches="auto" (whose planner reads a ValueError as "this split does not fit": a broken plan must
    not be skipped as one)."""
    toys("broken", fn)
    with pytest.raises(ValueError, match=f"solver 'broken'.*{why}"):
        plan_batch(LENGTHS, num_ranks=8, cost_model=CM, solver="broken", micro_batches=micro_batches)


def test_invalid_plan_on_the_cli_is_one_line(toys, tmp_path, capsys):
    """`fcp plan --solver broken` (an in-process registration) exits 2 with one line naming the solver."""
    toys("broken", _missing)
    lengths, cost = _files(tmp_path)
    assert main(["plan", "--lengths", lengths, "--ranks", "8", "--cost", cost, "--solver", "broken"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "solver 'broken' returned an invalid plan" in err and "missing" in err


def test_names_are_unique_unless_replaced(toys):
    """Registering an existing name (a built-in or one's own) is a ValueError; replace=True swaps the function
    and keeps the name's place in SOLVER_NAMES; unregistering removes it from every view."""
    with pytest.raises(ValueError, match="'fcp' is registered already"):
        register_solver("fcp", _missing, help="x")
    toys("dup", _overfull)
    with pytest.raises(ValueError, match="replace=True"):
        register_solver("dup", _missing, help="x")
    place = list(SOLVER_NAMES).index("dup")
    assert SOLVER_NAMES[place] == "dup" and SOLVER_NAMES + ("x",) == tuple(SOLVER_NAMES) + ("x",)  # tuple-like view
    assert ("x",) + SOLVER_NAMES == ("x",) + tuple(SOLVER_NAMES) and SOLVER_NAMES == list(SOLVER_NAMES)
    register_solver("dup", _fast_clock, help="replaced", validate=False, replace=True)
    assert list(SOLVER_NAMES).index("dup") == place and get_solver("dup").help == "replaced"
    plan = SOLVERS["dup"](LENGTHS, num_ranks=8, cost_model=CM)  # not validated: the half time goes through
    assert plan.makespan == pytest.approx(_ring_time(LENGTHS, range(8)) / 2, rel=1e-12)
    unregister_solver("dup")
    assert "dup" not in SOLVER_NAMES and "dup" not in SOLVERS
    with pytest.raises(ValueError, match="unknown solver 'dup'"):
        plan_batch(LENGTHS, num_ranks=8, cost_model=CM, solver="dup")


@pytest.mark.parametrize("kwargs,match", [
    ({"name": "a:b"}, "no ':'"),
    ({"name": "Fcp2"}, "lower-case"),
    ({"fn": lambda lengths, etas, num_ranks, cost_model: None}, "cannot be called"),
    ({"options": ("num_heads",)}, "cannot be called"),
    ({"fixed_degree": True}, "takes the option 'degree'"),
    ({"options": ("micro_batches",)}, "plan_batch's own"),
    ({"help": ""}, "one non-empty line"),
    ({"max_ranks": 0}, "max_ranks"),
])
def test_bad_registrations_are_value_errors(kwargs, match):
    """A spec that could not work is refused at registration, with the fix in the message."""
    kw = {"name": "bad-spec", "fn": _missing, "help": "x", **kwargs}
    with pytest.raises(ValueError, match=match):
        register_solver(kw.pop("name"), kw.pop("fn"), **kw)
    assert "bad-spec" not in SOLVER_NAMES


def test_time_limit_option_means_non_deterministic(toys):
    """A solver taking the whole-call time_limit must say it is not deterministic; it then gets the budget
    (a positive float no larger than the one given) like the ILP."""
    seen = []

    def timed(lengths, etas, num_ranks, cost_model, *, time_limit, visual=None):
        seen.append(time_limit)
        return _fast_clock(lengths, etas, num_ranks, cost_model)[0], True

    with pytest.raises(ValueError, match="deterministic=False"):
        register_solver("timed", timed, help="x", options=("time_limit",))
    toys("timed", timed, options=("time_limit",), deterministic=False, validate=False)
    plan_batch(LENGTHS, num_ranks=8, cost_model=CM, solver="timed", time_limit=5)
    assert len(seen) == 1 and 0 < seen[0] <= 5 and "timed" not in solver_names(deterministic=True)


def test_undeclared_options_are_type_errors():
    """Only the options a spec declares reach its solver (static-cp used to swallow any keyword silently)."""
    with pytest.raises(TypeError, match="'static-cp' does not take option.*foo; its options: degree"):
        plan_batch(LENGTHS, num_ranks=8, cost_model=CM, solver="static-cp", foo=1)
    with pytest.raises(TypeError, match="'fcp' does not take option.*degree; its options: search, robust_tol"):
        plan_batch(LENGTHS, num_ranks=8, cost_model=CM, solver="fcp", degree=2)
    with pytest.raises(TypeError, match="'megatron-dynamic' does not take option.*num_heads; its options: none"):
        plan_batch(LENGTHS, num_ranks=8, cost_model=CM, solver="megatron-dynamic", num_heads=32)


def test_broken_plugin_module_is_one_line(tmp_path, monkeypatch, capsys):
    """FCP_SOLVER_PLUGINS naming a module that does not import: exit 2, one line naming the module."""
    monkeypatch.setenv("FCP_SOLVER_PLUGINS", "no_such_fcp_plugin_module")
    assert main(["presets"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "cannot import solver plugin 'no_such_fcp_plugin_module'" in err
    monkeypatch.delenv("FCP_SOLVER_PLUGINS")
    assert "fcp" in SOLVER_NAMES  # the registry still answers once the variable is fixed
