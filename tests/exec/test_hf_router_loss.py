"""Hugging Face mixture-of-experts models with their router's load-balancing loss (``output_router_logits=True``)
trained with FCP on 2 gloo processes against the stock model in one process.

Families: Qwen3-MoE, Mixtral, Qwen2-MoE, OLMoE, FlexOlmo, gpt-oss, Qwen3-VL-MoE (with images and videos),
Phi-3.5-MoE, Granite MoE and ERNIE-4.5-MoE (every family whose model adds transformers' ``load_balancing_loss_func`` and that fcp trains), their
tiny configs from ``examples/configs`` with ``output_router_logits=True`` and ``router_aux_loss_coef`` 0.5 (the loss
then moves the router's weights visibly; the families' defaults are 0.001–0.02); float64, 3 AdamW steps and one
evaluation batch, through the real pipeline (FCPSampler → FCPCollator → ``apply_fcp`` → ``train_step``; the allreduce
reducer, Qwen3-MoE also with DDP and with FSDP2 under activation checkpointing, and over an index with documents that
fail to read), in ONE launch; and ``FCPTrainer`` (steps and ``evaluate()``) in another. The sampler's ``auto``
micro-batches put 2 micro-batches in every step here, with degree-2 groups and idle ranks.

Reference (:func:`_stock`): the stock model (``sdpa``; gpt-oss ``eager``) in one process, each document alone (its
images and videos too), its logits giving the cross-entropy over the global batch's label tokens, and per micro-batch
the load-balancing loss over the rows of all its documents (:func:`_aux_float64`: transformers' formula summed in
float64 — the stock sums run in float32 — checked against the stock model's own ``aux_loss`` of each document to
STOCK_FP32; ``test_a_padded_batch_balances_like_its_documents`` checks that the rows of the documents are what a
padded batch's real tokens give): ``loss = CE + coef · mean over the step's micro-batches of aux`` (a micro-batch none
of whose documents was read counting 0). Losses and gradients of every step and the evaluation within 1e-12 (measured
≤ 3.7e-14; the float32 routers of Granite MoE and ERNIE-4.5-MoE: FP32_ROUTER). Leaving the loss out, or balancing each document alone, misses step 0's loss by far more
(``test_the_load_balancing_loss_is_really_there``)."""

from __future__ import annotations

import functools
import json
import tempfile

import pytest
from _requires import transformers_models, without_cpu_fsdp2
import torch

transformers_models()

import test_hf_train as H  # noqa: E402 - the tiny configs, the common run settings, _gap
from fcp_exec.integrations import hf  # noqa: E402
from fcp_exec.integrations.hf_data import _reference_labels, doc_output, special_ids  # noqa: E402
from fcp_exec.launch import launch  # noqa: E402
from fcp_exec.train import TrainConfig, hf_preload, train_matrix  # noqa: E402
from fcp_exec.train_data import load_train_data  # noqa: E402

FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe", "olmoe", "gpt_oss", "qwen3_vl_moe", "phimoe", "granitemoe",
            "ernie4_5_moe", "flex_olmo")
WRAPPED = without_cpu_fsdp2([("qwen3_moe", "ddp"), ("qwen3_moe", "fsdp2")])  # activation checkpointing on
COEF = 0.5
STOCK_FP32 = 1e-6  # the stock aux_loss (router sums in float32) against the float64 sums of _aux_float64
LOSS_TOL, GRAD_TOL = 1e-12, 1e-12  # step 0
LATER_LOSS_TOL, LATER_GRAD_TOL = 1e-12, 1e-12  # after AdamW steps
# Granite MoE scores its router in float32 (``F.linear(...).float()``) in a float64 model: the stock model's own
# routing, and so both sides' sums, carry float32 rounding — losses within 1e-8, gradients within 1e-6 of the largest
# entry at every step (measured 3.6e-9 / 1.2e-7; each document balanced alone misses by 2.1e-6)
# ERNIE-4.5-MoE too (its router in float32; measured 7.9e-9 / 2.0e-7; per-document balance misses by 1.1e-4)
FP32_ROUTER = {"granitemoe": (1e-8, 1e-6), "ernie4_5_moe": (4e-8, 1e-6)}


@functools.lru_cache(maxsize=None)
def _configs() -> dict[str, str]:
    """``{family: config path}`` with the router loss on (written once)."""
    folder = tempfile.mkdtemp(prefix="fcp-router-")
    out = {}
    for family in FAMILIES:
        raw = json.loads((H.CONFIGS / f"{family}-tiny.json").read_text())
        raw.get("text_config", raw).update(output_router_logits=True, router_aux_loss_coef=COEF)
        out[family] = f"{folder}/{family}-router.json"
        with open(out[family], "w") as f:
            json.dump(raw, f)
    return out


