"""The DDP and FSDP1 reducers (fcp_exec.reducers) pinned against single-process gradients, cheaply.

The accumulation tests of tests/exec/test_own_loop.py compare a reducer with itself (two steps accumulated vs two steps
apart), so a reducer that *averages* instead of summing, or that synchronises every micro-batch (no ``no_sync``),
passes them; only the heavy stock-model runs (tests/exec/test_hf_train.py) see it, and FSDP1's ``NO_SHARD`` branch
(all-reduce hook) is seen by none.

Here: 2 real gloo processes, tiny-llm float64, hand-built micro-batches of degree-1 groups (each rank its own
documents, 2 micro-batches per rank so accumulation inside a step runs), ``train_step`` with each reducer. Reference:
one process, the same model, every document of both ranks, ``Σ loss`` (each micro-batch's loss already divided by the
global label count) and one ``backward``: the single-process gradient of the global-batch mean (DESIGN §8). Every
reducer's full gradient (FSDP1's gathered with ``full_view(model, grads=True)``) must equal it to 1e-12 relative.
"""

from __future__ import annotations

import pytest
import torch

DOCS = {0: [[23, 9], [17]], 1: [[12], [31, 6]]}  # rank -> micro-batches -> document lengths
REDUCERS = ("allreduce", "ddp", "fsdp1", "fsdp1-noshard", "fsdp1-own")  # -own: wrapped by the user, reducer_for


def _batches(rank_docs, ranks):
    from fcp_data import FCPCollator
    from fcp_data.slots import SampleSlot

    total = sum(n - 1 for mbs in DOCS.values() for mb in mbs for n in mb)
    out, index = [], 0
    collate = FCPCollator(pad_token_id=0)
    for m, mb in enumerate(rank_docs):
        pairs = []
        for n in mb:
            ids = (torch.arange(n) * 7 + 3 * n) % 60 + 2
            slot = SampleSlot(index=index, num_tokens=n, length=n, ranks=ranks, cp_rank=0, epoch=0, global_batch=0,
                              micro_batch=m, num_micro_batches=len(rank_docs), num_tokens_global=total)
            pairs.append(({"input_ids": ids}, slot))
            index += 1
        out.append(collate(pairs))
    return out


def _loss(model, batch):
    from fcp_exec.train import _forward_loss

    return _forward_loss(model, batch, False)


def _grads(model, full=False):
    from fcp_exec.reducers import full_view

    with full_view(model, grads=True) if full else torch.no_grad():
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).clone()
                          for p in model.parameters()])


def _worker():
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from fcp_exec.models import build_model
    from fcp_exec.reducers import _shard_units, make_reducer, reducer_for
    from fcp_exec.step import train_step

    rank = dist.get_rank()
    out = {}
    for name in REDUCERS:
        base = build_model("tiny-llm", seed=0, dtype=torch.float64)
        if name in ("fsdp1-noshard", "fsdp1-own"):
            strategy = ShardingStrategy.NO_SHARD if name == "fsdp1-noshard" else ShardingStrategy.FULL_SHARD
            model = FullyShardedDataParallel(base, auto_wrap_policy=ModuleWrapPolicy({type(u) for u in _shard_units(base)}),
                                             sharding_strategy=strategy, use_orig_params=True,
                                             device_id=torch.device("cpu"))
            red = reducer_for(model)
        else:
            model, red = make_reducer(name, base)
        train_step(model, _batches(DOCS[rank], (rank,)), _loss, red)
        out[name] = _grads(model, full=name.startswith("fsdp1"))
    return out


def _reference():
    from fcp_exec.models import build_model

    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    loss = sum(_loss(model, b) for r in sorted(DOCS) for b in _batches(DOCS[r], (0,)))
    loss.backward()
    return _grads(model)


@pytest.fixture(scope="module")
def runs():
    from fcp_exec.launch import launch

    return launch(_worker, 2, timeout=240.0, pg_timeout=120.0)


@pytest.mark.parametrize("name", REDUCERS)
def test_reduced_gradients_equal_single_process_gradients(runs, name):
    ref = _reference()
    for rank, out in enumerate(runs):
        got = out[name]
        assert got.shape == ref.shape
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err <= 1e-12, f"{name} rank {rank}: gradients off the single-process ones by {err:.3e} (relative)"
