"""Fuzz fcp's user-facing surface with hostile values, one at a time, each in a forked child with a time limit.

Areas (``--areas``, default all):

* ``options``: every value-taking option of ``fcp plan``, ``compare``, ``simulate``, ``index``, ``train`` and
  ``profile`` — read from the parsers, so a new option is fuzzed too — set to each hostile value on an otherwise
  valid command line. Promise: exit 0, or one line on stderr and exit 2 (``fcp index`` may exit 1 when the error
  rate passes ``--max-error-rate``); never a traceback, a hang (the time limit), another exit code. ``train`` and
  ``profile`` get the values that cannot start a long run (one that is valid trains or profiles one step).
* ``index``: a length index damaged one way at a time — every ``manifest.json`` field set to values of other
  types or removed, every column truncated, emptied, of another dtype, garbage, a folder, missing, negated — then
  ``fcp plan --index``, ``fcp simulate --index`` and ``IndexedDataset`` reading every 37th sample. Promise: success
  or a ValueError/OSError (one line and exit 2 in the CLI); a KeyError of a sample whose recorded field is gone
  is a failed read, which ``FCPDataset`` records and skips.
* ``cost``: every key of a cost-model JSON set to hostile values, through plan, simulate and compare.
* ``examples``: every value-taking option of the five training scripts in ``examples/`` (read from each one's
  ``build_parser``) set to each hostile value, the script run as plain ``python`` (a world of one, one step).
  Promise: the ``options`` one, with the script's name in place of ``fcp``.
* ``api``: every argument of ``FCPSampler`` (then iterated and its state saved), ``FCPCollator``, ``plan_batch``,
  ``FCPDataset``, ``IndexedDataset`` and ``FCPTrainer`` (a tiny Qwen3, one training step and an evaluation). Promise:
  success or a ``ValueError``/``TypeError`` (``OSError`` for a path), raised by fcp with a message, never an
  exception from deep inside (an ``IndexError``, ``OverflowError``, ``KeyError``...).

Prints each misbehaving case and a Markdown table (area, cases, how many exited 0, misbehaved); exit 1 when any
case misbehaved.
The in-suite version (planning commands and ``fcp index``, in-process) is ``tests/e2e/test_cli_fuzz.py``.

    .venv/bin/python benchmarks/fuzz_cli.py --areas options --commands plan,index
    .venv/bin/python benchmarks/fuzz_cli.py            # everything: about 9 minutes on 2 cores
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _args import names, output_file, parser, positive_float, run  # noqa: E402

HOSTILE = ["", "-1", "0", "nan", "inf", "-inf", "1e400", "abc", "MISSING", "DIR", "BIN", "BADJSON", "LIST",
           "1.5", "99999999999999999999", "\x00", "é", "3,", ",", "auto,1"]
NO_RUN = ["", "-1", "nan", "inf", "abc", "MISSING", "DIR", "BIN", "BADJSON", "\x00", "1e400",
          "99999999999999999999", "0"]  # for train/profile: values that cannot start a long run when valid...
BASE = {
    "plan": ["--lengths", "L", "--ranks", "4", "--preset", "Qwen3-8B", "--hardware", "h100"],
    "compare": ["--lengths", "L", "--ranks", "4", "--preset", "Qwen3-8B", "--hardware", "h100"],
    "simulate": ["--lengths", "L", "--ranks", "4", "--preset", "Qwen3-8B", "--hardware", "h100",
                 "--global-batch-size", "4", "--steps", "2", "--no-progress"],
    "index": ["IN", "--spec", "text", "--out", "OUT", "--no-progress"],
    "train": ["--steps", "1", "--nproc", "1", "--json"],  # ...but "0" and "1e400" may: --seed 0 trains one step
    "profile": ["--nproc", "1", "--seq-lens", "64", "--reps", "1", "--warmup", "0"],
}
SKIP = {"--help", "--debug", "--json", "--no-progress"}


def child(fn, limit: float) -> tuple[object, str]:
    """Run ``fn()`` in a forked child (stdout/stderr to a file) for at most ``limit`` seconds: (exit code or
    "timeout"/"raised ...", its output)."""
    fd, path = tempfile.mkstemp(prefix="fcp-fuzz-")
    pid = os.fork()
    if pid == 0:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        signal.alarm(int(limit))
        try:
            rc = fn()
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException as e:  # noqa: BLE001 — what escapes is what the fuzz looks for
            import traceback

            traceback.print_exc()
            rc = 3 if not isinstance(e, TimeoutError) else 4
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc if isinstance(rc, int) else 0)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    out = Path(path).read_text(errors="replace")
    os.unlink(path)
    if os.WIFSIGNALED(status):
        return ("timeout" if os.WTERMSIG(status) == signal.SIGALRM else f"signal {os.WTERMSIG(status)}"), out
    return os.waitstatus_to_exitcode(status), out


SUCCEEDED = [0]  # cases that exited 0 (the rest were refused, or misbehaved)
ACCEPTED: list[str] = []  # their labels, for --accepted (a value taken that should have been refused is a bug too)


def one_line_or_ok(rc, out: str, exit1_ok: bool = False, prog: str = "fcp") -> str | None:
    """None when ``(rc, out)`` keeps the CLI's promise, else what is wrong."""
    if "Traceback" in out:
        return "traceback"
    if rc == 0:
        SUCCEEDED[0] += 1
        return None
    if rc == 1 and exit1_ok and "exceeds --max-error-rate" in out:
        return None
    if rc != 2:
        return f"exit {rc}"
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))
             and not ln.startswith("[fcp ")]
    return None if lines and lines[-1].startswith(prog) else "exit 2 without a one-line error"