def _cfg(family: str, reducer: str = "allreduce", gc: bool = False, data: str = "synthetic") -> TrainConfig:
    return TrainConfig(model=f"hf:{_configs()[family]}", reducer=reducer, grad_checkpointing=gc,
                       **dict(H.COMMON, data=data, num_synthetic=H.COMMON["num_synthetic"] if data == "synthetic" else None))


@functools.lru_cache(maxsize=None)
def _damaged() -> tuple[str, list[str]]:
    """An index of text documents, three of them edited after indexing (into garbage, and into valid JSON of another
    length): read, they fail and are skipped (test_hf_train's damaged text)."""
    import atexit
    import shutil
    from pathlib import Path

    from _damaged_data import edited_text_index

    root = Path(tempfile.mkdtemp(prefix="fcp-router-damaged-"))
    atexit.register(shutil.rmtree, root, True)
    path, lines = edited_text_index(root, edit=(2, 7), rewrite=(11,))
    return str(path), [f"doc-{k:05d}" for k in lines]


@functools.lru_cache(maxsize=None)
def _matrix():
    cfgs = [_cfg(f) for f in FAMILIES] + [_cfg(f, r, True) for f, r in WRAPPED]
    cfgs += [_cfg("qwen3_moe", data=_damaged()[0])]
    try:
        per_rank = launch(train_matrix, 2, cfgs, timeout=900.0, pg_timeout=120.0, preload=hf_preload(cfgs))
    except Exception as exc:  # noqa: BLE001 - re-raised by every test that needs this launch
        return cfgs, exc
    return cfgs, [dict(per_rank[0][k], checksums=[r[k]["param_checksum"] for r in per_rank]) for k in range(len(cfgs))]


def _run(family: str, reducer: str = "allreduce", data: str = "synthetic") -> tuple[TrainConfig, dict]:
    cfgs, results = _matrix()
    if isinstance(results, Exception):
        raise results
    [(cfg, res)] = [(c, r) for c, r in zip(cfgs, results) if c.model == f"hf:{_configs()[family]}"
                    and c.reducer == reducer and c.data == data]
    return cfg, res


def _aux_float64(router_logits, config) -> torch.Tensor:
    """transformers' ``load_balancing_loss_func`` over every row of ``router_logits`` (one ``[rows, E]`` tensor per
    MoE layer), summed in float64 (the stock one sums the router probabilities in float32):
    ``E · Σ_e (n_e / R) · (P_e / R)``."""
    cfg = getattr(config, "text_config", config)
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    counts, probs, rows = torch.zeros(experts, dtype=torch.float64), 0.0, 0
    for logits in router_logits:
        weights = torch.softmax(logits.reshape(-1, experts), dim=-1)
        top = torch.topk(weights, cfg.num_experts_per_tok, dim=-1).indices
        counts += torch.bincount(top.reshape(-1), minlength=experts).double()
        probs, rows = probs + weights.sum(0), rows + weights.shape[0]
    return experts * (counts / rows * probs / rows).sum()


def _read(data, i: int) -> dict | None:
    """Sample ``i``, None where its read raises or it is not the sample the index counted (FCP skips those)."""
    try:
        sample = data.dataset[i]
    except Exception:  # noqa: BLE001 - a damaged sample
        return None
    return sample if len(sample["input_ids"]) == data.lengths[i] else None


def _ignore_ids(config) -> tuple[int, ...]:
    """A VL model's image/video placeholder ids (no labels there), as the reference of ``test_hf_train``."""
    if not hasattr(config, "vision_config"):
        return ()
    ids = special_ids(config)
    return tuple(ids[k] for k in ("image", "video") if k in ids)


def _micro_batch_aux(outs: list, config) -> torch.Tensor:
    """The stock loss of a micro-batch's documents as one batch, from each document's own forward: the rows of every
    MoE layer over all documents (a padded batch's real tokens: ``test_a_padded_batch_balances_like_its_documents``).
    Each document's float64 sum is checked against the stock model's own ``aux_loss`` of it, to STOCK_FP32."""
    for out in outs:
        exact, stock = float(_aux_float64(out.router_logits, config).detach()), float(out.aux_loss.detach())
        assert abs(exact - stock) <= STOCK_FP32 * abs(stock), (exact, stock)
    layers = range(len(outs[0].router_logits))
    return _aux_float64([torch.cat([o.router_logits[k] for o in outs]) for k in layers], config)


