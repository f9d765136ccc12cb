"""The training loop of ``fcp train`` and the demo: FCPSampler → FCPCollator → ring attention → AdamW.

One optimizer step = one global batch of the sampler = its ``num_micro_batches`` plan-annotated
micro-batches. On every rank and for every micro-batch: run the model on this rank's zigzag shard
(skipped on an idle rank), ``loss = Σ local token losses / num_tokens_global`` (label tokens of the whole
global batch; for tiny-mllm labels whose target is a visual placeholder are ignored, the collator's default,
and the sampler counts the rest exactly from ``TrainData.visual_layout``), backward (gradients accumulate over micro-batches). Then one all-reduce SUM of a flat
buffer holding every parameter's gradient (zeros where a parameter was not used on this rank: idle
ranks, ranks without visual tokens) and the loss, and an AdamW step. The all-reduced gradient is exactly
the single-process gradient of the global-batch mean loss, and the reported loss is that mean, identical on all ranks.

``train(config)`` runs on one rank of an initialised process group (or alone, without one);
``run_training(config, nproc)`` starts the ranks (:func:`fcp_exec.launch.launch`, torchrun-aware) and
returns rank 0's result. Rank 0 prints one line per step (or, with ``json_lines``, one JSON object per
step on stdout and nothing else there).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from fcp_data.cost import CostModel
from fcp_exec.launch import current_device, dataloader_context, dist_info
from fcp_exec.reducers import full_view, grad_scaler_class
from fcp_exec.train_config import (DTYPE_NAMES, TrainConfig, builtin_cost_model, format_degrees, format_step,
                                   parse_planner)
from fcp_exec.train_launch import hf_preload, run_training

__all__ = ["TrainConfig", "Trainer", "train", "train_matrix", "run_training", "builtin_cost_model", "format_degrees", "parse_planner",
           "hf_preload"]

_DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def _to_device(batch: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def _forward_loss(model, batch: dict, is_mllm: bool) -> torch.Tensor:
    from fcp_exec.models import token_loss_sum
    from fcp_exec.step import denominator

    args = (batch["input_ids"], batch["position_ids"], batch["cu_seqlens"], batch["ranks"])
    if is_mllm:
        logits = model(*args, visual_pos=batch.get("visual_pos"), visual_index=batch.get("visual_index"),
                       pixel_values=batch.get("pixel_values"), grid_thw=batch.get("grid_thw"))
    else:
        logits = model(*args)
    # a global batch of one-token documents has no label token: its loss is 0, not 0/0
    return token_loss_sum(logits, batch["labels"]) / denominator(batch)


def _full(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one full tensor (FSDP2 shards are gathered)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _full_grad(p: torch.Tensor):
    """A parameter's full gradient as float64 numpy, or None (FSDP2 gathers zeros then: same collectives everywhere)."""
    g = _full(p.grad if p.grad is not None else torch.zeros_like(p))
    return g.detach().to("cpu", torch.float64, copy=True).numpy() if p.grad is not None else None


def _gather_step(res, seen: list[tuple[int, ...]], world: int) -> dict[str, Any]:
    """One all-gather of a step's facts from every rank: each micro-batch's CP-group degrees (idle ranks excluded),
    the samples any rank skipped (once each, by index), the sample indices of the global batch and per micro-batch."""
    mine = (res.groups, list(res.skipped), seen)
    if world > 1:
        import torch.distributed as dist

        allg: list = [None] * world
        dist.all_gather_object(allg, mine)
    else:
        allg = [mine]
    degrees = []
    for m in range(len(res.groups)):
        uniq = {tuple(r[m]) for r, _, _ in allg if r[m]}
        degrees.append(sorted((len(g) for g in uniq), reverse=True))
    by_index = {rec["index"]: rec for _, recs, _ in allg for rec in recs}
    return {"degrees": degrees, "skipped_samples": [by_index[i] for i in sorted(by_index)],
            "sample_indices": sorted({i for _, _, s in allg for b in s for i in b}),
            "micro_batch_indices": [sorted({i for _, _, s in allg for i in s[m]}) for m in range(len(seen))]}


