"""InternVL (transformers' ``internvl`` model type) on real bundled images: ``fcp train`` on the bundled samples'
``internvl3`` index — real 448-px tiles read and tiled by ``IndexedDataset`` — equals the stock model.

The matrix of ``test_hf_train.py`` covers InternVL with every reducer, gradient checkpointing and 2/3 processes on
synthetic 56-px tiles; here the tiles are the real ones (448 px, 256 tokens each): an image of several tiles is split
over a degree-2 group, so its tiles are encoded on both ranks and the rows exchanged. Plus the data that is refused
with one error: an index of another family, tiles of another size. (FCPTrainer: ``test_hf_trainer.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _requires import transformers_models
import torch

transformers = transformers_models()

from fcp_exec.integrations import hf  # noqa: E402
from fcp_exec.integrations.hf_data import reference_step  # noqa: E402
from fcp_exec.train import TrainConfig, run_training  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "internvl-tiny.json"  # 448-px tiles, as InternVL3
CONFIG_56 = Path(__file__).resolve().parent / "internvl-tiny.json"  # the same model with 56-px tiles


def test_fcp_train_on_real_tiles_equals_the_stock_model(tmp_path):
    """2 processes, float64, one global batch of two of the bundled index's images up to 3,400 tokens (several tiles
    each): loss and every gradient to 1e-12, the denominator exactly, against the stock InternVL model on the same
    documents, with a degree-2 group in the plan (an image's tiles encoded on both ranks)."""
    kw = dict(model=f"hf:{CONFIG}", dtype="float64", steps=1, global_batch_size=2, max_tokens=3400,
              tokens_per_rank=1700, prefetch=0, verbose=False, return_grads=True, cache_dir=str(tmp_path / "cache"))
    res = run_training(TrainConfig(**kw), 2)
    step = res["steps"][0]
    assert [2] in step["degrees"] or any(2 in mb for mb in step["degrees"]), step["degrees"]
    config = hf.load_config(CONFIG)
    data = load_train_data(f"hf:{CONFIG}", None, max_tokens=3400, seed=0, hf_config=config,
                           cache_dir=str(tmp_path / "cache"))
    samples = [data.dataset[i] for i in step["sample_indices"]]
    assert all(tuple(s["pixel_values"].shape[1:]) == (3, 448, 448) for s in samples)  # real tiles
    assert max(int(s["pixel_values"].shape[0]) for s in samples) > 1, [s["pixel_values"].shape for s in samples]
    ref = hf.build_model(config, dtype=torch.float64, seed=0)
    ref.train()
    loss, num = reference_step(ref, samples, ignore_ids=(int(config.image_token_id),))
    assert step["num_tokens"] == num
    assert abs(step["loss"] - loss) <= 1e-12 * abs(loss), (step["loss"], loss)
    grads = {n: p.grad for n, p in ref.named_parameters() if p.grad is not None}
    top = max(float(g.abs().max()) for g in grads.values())
    worst = max(float((torch.from_numpy(step["grads"][n]) - g).abs().max()) for n, g in grads.items())
    assert worst <= 1e-12 * top, worst / top
    assert any(n.startswith("model.vision_tower") for n in grads)  # the vision tower trained too


def test_mismatched_data_is_one_error(tmp_path):
    cache = str(tmp_path / "cache")
    with pytest.raises(ValueError, match="an internvl model needs an InternVL spec"):
        load_train_data(f"hf:{CONFIG}", str(hf_index(cache, "qwen2.5-vl")), hf_config=hf.load_config(CONFIG))
    with pytest.raises(ValueError, match=r"448-px tiles but the model's vision tower takes \(56, 56\)"):
        load_train_data(f"hf:{CONFIG_56}", None, hf_config=hf.load_config(CONFIG_56), cache_dir=cache)


def hf_index(cache: str, spec: str) -> Path:
    from fcp_data import bundled_index

    return bundled_index(spec, cache)
