"""HSDP — FSDP2 over a 2-D ``(replicate, shard)`` mesh, what torchtitan's ``parallelize_fn`` builds with
``dp_replicate > 1`` — trains like the all-reduce reducer (itself equal to single-process training in
``tests/e2e/test_e2e_pipeline.py`` and ``tests/exec/test_hf_train.py``).

4 real gloo processes, the real pipeline (FCPSampler over 4 ranks → FCPDataset → FCPCollator → ring attention →
``train_step``, tiny-llm, float64, AdamW): the same 3 steps with ``make_reducer("allreduce")``, with
``make_reducer("fsdp2", mesh=<2×2 mesh>)`` and with a user's own ``fully_shard(mesh=<2×2>)`` + ``reducer_for``.
Asserted: every step's loss and denominator, and every parameter after the last step (the full tensor), equal the
all-reduce run's to 1e-12 relative; the parameters really are HSDP (placements ``(Replicate(), Shard(0))``); the
plans had CP groups of degree 2 (a ring across ranks of different mesh rows or columns) and degree 1. And that
``FSDP2Reducer`` refuses an HSDP model in one line when torch says it is 2.7.1 (before 2.8 FSDP2 averages across
the replicas).
"""

from __future__ import annotations

import pytest
import torch

from _requires import cpu_fsdp2
from fcp_data import CostModel
from fcp_exec.compat import HSDP_RELEASE, torch_release
from fcp_exec.launch import launch

CLIP = 0.5  # max_grad_norm of every run (the norms are above it)
LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58, 44, 27, 61, 30, 52, 8, 66, 21, 35, 47, 13, 70]
STEPS = 3


class _Text:
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": (torch.arange(LENGTHS[i]) * (i + 3)) % 40 + 2}