def _recording(batches, seen: list):
    """``batches`` passed through, each one's ``sample_indices`` appended to ``seen``."""
    for b in batches:
        seen.append(tuple(b.get("sample_indices", ())))
        yield b


class Trainer:
    """One rank's training state: data pipeline, model (wrapped for its reducer), optimizer; :meth:`step` runs
    one global batch through :func:`fcp_exec.step.train_step`.

    Needs the process group initialised (or none, for one rank). Several trainers may live in one
    process (the e2e benchmark alternates planners step by step; the HF tests run a matrix of reducers)."""

    def __init__(self, cfg: TrainConfig) -> None:
        from fcp_exec.reducers import make_reducer, mixed_precision

        self.cfg = cfg
        self.rank, self.world = dist_info()
        self.device = current_device()
        self.is_hf = cfg.model.startswith("hf:")
        hf_config = None
        if self.is_hf:
            from fcp_exec.integrations import hf
            hf_config = hf.load_config(cfg.model[3:])
        self._hf_config = hf_config
        self.data = data = self._load(cfg.data)
        self.is_mllm = cfg.model == "tiny-mllm" or bool(self.is_hf and data.visual_token_ids)
        if cfg.model == "tiny-mllm" and not data.visual_token_ids:
            raise ValueError("tiny-mllm needs a multimodal dataset (an index built with a vision spec, e.g. qwen2-vl)")
        cost = CostModel.from_dict(cfg.cost) if cfg.cost else builtin_cost_model(cfg.max_tokens, self.world, cfg.dtype)
        if cfg.tokens_per_rank:
            cost = cost.replace(tokens_per_rank=cfg.tokens_per_rank)
        self.cost = cost
        model = self._model(hf_config)
        collator = self._collator_for(data, model)
        self.num_params = sum(p.numel() for p in model.parameters())
        if cfg.reducer == "fsdp2":  # transformers returns logits as a view; FSDP2 warns that an in-place op on it
            import warnings  # would skip a hook. The loss here never modifies outputs in place: noise for fcp train

            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor",
                                    category=UserWarning)
        # tiny-mllm skips its vision encoder on text-only micro-batches: DDP must be told (HF models: make_reducer knows)
        unused = True if cfg.model == "tiny-mllm" else None
        self.model, self.reducer = make_reducer(cfg.reducer, model, find_unused_parameters=unused,
                                                mp_policy=mixed_precision(cfg.fsdp_mixed_precision))
        self._collator = collator
        self.sampler, self.loader = self._loader(cfg.seed)
        self._eval_batches = None
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
        self.scaler = grad_scaler_class(cfg.reducer)(self.device.type, init_scale=cfg.initial_loss_scale,
                                                growth_interval=cfg.loss_scale_window) if cfg.amp == "float16" else None
        if cfg.amp != "none":
            from fcp_exec.step import autocast_loss

            self.loss_fn = autocast_loss(self.loss_fn, self.device.type, getattr(torch, cfg.amp))
        self.epoch, self._it, self.num_steps, self.last_result = 0, None, 0, None
        if cfg.resume:  # model, optimizer and the sampler's position after the saved step (fcp_exec.checkpoint)
            from fcp_exec.checkpoint import load_checkpoint

            self.num_steps = load_checkpoint(cfg.resume, self.model, self.opt, self.sampler, grad_scaler=self.scaler)
            self.epoch = self.sampler.epoch

    def _load(self, data: str | None):
        from fcp_exec.train_data import load_train_data

        cfg = self.cfg
        return load_train_data(cfg.model, data, max_tokens=cfg.max_tokens, seed=cfg.seed, cache_dir=cfg.cache_dir,
                               num_synthetic=cfg.num_synthetic, lengths=cfg.synthetic_lengths,
                               hf_config=self._hf_config, prompt_mask=cfg.sample_labels,
                               caption_labels=cfg.caption_labels)

    def _loader(self, seed: int, data=None, collator=None):
        """An FCPSampler over ``data`` (default: the run's) with this seed and the DataLoader that reads it."""
        from torch.utils.data import DataLoader

        from fcp_data import FCPDataset, FCPSampler
        from fcp_exec.train_data import view_exclusions

        cfg, data = self.cfg, data or self.data
        exclude = view_exclusions(data, cfg.exclude) if data is self.data else None  # the training data's numbering
        solver, degree = parse_planner(cfg.planner)
        sampler = FCPSampler(data.lengths, num_ranks=self.world, rank=self.rank, cost_model=self.cost,
                             global_batch_size=cfg.global_batch_size, seed=seed, solver=solver, prefetch=cfg.prefetch,
                             solver_options=None if degree is None else {"degree": degree},
                             visual_layout=data.visual_layout, exclude=exclude)
        dataset = FCPDataset(data.dataset, on_error=cfg.on_read_error, errors_path=cfg.read_errors_out)
        collate, workers = collator or self._collator, cfg.num_workers
        return sampler, DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=workers,
                                   persistent_workers=workers > 0,
                                   multiprocessing_context=dataloader_context(workers, dataset, collate))

    def evaluate(self) -> dict[str, Any]:
        """The mean loss of the next global batch of a second sampler (seed + 1) over ``cfg.eval_data`` (default: the
        training data), without gradients or updates (:func:`fcp_exec.step.eval_step`); its record: loss,
        num_tokens, sample_indices (every rank's, into the evaluated data), skipped_samples."""
        from fcp_exec.step import eval_step

        if self._eval_batches is None:
            data = self._load(self.cfg.eval_data) if self.cfg.eval_data else self.data
            collator = None if data is self.data else self._collator_for(data, self.model)
            self.eval_data = data
            self._eval_batches = _epochs(*self._loader(self.cfg.seed + 1, data, collator))
        seen: list[tuple[int, ...]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            res = eval_step(self.model, _recording(self._eval_batches, seen), self.loss_fn,
                            pad_token_id=self.data.pad_token_id, to_device=lambda b: _to_device(b, self.device))
        finally:
            self.model.train(was_training)
        facts = _gather_step(res, seen, self.world)
        return {"loss": res.loss, "num_tokens": res.num_tokens, **{k: v for k, v in facts.items() if k != "degrees"}}

    def _model(self, hf_config):
        """The model (HF: stock transformers model with ``fcp_ring`` attention; else a built-in tiny model) on this
        rank's device, and ``self.loss_fn``."""
        cfg = self.cfg
        if self.is_hf:
            from fcp_exec.integrations import hf

            model = hf.load_model(cfg.model[3:], config=hf_config, dtype=_DTYPES[cfg.dtype], seed=cfg.seed,
                                  init=cfg.init).to(self.device)
            self.pretrained = cfg.init == "pretrained" or (cfg.init == "auto" and hf.has_weights(cfg.model[3:]))
            hf.apply_fcp(model)
            if cfg.grad_checkpointing:
                hf.enable_gradient_checkpointing(model)
            model.train()
            self.loss_fn = hf.fcp_loss
            return model
        from fcp_exec.models import build_model

        is_mllm = self.is_mllm
        self.loss_fn = lambda m, b: _forward_loss(m, b, is_mllm)
        return build_model(cfg.model, seed=cfg.seed, dtype=_DTYPES[cfg.dtype]).to(self.device)

    def _collator_for(self, data, model):
        """The collator of ``data`` (its pad id, visual ids, own labels) for this run's model."""
        from fcp_data import FCPCollator

        sample_labels = self.cfg.sample_labels or data.has_labels  # an SFT index's samples carry their own labels
        if self.is_hf and self.is_mllm:
            from fcp_exec.integrations.hf_positions import hf_collator

            return hf_collator(getattr(model, "module", model).config, pad_token_id=data.pad_token_id,
                               sample_labels=sample_labels)
        if self.is_hf:
            return FCPCollator(pad_token_id=data.pad_token_id, sample_labels=sample_labels)
        return FCPCollator(pad_token_id=data.pad_token_id, visual_token_id=data.visual_token_ids or None,
                           sample_labels=sample_labels)

    def describe(self) -> str:
        c = self.cfg
        weights = "pretrained weights" if getattr(self, "pretrained", False) else f"random weights (seed {c.seed})"
        return (f"{c.model} ({self.num_params:,} params, {c.dtype}, {weights}) on {self.world} rank(s), device {self.device}, "
                f"reducer {c.reducer}{', gradient checkpointing' if c.grad_checkpointing else ''}"
                f"{f', {c.amp} autocast' if c.amp != 'none' else ''}"
                f"{f', FSDP2 {c.fsdp_mixed_precision} compute' if c.fsdp_mixed_precision != 'none' else ''}; data: "
                f"{self.data.description}; planner {c.planner}, tokens_per_rank {self.cost.tokens_per_rank}")

    def _batches(self):
        """This rank's batches, across epoch boundaries (a global batch never straddles one)."""
        while True:
            if self._it is None:
                self._it = iter(self.loader)
            try:
                yield next(self._it)
            except StopIteration:
                self.epoch += 1
                self.sampler.set_epoch(self.epoch)
                self._it = None

    def step(self) -> dict[str, Any]:
        """One optimizer step over the next global batch; returns its record (module docstring)."""
        from fcp_exec.optim import check_finite, clip_grad_norm, lr_at, set_lr
        from fcp_exec.skips import leave_out_later
        from fcp_exec.step import train_step

        t0 = time.perf_counter()
        waits_before = self.sampler.planner_wait_total
        self.opt.zero_grad(set_to_none=True)
        seen: list[tuple[int, ...]] = []
        res = self.last_result = train_step(self.model, _recording(self._batches(), seen), self.loss_fn, self.reducer,
                                            pad_token_id=self.data.pad_token_id, grad_scaler=self.scaler,
                                            to_device=lambda b: _to_device(b, self.device))
        scale = None
        if self.scaler is not None:  # the gradients below and the optimizer see the unscaled ones
            scale = float(self.scaler.get_scale())
            self.scaler.unscale_(self.opt)
        grads = None
        if self.cfg.return_grads:
            with full_view(self.model, grads=True):  # every rank gathers every parameter: same collectives
                grads = {n: _full_grad(p) for n, p in _named(self.model)}
        c = self.cfg
        grad_norm = clip_grad_norm(self.model, c.max_grad_norm)  # every rank: the FSDP2 norm is a collective
        lr = lr_at(self.num_steps, lr=c.lr, steps=c.steps, warmup_steps=c.warmup_steps, schedule=c.lr_schedule,
                   min_lr=c.min_lr)
        set_lr(self.opt, lr)
        check_finite(self.num_steps, res.loss, grad_norm, lr, loss_scaler=self.scaler is not None)
        if self.scaler is None:
            self.opt.step()
        else:  # skipped (on every rank alike) when a gradient overflowed; the scale then halves
            self.scaler.step(self.opt)
            self.scaler.update()
        facts = _gather_step(res, seen, self.world)  # sample_indices: the whole global batch, from every rank
        if not c.retry_skipped:  # what any rank skipped is not read again in later epochs (every rank alike)
            leave_out_later(self.sampler, res)
        rec = {"step": self.num_steps, "loss": res.loss, "num_tokens": res.num_tokens,
               "step_time_s": time.perf_counter() - t0, "planner_wait_s": self.sampler.planner_wait_total - waits_before,
               "num_idle": res.num_idle, "lr": lr, "grad_norm": grad_norm, **facts}
        if scale is not None:
            rec["loss_scale"], rec["skipped_step"] = scale, float(self.scaler.get_scale()) < scale
        rec.update({"grads": grads} if grads is not None else {})
        self.num_steps += 1
        return rec

    def checksum(self) -> float:
        with torch.no_grad(), full_view(self.model):
            return float(sum(_full(p).double().sum().item() * (i + 1) for i, p in enumerate(self.model.parameters())))


def _epochs(sampler, loader):
    """``loader``'s batches over epoch after epoch (the evaluation stream)."""
    epoch = 0
    while True:
        yield from loader
        epoch += 1
        sampler.set_epoch(epoch)


def _named(model) -> list:
    """``named_parameters`` without a DDP wrapper's ``module.`` prefix or FSDP1's unit prefixes."""
    inner = getattr(model, "module", model)
    return [(n.replace("_fsdp_wrapped_module.", ""), p) for n, p in inner.named_parameters()]


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run ``cfg.steps`` optimizer steps on this rank (module docstring). Returns ``{"steps": [...],
    "param_checksum": float, "params": {name: ndarray} (rank 0 with return_params), ...}``."""
    tr = Trainer(cfg)
    rank = tr.rank
    if rank == 0 and cfg.verbose and not cfg.json_lines:
        print(f"[fcp train] {tr.describe()}", flush=True)
    records = []
    while tr.num_steps < cfg.steps:  # from 0, or from a checkpoint's step (--resume)
        rec = tr.step()
        for key in () if cfg.return_grads else ("sample_indices", "micro_batch_indices"):
            rec.pop(key, None)
        records.append(rec)
        if rank == 0 and (cfg.json_lines or cfg.verbose):
            print(format_step(rec, cfg.json_lines), file=sys.stdout, flush=True)
        if cfg.checkpoint and tr.num_steps % cfg.checkpoint_every == 0:
            from fcp_exec.checkpoint import save_checkpoint

            path = save_checkpoint(Path(cfg.checkpoint) / f"step-{tr.num_steps}", tr.num_steps, tr.model, tr.opt,
                                   tr.sampler, tr.last_result, grad_scaler=tr.scaler)
            if rank == 0 and cfg.json_lines:
                print(json.dumps({"checkpoint": str(path), "resumes_at_step": tr.num_steps}), flush=True)
            elif rank == 0 and cfg.verbose:
                print(f"checkpoint {path}", flush=True)
    evals = [tr.evaluate() for _ in range(cfg.eval_steps)]
    for k, ev in enumerate(evals):
        if cfg.json_lines and rank == 0:
            print(json.dumps({"eval": k, "loss": ev["loss"], "num_tokens": ev["num_tokens"]}), flush=True)
        elif rank == 0 and cfg.verbose:
            print(f"eval {k:>3}  loss {ev['loss']:.6f}  tokens {ev['num_tokens']:>6}  (no update)", flush=True)
    if cfg.save_model:  # every rank: FSDP2/FSDP1 gather the shards
        from fcp_exec.checkpoint import save_hf_model

        path = save_hf_model(tr.model, cfg.save_model)
        if rank == 0 and (cfg.verbose or cfg.json_lines):
            print(json.dumps({"saved_model": str(path)}) if cfg.json_lines else f"model saved to {path}", flush=True)
    result: dict[str, Any] = {"steps": records, "eval": evals, "param_checksum": tr.checksum(), "rank": rank,
                              "world": tr.world, "tokens_per_rank": tr.cost.tokens_per_rank, "data": tr.data.description}
    if cfg.return_params:  # gathered on every rank (a collective under FSDP2), kept on rank 0
        with full_view(tr.model):
            params = {n: _full(p).detach().to("cpu", torch.float64, copy=True).numpy() for n, p in _named(tr.model)}
        if rank == 0:
            result["params"] = params
    if rank != 0:
        for rec in records:
            rec.pop("grads", None)
    return result


def train_matrix(cfgs: list[TrainConfig]) -> list[dict[str, Any]]:
    """:func:`train` for several configurations in turn on one process group (the HF equivalence tests run
    every reducer × checkpointing combination in one launch)."""
    return [train(c) for c in cfgs]
