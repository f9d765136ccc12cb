"""Ranks that planned a global batch differently stop with one clear error instead of hanging
(``fcp_exec.lockstep.check_plan_agreement``, called by ``train_step`` / ``eval_step``).

2 real gloo processes, the real pipeline (FCPSampler → FCPDataset → FCPCollator in a DataLoader → ``train_step``
with tiny-llm, all-reduce reducer). Reference for the agreeing case: the same run's loss equal on both ranks and the
step completing; for the disagreeing cases — rank 1 with one sample's length changed (an index rebuilt on one
node), another global batch size, another seed, another cost model — every rank raises ``PlanMismatchError``
naming both ranks' digests, at the first global batch whose plans differ, within the launch's 120 s limit (without
the check the ranks wait on each other's ring transfers and all-reduces until gloo's timeout). ``plan_digest``
itself: equal for equal plans, different when any sample, token count, micro-batch or CP group differs. A sampler
built for another world than the process group's (``num_ranks=4`` on 2 processes; ``rank=0`` in both) agrees on the
digest, but would train only part of the global batch (a wrong loss, no error) or hang: every rank raises too.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data import CostModel
from fcp_data.plan.types import CPGroup, MicroBatchPlan, Plan
from fcp_data.slots import plan_digest
from fcp_exec.launch import launch

LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58]
CASES = ("agree", "lengths", "global batch size", "seed", "cost model")
WORLD_CASES = ("num_ranks 4", "rank 0 everywhere")


def _cost(tokens_per_rank: int = 64) -> CostModel:
    return CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=tokens_per_rank)


def _one_step(case: str) -> tuple[str, str]:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from fcp_data import FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.models import build_model
    from fcp_exec.step import make_reducer, train_step
    from fcp_exec.train import _forward_loss

    rank, odd = dist.get_rank(), dist.get_rank() == 1
    lengths = list(LENGTHS)
    if case == "lengths" and odd:
        lengths[5] += 3
    sampler = FCPSampler(lengths, num_ranks=4 if case == "num_ranks 4" else 2,
                         rank=0 if case == "rank 0 everywhere" else rank, global_batch_size=5 if case == "global batch size" and odd
                         else 4, seed=1 if case == "seed" and odd else 0,
                         cost_model=_cost(80 if case == "cost model" and odd else 64))
    data = [{"input_ids": (torch.arange(n) % 40) + 2} for n in lengths]
    loader = DataLoader(FCPDataset(data), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))
    model, reducer = make_reducer("allreduce", build_model("tiny-llm", seed=0, dtype=torch.float64))
    from fcp_exec.lockstep import PlanMismatchError

    batches = iter(loader)
    try:
        for _ in range(sampler.num_global_batches()):
            res = train_step(model, batches, lambda m, b: _forward_loss(m, b, False), reducer)
    except PlanMismatchError as e:
        return "mismatch", str(e)
    return "ok", repr(res.loss)


def _all_cases() -> dict:
    return {case: _one_step(case) for case in CASES + WORLD_CASES}


@pytest.fixture(scope="module")
def outcomes():
    return launch(_all_cases, 2, timeout=120.0, pg_timeout=60.0)


def test_ranks_that_plan_alike_train_without_a_word(outcomes):
    r0, r1 = (o["agree"] for o in outcomes)
    assert r0[0] == r1[0] == "ok" and r0[1] == r1[1], (r0, r1)


@pytest.mark.parametrize("case", [c for c in CASES if c != "agree"])
def test_ranks_that_plan_apart_stop_with_one_error_each(outcomes, case):
    got = [o[case] for o in outcomes]
    assert [kind for kind, _ in got] == ["mismatch", "mismatch"], got
    msg = got[0][1]
    assert got[1][1] == msg, "both ranks name the same disagreement"
    assert "the ranks planned different global batches" in msg and "ranks 0: " in msg and "ranks 1: " in msg, msg
    assert "same data (the same index or lengths" in msg, msg


@pytest.mark.parametrize("case", WORLD_CASES)
def test_a_sampler_planned_for_another_world_stops_every_rank(outcomes, case):
    got = [o[case] for o in outcomes]
    assert [kind for kind, _ in got] == ["mismatch", "mismatch"], got
    wrong = [1] if case == "rank 0 everywhere" else [0, 1]  # the ranks whose own sampler is wrong name the cause
    for r, (_, msg) in enumerate(got):
        if r in wrong:
            planned = "rank 0 of 2" if case == "rank 0 everywhere" else f"rank {r} of 4"
            assert f"planned this batch for {planned} ranks, but this process is rank {r} of 2" in msg, msg
            assert "num_ranks and rank left out" in msg, msg
        else:
            assert "another rank's FCPSampler was built for another world" in msg, msg


def test_a_sampler_for_several_ranks_in_one_process_is_refused():
    """Without a process group the check is local: a batch planned for rank 0 of 4 would train a quarter of the
    global batch and divide by all of its tokens."""
    from fcp_exec.lockstep import PlanMismatchError, check_plan_agreement

    check_plan_agreement({"plan_digest": 5, "num_ranks": 1, "sampler_rank": 0})
    check_plan_agreement({"plan_digest": 5})  # a batch built by hand: nothing to compare
    with pytest.raises(PlanMismatchError, match="planned this batch for rank 0 of 4 ranks, but this process is rank 0 "
                                                "of 1"):
        check_plan_agreement({"plan_digest": 5, "num_ranks": 4, "sampler_rank": 0})


def _plan(groups_per_mb) -> Plan:
    mbs = [MicroBatchPlan(groups=tuple(CPGroup(ranks=r, seq_ids=s, time=1.0) for r, s in mb), makespan=1.0)
           for mb in groups_per_mb]
    return Plan(num_ranks=4, solver="fcp", solve_ms=0.0, makespan=float(len(mbs)), micro_batches=tuple(mbs))


def test_the_digest_changes_with_every_part_of_the_plan():
    base = dict(epoch=0, global_batch=3, ids=[7, 2, 9], num_tokens=[10, 20, 30],
                plan=_plan([[((0, 1), (0, 1)), ((2,), (2,))]]))
    d = plan_digest(**base)
    assert d == plan_digest(**base) and 0 <= d < 2 ** 63
    changed = [dict(base, epoch=1), dict(base, global_batch=4), dict(base, ids=[7, 2, 8]),
               dict(base, num_tokens=[10, 20, 31]), dict(base, plan=_plan([[((1, 0), (0, 1)), ((2,), (2,))]])),
               dict(base, plan=_plan([[((0, 1), (0,)), ((2,), (1, 2))]])),
               dict(base, plan=_plan([[((0, 1), (0, 1))], [((2,), (2,))]])),
               dict(base, plan=_plan([[((0, 1, 2), (0, 1, 2))]]))]
    digests = {plan_digest(**c) for c in changed}
    assert len(digests) == len(changed) and d not in digests