def _train(how: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader

    from fcp_data import FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.compat import dtensor_type, fsdp2_api
    from fcp_exec.models import build_model
    from fcp_exec.optim import clip_grad_norm
    from fcp_exec.reducers import full_view
    from fcp_exec.step import make_reducer, reducer_for, train_step
    from fcp_exec.train import _forward_loss

    rank = dist.get_rank()
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=48)
    sampler = FCPSampler(LENGTHS, num_ranks=4, rank=rank, global_batch_size=8, seed=0, cost_model=cost)
    loader = DataLoader(FCPDataset(_Text()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))
    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    if how == "allreduce":
        model, reducer = make_reducer("allreduce", model)
    elif how == "hsdp":
        model, reducer = make_reducer("fsdp2", model, mesh=mesh)
    elif how == "fsdp1":  # a user's own FSDP1 (flat parameters: use_orig_params=False) over the 4 ranks
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy({type(model.layers[0])}),
                                         device_id=torch.device("cpu"))
        reducer = reducer_for(model)
    else:  # the user's own fully_shard, as torchtitan's parallelize_fn applies it
        fully_shard = fsdp2_api()[0]
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        reducer = reducer_for(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    batches, out = iter(loader), {"loss": [], "tokens": [], "degrees": [], "norms": []}
    for _ in range(STEPS):
        res = train_step(model, batches, lambda m, b: _forward_loss(m, b, False), reducer)
        out["norms"].append(clip_grad_norm(model, CLIP))
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["loss"].append(res.loss)
        out["tokens"].append(res.num_tokens)
        out["degrees"] += [len(g) for g in res.groups]
    dtensor = dtensor_type()
    out["placements"] = sorted({str(tuple(p.placements)) for p in model.parameters() if isinstance(p, dtensor)})
    with full_view(model):  # FSDP1: the whole original parameters
        out["params"] = {k.replace("_fsdp_wrapped_module.", ""): (v.full_tensor() if isinstance(v, dtensor) else v)
                         .detach().clone() for k, v in model.named_parameters()}
    out["reducer"] = type(reducer).__name__
    return out


def _fsdp1_refused() -> list[str]:
    """FSDP1Reducer's messages for FSDP1 with hybrid sharding (2 × 2) and for FSDP1 over a subgroup of 2 ranks."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    from fcp_exec.reducers import reducer_for

    cpu = torch.device("cpu")
    hybrid = FullyShardedDataParallel(torch.nn.Linear(4, 4).double(), device_id=cpu,
                                      device_mesh=init_device_mesh("cpu", (2, 2)),
                                      sharding_strategy=ShardingStrategy.HYBRID_SHARD)
    sub = FullyShardedDataParallel(torch.nn.Linear(4, 4).double(), device_id=cpu,
                                   process_group=dist.new_subgroups(group_size=2)[0])
    out = []
    for model in (hybrid, sub):
        try:
            reducer_for(model)
            out.append("not refused")
        except ValueError as e:
            out.append(str(e))
    return out


def _refused_before_2_8() -> str:
    """The message FSDP2Reducer gives an HSDP model when torch says it is 2.7.1 (it averages across replicas)."""
    from torch.distributed.device_mesh import init_device_mesh

    from fcp_exec.compat import MissingDependency, fsdp2_api
    from fcp_exec.reducers import FSDP2Reducer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).double()
    fsdp2_api()[0](model, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
    real, torch.__version__ = torch.__version__, "2.7.1"
    try:
        FSDP2Reducer(model)
    except MissingDependency as e:
        return str(e)
    finally:
        torch.__version__ = real
    return "not refused"


def _all() -> dict:
    out = {"refused": _refused_before_2_8(), "fsdp1-refused": _fsdp1_refused(), "allreduce": _train("allreduce"),
           "fsdp1": _train("fsdp1")}
    if torch_release() >= HSDP_RELEASE:  # refused below (the test above); on 2.7.1 HSDP does not run on the CPU anyway
        out.update({how: _train(how) for how in ("hsdp", "own")})
    return out


@pytest.fixture(scope="module")
def runs():
    return launch(_all, 4, timeout=300.0, pg_timeout=60.0)


@pytest.mark.parametrize("how", ["hsdp", "own", "fsdp1"])
def test_hsdp_trains_like_the_allreduce_reducer(runs, how):
    """``fsdp1``: a user's own FSDP1 (``FullyShardedDataParallel`` per layer, flat parameters) on the 4 ranks through
    ``reducer_for``, the same comparison (FSDP1's average made a SUM; ``clip_grad_norm`` over its flat shards)."""
    if how != "fsdp1" and torch_release() < HSDP_RELEASE:
        pytest.skip(f"fcp refuses HSDP on torch {torch.__version__} (test_hsdp_is_refused_where_torch_averages...)")
    if how != "fsdp1":
        cpu_fsdp2()
    for rank, res in enumerate(runs):
        a, b = res["allreduce"], res[how]
        if how == "fsdp1":
            assert b["reducer"] == "FSDP1Reducer" and b["placements"] == [], (b["reducer"], b["placements"])
        else:
            assert b["reducer"] == "FSDP2Reducer" and b["placements"] == ["(Replicate(), Shard(dim=0))"], \
                b["placements"]
        assert a["tokens"] == b["tokens"], (rank, a["tokens"], b["tokens"])
        assert all(n > CLIP for n in a["norms"]), a["norms"]  # clipping acted at every step
        for x, y in zip(a["loss"] + a["norms"], b["loss"] + b["norms"]):
            assert abs(x - y) <= 1e-12 * abs(x), (rank, how, a["loss"], b["loss"], a["norms"], b["norms"])
        scale = max(float(v.abs().max()) for v in a["params"].values())
        worst = max(float((a["params"][k] - v).abs().max()) for k, v in b["params"].items())
        assert worst <= 1e-12 * scale, (rank, how, worst)
    degrees = {d for res in runs for d in res["allreduce"]["degrees"]}
    assert {1, 2} <= degrees, degrees


def test_hsdp_is_refused_where_torch_averages_across_replicas(runs):
    for res in runs:
        assert res["refused"].startswith("HSDP (FSDP2 over a 2-D mesh) with torch 2.7.1: before 2.8 FSDP2 averages the "
                                         "all-reduce across replicas"), res["refused"]


def test_fsdp1_hybrid_sharding_and_subgroups_are_refused(runs):
    """FSDP1 takes no comm hook with hybrid sharding, and an FSDP1 group smaller than the world would leave FCP's
    gradients unsummed across it: both are one clear error from ``reducer_for`` (FSDP1Reducer), on every rank."""
    for res in runs:
        hybrid, sub = res["fsdp1-refused"]
        assert hybrid.startswith("FSDP1 with ShardingStrategy.HYBRID_SHARD: FSDP1 takes no gradient hook") and \
            "FSDP2 over a 2-D mesh" in hybrid, hybrid
        assert sub.startswith("FSDP1 over a process group of 2 of the 4 ranks"), sub
