"""FSDP2 and HSDP gradients against the all-reduce reducer on this torch: one step of fcp's pipeline on 4 gloo ranks.

For each dtype, one FCP step (FCPSampler over 4 ranks → FCPDataset → FCPCollator → ring attention →
``train_step``, tiny-llm) with ``make_reducer("allreduce")``, ``make_reducer("fsdp2")`` (a 1-D mesh) and, with
``--hsdp``, ``make_reducer("fsdp2", mesh=<2×2 mesh>)``; prints the largest gradient difference from the all-reduce
run relative to the largest entry of each tensor. ``--hsdp`` bypasses fcp's refusal of HSDP below torch 2.8 so
that an older torch's behaviour can be seen (torch 2.7.1: float64 HSDP fails an assertion in FSDP2's
``post_backward``; float32 HSDP all-reduces across the replicas with AVG, which gloo refuses — BENCHMARKS.md
"Older torch releases")::

    .venv/bin/python benchmarks/hsdp_probe.py [--hsdp] [--dtypes float64,float32]

Exit code 0 when every run finished, 1 when one raised (its error printed), 2 for bad arguments.
"""

from __future__ import annotations

import torch

from _args import names, parser, run

LENGTHS = [37, 12, 64, 9, 50, 23, 71, 18, 40, 33, 15, 58, 44, 27, 61, 30]


class _Text:
    def __len__(self) -> int:
        return len(LENGTHS)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": (torch.arange(LENGTHS[i]) * (i + 3)) % 40 + 2}


def _grads(how: str, dtype: torch.dtype) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils.data import DataLoader

    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler
    from fcp_exec.compat import dtensor_type
    from fcp_exec.models import build_model
    from fcp_exec.step import make_reducer, train_step
    from fcp_exec.train import _forward_loss

    cost = CostModel.preset("qwen3-1.7b", "h100").replace(tokens_per_rank=48)
    sampler = FCPSampler(LENGTHS, num_ranks=4, rank=dist.get_rank(), global_batch_size=8, seed=0, cost_model=cost)
    loader = DataLoader(FCPDataset(_Text()), batch_sampler=sampler, collate_fn=FCPCollator(pad_token_id=0))
    model = build_model("tiny-llm", seed=0, dtype=dtype)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")) if how == "hsdp" else None
    model, reducer = make_reducer("allreduce" if how == "allreduce" else "fsdp2", model,
                                  **({"mesh": mesh} if mesh is not None else {}))
    train_step(model, iter(loader), lambda m, b: _forward_loss(m, b, False), reducer)
    D = dtensor_type()
    return {n: (p.grad.full_tensor() if isinstance(p.grad, D) else p.grad).double()
            for n, p in model.named_parameters()}


def _probe(dtype_name: str, hsdp: bool) -> dict:
    import fcp_exec.reducers as reducers

    if hsdp:
        reducers.torch_release = lambda: (99, 0)  # see what this torch does instead of refusing
    dtype = getattr(torch, dtype_name)
    ref = _grads("allreduce", dtype)
    out = {}
    for how in ("fsdp2", "hsdp") if hsdp else ("fsdp2",):
        try:
            g = _grads(how, dtype)
            out[how] = max(float((g[n] - r).abs().max() / r.abs().max()) for n, r in ref.items())
        except Exception as e:  # noqa: BLE001 - reported, the probe goes on
            out[how] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
    return out


def build_parser():
    ap = parser(__doc__.split("\n\n")[0], epilog=__doc__)
    ap.add_argument("--hsdp", action="store_true", help="also HSDP (a 2×2 mesh), bypassing fcp's refusal below 2.8")
    ap.add_argument("--dtypes", type=names(("float64", "float32"), "dtype"), default="float64,float32",
                    help="comma-separated, of float64, float32 (default float64,float32)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    dtypes = args.dtypes
    from fcp_exec.launch import launch

    print(f"torch {torch.__version__}, 4 gloo ranks")
    failed = False
    for d in dtypes:
        res = launch(_probe, 4, d, args.hsdp, timeout=300)[0]
        for how, v in res.items():
            failed |= isinstance(v, str)
            told = v if isinstance(v, str) else f"max relative gradient difference {v:.2e}"
            print(f"  {d:8s} {how:6s} {told}")
    return 1 if failed else 0


if __name__ == "__main__":
    run(main)