def run_case(fn, limit: float, label: str, bad: list, exit1_ok: bool = False, prog: str = "fcp") -> int:
    """Run one case in a child; append ``(label, what is wrong, the output's end)`` to ``bad`` if it broke the
    promise. Returns 1 (the case count)."""
    rc, out = child(fn, limit)
    why = one_line_or_ok(rc, out, exit1_ok=exit1_ok, prog=prog)
    if why:
        bad.append((label, why, out[-300:]))
    elif rc == 0:
        ACCEPTED.append(label)
    return 1


def _write_inputs(d: Path) -> None:
    """The input files the values name (rewritten before every case: ``profile --out BADJSON`` once wrote a valid
    cost model there, which a later ``--cost BADJSON`` then read)."""
    (d / "L.txt").write_text("100\n2000\n300\n5000\n")
    (d / "bin.dat").write_bytes(bytes(range(256)))
    (d / "bad.json").write_text('{"alpha1": ')
    (d / "list.json").write_text("[1, 2]")
    (d / "in.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": "a b c " * i}) + "\n" for i in range(1, 9)))


def workdir() -> dict:
    d = Path(tempfile.mkdtemp(prefix="fcp-fuzz-"))
    (d / "adir").mkdir()
    _write_inputs(d)
    return {"dir": d, "L": str(d / "L.txt"), "DIR": str(d / "adir"), "BIN": str(d / "bin.dat"),
            "BADJSON": str(d / "bad.json"), "LIST": str(d / "list.json"), "IN": str(d / "in.jsonl"),
            "OUT": str(d / "out"), "MISSING": str(d / "missing" / "x"), "cwd": str(d / "cwd")}  # see fresh_cwd


def fresh_cwd(files: dict) -> None:
    """Each case starts where no earlier case left anything: an empty working directory (``index --out abc`` writes
    ``./abc``, which ``train --data abc`` would then read), an empty DIR, no OUT and no MISSING, the input files as
    first written."""
    for key in ("OUT", "cwd", "DIR"):
        shutil.rmtree(files[key], ignore_errors=True)
    shutil.rmtree(files["dir"] / "missing", ignore_errors=True)
    Path(files["cwd"]).mkdir()
    Path(files["DIR"]).mkdir()
    _write_inputs(files["dir"])
    os.chdir(files["cwd"])


def value_options(command: str) -> list[str]:
    from fcp_cli.main import build_parser

    parser = build_parser(command).commands[command]
    return sorted(a.option_strings[-1] for a in parser._actions
                  if a.option_strings and a.nargs != 0 and a.option_strings[-1] not in SKIP)


def fuzz_options(commands: list[str], files: dict, limit: float, progress) -> tuple[int, list]:
    from fcp_cli.main import main

    tried, bad = 0, []
    for command in commands:
        values = NO_RUN if command in ("train", "profile") else HOSTILE
        base = [files.get(a, a) for a in BASE[command]]
        for opt, raw in itertools.product(value_options(command), values):
            argv = [command, *base]
            value = files.get(raw, raw)
            if opt in argv:
                argv[argv.index(opt) + 1] = value
            else:
                argv += [opt, value]
            if opt == "--index":
                i = argv.index("--lengths")
                del argv[i:i + 2]
            fresh_cwd(files)
            tried += run_case(lambda: main(argv), limit, f"{command} {opt} {raw!r}", bad, exit1_ok=command == "index")
            progress(f"options: {command} {opt}")
    return tried, bad


