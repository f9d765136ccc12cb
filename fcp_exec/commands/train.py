"""``fcp train``: train tiny-llm / tiny-mllm or a Hugging Face model (``hf:CONFIG.json``) on N processes with
FCP plans and ring attention.

Everything a user can get wrong is checked here, in the parent, before any process starts (cheap first):
option values, the model config, backend and process count, then the data (loaded once, with rank 0's
sampler built on it) — so a bad input is one line and exit code 2, not a worker's traceback.
"""

from __future__ import annotations

__all__ = ["register", "config_from_args", "resolve_model", "load_hf_config", "check_index_path", "check_resume",
           "preflight", "check_data", "report"]

EPILOG = """Each step is one global batch: its plan-annotated micro-batches run on the CP groups the planner
formed (ring attention inside each group), gradients are summed over all ranks by the --reducer, then AdamW.
A rank the plan leaves idle in a micro-batch runs a zero-weighted dummy forward/backward, so DDP/FSDP2
collectives stay in lock-step. Printed per step: loss (global-batch mean), label tokens, the plan
(⟨degree⟩×count per micro-batch), step time and the time the loop waited for the planner. --json prints one
object per step on stdout ({"step", "loss", "num_tokens", "degrees", "step_time_s", "skipped_samples"}, with
--amp float16 also "loss_scale" and "skipped_step"; "degrees"
lists each micro-batch's CP-group degrees, idle ranks = nproc − Σ degrees), with --checkpoint one
{"checkpoint", "resumes_at_step"} object after each saved checkpoint, then, with --eval-steps N, one
{"eval", "loss", "num_tokens"} object per evaluated global batch, then, with --save-model, one {"saved_model"}
object, and nothing else there (warnings and errors go to stderr; ranks whose parameters differ at the end: one
line there and exit code 1).

A sample that fails to read (a video damaged behind a readable header, a file gone or edited since `fcp index`)
is retried once, then skipped: its slot runs as padding without labels and the step's loss is the mean over the
rest of the global batch; it is listed in the step's "skipped_samples", one warning line on stderr and, with
--read-errors-out FILE, one JSON line there. 8 failures in a row (or > 1 % of reads once 8 failed) end the run
with one line, exit 2; --on-read-error raise stops at the first.

--model hf:PATH takes a local transformers config.json (random weights) or checkpoint folder (its weights;
nothing is downloaded) of a model type fcp was tested with (qwen3, llama, qwen2_vl, qwen2_5_vl, qwen3_vl,
qwen3_vl_moe, internvl, llava_onevision, the MoE and other text families; another one is refused with the list);
text models train on the bundled text samples, VL models on the bundled videos/images (indexed with the family's
spec), --data synthetic on generated documents.

examples:
  fcp train --model tiny-llm --nproc 2 --steps 5
  fcp train --model tiny-mllm --nproc 2 --planner static-cp --steps 3 --json
  fcp train --model hf:examples/configs/qwen3-tiny.json --nproc 2 --reducer ddp --steps 3
  fcp train --model hf:examples/configs/qwen2_5_vl-tiny.json --nproc 2 --reducer fsdp2 --grad-checkpointing
  fcp train --model tiny-llm --nproc 3 --data synthetic --dtype float64 --max-tokens 160
  fcp train --model hf:examples/configs/qwen3-tiny.json --nproc 2 --amp float16   # fp16 with a loss scaler
  fcp index samples/text.jsonl --spec text --out idx && fcp train --data idx --nproc 2
  torchrun --nproc-per-node 4 -m fcp_cli train --model hf:config.json --reducer fsdp2 --steps 10
  fcp train --nproc 2 --steps 6 --checkpoint ckpt --checkpoint-every 2   # then, on any number of ranks:
  fcp train --nproc 3 --steps 10 --resume ckpt/step-6"""

_TINY = ("tiny-llm", "tiny-mllm")


