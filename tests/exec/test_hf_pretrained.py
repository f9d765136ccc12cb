"""Pretrained weights: ``fcp_exec.integrations.hf.load_model`` and ``fcp train --model hf:FOLDER [--init ...]``.

A folder written by ``save_pretrained`` (a tiny random Qwen3 / Qwen2.5-VL, seed 7, standing in for a downloaded
checkpoint: nothing can be downloaded here) must load tensor for tensor; ``fcp train`` on it must start from those
weights — its step-0 loss equals the stock model's ``from_pretrained`` loss on the same global batch (float64, 1e-12),
which a randomly initialised run does not. A checkpoint that does not fit (a tensor missing, a damaged file) is one
error naming it; ``--init pretrained`` on a folder without weights is one line from the CLI.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _requires import needs_cpu_fsdp2, transformers_models
import torch

transformers = transformers_models()

from fcp_exec.integrations import hf  # noqa: E402
from fcp_exec.integrations.hf_data import reference_step, special_ids  # noqa: E402
from fcp_exec.train import TrainConfig, run_training  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``{family: (folder, the saved model)}`` for Qwen3 and Qwen2.5-VL, weights from seed 7 (the runs use seed 0)."""
    root = tmp_path_factory.mktemp("pretrained")
    out = {}
    for family in ("qwen3", "qwen2_5_vl"):
        model = hf.build_model(hf.load_config(CONFIGS / f"{family}-tiny.json"), seed=7)
        model.save_pretrained(root / family)
        out[family] = (root / family, model)
    return out


@pytest.mark.parametrize("family", ["qwen3", "qwen2_5_vl"])
def test_load_model_reads_every_tensor_of_the_checkpoint(checkpoints, family):
    folder, saved = checkpoints[family]
    assert hf.has_weights(folder) and not hf.has_weights(CONFIGS / f"{family}-tiny.json")
    for init in ("auto", "pretrained"):
        got = hf.load_model(folder, init=init)
        want = saved.state_dict()
        assert got.state_dict().keys() == want.keys()
        assert all(torch.equal(got.state_dict()[k], v) for k, v in want.items()), init
        assert got.config._attn_implementation == "sdpa"
    rand = hf.load_model(folder, init="random", seed=0)  # the config of the folder, weights from the seed
    ref = hf.build_model(hf.load_config(folder), seed=0)
    assert all(torch.equal(a, b) for a, b in zip(rand.state_dict().values(), ref.state_dict().values()))
    assert any(not torch.equal(a, b) for a, b in zip(rand.state_dict().values(), saved.state_dict().values()))
    assert next(hf.load_model(folder, dtype=torch.float64).parameters()).dtype == torch.float64


def test_a_checkpoint_that_does_not_fit_is_one_error(checkpoints, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _ = checkpoints["qwen3"]
    short = tmp_path / "short"
    shutil.copytree(folder, short)
    tensors = load_file(short / "model.safetensors")
    dropped = sorted(k for k in tensors if k.endswith("mlp.down_proj.weight"))[0]
    del tensors[dropped]
    save_file(tensors, short / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=re.escape(f"does not fit this qwen3 config (1 tensor(s): missing {dropped}")):
        hf.load_model(short)
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="cannot load the checkpoint's weights") as e:
        hf.load_model(cut)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="init='pretrained' needs a checkpoint folder"):
        hf.load_model(CONFIGS / "qwen3-tiny.json", init="pretrained")


@pytest.mark.parametrize("family", ["qwen3", "qwen2_5_vl"])
def test_fcp_train_starts_from_the_checkpoint(checkpoints, family):
    """Step 0 of ``fcp train --model hf:FOLDER`` (2 processes, float64) has the stock pretrained model's loss on the
    same global batch to 1e-12; the same run with ``--init random`` does not."""
    folder, _ = checkpoints[family]
    kw = dict(model=f"hf:{folder}", data="synthetic", dtype="float64", steps=1, global_batch_size=3, num_synthetic=12,
              max_tokens=80, tokens_per_rank=40, prefetch=0, verbose=False, return_grads=True)
    res = run_training(TrainConfig(**kw), 2)
    rand = run_training(TrainConfig(**kw, init="random"), 2)
    batch = res["steps"][0]["sample_indices"]
    assert rand["steps"][0]["sample_indices"] == batch
    config = hf.load_config(folder)
    data = load_train_data(f"hf:{folder}", "synthetic", max_tokens=80, seed=0, num_synthetic=12, hf_config=config)
    stock = transformers.AutoModelForImageTextToText if family == "qwen2_5_vl" else transformers.AutoModelForCausalLM
    ref = stock.from_pretrained(folder, dtype=torch.float64, attn_implementation="sdpa", local_files_only=True)
    ref.train()
    ids = special_ids(config) if family == "qwen2_5_vl" else {}
    loss, num = reference_step(ref, [data.dataset[i] for i in batch],
                               ignore_ids=(ids["image"], ids["video"]) if ids else ())
    assert res["steps"][0]["num_tokens"] == num
    assert abs(res["steps"][0]["loss"] - loss) <= 1e-12 * abs(loss), (res["steps"][0]["loss"], loss)
    assert abs(rand["steps"][0]["loss"] - loss) > 1e-6 * abs(loss)


def test_fcp_train_with_a_checkpoint_that_does_not_fit_is_one_line(checkpoints, tmp_path, capsys):
    """The damaged-checkpoint error of :func:`load_model` reaches the user as one line, exit 2 (raised in every rank
    before any step)."""
    import shutil

    from fcp_cli.main import main

    folder, _ = checkpoints["qwen3"]
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) // 2])
    rc = main(["train", "--model", f"hf:{cut}", "--nproc", "2", "--steps", "1"])
    _, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1, err
    assert "cannot load the checkpoint's weights" in err, err


@pytest.mark.parametrize("family, reducer", [pytest.param("qwen3", "fsdp2", marks=needs_cpu_fsdp2),
                                             ("qwen2_5_vl", "ddp"), ("qwen3", "fsdp1")])
def test_save_model_writes_the_trained_weights_for_from_pretrained(family, reducer, tmp_path):
    """``fcp train --save-model DIR`` after 2 steps on 2 processes (FSDP2, FSDP1: the shards gathered; DDP: unwrapped): the
    stock ``from_pretrained`` reads every trained parameter back exactly (float64), and the config names no fcp
    attention, so the folder loads where fcp is not installed."""
    out = tmp_path / "trained"
    cfg = TrainConfig(model=f"hf:{CONFIGS / f'{family}-tiny.json'}", data="synthetic", dtype="float64", steps=2,
                      global_batch_size=3, num_synthetic=12, max_tokens=80, tokens_per_rank=40, prefetch=0,
                      verbose=False, reducer=reducer, return_params=True, save_model=str(out))
    res = run_training(cfg, 2)
    stock = transformers.AutoModelForImageTextToText if family == "qwen2_5_vl" else transformers.AutoModelForCausalLM
    loaded = stock.from_pretrained(out, dtype=torch.float64, local_files_only=True)
    got = dict(loaded.named_parameters())
    assert got.keys() == res["params"].keys()
    untrained = dict(hf.build_model(hf.load_config(cfg.model[3:]), dtype=torch.float64, seed=0).named_parameters())
    assert all(torch.equal(got[n].detach(), torch.from_numpy(p)) for n, p in res["params"].items())
    assert any(not torch.equal(got[n].detach(), untrained[n].detach()) for n in got)  # it did train
    assert "fcp_ring" not in (out / "config.json").read_text()