EXAMPLES = {  # script -> the rest of an otherwise valid command line (one step, no evaluation)
    "train_qwen3_text": ["--steps", "1", "--eval-batches", "0"],
    "train_hf_trainer": ["--max-steps", "1", "--eval-batches", "0"],
    "train_qwen2_5_vl_video": ["--steps", "1"],
    "train_megatron_gpt": ["--steps", "1", "--eval-batches", "0"],
    "train_torchtitan": ["--steps", "1", "--eval-batches", "0"],
}

PARTNER = {  # what an option needs beside it to be read at all (else the pair's own one-line refusal)
    "--checkpoint": ["--checkpoint-every", "1"], "--checkpoint-every": ["--checkpoint", "OUT"],
    "--save-steps": ["--output-dir", "OUT"], "--data-prefix": ["--vocab-size", "2000"],
}


def fuzz_examples(files: dict, limit: float, progress) -> tuple[int, list]:
    import importlib.util

    tried, bad = 0, []
    for name, base in EXAMPLES.items():
        spec = importlib.util.spec_from_file_location(f"_example_{name}", ROOT / "examples" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as e:  # megatron-core / torchtitan not installed
            print(f"{name} not fuzzed: {e}", file=sys.stderr)
            continue
        options = sorted(a.option_strings[-1] for a in module.build_parser()._actions
                         if a.option_strings and a.nargs != 0 and a.option_strings[-1] not in SKIP)
        for opt, raw in itertools.product(options, NO_RUN):
            argv = [*base, *PARTNER.get(opt, []), f"{opt}={files.get(raw, raw)}"]  # the last of a repeat wins
            argv = [files.get(a, a) for a in argv]
            fresh_cwd(files)

            def one(module=module, argv=argv, script=f"{name}.py"):
                sys.argv = [script, *argv]  # the parser's prog, as when started with python
                module.run_main(module.main)

            tried += run_case(one, limit, f"{name}.py {opt} {raw!r}", bad, prog=f"{name}.py")
            progress(f"examples: {name} {opt}")
    return tried, bad


def _damaged_indexes(src: Path, dst: Path):
    """Yield (description, damage) pairs; each call of damage() turns ``dst`` (a fresh copy of ``src``) into one
    damaged index."""
    manifest = json.loads((src / "manifest.json").read_text())
    values = [None, -1, 0, "x", [], {}, 2**70, 1.5, True]

    def with_manifest(m):
        def damage():
            (dst / "manifest.json").write_text(json.dumps(m))
        return damage

    for key, val in itertools.product(list(manifest), values):
        yield f"manifest[{key}]={val!r}", with_manifest({**manifest, key: val})
    for key in manifest:
        yield f"manifest without {key}", with_manifest({k: v for k, v in manifest.items() if k != key})
    data = dst / manifest["data"]
    for name in sorted(p.name for p in (src / manifest["data"]).glob("*.npy")):
        for how in ("truncate", "empty", "dtype", "garbage", "folder", "missing", "negate"):
            def damage(name=name, how=how):
                p = data / name
                a = np.load(p)
                if how == "truncate":
                    np.save(p, a[: max(len(a) // 2, 1)])
                elif how == "empty":
                    p.write_bytes(b"")
                elif how == "dtype":
                    np.save(p, a.astype(np.float64 if a.dtype == np.float32 else np.float32))
                elif how == "garbage":
                    p.write_bytes(os.urandom(200))
                elif how == "folder":
                    p.unlink()
                    p.mkdir()
                elif how == "missing":
                    p.unlink()
                elif how == "negate" and a.dtype.kind in "iuf":
                    np.save(p, -np.abs(a) - 1)
            yield f"{name} {how}", damage


def fuzz_index(files: dict, limit: float, progress) -> tuple[int, list]:
    from fcp_cli.main import main
    from fcp_data.index import build_index
    from fcp_data.readers import IndexedDataset

    src, dst = files["dir"] / "good-index", files["dir"] / "damaged"
    _, rc = build_index([str(ROOT / "samples" / "text.jsonl")], "text", src, progress=False)
    assert rc == 0

    def read_all():
        try:
            d = IndexedDataset(str(dst))
            for i in range(0, len(d), 37):
                try:
                    d[i]
                except KeyError:  # a sample's recorded field is gone: a failed read, recorded and skipped by FCPDataset
                    pass
        except (ValueError, OSError) as e:
            print(f"fcp: {type(e).__name__}: {e}")
            return 2
        return 0

    tried, bad = 0, []
    for what, damage in _damaged_indexes(src, dst):
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        damage()
        for label, fn in (("plan", lambda: main(["plan", "--index", str(dst), "--ranks", "4", "--preset", "Qwen3-8B",
                                                  "--hardware", "h100"])),
                          ("simulate", lambda: main(["simulate", "--index", str(dst), "--ranks", "4", "--preset",
                                                      "Qwen3-8B", "--hardware", "h100", "--global-batch-size", "8",
                                                      "--steps", "1", "--no-progress"])),
                          ("IndexedDataset", read_all)):
            tried += run_case(fn, limit, f"{label} on {what}", bad)
        progress(f"index: {what}")
    return tried, bad


def fuzz_cost(files: dict, limit: float, progress) -> tuple[int, list]:
    from fcp_cli.main import main
    from fcp_data.presets import preset_cost_model

    base = preset_cost_model("Qwen3-8B", "h100").to_dict()
    values = [0, -1, 1e308, 1e-308, "x", None, True, [], {}, 2**70, 0.5, 1e30, -0.0]
    path = str(files["dir"] / "cost.json")
    tried, bad = 0, []
    for key, val in itertools.product(list(base) + ["alpha_vis", "unknown_key"], values):
        Path(path).write_text(json.dumps({**base, key: val}))
        for command in ("plan", "simulate", "compare"):
            argv = [command, "--lengths", files["L"], "--ranks", "16", "--cost", path]
            if command == "simulate":
                argv += ["--global-batch-size", "4", "--steps", "2", "--no-progress"]
            tried += run_case(lambda: main(argv), limit, f"{command} cost[{key}]={val!r}", bad)
        progress(f"cost: {key}")
    return tried, bad


API_VALUES = [None, -1, 0, 1, 2**70, 1.5, float("nan"), float("inf"), "x", "", [], {}, True, b"a", [1, 2, 3]]


def _api_targets(files: dict) -> list[tuple[str, object, dict, list[str]]]:
    """(name, call(**kwargs), valid kwargs, the arguments to fuzz) of each public constructor."""
    import torch

    from fcp_data import FCPCollator, FCPSampler
    from fcp_data.index import build_index
    from fcp_data.plan import plan_batch
    from fcp_data.presets import preset_cost_model
    from fcp_data.readers import IndexedDataset
    from fcp_data.slots import FCPDataset

    cm = preset_cost_model("Qwen3-8B", "h100")
    lengths = np.array([100, 2000, 300, 5000, 70, 80, 90, 100])

    def sampler(**kw):
        s = FCPSampler(**kw)
        for i, _ in zip(range(3), s):
            pass
        s.state_dict()

    def method(name):  # a sampler one list into epoch 0, then sampler.<name>(**kw), then planned on and saved
        def call(**kw):
            s = FCPSampler(lengths, num_ranks=4, rank=0, cost_model=cm, global_batch_size=4, prefetch=0)
            next(iter(s))
            getattr(s, name)(**kw)
            for i, _ in zip(range(3), s):
                pass
            s.state_dict()
        return call

    saved = FCPSampler(lengths, num_ranks=4, rank=0, cost_model=cm, global_batch_size=4, prefetch=0)
    next(iter(saved))
    state = saved.state_dict()

    def load_state(**kw):  # one key of a valid state replaced
        method("load_state_dict")(state={**state, **kw})

    index = files["dir"] / "api-index"
    build_index([str(ROOT / "samples" / "text.jsonl")], "text", index, progress=False)
    targets = [
        ("FCPSampler", sampler, dict(lengths_or_index=lengths, num_ranks=4, rank=0, cost_model=cm, global_batch_size=4,
                                     prefetch=0),
         ["lengths_or_index", "num_ranks", "rank", "cost_model", "global_batch_size", "seed", "drop_last",
          "on_overlong", "prefetch", "solver", "micro_batches", "etas", "solver_options", "visual", "exclude"]),
        ("FCPSampler.set_epoch", method("set_epoch"), dict(epoch=1), ["epoch"]),
        ("FCPSampler.exclude_later", method("exclude_later"), dict(indices=[1], epoch=1), ["indices", "epoch"]),
        ("FCPSampler.load_state_dict", load_state, {}, sorted(state)),
        ("FCPCollator", FCPCollator, {}, ["pad_token_id", "ignore_index", "visual_token_id", "spatial_merge_size",
                                          "mrope", "strict_lengths", "mask_visual_labels", "position_fn",
                                          "sample_labels"]),
        ("plan_batch", plan_batch, dict(lengths=lengths, num_ranks=4, cost_model=cm),
         ["lengths", "num_ranks", "cost_model", "solver", "micro_batches", "etas", "visual", "robust_tol"]),
        ("FCPDataset", FCPDataset, dict(base=[{"input_ids": torch.arange(3)}]),
         ["base", "on_error", "retries", "max_consecutive_errors", "max_error_rate", "errors_path", "strict_lengths",
          "vocab_size"]),
        ("IndexedDataset", IndexedDataset, dict(index=str(index)),
         ["index", "spec", "tokenizer", "roots", "max_open_files", "caption_labels"]),
    ]
    try:
        targets.append(_trainer_target(files, cm))
    except ImportError as e:
        print(f"FCPTrainer not fuzzed: {e}", file=sys.stderr)
    return targets


def _trainer_target(files: dict, cm) -> tuple:
    """FCPTrainer on a tiny Qwen3 (transformers and accelerate needed): construct, train one step, evaluate."""
    import torch
    from transformers import TrainingArguments

    from fcp_exec.integrations.hf import build_model, load_config
    from fcp_exec.integrations.hf_trainer import FCPTrainer

    config = load_config(ROOT / "examples" / "configs" / "qwen3-tiny.json")
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(1, 100, (int(n),), generator=g).tolist()} for n in (40, 90, 25, 60, 33, 70)]
    cost = cm.replace(tokens_per_rank=256)

    def trainer(**kw):
        model = build_model(config, dtype=torch.float32, seed=0)
        args = TrainingArguments(output_dir=str(files["dir"] / "trainer"), max_steps=1, report_to=[], use_cpu=True,
                                 per_device_train_batch_size=2)
        t = FCPTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:2], **kw)
        t.train()
        t.evaluate()

    return ("FCPTrainer", trainer, dict(cost_model=cost), ["cost_model", "global_batch_size", "train_lengths",
            "sampler_kwargs", "collator_kwargs", "dataset_kwargs", "pad_token_id", "eval_batches", "history"])


