"""``fcp_exec.compat``: the torch APIs that moved between the releases fcp supports (torch>=2.4).

The suite runs on the installed torch (2.13 here); ``benchmarks/torch_compat.py`` runs it on 2.4.1, 2.5.1, 2.6.0 and
2.7.1. These tests check the parts a newer torch does not exercise: the release parser, the FSDP2 refusal on the
CPU before 2.7 and the norm computed where ``get_total_norm`` is missing (against a float64 reference)."""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch

from fcp_exec import compat
from fcp_exec.optim import clip_grad_norm


@pytest.mark.parametrize("version, want", [("2.4.1+cu121", (2, 4)), ("2.5.1", (2, 5)), ("2.6.0a0+git1234", (2, 6)),
                                           ("2.13.0+cpu", (2, 13)), ("3.0.0.dev20270101", (3, 0)),
                                           ("2.10rc1", (2, 10))])
def test_torch_release_parses_the_version_strings_torch_has_used(monkeypatch, version, want):
    monkeypatch.setattr(torch, "__version__", version)
    assert compat.torch_release() == want


@pytest.mark.parametrize("version, device, refused", [("2.4.1", "cpu", True), ("2.5.1+cu124", "cpu", True),
                                                      ("2.5.1+cu124", "cuda", False), ("2.5.1", "npu", False),
                                                      ("2.6.0", "cpu", True), ("2.7.1", "cpu", False),
                                                      ("2.13.0", "cpu", False)])
def test_fsdp2_on_the_cpu_before_torch_2_7_is_one_clear_error(monkeypatch, version, device, refused):
    monkeypatch.setattr(torch, "__version__", version)
    if refused:
        want = f"torch {version} does not run on the CPU; it needs torch>=2.7 there (or use the 'ddp' reducer)"
        with pytest.raises(compat.MissingDependency, match=re.escape(want)):
            compat.check_fsdp2_device(torch.device(device) if device == "cpu" else device)
    else:
        compat.check_fsdp2_device(device)


def test_the_divide_factor_setter_of_each_release():
    class Torch26:
        def set_gradient_divide_factor(self, f): ...
        def set_reduce_scatter_divide_factor(self, f): ...

    class Torch25:
        def set_reduce_scatter_divide_factor(self, f): ...

    a, b = Torch26(), Torch25()
    assert compat.fsdp_divide_factor_setter(a).__func__ is Torch26.set_gradient_divide_factor
    assert compat.fsdp_divide_factor_setter(b).__func__ is Torch25.set_reduce_scatter_divide_factor
    assert compat.fsdp_divide_factor_setter(object()) is None  # torch 2.4: FSDP2Reducer refuses it


@pytest.mark.parametrize("with_get_total_norm", [True, False])
def test_total_norm_equals_the_float64_norm_of_all_gradients(monkeypatch, with_get_total_norm):
    if not with_get_total_norm:  # what torch < 2.6 has
        monkeypatch.delattr(torch.nn.utils, "get_total_norm", raising=False)
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(3, 5, generator=g), torch.randn(7, generator=g) * 1e3, torch.randn(1, 1, 2, generator=g)]
    want = math.sqrt(sum(float((x.double() ** 2).sum()) for x in grads))
    assert float(compat.total_norm(grads)) == pytest.approx(want, rel=1e-6)  # float32 sums
    grads[1][3] = math.inf
    assert float(compat.total_norm(grads)) == math.inf


def test_clip_grad_norm_without_get_total_norm_leaves_an_overflow_alone(monkeypatch):
    """torch < 2.6 had only ``clip_grad_norm_``, whose clip to infinity multiplied an overflowed gradient by NaN."""
    monkeypatch.delattr(torch.nn.utils, "get_total_norm", raising=False)
    m = torch.nn.Linear(3, 2)
    m.weight.grad, m.bias.grad = torch.ones(2, 3), torch.full((2,), math.inf)
    assert clip_grad_norm(m, 0.5) == math.inf
    assert torch.equal(m.weight.grad, torch.ones(2, 3)) and torch.isinf(m.bias.grad).all()
    m.bias.grad = torch.full((2,), 4.0)  # norm sqrt(6 + 32) = 6.16...: clipped to 0.5
    assert clip_grad_norm(m, 0.5) == pytest.approx(math.sqrt(38.0), rel=1e-6)
    assert float(compat.total_norm([m.weight.grad, m.bias.grad])) == pytest.approx(0.5, rel=1e-5)


def test_fsdp2_api_and_dtensor_type_are_the_installed_classes():
    fully_shard, fsdp_module, mp_policy = compat.fsdp2_api()
    assert callable(fully_shard) and isinstance(fsdp_module, type)
    assert mp_policy(param_dtype=torch.bfloat16).param_dtype == torch.bfloat16
    assert compat.dtensor_type().__name__ == "DTensor"


