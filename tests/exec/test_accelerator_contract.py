"""Accelerator contracts pinned down on CPU (issue 11): what NCCL/HCCL need that gloo forgives.

* Collective dtypes: with the backend reported as ``hccl`` (whose all-reduce rejects float64), a real 2-process
  training step (tiny-llm and a Hugging Face Qwen3, allreduce reducer) issues no collective in a dtype HCCL
  rejects. Before the fix the loss was all-reduced in float64 ("HCCL allreduce: Unsupported data type").
* Eager init: after :func:`fcp_exec.launch.init_distributed`, the first communication of every rank is a world
  collective (the warm-up barrier), before any batched P2P of ring attention.
* Two ranks on one accelerator are refused before any process starts (NCCL's "Duplicate GPU detected").
"""

from __future__ import annotations

import os
import queue
import socket
from pathlib import Path

import pytest
from _requires import transformers_models
import torch

from fcp_exec.launch import collective_dtype, launch
from fcp_exec.train import hf_preload

HCCL_OK = {torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32, torch.bfloat16}
CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
QWEN3 = f"hf:{CONFIGS / 'qwen3-tiny.json'}"


def _spy_collectives(record: list, backend_name: str | None = None) -> None:
    import torch.distributed as dist

    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "reduce"):
        real = getattr(dist, name)

        def spy(tensor, *args, __real=real, __name=name, **kwargs):
            t = tensor[0] if isinstance(tensor, (list, tuple)) else tensor
            record.append((__name, t.dtype))
            return __real(tensor, *args, **kwargs)

        setattr(dist, name, spy)
    if backend_name:
        dist.get_backend = lambda group=None: backend_name


def _hccl_step(model: str) -> list:
    from fcp_exec.train import TrainConfig, train

    record: list = []
    _spy_collectives(record, "hccl")
    kw = dict(data="synthetic", steps=2, dtype="float32", global_batch_size=4, num_synthetic=8, max_tokens=96,
              tokens_per_rank=48, verbose=False, prefetch=0)
    train(TrainConfig(model=model, **kw))
    return [(n, str(d)) for n, d in record]


def test_collective_dtype_table():
    assert collective_dtype(torch.float64, "hccl") == torch.float32
    assert collective_dtype(torch.bfloat16, "hccl") == torch.bfloat16
    assert collective_dtype(torch.float64, "gloo") == torch.float64
    assert collective_dtype(torch.float64, "nccl") == torch.float64


@pytest.mark.timeout(180)
@pytest.mark.parametrize("model", ["tiny-llm", f"hf:{CONFIGS / 'qwen3-tiny.json'}"])
def test_no_collective_in_a_dtype_hccl_rejects(model):
    if model.startswith("hf:"):
        transformers_models()
    per_rank = launch(_hccl_step, 2, model, timeout=150.0, preload=hf_preload([model]))
    for rank, ops in enumerate(per_rank):
        assert ops, "the spy saw no collective at all (the test would prove nothing)"
        bad = [(n, d) for n, d in ops if d not in {str(x) for x in HCCL_OK}]
        assert not bad, f"rank {rank}: collectives HCCL would reject: {bad}"


