"""The data side of :mod:`fcp_exec.integrations.torchtitan_trainer`: :class:`FCPTitanDataLoader` (torchtitan's
dataloader slot filled by ``FCPSampler`` → ``FCPDataset`` → ``FCPCollator``, its state in torchtitan's checkpoints)
and :class:`PreTokenized` (its tokenizer slot: FCP's data comes tokenized)."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from fcp_exec.launch import dataloader_context

try:
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(f"fcp_exec.integrations.torchtitan_data needs torchtitan ({e}): pip install 'torchtitan>=0.3' "
                      "with its dependencies (tensorboard, tyro, torchdata)") from None

__all__ = ["FCPTitanDataLoader", "PreTokenized"]


class FCPTitanDataLoader(BaseDataLoader):
    """This rank's FCP micro-batches (collator dicts) for :class:`FCPTitanTrainer`, epoch after epoch."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = ""
        """"" (read dataset_path), or "package.module:function" returning a map-style dataset of {"input_ids"} samples"""
        dataset_path: str | None = None
        """an fcp length index folder (`fcp index`) or a Megatron PREFIX (PREFIX.bin / PREFIX.idx)"""
        global_batch_size: int = 8
        """sequences per global batch (one optimizer step)"""
        micro_batches: int = 0
        """micro-batches per global batch; 0: the planner chooses per global batch ("auto")"""
        tokens_per_rank: int = 0
        """each rank's token budget per micro-batch; 0: training.seq_len"""
        cost_model: str = ""
        """a cost-model JSON from `fcp profile`; "": the preset below"""
        preset: str = "qwen3-1.7b"
        """a model preset (`fcp presets`) or hf:PATH (a Hugging Face config.json), with hardware below; "": the
        trained model's own shape (model_shape)"""
        hardware: str = "h100"
        model_shape: str = ""
        """the trained model's shape as JSON (fcp_config fills it from the model config: its preset where preset is
        "")"""
        solver: str = "fcp"
        seed: int = 0
        drop_last: bool = False
        on_overlong: str = "truncate"
        """a document longer than training.seq_len or than all ranks hold: "truncate", "drop" or "error\""""
        num_workers: int = 2
        infinite: bool = True
        """go on with the next epoch at the end of one (False: the run stops there)"""
        vocab_size: int = 0
        """the model's vocabulary (fcp_config fills it): a sample holding a larger id is recorded and skipped"""
        future_tokens: int = 0
        """look-ahead tokens per token for multi-token prediction (fcp_config fills it: the model's MTP depth)"""

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, seq_len: int, tokenizer: Any = None,
                 local_batch_size: int = 1, snapshot_every_n_steps: int | None = None) -> None:
        from fcp_data import FCPCollator, FCPDataset, FCPSampler
        from fcp_data.sampler_config import OVERLONG_CHOICES
        from fcp_data.sampler_inputs import check_lengths, dist_rank_and_world

        if config.on_overlong not in OVERLONG_CHOICES:
            raise ValueError(f"FCPTitanDataLoader: on_overlong must be one of {', '.join(OVERLONG_CHOICES)}, got "
                             f"{config.on_overlong!r}")
        rank, world = dist_rank_and_world()
        if (dp_rank, dp_world_size) != (rank, world):
            raise ValueError(f"FCPTitanDataLoader: every rank is data-parallel to torchtitan under FCP, but the "
                             f"batch mesh has rank {dp_rank} of {dp_world_size} in a world of {world}")
        self.config = config
        data, lengths = _open_dataset(config)

        exclude = None
        if int(check_lengths(lengths, None)[0].max()) > seq_len:  # RoPE covers training.seq_len positions
            data, lengths, exclude = _within_seq_len(data, lengths, seq_len, config.on_overlong)
        self.sampler = FCPSampler(lengths, num_ranks=world, rank=rank, cost_model=_cost_model(config, seq_len),
                                  global_batch_size=config.global_batch_size, seed=config.seed,
                                  drop_last=config.drop_last, on_overlong=config.on_overlong, solver=config.solver,
                                  micro_batches=config.micro_batches or "auto", exclude=exclude)
        self.pad_token_id = int(getattr(data, "pad_token_id", 0) or 0)
        collate = FCPCollator(pad_token_id=self.pad_token_id, sample_labels=bool(getattr(data, "has_labels", False)),
                              future_tokens=config.future_tokens)
        dataset = FCPDataset(data, vocab_size=config.vocab_size or None)
        workers = config.num_workers
        self.loader = DataLoader(dataset, batch_sampler=self.sampler, num_workers=workers, collate_fn=collate,
                                 multiprocessing_context=dataloader_context(workers, dataset, collate))
        self.trainer_bound, self._last = False, None

    def __iter__(self) -> Iterator[dict]:
        if not self.trainer_bound:
            raise RuntimeError("FCPTitanDataLoader yields FCP micro-batches, which torchtitan's own Trainer does not "
                               "run: use fcp_exec.integrations.torchtitan_trainer.FCPTitanTrainer (fcp_config does)")
        while True:
            yield from self.loader
            if not self.config.infinite:
                return

    def consumed(self, last: dict) -> None:
        """The last micro-batch the trainer trained on (the position :meth:`state_dict` saves)."""
        self._last = last

    def state_dict(self) -> dict[str, Any]:
        """The sampler's state after the last trained micro-batch (before any, where it stands), as JSON text: one
        key for every rank (the position and the exclusions are the same on all of them)."""
        state = self.sampler.state_after(self._last) if self._last is not None else self.sampler.state_dict()
        return {"fcp_sampler": json.dumps(state)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if "fcp_sampler" not in state_dict:
            raise ValueError(f"FCPTitanDataLoader: the checkpoint's dataloader state has {sorted(state_dict)}, not "
                             "the FCP sampler's: it was saved by another dataloader")
        self.sampler.load_state_dict(json.loads(state_dict["fcp_sampler"]))
        self._last = None


class PreTokenized(BaseTokenizer):
    """The tokenizer slot of an FCP run: FCP's data comes tokenized (the index's tokenizer wrote the ids), so nothing
    is loaded from ``hf_assets_path`` and nothing is encoded; ``get_vocab_size`` is the model's."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 0

    def __init__(self, config: Config, **_: Any) -> None:
        super().__init__()
        self.vocab_size = int(config.vocab_size)

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise RuntimeError("FCP's data comes tokenized (fcp index); the run holds no tokenizer to encode with")

    decode = encode

    def get_vocab_size(self) -> int:
        return self.vocab_size


def _open_dataset(config: FCPTitanDataLoader.Config) -> tuple[Any, Any]:
    """``(dataset, what the sampler plans with)`` for the config's ``dataset`` / ``dataset_path``."""
    if config.dataset:
        module, _, name = config.dataset.partition(":")
        try:
            factory = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"FCPTitanDataLoader: dataset={config.dataset!r} is not an importable "
                             f"'package.module:function' ({e})") from None
        from fcp_exec.integrations.hf_trainer_data import count_lengths

        data = factory()
        return data, data.index if _is_index(data) else count_lengths(data)
    if not config.dataset_path:
        raise ValueError("FCPTitanDataLoader: set dataset_path (an fcp length index or a Megatron PREFIX) or dataset")
    path = config.dataset_path
    from fcp_data.megatron_indexed import is_megatron_index

    if Path(path + ".idx").is_file() or (Path(path).suffix in (".idx", ".bin") and is_megatron_index(path)):
        from fcp_data.megatron_indexed import MegatronIndexedDocuments

        docs = MegatronIndexedDocuments(path)
        return docs, docs
    from fcp_data import IndexedDataset

    data = IndexedDataset(path)
    return data, data.index


