"""Failed reads taken out of the loss denominator *before* the step (a reducer with ``exact_denominator``, e.g.
DeepSpeed's, whose gradients live in its partitions and cannot be rescaled afterwards) train exactly like taking
them out *after* the backward by rescaling the gradients (``rescale_skipped``, the path proven equal to the stock
model trained on the rest of each global batch in ``tests/exec/test_hf_train.py``).

2 real gloo processes, the real pipeline (FCPSampler → FCPDataset → FCPCollator → ``train_step``, tiny-llm, float64,
all-reduce reducer): a dataset whose sample 3 fails to read everywhere and sample 6 on rank 1 only; the same 4 steps
with the plain reducer and with the same reducer flagged ``exact_denominator``. Asserted: losses, denominators and
final parameters equal to 1e-12 relative, the skips recorded alike, and that something was skipped.
"""

from __future__ import annotations

import pytest
import torch

from fcp_data import CostModel
from fcp_exec.launch import launch

LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58]
STEPS = 3


class _Damaged:
    def __init__(self, rank: int) -> None:
        self.rank = rank

    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> dict:
        if i == 3 or (i == 6 and self.rank == 1):
            raise OSError(f"sample {i}: damaged")
        return {"input_ids": (torch.arange(LENGTHS[i]) * (i + 3)) % 40 + 2}


def _train(exact: bool) -> dict:
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from fcp_data import FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.models import build_model
    from fcp_exec.step import AllReduceReducer, train_step
    from fcp_exec.train import _forward_loss

    class Exact(AllReduceReducer):
        exact_denominator = True

    rank = dist.get_rank()
    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=48)
    sampler = FCPSampler(LENGTHS, num_ranks=2, rank=rank, global_batch_size=4, seed=0, cost_model=cost)
    loader = DataLoader(FCPDataset(_Damaged(rank)), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))
    model = build_model("tiny-llm", seed=0, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reducer = Exact() if exact else AllReduceReducer()
    batches, out = iter(loader), {"loss": [], "tokens": [], "skipped": []}
    for _ in range(STEPS):
        res = train_step(model, batches, lambda m, b: _forward_loss(m, b, False), reducer)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out["loss"].append(res.loss)
        out["tokens"].append(res.num_tokens)
        out["skipped"].append(sorted(r["index"] for r in res.skipped))
    out["params"] = {k: v.detach().clone() for k, v in model.named_parameters()}
    return out


def _both() -> dict:
    return {"rescaled": _train(False), "exact": _train(True)}


@pytest.fixture(scope="module")
def runs():
    return launch(_both, 2, timeout=240.0, pg_timeout=60.0)


def test_counting_skips_first_equals_rescaling_the_gradients(runs):
    for rank, res in enumerate(runs):
        a, b = res["rescaled"], res["exact"]
        assert a["tokens"] == b["tokens"] and a["skipped"] == b["skipped"], (rank, a, b)
        for x, y in zip(a["loss"], b["loss"]):
            assert abs(x - y) <= 1e-12 * abs(x), (rank, a["loss"], b["loss"])
        scale = max(float(v.abs().max()) for v in a["params"].values())
        worst = max(float((a["params"][k] - v).abs().max()) for k, v in b["params"].items())
        assert worst <= 1e-12 * scale, (rank, worst)
    skipped = {i for res in runs for step in res["exact"]["skipped"] for i in step}
    assert 3 in skipped, skipped  # sample 3 failed everywhere (6 only where rank 1 read it)