def _first_comm_worker(rank: int, port: int, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch.distributed as dist

    ops: list = []
    for name in ("barrier", "all_reduce", "batch_isend_irecv", "all_gather_object"):
        real = getattr(dist, name)
        setattr(dist, name, lambda *a, __r=real, __n=name, **k: (ops.append((__n, k.get("group"))), __r(*a, **k))[1])
    try:
        from fcp_exec.launch import init_distributed
        from fcp_exec.ring_attention import ring_attention

        init_distributed("gloo", timeout_s=60)
        q = torch.randn(8, 2, 4)
        ring_attention(q, q.clone(), q.clone(), torch.tensor([0, 8], dtype=torch.int32), ranks=(0, 1), timeout=30)
        out.put((rank, [(n, g is None) for n, g in ops]))
    except BaseException as e:  # noqa: BLE001
        out.put((rank, repr(e)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_first_communication_is_a_world_collective():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_first_comm_worker, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out.get(timeout=90) for _ in procs)
    except queue.Empty:
        pytest.fail("workers did not report within 90 s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for rank, ops in got.items():
        assert isinstance(ops, list), f"rank {rank} failed: {ops}"
        assert ops and ops[0] == ("barrier", True), f"rank {rank}: first communication was {ops[:1]}, not a world barrier"
        assert ("batch_isend_irecv", True) in ops, f"rank {rank}: the ring never communicated: {ops}"


def test_two_ranks_on_one_gpu_refused_before_start(monkeypatch):
    from fcp_exec import launch as L

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="one GPU per rank"):
        L.check_devices("nccl", 2)
    L.check_devices("nccl", 1)
    L.check_devices("gloo", 4)


def _fake_flash_attn(monkeypatch, version: str, with_entry_points: bool = True):
    import sys
    import types

    pkg = types.ModuleType("flash_attn")
    pkg.__version__ = version
    fai = types.ModuleType("flash_attn.flash_attn_interface")
    if with_entry_points:
        fai._flash_attn_varlen_forward = lambda *a, **k: None
        fai._flash_attn_varlen_backward = lambda *a, **k: None
    pkg.flash_attn_interface = fai
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.flash_attn_interface", fai)


@pytest.mark.parametrize("version,usable", [("2.4.2", False), ("2.5.9.post1", False), ("2.6.3", True), ("2.8.1", True)])
def test_flash_attn_gated_at_2_6(monkeypatch, version, usable):
    """flash-attn <= 2.5 has a [batch, heads, max_seqlen] LSE and a required block_table: "auto" must not pick it."""
    from fcp_exec.kernels.cuda import CudaKernel, flash_attn_status

    _fake_flash_attn(monkeypatch, version)
    mod, reason = flash_attn_status()
    assert (mod is not None) == usable, reason
    kernel = CudaKernel("auto")
    assert (kernel.backend == "flash_attn") == usable
    if not usable:
        assert "2.6" in reason
        with pytest.raises(ImportError, match="2.6"):
            CudaKernel("flash_attn")


def test_device_bounds_are_cached_per_layout():
    """The cumulative bounds of a micro-batch go to the device once, not once per ring block and layer."""
    from fcp_exec.kernels.cuda import CudaKernel

    kernel = CudaKernel("sdpa")
    a = kernel._fa_bounds([0, 4, 10], [0, 4, 10], None, None, torch.device("cpu"))
    b = kernel._fa_bounds([0, 4, 10], [0, 4, 10], None, None, torch.device("cpu"))
    assert a[0] is b[0] and a[1] is b[1] and a[2:] == (6, 6)


def _count_host_reads(fn) -> int:
    """Calls of ``Tensor.tolist/item/__int__/__index__`` (device → host reads on an accelerator) made by ``fn``."""
    counter = [0]
    saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__int__", "__index__")}

    def wrap(real):
        def spy(self, *a, **k):
            counter[0] += 1
            return real(self, *a, **k)
        return spy

    try:
        for name, real in saved.items():
            setattr(torch.Tensor, name, wrap(real))
        fn()
    finally:
        for name, real in saved.items():
            setattr(torch.Tensor, name, real)
    return counter[0]


def _reads_per_layer_count(layers: int, degree: int) -> int:
    import json
    import tempfile

    from fcp_data import FCPCollator
    from fcp_data.slots import SampleSlot
    from fcp_exec.integrations import hf
    from fcp_exec.launch import dist_info

    rank, _ = dist_info()
    raw = json.loads((CONFIGS / "qwen3-tiny.json").read_text())
    raw["num_hidden_layers"] = layers
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(raw, f)
    model = hf.apply_fcp(hf.build_model(f.name, dtype=torch.float32, seed=0), kernel="sdpa")
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(10, 2000, (n,), generator=g) for n in (24, 12)]
    ranks = tuple(range(degree))
    slots = [SampleSlot(index=i, ranks=ranks, cp_rank=rank, num_tokens=len(d), length=len(d), num_tokens_global=34,
                        epoch=0, global_batch=0, micro_batch=0, num_micro_batches=1) for i, d in enumerate(docs)]
    batch = FCPCollator(pad_token_id=1)([({"input_ids": d}, s) for d, s in zip(docs, slots)])
    inputs = hf.batch_inputs(batch, model)  # the micro-batch's host metadata is built here, once

    def step():
        out = model(**inputs)
        hf.lm_loss(out.logits, batch).backward()

    return _count_host_reads(step)


@pytest.mark.timeout(120)
def test_no_device_read_per_layer():
    """Forward+backward of a Hugging Face model through fcp_ring with the device-agnostic SDPA kernel of the CUDA
    path: the number of device→host reads (tolist/item/int) does not grow with the number of layers, at degree 1
    in one process and at degree 2 on two gloo processes (the neighbour shape check runs once per micro-batch)."""
    transformers_models()
    assert _reads_per_layer_count(2, 1) == _reads_per_layer_count(4, 1)
    two = launch(_reads_per_layer_count, 2, 2, 2, timeout=100.0, preload=hf_preload([QWEN3]))
    four = launch(_reads_per_layer_count, 2, 4, 2, timeout=100.0, preload=hf_preload([QWEN3]))
    assert two == four, f"host reads per rank grow with layers: 2 layers {two}, 4 layers {four}"