def fuzz_api(files: dict, limit: float, progress) -> tuple[int, list]:
    tried, bad = 0, []
    for name, call, base, keys in _api_targets(files):
        for key, value in itertools.product(keys, API_VALUES):
            def one(call=call, kw={**base, key: value}):
                import warnings

                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        call(**kw)
                except (ValueError, TypeError, OSError) as e:
                    print(f"fcp: {type(e).__name__}: {e}")
                    return 2
                return 0

            tried += run_case(one, limit, f"{name}({key}={value!r})", bad)
        progress(f"api: {name}")
    return tried, bad


AREAS = ("options", "index", "cost", "api", "examples")


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--areas", type=names(AREAS, "area"), default=",".join(AREAS),
                    help=f"comma-separated, of {', '.join(AREAS)}")
    ap.add_argument("--commands", type=names(BASE, "command"), default="plan,compare,simulate,index,train,profile",
                    help="the commands whose options are fuzzed (area options), comma-separated")
    ap.add_argument("--limit", type=positive_float, default=120.0,
                    help="seconds a case may take before it counts as a hang")
    ap.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    ap.add_argument("--accepted", metavar="FILE", type=output_file, default=None,
                    help="write the cases that exited 0, one per line, to FILE (default: not written): the harness "
                         "cannot tell a value rightly taken from one that should have been refused; read them")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    areas, commands = args.areas, args.commands
    accepted = args.accepted.resolve() if args.accepted else None
    files = workdir()
    fresh_cwd(files)  # a value taken as an output path lands in the scratch folder
    start = time.time()

    def progress(what: str) -> None:
        if not args.no_progress:
            print(f"\r[{time.time() - start:6.0f} s] {what[:70]:<70}", end="", file=sys.stderr, flush=True)

    rows, failed = [], 0
    for area in areas:
        SUCCEEDED[0] = 0
        if area == "options":
            tried, bad = fuzz_options(commands, files, args.limit, progress)
        elif area == "index":
            tried, bad = fuzz_index(files, args.limit, progress)
        elif area == "api":
            tried, bad = fuzz_api(files, args.limit, progress)
        elif area == "examples":
            tried, bad = fuzz_examples(files, args.limit, progress)
        else:
            tried, bad = fuzz_cost(files, args.limit, progress)
        rows.append((area, tried, SUCCEEDED[0], len(bad)))
        failed += len(bad)
        for case, why, out in bad:
            print(f"\nMISBEHAVED {case}: {why}: {out!r}")
    print("\n\n| area | cases | exit 0 | misbehaved |\n|---|---:|---:|---:|")
    for area, tried, ok, nbad in rows:
        print(f"| {area} | {tried} | {ok} | {nbad} |")
    print(f"\n{time.time() - start:.0f} s; scratch folder {files['dir']}")
    if accepted:
        accepted.write_text("".join(f"{label}\n" for label in ACCEPTED))
    shutil.rmtree(files["dir"], ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    run(main)