def _stock_loss(model, data, micro_batches: list[list[int]], aux: str = "batch"):
    """``(loss, label tokens)`` of one step (module docstring), differentiable: every document through the stock model
    alone (its images and videos too). ``aux``: "batch" (the stock model's loss of each micro-batch as one batch),
    "none" (cross-entropy only) or "document" (each document's own aux, averaged: balance over fewer tokens)."""
    config = model.config
    is_vl, ignore = hasattr(config, "vision_config"), _ignore_ids(config)
    samples = [[s for s in (_read(data, i) for i in mb) if s is not None] for mb in micro_batches]
    samples = [mb for mb in samples if mb]  # a micro-batch none of whose documents was read adds 0 to the mean
    num = _reference_labels([s for mb in samples for s in mb], ignore)[1]
    ce, total = 0.0, 0.0
    for mb in samples:
        outs = [doc_output(model, s, is_vl) for s in mb]
        for out, lab in zip(outs, _reference_labels(mb, ignore)[0]):
            ce = ce + torch.nn.functional.cross_entropy(out.logits[0, :-1], lab, ignore_index=-100, reduction="sum")
        if aux == "batch":
            total = total + _micro_batch_aux(outs, config)
        elif aux == "document":
            total = total + sum(out.aux_loss for out in outs) / len(outs)
    coef = getattr(config, "text_config", config).router_aux_loss_coef
    return ce / num + coef * total / len(micro_batches), num


@functools.lru_cache(maxsize=None)
def _stock(family: str, steps: tuple, evals: tuple, aux: str = "batch", source: str = "synthetic",
           weight_decay: float = 0.01) -> list:
    """Per step ``(loss, num, {name: grad})`` of the stock model over ``steps`` (each a tuple of micro-batches' sample
    indices), then ``(loss, num, None)`` per evaluation batch with the trained weights; AdamW as ``fcp train``'s (every
    parameter decays: ``weight_decay`` 0 for a comparison with the Trainer's, which exempts norms and biases)."""
    path = _configs()[family]
    config = hf.load_config(path)
    data = load_train_data(f"hf:{path}", source, max_tokens=H.COMMON["max_tokens"], seed=0,
                           num_synthetic=H.COMMON["num_synthetic"], hf_config=config)
    model = hf.build_model(config, dtype=torch.float64, seed=0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=H.COMMON["lr"], weight_decay=weight_decay, foreach=False)
    out = []
    for mbs in steps:
        opt.zero_grad(set_to_none=True)
        loss, num = _stock_loss(model, data, [list(mb) for mb in mbs], aux)
        loss.backward()
        out.append((float(loss.detach()), num, {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()
                                       if p.grad is not None}))
        opt.step()
    model.eval()
    with torch.no_grad():
        for mbs in evals:
            loss, num = _stock_loss(model, data, [list(mb) for mb in mbs], aux)
            out.append((float(loss), num, None))
    return out


def _as_key(records: list[dict]) -> tuple:
    return tuple(tuple(tuple(mb) for mb in r["micro_batch_indices"]) for r in records)


def _check(family: str, res: dict, what: str, source: str = "synthetic") -> None:
    steps, evals = res["steps"], res["eval"]
    ref = _stock(family, _as_key(steps), _as_key(evals), source=source)
    for k, (s, (loss, num, grads)) in enumerate(zip(steps, ref)):
        ltol, gtol = FP32_ROUTER.get(family) or ((LOSS_TOL, GRAD_TOL) if k == 0 else (LATER_LOSS_TOL, LATER_GRAD_TOL))
        assert s["num_tokens"] == num, f"{what} step {k}: denominator {s['num_tokens']} != {num}"
        assert abs(s["loss"] - loss) <= ltol * abs(loss), f"{what} step {k}: loss {s['loss']!r} vs stock {loss!r}"
        gap = H._gap(s["grads"], grads)
        assert gap <= gtol, f"{what} step {k}: gradients differ by {gap:.2e} of the largest entry"
    for e, (loss, num, _) in zip(evals, ref[len(steps):]):
        assert e["num_tokens"] == num, f"{what} eval: denominator"
        ltol = FP32_ROUTER.get(family, (LATER_LOSS_TOL,))[0]
        assert abs(e["loss"] - loss) <= ltol * abs(loss), f"{what} eval: loss {e['loss']!r} vs {loss!r}"
    assert len(set(res["checksums"])) == 1, f"{what}: parameters differ across ranks"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family", FAMILIES)
