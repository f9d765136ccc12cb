"""Simulated step times of every solver over global batches drawn from a workload (what ``fcp simulate`` prints
and the evaluation in ``benchmarks/paper`` uses): a library function, the CLI only parses and prints."""

from __future__ import annotations

import sys

__all__ = ["simulate"]


def simulate(lengths, *, num_ranks: int, cost_model, global_batch_size: int, steps: int, seed: int,
             solvers, options=None, progress: bool = False, visual=None, etas=None):
    """``({solver: [step seconds]}, {solver: first Plan}, {solver: fixed degree or None})`` over the same
    drawn batches for every solver; ``visual``: visual tokens per workload sequence (None: text); ``etas``:
    η per workload sequence (None: all causal)."""
    from tqdm import tqdm

    from fcp_data.plan import get_solver, plan_batch
    from fcp_data.workloads import draw_batches

    options = options or {}
    batches = draw_batches(len(lengths), global_batch_size, steps, seed)
    # fixed-degree solvers keep one degree for the whole run (a Megatron/DeepSpeed job is configured once):
    # every degree of the spec's sweep is simulated and the best mean kept.
    runs: list[tuple[str, dict]] = []
    for name in solvers:
        opts = dict(options.get(name, {}))
        spec = get_solver(name)
        if spec.fixed_degree:
            runs += [(name, {**opts, "degree": d}) for d in spec.degrees(num_ranks, opts)]
        else:
            runs.append((name, opts))
    results: list[tuple[str, dict, list[float], object]] = []
    bar = tqdm(total=steps * len(runs), desc="simulate", unit="plan", file=sys.stderr, disable=not progress)
    for name, opts in runs:
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
        elif not get_solver(name).fixed_degree:
            raise ValueError(failed)
    bar.close()
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