@pytest.mark.parametrize("version, want", [("5.25.0", (5, 25)), ("5.18.0.dev0", (5, 18)), ("4.57.6", (4, 57)),
                                           ("5.3.0rc1", (5, 3)), ("6", (6, 0))])
def test_release_of_parses_transformers_versions(version, want):
    assert compat.release_of(version) == want


@pytest.mark.parametrize("version, refused", [("5.17.0", True), ("5.3.0", True), ("4.57.6", True), ("5.18.0", False),
                                              ("5.25.0", False)])
def test_transformers_older_than_the_floor_is_refused_in_one_line(monkeypatch, version, refused):
    """Below 5.18 a VL model ignores ``mm_encoder_outputs`` (fcp's vision rows) and trains without its images: the
    suite's Qwen2-VL run's first loss was 8.8e-4 off the stock model's on 5.15.1 (``benchmarks/torch_compat.py``).
    ``apply_fcp``, ``build_model`` and ``fcp train`` refuse it with one line that says what to install."""
    transformers = pytest.importorskip("transformers")
    if not transformers.utils.is_torch_available():
        pytest.skip("transformers disables its models on this torch (the other refusal)")
    from fcp_exec.integrations.hf import apply_fcp

    config = transformers.AutoConfig.for_model("llama", vocab_size=32, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    model = transformers.AutoModelForCausalLM.from_config(config)
    # transformers' lazy loading can put a new module object into sys.modules: patch the one an import returns
    monkeypatch.setattr(sys.modules["transformers"], "__version__", version)
    problem = compat.hf_models_problem()
    if not refused:
        assert problem is None
        return
    assert problem.startswith(f"transformers {version} is older than fcp's Hugging Face integration supports: "
                              "pip install 'transformers>=5.18,<6'") and "\n" not in problem
    with pytest.raises(compat.MissingDependency, match=re.escape(problem)):
        apply_fcp(model)
    assert model.config._attn_implementation != "fcp_ring"  # refused before touching the model


def test_hf_models_problem_says_what_transformers_can_do_here():
    """None where transformers builds models on this torch; one line naming both versions where it does not (torch
    < 2.6, run by ``benchmarks/torch_compat.py``), which ``build_model`` raises as ``MissingDependency``."""
    from fcp_exec.integrations.hf_models import build_model

    problem = compat.hf_models_problem()
    try:
        import transformers
    except ImportError:
        assert problem.startswith("Hugging Face models need transformers: pip install 'fcp[hf]'")
        return
    config = transformers.AutoConfig.for_model("llama", vocab_size=32, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    if transformers.utils.is_torch_available() and compat.release_of(transformers.__version__) >= (5, 18):
        assert problem is None
        assert sum(p.numel() for p in build_model(config).parameters()) > 0
    elif transformers.utils.is_torch_available():
        assert problem.startswith(f"transformers {transformers.__version__} is older than fcp's Hugging Face")
        with pytest.raises(compat.MissingDependency, match=re.escape(problem)):
            build_model(config)
    else:
        assert problem.startswith(f"transformers {transformers.__version__} does not run on torch {torch.__version__}")
        assert "\n" not in problem
        with pytest.raises(compat.MissingDependency, match=re.escape(problem)):
            build_model(config)


_REFUSALS = """
import torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
import fcp_exec.reducers as R
from fcp_exec.compat import MissingDependency

def attempt():
    try:
        R.make_reducer("fsdp2", torch.nn.Sequential(torch.nn.Linear(2, 2)))
        return "accepted"
    except MissingDependency as e:
        return "refused: " + str(e)

real = torch.__version__
torch.__version__ = "2.5.1"          # FSDP2 of 2.5 on the CPU
print(attempt())
torch.__version__ = real
R.fsdp_divide_factor_setter = lambda module: None   # what 2.4's FSDPModule offers
print(attempt())
dist.destroy_process_group()
"""


def test_make_reducer_refuses_what_an_older_torch_cannot_do():
    """In a world of one (a fresh interpreter: the process group and the patches stay there): torch 2.5's FSDP2 on
    the CPU and torch 2.4's FSDP2 without a divide factor are one MissingDependency each, before any training."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _REFUSALS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first == ("refused: FSDP2 (fully_shard) of torch 2.5.1 does not run on the CPU; it needs torch>=2.7 there "
                     "(or use the 'ddp' reducer)"), first
    if compat.torch_release() >= compat.CPU_FSDP2_RELEASE:  # FSDP2 wrapped the model; the reducer refuses
        assert second.startswith(f"refused: FSDP2 of torch {torch.__version__} averages gradients and has no divide "
                                 "factor to set; fcp's fsdp2 reducer needs torch>=2.5"), second


@pytest.mark.skipif(compat.torch_release() >= compat.CPU_FSDP2_RELEASE,
                    reason="FSDP2 runs on the CPU here (benchmarks/torch_compat.py runs this on torch 2.4 to 2.6)")
def test_fcp_train_with_fsdp2_on_an_older_torch_is_one_line():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fcp_cli", "train", "--model", "tiny-llm", "--nproc", "2", "--steps",
                          "1", "--reducer", "fsdp2"], capture_output=True, text=True, timeout=200)
    err = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(err) == 1, out.stderr[-2000:]
    assert err[0].startswith("fcp train: error: FSDP2") and "torch>=2." in err[0], err[0]


@pytest.mark.parametrize("reduce_dtype, param_dtype, orig_dtype, want", [
    (None, None, torch.float64, 3.0),             # float64 parameters, no policy: pre/post-divided by 2 and 1.5
    (None, torch.float16, torch.float32, 3.0),    # a float16 policy reducing in float16 (reduce dtype clamped to None)
    (torch.float32, torch.float16, torch.float32, 1.0),  # reduced in float32: PreMulSum(1), a SUM already
    (None, torch.bfloat16, torch.float32, 1.0),
    (None, None, torch.float32, 1.0)])
def test_undo_fsdp_gradient_average_reads_the_state_of_torch_2_5_to_2_7(reduce_dtype, param_dtype, orig_dtype, want):
    """The rule of those releases' ``_get_gradient_divide_factors`` (float32/bfloat16: no division; else the
    data-parallel size), on an object shaped like their private FSDP state; the real thing runs in
    ``benchmarks/torch_compat.py`` on 2.7.1, where the float64 FSDP2 tests are exact with it and off by 2x without."""
    from types import SimpleNamespace as NS

    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 0.5)
    group = NS(fsdp_params=[NS(sharded_param=p, param_dtype=param_dtype, orig_dtype=orig_dtype)],
               _reduce_dtype=reduce_dtype, mesh_info=NS(mesh=NS(size=lambda: 3)))
    module = NS(_get_fsdp_state=lambda: NS(_fsdp_param_group=group))
    assert compat.undo_fsdp_gradient_average(module) == want
    assert torch.equal(p.grad, torch.full((2,), 0.5 * want))
    module.set_gradient_divide_factor = lambda f: None  # torch >= 2.8: its divide factor already made a SUM
    assert compat.undo_fsdp_gradient_average(module) == 1.0 and torch.equal(p.grad, torch.full((2,), 0.5 * want))


def test_resumable_trainer_routes_fcp_loaders_on_a_trainer_without_get_resumed_dataloader(monkeypatch):
    """transformers < 5.24 resumes mid-epoch through ``transformers.trainer.skip_first_batches`` (accelerate's, which
    needs a DataLoader's ``batch_sampler``): inside :func:`compat.resumable_trainer` a loader with ``skip_to`` goes to
    the trainer's ``get_resumed_dataloader``, any other to the original; the original is back afterwards. On 5.20.2
    this made FCPTrainer's resume tests pass (``benchmarks/torch_compat.py``); 5.24+ has the Trainer hook."""
    problem = compat.hf_models_problem()  # transformers 5.25's trainer does not import on torch 2.4
    if problem:
        pytest.skip(problem)
    hf_trainer = pytest.importorskip("transformers.trainer")
    original = hf_trainer.skip_first_batches
    calls = []

    class Loader:
        def skip_to(self, epoch, global_batch):  # fcp's GlobalBatchLoader has it
            raise AssertionError("not called directly")

    class Owner:
        def get_resumed_dataloader(self, loader, n):
            calls.append(("fcp", n))
            return loader

    monkeypatch.setattr(hf_trainer, "skip_first_batches", lambda loader, n=0: calls.append(("original", n)) or loader)
    patched_original = hf_trainer.skip_first_batches
    if hasattr(hf_trainer.Trainer, "get_resumed_dataloader"):
        with compat.resumable_trainer(Owner()):  # 5.24+: nothing to route
            assert hf_trainer.skip_first_batches is patched_original
        monkeypatch.delattr(hf_trainer.Trainer, "get_resumed_dataloader")
    fcp_loader, plain = Loader(), object()
    with compat.resumable_trainer(Owner()):
        assert hf_trainer.skip_first_batches(fcp_loader, 3) is fcp_loader
        assert hf_trainer.skip_first_batches(plain, 2) is plain
    assert calls == [("fcp", 3), ("original", 2)]
    assert hf_trainer.skip_first_batches is patched_original
    with pytest.raises(KeyError):
        with compat.resumable_trainer(Owner()):
            raise KeyError("a failed train() restores it too")
    assert hf_trainer.skip_first_batches is patched_original is not original