def test_router_loss_trains_like_the_stock_model(family):
    """Every step's loss, denominator and gradients and the evaluation's loss equal the stock model's (tolerances in
    the module docstring); the steps hold degree-2 groups, an idle rank and several micro-batches."""
    cfg, res = _run(family)
    _check(family, res, family)
    degrees = [d for s in res["steps"] for d in s["degrees"]]
    assert any(2 in mb for mb in degrees), degrees
    assert any(sum(mb) < 2 for mb in degrees), f"no micro-batch with an idle rank in {degrees}"
    assert any(len(s["micro_batch_indices"]) > 1 for s in res["steps"]), "no step of several micro-batches"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("family, reducer", WRAPPED)
def test_router_loss_trains_like_the_stock_model_with_ddp_and_fsdp2(family, reducer):
    """The same under DDP and FSDP2 with activation checkpointing (the router's logits recomputed in the backward)."""
    cfg, res = _run(family, reducer)
    assert cfg.grad_checkpointing
    _check(family, res, f"{family} {reducer}")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("aux", ["none", "document"])
def test_the_load_balancing_loss_is_really_there(aux):
    """The stock reference without the aux term, and one whose aux is each document's own (the balance of fewer
    tokens than the micro-batch's), both miss the FCP run's step 0 by far more than the tolerance: the term is
    computed, and over the whole micro-batch."""
    _, res = _run("qwen3_moe")
    step = res["steps"][0]
    other = _stock("qwen3_moe", _as_key([step]), (), aux)[0][0]
    assert abs(step["loss"] - other) > 1e3 * LOSS_TOL * abs(other), (step["loss"], other)


def test_a_router_loss_fcp_does_not_know_is_refused(tmp_path):
    """A model type whose load-balancing loss fcp does not compute (here: a Qwen3-MoE config relabelled) is refused
    with one error naming the families it does compute, instead of training without the term."""
    from fcp_exec.integrations.hf_router import router_loss_of

    cfg = hf.load_config(_configs()["qwen3_moe"])
    with pytest.raises(ValueError, match=r"computes over the global batch for mixtral, .*set it to False"):
        router_loss_of(cfg, "jetmoe", "JetMoeForCausalLM")
    assert router_loss_of(cfg, "qwen3_moe", "x").num_experts == 4
    cfg.output_router_logits = False
    assert router_loss_of(cfg, "jetmoe", "x") is None


@pytest.mark.timeout(900)
def test_router_loss_with_samples_that_fail_to_read():
    """Documents that fail to read (edited after indexing) are skipped: every step equals the stock model trained on
    the rest of its micro-batches — their tokens out of the router's counts, their labels out of the denominator before
    the first forward, so no gradient of the load-balancing loss is rescaled afterwards (which would be off by the
    share of skipped labels)."""
    path, damaged = _damaged()
    _, res = _run("qwen3_moe", data=path)
    skipped = [rec["key"] for s in res["steps"] + res["eval"] for rec in s["skipped_samples"]]
    assert skipped and set(skipped) <= set(damaged), (skipped, damaged)
    _check("qwen3_moe", res, "qwen3_moe with skipped samples", source=path)


TRAINER_STEPS = 3


def _trainer_run(out: str) -> dict:
    """FCPTrainer (``transformers.Trainer`` API) on this rank: Qwen3-MoE with its router loss, the synthetic documents,
    3 steps of AdamW at a constant rate without weight decay or clipping, then ``evaluate()``. Returns the step losses, the evaluation
    loss and every step's micro-batches (sample indices, from the sampler's plans)."""
    from transformers import TrainingArguments

    from fcp_data import CostModel
    from fcp_exec.integrations.hf_trainer import FCPTrainer

    path = _configs()["qwen3_moe"]
    config = hf.load_config(path)
    data = load_train_data(f"hf:{path}", "synthetic", max_tokens=H.COMMON["max_tokens"], seed=0,
                           num_synthetic=H.COMMON["num_synthetic"], hf_config=config)
    args = TrainingArguments(output_dir=out, max_steps=TRAINER_STEPS, learning_rate=H.COMMON["lr"], weight_decay=0.0,
                             lr_scheduler_type="constant", max_grad_norm=0.0, optim="adamw_torch", seed=0,
                             report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=0, remove_unused_columns=False)
    trainer = FCPTrainer(model=hf.build_model(config, dtype=torch.float64, seed=0), args=args,
                         train_dataset=data.dataset, train_lengths=data.lengths, eval_dataset=data.dataset,
                         eval_lengths=data.lengths, global_batch_size=H.COMMON["global_batch_size"],
                         cost_model=CostModel.preset("qwen3-1.7b", "h100").replace(
                             tokens_per_rank=H.COMMON["tokens_per_rank"]), pad_token_id=data.pad_token_id)
    trainer.train()
    evaluation = trainer.evaluate()
    evals = trainer._fcp_loader(data.dataset, "eval", trainer._data_seed() + 1).sampler  # the one evaluate() read
    return {"losses": [r.loss for r in trainer.fcp_steps], "eval": evaluation,
            "steps": _micro_batches(trainer._train_sampler, range(TRAINER_STEPS)),
            "evals": _micro_batches(evals, range(evals.num_global_batches()))}