def _within_seq_len(data: Any, lengths: Any, seq_len: int, on_overlong: str) -> tuple[Any, Any, Any]:
    """``(data, lengths, exclude)`` for a sampler that plans no document past ``training.seq_len`` (the model's
    RoPE length; FCP's capacity, ranks × tokens_per_rank, may be larger): cut to it, left out, or one error, as
    ``on_overlong`` says."""
    import numpy as np

    from fcp_data.sampler_inputs import check_lengths

    full = check_lengths(lengths, None)[0]
    over = np.flatnonzero(full > seq_len)
    what = (f"{over.size} document(s) are longer than training.seq_len={seq_len} (the model's RoPE length; first: "
            f"sample {int(over[0])}, {int(full[over[0]])} tokens)")
    if _is_index(data) and np.asarray(data.index.num_visual_tokens).any():
        raise ValueError(f"FCPTitanDataLoader: {what}, and the index holds images/videos, which cannot be cut: "
                         "raise training.seq_len")
    if on_overlong == "error":
        raise ValueError(f"FCPTitanDataLoader: {what}; raise training.seq_len or pass on_overlong='truncate'/'drop'")
    if on_overlong == "drop":
        return data, lengths, over
    return _Cut(data, seq_len), np.minimum(full, seq_len), None


def _is_index(data: Any) -> bool:
    """An fcp ``IndexedDataset`` (its ``index`` a LengthIndex, not a list's method)."""
    index = getattr(data, "index", None)
    return index is not None and not callable(index) and hasattr(index, "manifest")


class _Cut(torch.utils.data.Dataset):
    """``data`` with every sample's ``input_ids`` (and ``labels``) cut to the first ``n`` tokens."""

    def __init__(self, data: Any, n: int) -> None:
        self.data, self.n = data, int(n)
        self.pad_token_id = getattr(data, "pad_token_id", 0)
        self.has_labels = getattr(data, "has_labels", False)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        sample = self.data[i]
        if not isinstance(sample, dict):
            return sample
        return {k: v[:self.n] if k in ("input_ids", "labels") and v is not None else v for k, v in sample.items()}


def _cost_model(config: FCPTitanDataLoader.Config, seq_len: int):
    from fcp_data import CostModel

    if config.cost_model:
        cost = CostModel.load(config.cost_model)
    elif config.preset or not config.model_shape:
        cost = CostModel.preset(config.preset or "qwen3-1.7b", config.hardware)
    else:
        from fcp_data.presets import ModelConfig

        cost = CostModel.preset(ModelConfig(**json.loads(config.model_shape)), config.hardware)
    return cost.replace(tokens_per_rank=int(config.tokens_per_rank or seq_len))
