"""Every rank runs the same plan: a check before a step's first collective.

Each rank plans its global batches itself, from ``(seed, epoch, lengths, config)``, with no communication
(:mod:`fcp_data.sampler`). When two ranks plan differently — a dataset or index that differs between nodes (a
filter, a shuffle, a file edited on one of them), another ``global_batch_size``, seed, cost model or planner option —
their micro-batches and CP groups differ, and a rank waits in a ring transfer or an all-reduce that its peer never
starts: the job hangs until the backend's timeout (30 minutes by default) and then fails far from the cause.

The sampler stamps every micro-batch with the digest of its global batch's plan
(:func:`fcp_data.slots.plan_digest`: samples, tokens kept, micro-batches and CP groups). :func:`check_plan_agreement`,
called by ``train_step`` and ``eval_step`` on a step's first micro-batch before anything else, compares it over the
default process group with one all-reduce of two integers (the MAX of ``d`` and of ``−d``); when the digests differ,
every rank sees it in that same all-reduce, gathers the digests (one ``all_gather``) and raises
:class:`PlanMismatchError` naming the ranks that disagree and what to compare — no rank is left waiting. A batch
without a digest (built by hand: 0) is compared like any other: all zeros agree.

The same all-reduce carries a third integer: whether this rank's batch was planned for another world — the sampler's
``num_ranks`` and ``rank`` (``batch["num_ranks"]``, ``batch["sampler_rank"]``) other than the process group's size and
this process's rank (e.g. ``FCPSampler(lengths, num_ranks=64, rank=0, ...)`` copied into a 2-process job). Such a rank
would compute only the documents planned onto it and normalise by the whole global batch — a wrong loss, no error —
or wait on a peer that plans another group; every rank raises :class:`PlanMismatchError` instead. In one process
(no process group) the check is local.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["PlanMismatchError", "check_plan_agreement"]


class PlanMismatchError(RuntimeError):
    """Ranks planned a global batch differently (:mod:`fcp_exec.lockstep`)."""


def check_plan_agreement(batch: dict, device: torch.device | str = "cpu") -> None:
    """Raise :class:`PlanMismatchError` on every rank when the ranks of the default process group hold different
    plans for this global batch (``batch["plan_digest"]``) or any rank's batch was planned for another world (module
    docstring); without a process group of 2 or more ranks only that world is checked, locally."""
    grouped = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if grouped else (0, 1)
    planned = batch.get("num_ranks"), batch.get("sampler_rank")
    other_world = any(v is not None and int(v) != want for v, want in zip(planned, (world, rank)))
    if world < 2:
        if other_world:
            raise PlanMismatchError(_other_world(batch, rank, world))
        return
    digest = int(batch.get("plan_digest", 0) or 0)
    both = torch.tensor([digest, -digest, int(other_world)], dtype=torch.int64, device=device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if int(both[2]):
        raise PlanMismatchError(_other_world(batch, rank, world) if other_world else
                                "another rank's FCPSampler was built for another world than the process group's "
                                "(its error names it); leave num_ranks and rank out under torch.distributed")
    if int(both[0]) == -int(both[1]):  # max == min: every rank holds the same digest
        return
    world = dist.get_world_size()
    mine = torch.tensor([digest], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    digests = [int(t) for t in every]
    groups: dict[int, list[int]] = {}
    for rank, d in enumerate(digests):
        groups.setdefault(d, []).append(rank)
    held = "; ".join(f"ranks {_ranks(r)}: {d:016x}" for d, r in sorted(groups.items(), key=lambda kv: kv[1][0]))
    raise PlanMismatchError(
        f"epoch {batch.get('epoch')}, global batch {batch.get('global_batch')}: the ranks planned different global "
        f"batches (plan digests — {held}), so they would wait on each other's transfers; every rank must build its "
        "FCPSampler from the same data (the same index or lengths, in the same order), global_batch_size, seed, cost "
        "model and solver options — compare them between the nodes of these ranks")


def _other_world(batch: dict, rank: int, world: int) -> str:
    return (f"the FCPSampler planned this batch for rank {batch.get('sampler_rank')} of {batch.get('num_ranks')} "
            f"ranks, but this process is rank {rank} of {world}: the rank would train only the documents planned onto "
            "it (a wrong loss) or wait on peers that plan other groups — build the sampler in every process with "
            "num_ranks and rank left out (they come from torch.distributed), or the process group's own values")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}…{ranks[-1]} ({len(ranks)})"
