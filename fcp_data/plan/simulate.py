"""Simulated step times of every solver over global batches drawn from a workload (what ``fcp simulate`` prints
and the evaluation in ``benchmarks/paper`` uses): a library function, the CLI only parses and prints."""

from __future__ import annotations

import sys

import numpy as np

__all__ = ["simulate"]


def _workload(lengths, etas, visual) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The workload as checked arrays (a list is fine), by the planner's own length / η / visual checks."""
    from fcp_data.plan.inputs import validate_etas, validate_lengths, validate_visual

    arr = validate_lengths(lengths)
    return arr, None if etas is None else validate_etas(etas, arr), validate_visual(visual, arr)


def _runs(solvers, options, num_ranks: int) -> list[tuple[str, dict, bool]]:
    """``(solver, options, swept)`` for every run: a fixed-degree solver without a ``degree`` option is swept over
    its degrees (``swept``: a degree that cannot plan every step is skipped); a given ``degree`` is kept (checked
    against the spec's degrees), as are a flexible solver's options."""
    from fcp_data.plan import get_solver

    if options is not None and not isinstance(options, dict):
        raise ValueError(f"options must be a dict {{solver: {{option: value}}}}, got {type(options).__name__}")
    runs: list[tuple[str, dict, bool]] = []
    for name in solvers:
        given = (options or {}).get(name, {})
        if not isinstance(given, dict):
            raise ValueError(f"options[{name!r}] must be a dict of solver options, got {type(given).__name__}")
        opts, spec = dict(given), get_solver(name)
        if not spec.fixed_degree:
            runs.append((name, opts, False))
        elif opts.get("degree") is None:  # no degree (or None): sweep them all
            opts.pop("degree", None)
            runs += [(name, {**opts, "degree": d}, True) for d in spec.degrees(num_ranks, opts)]
        else:
            d, valid = opts["degree"], spec.degrees(num_ranks, opts)
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) or int(d) not in valid:
                raise ValueError(f"options[{name!r}]['degree'] = {d!r} is not a degree {name} uses on {num_ranks} ranks; "
                                 f"valid: {list(valid)} (or leave it out to simulate the best)")
            runs.append((name, {**opts, "degree": int(d)}, False))
    return runs


def simulate(lengths, *, num_ranks: int, cost_model, global_batch_size: int, steps: int, seed: int,
             solvers, options=None, progress: bool = False, visual=None, etas=None):
    """``({solver: [step seconds]}, {solver: first Plan}, {solver: fixed degree or None})`` over the same
    drawn batches for every solver; ``visual``: visual tokens per workload sequence (None: text); ``etas``:
    η per workload sequence (None: all causal). A fixed-degree solver keeps one degree for the whole run (a
    Megatron/DeepSpeed job is configured once): ``options[name]["degree"]`` when given, else the degree of its sweep
    with the best mean."""
    from tqdm import tqdm

    from fcp_data.plan import plan_batch
    from fcp_data.workloads import draw_batches

    lengths, etas, visual = _workload(lengths, etas, visual)
    batches = draw_batches(len(lengths), global_batch_size, steps, seed)
    runs = _runs(solvers, options, num_ranks)
    results: list[tuple[str, dict, list[float], object]] = []
    bar = tqdm(total=steps * len(runs), desc="simulate", unit="plan", file=sys.stderr, disable=not progress)
    for name, opts, swept in runs:
        ts, first_plan, failed = [], None, None
        for b, ids in enumerate(batches):
            try:
                plan = plan_batch(lengths[ids], num_ranks=num_ranks, cost_model=cost_model, solver=name,
                                  micro_batches="auto", visual=None if visual is None else visual[ids],
                                  etas=None if etas is None else etas[ids], **opts)
            except ValueError as e:
                failed = f"{name} cannot plan step {b}: {e}"
                bar.update(steps - b)
                break
            ts.append(plan.makespan)
            first_plan = first_plan or plan
            bar.update(1)
        if failed is None:
            results.append((name, opts, ts, first_plan))
        elif not swept:
            raise ValueError(failed)
    bar.close()
    return _best(results, solvers, num_ranks)


def _best(results, solvers, num_ranks: int):
    """:func:`simulate`'s result: per solver the run of least total time (a swept solver: its best degree)."""
    times: dict[str, list[float]] = {}
    first: dict[str, object] = {}
    chosen: dict[str, dict] = {}
    for name, opts, ts, plan in results:
        if name not in times or sum(ts) < sum(times[name]):
            times[name], first[name], chosen[name] = ts, plan, opts
    missing = [n for n in solvers if n not in times]
    if missing:
        raise ValueError(f"no fixed degree of {', '.join(missing)} can plan every step on {num_ranks} ranks")
    return {n: times[n] for n in solvers}, first, {n: chosen[n].get("degree") for n in solvers}