def _micro_batches(sampler, batches) -> tuple:
    """Each global batch's micro-batches as sorted sample indices, from the sampler's plans."""
    per_epoch, out = sampler.num_global_batches(), []
    for k in batches:
        ids = sampler.global_batch_indices(k % per_epoch, epoch=k // per_epoch)
        plan = sampler.plan_global_batch(k % per_epoch, epoch=k // per_epoch)
        out.append(tuple(tuple(sorted(int(ids[s]) for s in mb.seq_ids)) for mb in plan.micro_batches))
    return tuple(out)


@pytest.mark.timeout(900)
def test_fcp_trainer_trains_the_router_loss_like_the_stock_model(tmp_path):
    """``FCPTrainer`` on 2 gloo processes: every step's loss equals the stock model's with the router loss (module
    docstring) to 1e-12, and ``evaluate()``'s loss is the stock model's over the evaluation batches, aux included,
    within 1e-12 (the evaluation reaches the load-balancing loss through its own forward,
    ``fcp_exec.integrations.hf_predict``)."""
    per_rank = launch(_trainer_run, 2, str(tmp_path), backend="gloo", timeout=900.0,
                      preload=("transformers.modeling_utils",))
    got = per_rank[0]
    assert got["losses"] == per_rank[1]["losses"]
    ref = _stock("qwen3_moe", got["steps"], got["evals"], weight_decay=0.0)
    for k, (loss, (want, _, _)) in enumerate(zip(got["losses"], ref)):
        assert abs(loss - want) <= LOSS_TOL * abs(want), f"step {k}: {loss!r} vs stock {want!r}"
    assert any(len(s) > 1 for s in got["steps"]), got["steps"]
    evals = ref[TRAINER_STEPS:]  # token-weighted over the evaluation's global batches, as evaluate() reports
    want = sum(loss * num for loss, num, _ in evals) / sum(num for _, num, _ in evals)
    assert got["eval"]["eval_num_tokens"] == sum(num for _, num, _ in evals)
    assert abs(got["eval"]["eval_loss"] - want) <= LOSS_TOL * want, (got["eval"]["eval_loss"], want)


def test_a_padded_batch_balances_like_its_documents():
    """The reference's premise: the stock model's ``aux_loss`` of a right-padded batch with its attention mask (what
    a stock Trainer computes for a micro-batch) equals the float64 loss over the rows of its documents run one by one
    (the routers see the same tokens), to the stock model's float32 sums; with the pads counted it would differ."""
    family = "qwen3_moe"
    config = hf.load_config(_configs()[family])
    data = load_train_data(f"hf:{_configs()[family]}", "synthetic", max_tokens=H.COMMON["max_tokens"], seed=0,
                           num_synthetic=H.COMMON["num_synthetic"], hf_config=config)
    model = hf.build_model(config, dtype=torch.float64, seed=0)
    samples = [data.dataset[i] for i in (1, 4, 7)]
    assert len({len(s["input_ids"]) for s in samples}) == 3  # pads in two of the three rows
    with torch.no_grad():
        longest = max(len(s["input_ids"]) for s in samples)
        ids = torch.full((3, longest), int(config.pad_token_id), dtype=torch.long)
        mask = torch.zeros((3, longest), dtype=torch.long)
        for b, s in enumerate(samples):
            ids[b, :len(s["input_ids"])], mask[b, :len(s["input_ids"])] = torch.as_tensor(s["input_ids"]), 1
        batch = model(input_ids=ids, attention_mask=mask, use_cache=False)
        joined = _micro_batch_aux([doc_output(model, s, False) for s in samples], config)
        padded = _aux_float64(batch.router_logits, config)  # every row, pads too
    assert abs(float(joined) - float(batch.aux_loss)) <= STOCK_FP32 * float(batch.aux_loss)
    assert abs(float(padded) - float(batch.aux_loss)) > 10 * STOCK_FP32 * float(batch.aux_loss)  # measured 1.8e-4