def register(subparsers, summary: str) -> None:
    import argparse

    from fcp_exec.commands import add_config_options
    from fcp_exec.train_config import TrainConfig

    p = subparsers.add_parser("train", help=summary, description=summary, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_options(p, TrainConfig)  # every TrainConfig field with a plain value: name, type, default, help
    p.add_argument("--nproc", type=int, default=None,
                   help="processes to start (default 2; under torchrun its WORLD_SIZE, no processes are started)")
    p.add_argument("--cost", default=None, help="cost-model JSON (DESIGN §4, e.g. from `fcp profile`); default: "
                                                "a built-in CPU model with tokens_per_rank = max-tokens/2")
    p.add_argument("--json", action="store_true", help="one JSON object per step on stdout, nothing else but the "
                                                        "checkpoint, eval and saved_model objects listed below")
    p.add_argument("--backend", default=None, help="torch.distributed backend: gloo, nccl, hccl (default by device)")
    p.set_defaults(func=run)


def resolve_model(text: str) -> tuple[str, str | None]:
    """``(model, config_path)`` for ``--model``: a tiny model name, or ``hf:`` with the config's absolute path
    (workers need not share the current directory). Checks only that the path exists (cheap)."""
    from pathlib import Path

    from fcp_data.commands import UsageError

    if text in _TINY:
        return text, None
    if not text.startswith("hf:") or not text[3:].strip():
        raise UsageError(f"--model must be tiny-llm, tiny-mllm or hf:PATH (a local transformers config.json), got {text!r}")
    path = Path(text[3:]).expanduser()
    if not path.exists():
        raise UsageError(f"--model {text}: {str(path)!r} does not exist; pass a local transformers config.json or its "
                         "checkpoint folder (nothing is downloaded), e.g. hf:examples/configs/qwen3-tiny.json")
    if path.is_dir() and not (path / "config.json").is_file():
        raise UsageError(f"--model {text}: the folder {str(path)!r} holds no config.json")
    path = path.resolve()
    return f"hf:{path}", str(path)


def load_hf_config(path: str):
    """The transformers config at ``path``; ``UsageError`` unless its model type is one fcp supports."""
    from fcp_data.commands import UsageError

    from fcp_exec.compat import hf_models_problem

    problem = hf_models_problem()
    if problem is not None:
        raise UsageError(f"hf: models: {problem}")
    from fcp_exec.integrations import hf

    config = hf.load_config(path)  # ValueError with the reason
    if config.model_type not in hf.SUPPORTED_MODEL_TYPES:
        raise UsageError(f"{path}: model_type {config.model_type!r} is not supported; use one of "
                         f"{', '.join(hf.SUPPORTED_MODEL_TYPES)}")
    return config


def check_index_path(data: str | None, flag: str = "--data") -> None:
    """``--data`` (or ``flag``): 'synthetic', nothing, or a folder holding a finished length index (cheap, before
    loading)."""
    from pathlib import Path

    from fcp_data.commands import UsageError

    if data in (None, "synthetic"):
        return
    p = Path(data)
    hint = f"build one with `fcp index INPUT... --spec SPEC --out {data}`, or pass {flag} synthetic"
    if not p.exists():
        raise UsageError(f"{flag} {data}: no such length index; {hint}")
    if not p.is_dir():
        raise UsageError(f"{flag} {data} is a file, not a length index folder; {hint}")
    if not (p / "manifest.json").is_file():
        raise UsageError(f"{flag} {data} is not a finished length index (no manifest.json): {hint}, or finish an "
                         "interrupted build with `fcp index ... --resume`")


def check_resume(path: str | None, steps: int) -> None:
    """``--resume DIR``: a complete checkpoint saved before step ``steps`` (cheap, before loading; any number of
    ranks: the sampler state says in the workers whether it can resume there)."""
    from fcp_data.commands import UsageError
    from fcp_exec.checkpoint import checkpoint_step

    if path is None:
        return
    try:
        step = checkpoint_step(path)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError(f"--resume {e}") from None
    if step >= steps:
        raise UsageError(f"--resume {path} is at step {step}; --steps {steps} leaves nothing to train (--steps counts "
                         "from 0: give more than the checkpoint's step)")


def preflight(cfg, nproc: int, hf_config=None):
    """Load ``cfg``'s data once and build rank 0's sampler on it, exactly as every rank will, so that data/config
    mismatches (vocabulary, special tokens, a text index for a vision model, samples that no plan can hold, a
    planner the sampler refuses, label options the data gives nothing to act on) are a ``ValueError`` here, in the
    parent; what the run will quietly adapt (samples left out, a global batch larger than the data) is one warning
    line on stderr (:func:`check_data`). Returns the data."""
    from fcp_data import CostModel, FCPSampler
    from fcp_exec.train import builtin_cost_model, parse_planner
    from fcp_exec.train_data import load_train_data, view_exclusions

    cost = CostModel.from_dict(cfg.cost) if cfg.cost else builtin_cost_model(cfg.max_tokens, nproc, cfg.dtype)
    if cfg.tokens_per_rank:
        cost = cost.replace(tokens_per_rank=cfg.tokens_per_rank)
    solver, degree = parse_planner(cfg.planner)
    out = None
    for which in [cfg.data] + ([cfg.eval_data] if cfg.eval_data else []):  # the evaluation data passes the same checks
        data = load_train_data(cfg.model, which, max_tokens=cfg.max_tokens, seed=cfg.seed, cache_dir=cfg.cache_dir,
                               num_synthetic=cfg.num_synthetic, lengths=cfg.synthetic_lengths, hf_config=hf_config,
                               prompt_mask=cfg.sample_labels, caption_labels=cfg.caption_labels)
        if cfg.model == "tiny-mllm" and not data.visual_token_ids:
            raise ValueError("tiny-mllm needs a multimodal dataset (an index built with a vision spec, e.g. qwen2-vl)")
        sampler = FCPSampler(data.lengths, num_ranks=nproc, rank=0, cost_model=cost,
                             global_batch_size=cfg.global_batch_size, seed=cfg.seed, solver=solver, prefetch=0,
                             visual_layout=data.visual_layout,
                             exclude=view_exclusions(data, cfg.exclude) if which is cfg.data else None,
                             solver_options=None if degree is None else {"degree": degree})
        if out is None:
            check_data(cfg, data, sampler)
        out = out or data
    return out


def check_data(cfg, data, sampler) -> None:
    """The training data against the options that depend on it: ``--sample-labels`` / ``--caption-labels`` on data
    without labels / image-video samples are refused (they would change nothing); samples left out for
    ``--max-tokens`` (named in the data line of a text-mode run; a stderr line under ``--json``) and a
    ``--global-batch-size`` beyond the samples there are (each step takes them all) are a warning line on stderr."""
    import os
    import sys

    what = cfg.data or "the bundled samples"
    if cfg.caption_labels and not getattr(getattr(data.dataset, "base", None), "caption_labels", False):
        raise ValueError(f"--caption-labels masks the visual block of an index's image/video samples, but {what} has "
                         "no image/video samples of an index: it would have no effect here")
    if cfg.sample_labels and not data.has_labels:
        raise ValueError(f"--sample-labels trains on each sample's own labels, but {what} carries none (an SFT index "
                         "built from prompt/response or chat fields does): it would have no effect here")
    if int(os.environ.get("RANK", "0") or 0) != 0:  # under torchrun every rank runs the checks; rank 0 tells
        return
    if cfg.json_lines and data.num_dropped:
        print(f"fcp train: warning: {data.num_dropped} sample(s) of {what} left out (longer than --max-tokens "
              f"{cfg.max_tokens})", file=sys.stderr, flush=True)
    kept = getattr(sampler, "_kept", None)
    num = len(data.lengths) if kept is None else int(kept.size)
    if cfg.global_batch_size > num:
        print(f"fcp train: warning: --global-batch-size {cfg.global_batch_size} is more than the {num} sample(s) of "
              f"{what}: each step takes all {num}", file=sys.stderr, flush=True)


def config_from_args(args, model: str | None = None):
    """The :class:`TrainConfig` of parsed ``fcp train`` arguments: the derived options as they are, ``model``
    (resolved by :func:`resolve_model`) in place of ``--model``, ``--cost`` read from its JSON file, ``--json``
    as ``json_lines`` (and not ``verbose``)."""
    from fcp_data.cost import CostModel
    from fcp_exec.commands import config_kwargs
    from fcp_exec.train_config import TrainConfig

    cost = CostModel.load(args.cost).to_dict() if args.cost else None
    return TrainConfig(**{**config_kwargs(TrainConfig, args), "model": model or args.model, "cost": cost,
                          "json_lines": args.json, "verbose": not args.json})


def run(args) -> int:
    model, hf_path = resolve_model(args.model)
    check_index_path(args.data)
    check_index_path(args.eval_data, "--eval-data")
    if args.read_errors_out is not None:  # found out now, not at the first skipped sample mid-run
        from fcp_data.read_errors import check_errors_path

        check_errors_path(args.read_errors_out)
    from fcp_exec.commands import check_launch
    from fcp_exec.launch import default_backend, in_torchrun
    from fcp_exec.train import run_training

    cfg = config_from_args(args, model)
    nproc, backend = check_launch(args.nproc, args.backend)
    if cfg.reducer != "allreduce" and nproc == 1 and backend is None and not in_torchrun():
        backend = default_backend()  # DDP/FSDP2 need a process group even for one rank: start one worker
    if (nproc > 1 or backend is not None) and not in_torchrun():  # run_training will launch ranks
        from fcp_exec import forkserver
        from fcp_exec.launch import _TRAIN_PRELOAD
        from fcp_exec.train import hf_preload

        forkserver.start(_TRAIN_PRELOAD + hf_preload([cfg]))  # its imports overlap the checks and data loading below
    check_resume(cfg.resume, cfg.steps)
    preflight(cfg, nproc, load_hf_config(hf_path) if hf_path else None)
    res = run_training(cfg, nproc, backend=backend)
    return report(res, cfg)


def report(res: dict, cfg) -> int:
    """After the run: the summary line (text mode) and the check that every rank ended with the same parameters, in
    both modes (under --json a disagreement is one line on stderr; stdout keeps its JSON objects). Printed by rank 0
    only (under torchrun every rank gets here, each with every rank's checksum); 1 when the ranks disagree."""
    import json
    import sys

    agree = len(set(res["checksums"])) == 1
    if res.get("rank", 0) != 0:
        return 0 if agree else 1
    if cfg.json_lines:
        if not agree:
            print(f"fcp train: error: the ranks' parameters differ after training (checksums by rank: "
                  f"{json.dumps(res['checksums'])})", file=sys.stderr)
        return 0 if agree else 1
    steps = res["steps"]
    times = sorted(s["step_time_s"] for s in steps)
    waits = [s["planner_wait_s"] for s in steps]
    idle = sum(s.get("num_idle", 0) for s in steps)
    print(f"done: {len(steps)} steps, median step {times[len(times) // 2] * 1e3:.1f} ms, "
          f"planner wait total {sum(waits) * 1e3:.1f} ms, rank 0 idle in {idle} micro-batch(es); parameters "
          f"identical on all {len(res['checksums'])} ranks: {'yes' if agree else 'NO'}")
    skipped = [rec for s in steps for rec in s.get("skipped_samples", ())]
    if skipped:
        where = "; ".join(f"{r['key'] or r['index']}: {r['reason']}: {r['detail'][:80]}" for r in skipped[:3])
        later = "read again in later epochs" if cfg.retry_skipped else "left out of later epochs"
        print(f"skipped {len(skipped)} sample(s) that failed to read (left out of the loss, {later}; "
              f"--read-errors-out FILE lists them): {where}{' …' if len(skipped) > 3 else ''}")
    if not agree:
        print(json.dumps(res["checksums"]))
        return 1
    return 0
