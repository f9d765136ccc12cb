"""``torch.compile`` of a whole Hugging Face model with FCP's ring attention inside the graph.

2 real gloo processes, the real pipeline (FCPSampler → FCPDataset → FCPCollator → ``apply_fcp`` → ``train_step``,
all-reduce reducer, AdamW, float64, 5 global batches of 2–4 micro-batches with CP groups of degree 1 and 2 and
documents of new lengths in each). Qwen3 compiled with ``fullgraph=True`` (a graph break would raise), dynamic
shapes, backend ``aot_eager`` (Dynamo and AOT autograd without code generation): the ring is one opaque node,
``torch.ops.fcp.ring_attention``, which finds each micro-batch's plan through the handle ``batch_inputs`` registered
(``fcp_exec.ring_op``). Reference: the same training run eagerly. Asserted: every step's loss and every parameter
after the last step equal eager's to 1e-12 (measured: identical), the ring ran through the op and never eagerly, and
Dynamo built one graph for every micro-batch (no recompile for new lengths or another CP group). And Mistral with a
16-token sliding window (shorter than most documents) compiled with ``fullgraph=True`` too: the window is an argument
of the op, which decides per micro-batch whether it acts (documents longer than it), so one graph, no break, equal to
eager to 1e-12. The Hugging Face Trainer's ``torch_compile=True`` is ``tests/exec/test_hf_trainer.py``'s.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _requires import transformers_models
import torch

transformers = transformers_models()

from fcp_exec.launch import launch  # noqa: E402

STEPS = 5


def _train(config_path: str, compile_kw: dict | None) -> dict:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.integrations import hf
    from fcp_exec.step import make_reducer, train_step
    from fcp_exec.train_data import load_train_data
    from test_hf_trainer import _compile_watched  # the ring's runs as the op and eagerly; Dynamo's counters

    config = hf.load_config(config_path)
    data = load_train_data(f"hf:{config_path}", "synthetic", max_tokens=80, seed=0, num_synthetic=24, hf_config=config)
    model = hf.apply_fcp(hf.build_model(config, dtype=torch.float64, seed=0))
    model, reducer = make_reducer("allreduce", model)
    run = torch.compile(model, backend="aot_eager", dynamic=True, **compile_kw) if compile_kw is not None else model
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=40)
    sampler = FCPSampler(data.lengths, num_ranks=2, rank=dist.get_rank(), global_batch_size=4, seed=0, cost_model=cost)
    loader = DataLoader(FCPDataset(data.dataset), batch_sampler=sampler,
                        collate_fn=FCPCollator(pad_token_id=data.pad_token_id))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    torch._dynamo.reset()
    with _compile_watched() as seen:
        batches, losses, degrees = iter(loader), [], set()
        for _ in range(STEPS):
            res = train_step(run, batches, hf.fcp_loss, reducer, pad_token_id=data.pad_token_id)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(res.loss)
            degrees |= {len(g) for g in res.groups}
    return {"losses": losses, "degrees": sorted(degrees), "calls": {"op": seen["op"], "eager": seen["eager"]},
            "graphs": seen["graphs"], "breaks": seen["breaks"],
            "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()}}


def _windowed_config(folder: str) -> str:
    from test_hf_families import WINDOWED
    from test_hf_train import CONFIGS

    raw = json.loads((CONFIGS / "mistral-tiny.json").read_text())
    raw.update(WINDOWED["mistral"])
    path = f"{folder}/mistral-window.json"
    with open(path, "w") as f:
        json.dump(raw, f)
    return path


def _all(windowed: str) -> dict:
    from test_hf_train import CONFIGS

    qwen3 = str(CONFIGS / "qwen3-tiny.json")
    return {"qwen3-eager": _train(qwen3, None), "qwen3-compiled": _train(qwen3, {"fullgraph": True}),
            "window-eager": _train(windowed, None), "window-compiled": _train(windowed, {"fullgraph": True})}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    windowed = _windowed_config(str(tmp_path_factory.mktemp("windowed")))
    return launch(_all, 2, windowed, timeout=600.0, pg_timeout=120.0, preload=("transformers.modeling_utils",))


def _same(a: dict, b: dict, what: str) -> None:
    for x, y in zip(a["losses"], b["losses"]):
        assert abs(x - y) <= 1e-12 * abs(x), (what, a["losses"], b["losses"])
    scale = max(float(np.abs(v).max()) for v in a["params"].values())
    worst = max(float(np.abs(a["params"][n] - v).max()) for n, v in b["params"].items())
    assert worst <= 1e-12 * scale, (what, worst)


@pytest.mark.timeout(600)
def test_fullgraph_compile_with_the_ring_op_trains_like_eager(runs):
    for rank, res in enumerate(runs):
        eager, compiled = res["qwen3-eager"], res["qwen3-compiled"]
        _same(eager, compiled, f"qwen3 rank {rank}")
        assert eager["degrees"] == compiled["degrees"] and {1, 2} <= set(eager["degrees"]), eager["degrees"]
        assert eager["calls"]["op"] == 0 and eager["calls"]["eager"] > 0, eager["calls"]  # eagerly: no op
        assert compiled["calls"]["eager"] == 0 and compiled["calls"]["op"] > 0, compiled["calls"]
        assert compiled["breaks"] == 0 and compiled["graphs"] == 1, (compiled["breaks"], compiled["graphs"])
    assert any(0 in res["qwen3-compiled"]["degrees"] for res in runs), "no idle micro-batch (its dummy) compiled"


@pytest.mark.timeout(600)
def test_a_sliding_window_compiles_fullgraph_with_the_ring_op(runs):
    for rank, res in enumerate(runs):
        eager, compiled = res["window-eager"], res["window-compiled"]
        _same(eager, compiled, f"mistral window rank {rank}")
        assert compiled["calls"]["eager"] == 0 and compiled["calls"]["op"] > 0, compiled["calls"]
        assert compiled["breaks"] == 0 and compiled["graphs"] == 1, (compiled["breaks"], compiled["graphs"])
