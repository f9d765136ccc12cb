"""The examples' command lines keep fcp's error contract: a bad value is one line on stderr and exit 2, before any
process group, model or loader exists; an error about the user's input later in the run (a missing index) is one
line and exit 2 too, not a traceback; and a script started with plain ``python`` is one rank of a world of one.

Reference for the world of one: the same example under ``torchrun --nproc-per-node 1`` (the env:// rendezvous)
prints the identical steps. The parsers are read from each example's ``build_parser``, so a new option is
checked too; every value of HOSTILE that an option's type cannot take must be refused (the examples once took
``--steps -1``, ``--lr nan``, ``--data ''`` and trained on; ``--checkpoint DIR`` alone saved nothing)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _procs import run as run_process
from _requires import transformers_models

transformers_models()

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("train_qwen3_text", "train_hf_trainer", "train_qwen2_5_vl_video", "train_megatron_gpt", "train_torchtitan")
HOSTILE = ["", " ", "-1", "nan", "inf", "-inf", "abc", "1e400", "99999999999999999999", "1.5"]


def _example(name: str):
    if name == "train_megatron_gpt":
        pytest.importorskip("megatron.core")
    if name == "train_torchtitan":
        pytest.importorskip("torchtitan")
    spec = importlib.util.spec_from_file_location(f"_example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _refused(module, argv: list[str], capsys) -> str:
    """The one stderr line of a refused command line (asserts exit 2 and one line)."""
    with pytest.raises(SystemExit) as e:
        module.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{Path(sys.argv[0]).name}: error: "), (argv, err)
    return lines[0]


def _accepts(action: argparse.Action, value: str) -> bool:
    """What the option may take: a non-empty path or name for a string option, a listed choice, else nothing of
    HOSTILE except a finite number >= 0 for a float (every integer option needs an integer in [0 or 1, 2**40], every
    float is finite; a huge learning rate is valid, and the run stops at its first non-finite loss)."""
    if action.choices is not None:
        return value in action.choices
    type_name = getattr(action.type, "__name__", "str")
    if type_name in ("nonempty", "output_dir"):  # output_dir: a relative folder name here is creatable
        return bool(value.strip())
    if type_name in ("nonnegative_float", "positive_float"):
        return value in ("1.5", "99999999999999999999")
    assert type_name in ("positive_int", "count"), f"{action.option_strings}: type {type_name} is not fcp's"
    return False


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_option_refuses_what_it_cannot_take(name, capsys):
    module = _example(name)
    parser = module.build_parser()
    options = [a for a in parser._actions if a.option_strings and a.nargs != 0 and a.dest != "help"]
    assert len(options) >= 8
    for action in options:
        opt = action.option_strings[-1]
        for value in HOSTILE:
            argv = [f"{opt}={value}"]  # verbatim: "-inf" after a space would be read as an option
            if _accepts(action, value):
                assert getattr(parser.parse_args(argv), action.dest) is not None  # (pairs: the next test)
            else:
                assert opt in _refused(module, argv, capsys)
    args = module.parse_args([])  # the defaults are a valid run
    resolved = {"hardware": "h100"}  # declared None so that a --hardware given beside --cost can be told apart
    assert all(getattr(args, a.dest) == resolved.get(a.dest, a.default) for a in options)


@pytest.mark.parametrize("name, argv, says", [
    ("train_qwen3_text", ["--checkpoint", "ck"], "--checkpoint needs --checkpoint-every"),
    ("train_qwen3_text", ["--checkpoint-every", "2"], "--checkpoint-every needs --checkpoint"),
    ("train_qwen2_5_vl_video", ["--checkpoint", "ck"], "--checkpoint needs --checkpoint-every"),
    ("train_torchtitan", ["--checkpoint-every", "1"], "--checkpoint-every needs --checkpoint"),
    ("train_megatron_gpt", ["--checkpoint", "ck"], "--checkpoint needs --checkpoint-every"),
    ("train_megatron_gpt", ["--data-prefix", "p"], "--data-prefix takes --vocab-size"),
    ("train_hf_trainer", ["--save-steps", "2"], "--save-steps needs --output-dir"),
    # found by a review of the examples: --vocab-size was ignored; heads that do not divide failed deep in the model
    ("train_megatron_gpt", ["--vocab-size", "100"], "without --data-prefix it would be ignored"),
    ("train_megatron_gpt", ["--heads", "3", "--groups", "1"], "--hidden 64 must be a multiple of --heads 3"),
    # the cost-model file won and --hardware was dropped without a word (a review of the examples), in every example
    *[(name, ["--cost", "c.json", "--hardware", "h200"], "--hardware h200 has no effect with --cost c.json")
      for name in EXAMPLES],
])
def test_options_that_only_work_together(name, argv, says, capsys):
    assert says in _refused(_example(name), argv, capsys)


def _run(argv: list[str], tmp_path: Path, torchrun: bool = False, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                                            "LOCAL_RANK")}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"] if torchrun \
        else [sys.executable]
    return run_process([*launcher, str(ROOT / "examples" / "train_qwen3_text.py"), *argv], timeout=300, cwd=tmp_path,
                       env={**base, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1", **env})


def test_plain_python_is_a_world_of_one_like_torchrun(tmp_path):
    """`python examples/train_qwen3_text.py` trains (before: torch's rendezvous traceback, RANK not set) and prints
    the steps `torchrun --nproc-per-node 1` prints."""
    argv = ["--steps", "2", "--eval-batches", "1"]
    plain, launched = _run(argv, tmp_path), _run(argv, tmp_path, torchrun=True)
    assert plain.returncode == 0 and launched.returncode == 0, plain.stderr[-2000:] + launched.stderr[-2000:]
    steps = [ln for ln in plain.stdout.splitlines() if ln.startswith(("step ", "eval "))]
    assert len(steps) == 3 and steps == [ln for ln in launched.stdout.splitlines() if ln.startswith(("step ", "eval "))]


def test_an_input_error_during_the_run_is_one_line(tmp_path):
    """A missing index is found after the process group is up: one line naming it, exit 2, no traceback."""
    r = _run(["--data", str(tmp_path / "missing")], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        f"train_qwen3_text.py: error: {tmp_path / 'missing'} is not a length index (no manifest.json); build one "
        f"with `fcp index ... --out {tmp_path / 'missing'}`")


def test_a_resume_that_leaves_nothing_to_train_and_a_video_index_for_a_text_model_are_one_line(tmp_path):
    """Found by a review of the examples: `--resume DIR/step-K` with `--steps` <= K trained nothing and exited 0; the
    text example trained a Qwen3 on the video index, its visual placeholders as text, where `fcp train` refuses."""
    from fcp_data import bundled_index

    first = _run(["--steps", "1", "--checkpoint", "ck", "--checkpoint-every", "1", "--eval-batches", "0"], tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    again = _run(["--steps", "1", "--resume", "ck/step-1", "--eval-batches", "0"], tmp_path)
    assert again.returncode == 2 and again.stderr.strip().splitlines()[-1].endswith(
        "--resume ck/step-1 is at step 1; --steps 1 leaves nothing to train"), again.stderr[-2000:]
    video = _run(["--steps", "1", "--data", str(bundled_index("qwen2.5-vl"))], tmp_path)
    assert video.returncode == 2 and "holds images/videos but qwen3 is a text model" in video.stderr, video.stderr[-2000:]


def test_the_video_example_names_a_model_without_a_video_spec(tmp_path):
    """A text model's config in the video example was trained on the Qwen2.5-VL index (the spec fell back to it): now
    one line naming the families that have a spec, exit 2."""
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_qwen2_5_vl_video.py"), "--config",
                        str(ROOT / "examples" / "configs" / "qwen3-tiny.json"), "--steps", "1"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(
        "train_qwen2_5_vl_video.py: error: --config: a qwen3 model has no video spec; use one of qwen2_vl, "), r.stderr
    # a Qwen3-VL config on an index of Qwen2.5-VL's spec died in a DataLoader worker (a flattened traceback, "placeholder
    # run ... holds 2800 video tokens"): one line before any step, as fcp train says it (found by a review, stop 60)
    from fcp_data import bundled_index

    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_qwen2_5_vl_video.py"), "--config",
                        str(ROOT / "examples" / "configs" / "qwen3_vl-tiny.json"), "--data",
                        str(bundled_index("qwen2.5-vl")), "--steps", "1"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "pixel patches of 1176 values but the model's vision tower takes 1536" in \
        r.stderr.strip().splitlines()[-1], r.stderr[-2000:]


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_says_how_to_run_it(name, capsys):
    """--help carries the script's docstring: the torchrun command lines (a continued line kept whole) and what the
    script does, under the options."""
    with pytest.raises(SystemExit) as e:
        _example(name).parse_args(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert f"torchrun --standalone --nproc-per-node 2 examples/{name}.py" in out
    assert f"torchrun --nproc-per-node 8 examples/{name}.py" in out and " \\\n" in out
    bare = [a.option_strings[-1] for a in _example(name).build_parser()._actions
            if a.option_strings and a.dest != "help" and not (a.help or "").strip()]
    assert not bare, f"options without --help text: {bare}"  # 17 had none (a review of the examples)


def test_a_torchtitan_flavor_it_does_not_have_is_named(tmp_path):
    """`--flavor abc` was a KeyError from torchtitan's registry: now a ValueError listing the flavors."""
    import torch

    module = _example("train_torchtitan")
    with pytest.raises(ValueError, match=r"torchtitan's qwen3 has no flavor 'abc'; its flavors: debugmodel"):
        module.build_model("qwen3", "abc", 2, 2000, torch.device("cpu"))
    # --layers above the flavor's depth kept every block without a word (a review of the examples)
    with pytest.raises(ValueError, match=r"--layers 99: torchtitan's qwen3 'debugmodel' has \d+ blocks"):
        module.build_model("qwen3", "debugmodel", 99, 2000, torch.device("cpu"))


class _Crafted:
    def __reduce__(self):
        return eval, ("{'step': 1, 'model': {}, 'optimizer': {}, 'sampler': {}}",)


def test_megatron_resume_reads_only_its_own_checkpoints(tmp_path):
    """`--resume` of a file that is not this example's checkpoint was an UnpicklingError; a pickle that would run
    code is refused too (read with weights_only)."""
    import torch

    module = _example("train_megatron_gpt")
    garbage, other, crafted, good = (tmp_path / n for n in ("garbage.pt", "other.pt", "crafted.pt", "good.pt"))
    garbage.write_bytes(b"\x00\x01not a checkpoint")
    torch.save({"weights": torch.zeros(2)}, other)
    torch.save(_Crafted(), crafted)  # unpickled, it would run eval and return a valid-looking state
    for path in (garbage, other, crafted):
        with pytest.raises(ValueError, match=f"--resume {path} is not a checkpoint this example wrote"):
            module.read_checkpoint(str(path), torch.device("cpu"))
    state = {"step": 2, "model": {"w": torch.ones(2)}, "optimizer": {}, "sampler": {"epoch": 0}}
    torch.save(state, good)
    assert module.read_checkpoint(str(good), torch.device("cpu"))["step"] == 2


def test_the_trainer_example_refuses_a_resume_that_leaves_nothing_to_train(tmp_path):
    """Found by a review of the examples: `--resume OUTPUT/checkpoint-2 --max-steps 2` ran a third step at learning
    rate 0 (the stock Trainer's own behaviour at max_steps) and exited 0; refused now, before any process group, like
    the other examples; a folder that is not a Trainer checkpoint is named."""
    import json

    module = _example("train_hf_trainer")
    ck = tmp_path / "checkpoint-2"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    with pytest.raises(ValueError, match=f"^--resume {ck} is at step 2; --max-steps 2 leaves nothing to train$"):
        module.main(["--max-steps", "2", "--resume", str(ck)])
    with pytest.raises(ValueError, match=f"^--resume {tmp_path} is not a Trainer checkpoint"):
        module.main(["--resume", str(tmp_path)])
    assert module.resumed_step(str(ck)) == 2
