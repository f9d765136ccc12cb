"""Bad inputs to `fcp plan / compare / simulate / presets / index` found in review: each must print one line
`fcp <cmd>: error: ...` on stderr, nothing on stdout, and exit 2 — never a traceback.

A failure means a user hits a traceback, a silently wrong result, or an unhelpful message for that input.
"""

from __future__ import annotations

import re

import pytest
from _requires import transformers_models

from fcp_cli.main import main

PRESET = ["--preset", "qwen3-8b", "--hardware", "h100"]


def _run(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse-level errors (usage, an empty value) exit from the parser
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(capsys, argv, match):
    rc, out, err = _run(capsys, argv)
    assert rc == 2, (rc, out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith(f"fcp {argv[0]}: error:"), err
    assert re.search(match, err), err
    return err


@pytest.fixture
def lengths(tmp_path):
    p = tmp_path / "l.txt"
    p.write_text("100\n200\n300\n")
    return p


def test_cost_json_that_is_a_directory(capsys, tmp_path, lengths):
    """--cost pointing at a folder was an IsADirectoryError traceback."""
    _one_line_error(capsys, ["plan", "--lengths", str(lengths), "--ranks", "4", "--cost", str(tmp_path)],
                    "is a directory")


def test_lengths_that_are_a_directory_or_binary(capsys, tmp_path):
    """A folder was reported as 'not found'; a binary file gave a bare codec error without the file name."""
    bad = tmp_path / "bin.txt"
    bad.write_bytes(b"\xff\xfe\x00")
    for cmd in ("plan", "compare"):
        _one_line_error(capsys, [cmd, "--lengths", str(tmp_path), "--ranks", "4", *PRESET], "is a directory")
        _one_line_error(capsys, [cmd, "--lengths", str(bad), "--ranks", "4", *PRESET], r"bin\.txt: not a text file")


def test_simulate_plot_path_checked_before_simulating(capsys, tmp_path, lengths):
    """A bad --plot target used to fail only after every solver had run (or, for a folder, wrote FOLDER.png and
    claimed to have written FOLDER)."""
    base = ["simulate", "--lengths", str(lengths), "--ranks", "4", "--global-batch-size", "2", "--steps", "1",
            "--no-progress", *PRESET, "--plot"]
    _one_line_error(capsys, base + [str(tmp_path / "missing" / "x.png")], "does not exist")
    _one_line_error(capsys, base + [str(tmp_path)], "is a directory")
    _one_line_error(capsys, base + [str(tmp_path / "x.txt")], "needs an image suffix")
    compare = ["compare", "--lengths", str(lengths), "--ranks", "4", *PRESET, "--ilp", "--plot"]  # before the ILP
    _one_line_error(capsys, compare + [str(tmp_path / "missing" / "x.png")], "does not exist")
    _one_line_error(capsys, compare + [str(tmp_path)], "is a directory")


def test_presets_unknown_filter_and_case(capsys):
    """`fcp presets --model nope --json` printed [] with exit 0 while the table form failed; both now list names."""
    for extra in ([], ["--json"]):
        _one_line_error(capsys, ["presets", "--model", "nope", *extra], "valid: Qwen3-1.7B")
        _one_line_error(capsys, ["presets", "--hardware", "tpu", *extra], "valid: ascend-910c")
    rc, out, _ = _run(capsys, ["presets", "--model", "QWEN3-8B", "--hardware", "H100", "--json"])
    rows = __import__("json").loads(out)
    assert rc == 0 and [r["model"] for r in rows] == ["Qwen3-8B"]
    assert rows[0]["alpha_vis"] == 0.0 and rows[0]["gamma"] > 0  # every v2 key, as --help says (0 was left out)


def test_compare_time_limit_must_be_positive(capsys, lengths):
    """--time-limit -1 reached HiGHS and came back as an 'infeasible' ILP row."""
    with pytest.raises(SystemExit) as e:
        main(["compare", "--lengths", str(lengths), "--ranks", "4", *PRESET, "--ilp", "--time-limit", "-1"])
    assert e.value.code == 2 and "must be > 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["plan", "compare", "simulate", "presets", "index"])
def test_help_has_examples(capsys, cmd):
    """Every planning/index command's --help ends with worked examples."""
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    assert "examples:" in capsys.readouterr().out


def test_index_bad_inputs(capsys, tmp_path):
    """fcp index: an explicit --tokenizer that does not exist was silently replaced by the spec's own (wrong
    counts); a broken tokenizer.json, --out naming a file, and an empty folder gave tracebacks or an empty
    index with exit 0; a missing single input exited 1 as a 100 % error rate; spec names were case-sensitive."""
    from fcp_data._resources import data_path

    text = str(data_path("samples") / "text.jsonl")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": 1')
    afile = tmp_path / "afile"
    afile.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    base = ["--out", str(tmp_path / "idx"), "--no-progress"]
    _one_line_error(capsys, ["index", text, "--spec", "text", "--tokenizer", str(tmp_path / "nope.json"), *base],
                    "tokenizer .*nope.json not found")
    _one_line_error(capsys, ["index", text, "--spec", "text", "--tokenizer", str(bad), *base], "not a valid HF tokenizer")
    _one_line_error(capsys, ["index", text, "--spec", str(bad), *base], "bad.json is not valid JSON")
    _one_line_error(capsys, ["index", text, "--spec", str(tmp_path / "x.json"), *base], "spec file .* not found")
    _one_line_error(capsys, ["index", text, "--spec", "text", "--out", str(afile), "--no-progress"], "is a file")
    _one_line_error(capsys, ["index", str(empty), "--spec", "text", *base], "no samples found")
    _one_line_error(capsys, ["index", str(tmp_path / "missing.jsonl"), "--spec", "text", *base], "none of the inputs exist")
    _one_line_error(capsys, ["index", text, "--spec", "nope", *base], "unknown spec 'nope': use one of .*qwen2-vl")
    from fcp_data.specs import load_spec

    assert load_spec("QWEN2-VL").name == load_spec("qwen2-vl").name


def test_index_options_out_of_range_or_ignored(capsys, tmp_path, monkeypatch):
    """Found by a CLI fuzz (every option × hostile values): --out '' wrote the index into the working directory;
    a --workers or --max-text-bytes too large for a C integer ended in an OverflowError traceback (or a 100 %
    shard_failed index); --address without --engine ray and --chat-template without --chat-field were ignored."""
    from fcp_data._resources import data_path
    from fcp_data.index import LengthIndex

    text = str(data_path("samples") / "text.jsonl")
    monkeypatch.chdir(tmp_path)
    base = ["index", text, "--spec", "text", "--no-progress"]
    out = ["--out", str(tmp_path / "idx")]
    _one_line_error(capsys, [*base, "--out", ""], "--out: an empty value")
    assert not any(tmp_path.iterdir())  # nothing written into the working directory
    _one_line_error(capsys, [*base, *out, "--tokenizer", ""], "--tokenizer: an empty value")
    _one_line_error(capsys, [*base, *out, "--address", "auto"], "needs --engine ray")
    _one_line_error(capsys, [*base, *out, "--chat-template", "llama3"], "--chat-template .* give both")
    for opt in ("--max-text-bytes", "--max-image-pixels", "--max-json-depth", "--max-frames"):
        _one_line_error(capsys, [*base, *out, opt, str(2**64)], f"{opt} must be an integer in|{opt} must be <=")
    # more workers than shards: a pool of as many processes as shards, the same index as one worker
    assert main([*base, *out, "--workers", str(2**64)]) == 0
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "one")]) == 0
    a, b = (LengthIndex.load(tmp_path / d) for d in ("idx", "one"))
    assert len(a) == len(b) == 320 and (a.num_tokens == b.num_tokens).all()


def test_lengths_with_utf8_bom(capsys, tmp_path):
    """A lengths file saved by Excel/Windows starts with a UTF-8 BOM: '\\ufeff100' was 'not a number' and a
    csv header 'len' did not match --column len."""
    from fcp_data.workloads import load_lengths

    (tmp_path / "l.txt").write_bytes(b"\xef\xbb\xbf100\r\n200\r\n")
    (tmp_path / "l.csv").write_bytes(b"\xef\xbb\xbflen,x\r\n100,1\r\n200,2\r\n")
    assert load_lengths(tmp_path / "l.txt").tolist() == [100, 200]
    assert load_lengths(tmp_path / "l.csv", "len").tolist() == [100, 200]


def test_cost_json_with_a_bom_loads_and_with_a_key_twice_is_refused(tmp_path):
    """A cost JSON saved with a BOM was refused while lengths files took one; a key given twice silently kept the
    last value (a review of the CLI)."""
    import json

    from fcp_data.cost import CostModel

    cm = CostModel.preset("qwen3-8b", "h100")
    text = json.dumps(cm.to_dict())
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert CostModel.load(tmp_path / "bom.json") == cm
    (tmp_path / "dup.json").write_text(text.replace('{"alpha1": ', '{"alpha1": 1.0, "alpha1": ', 1))
    with pytest.raises(ValueError, match=r"dup.json is not valid JSON: key 'alpha1' appears twice"):
        CostModel.load(tmp_path / "dup.json")


def test_index_crashed_worker_is_one_line(tmp_path):
    """A worker that dies (OOM-killed) used to end `fcp index --workers 2` with a BrokenProcessPool traceback;
    now one line says to rerun with --resume, and exit code 2."""
    import os
    import subprocess
    import sys

    from fcp_data._resources import data_path
    from fcp_data.index.build import EXIT_AFTER_ENV

    shards = str(data_path("samples") / "wds" / "shard-{000000..000003}.tar")
    r = subprocess.run([sys.executable, "-m", "fcp_cli", "index", shards, "--spec", "text", "--out",
                        str(tmp_path / "ix"), "--workers", "2", "--no-progress"],
                       env={**os.environ, EXIT_AFTER_ENV: "1"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().endswith("--resume") and r.stderr.count("\n") == 1, r.stderr


def test_json_stdout_is_pure_with_reports(capsys, tmp_path):
    """--json output must be the only thing on stdout even when an overlong report or progress would print."""
    import json

    p = tmp_path / "l.txt"
    p.write_text("100\n999999999\n3000\n700\n")
    common = ["--lengths", str(p), "--ranks", "4", *PRESET, "--on-overlong", "truncate"]
    for argv in (["plan", *common, "--micro-batches", "auto", "--json"],
                 ["compare", *common, "--micro-batches", "auto", "--baselines", "static-cp", "--json"],
                 ["simulate", *common, "--global-batch-size", "3", "--steps", "2", "--baselines", "static-cp", "--json"],
                 ["presets", "--json"]):
        rc, out, _ = _run(capsys, argv)
        assert rc == 0 and out.endswith("\n") and out.count("\n") == 1, (argv[0], out[:200])
        json.loads(out)


def test_json_seq_ids_index_the_input_after_a_drop(capsys, tmp_path):
    """DESIGN §6: ``seq_ids`` index the input lengths. After ``--on-overlong drop`` they numbered the kept sequences
    (input 1, dropped, appeared in the plan), and with --json nothing said that sequences were dropped."""
    import json

    p = tmp_path / "l.txt"
    p.write_text("1000\n2000000\n4000\n3000000\n500\n")
    for argv in (["plan", "--json"], ["compare", "--solvers", "fcp,static-cp", "--json"]):
        rc, out, err = _run(capsys, [*argv, "--lengths", str(p), "--ranks", "2", *PRESET, "--on-overlong", "drop"])
        plans = json.loads(out)
        for plan in [plans] if argv[0] == "plan" else plans.values():
            ids = sorted(i for mb in plan["micro_batches"] for g in mb["groups"] for i in g["seq_ids"])
            assert ids == [0, 2, 4], (argv[0], ids)
        assert rc == 0 and err == "2 sequence(s) dropped (over) 172032 tokens\n", err


def test_compare_plot_without_fcp(capsys, tmp_path, lengths):
    """--solvers without fcp and --plot: a KeyError traceback after the table (the plot assumed an FCP plan)."""
    out = tmp_path / "p.png"
    rc, _, err = _run(capsys, ["compare", "--lengths", str(lengths), "--ranks", "4", *PRESET, "--solvers",
                               "static-cp,ulysses", "--plot", str(out)])
    assert rc == 0 and err == "" and out.stat().st_size > 0, err


def test_a_hf_config_that_is_no_regular_file(capsys, tmp_path, lengths):
    """`--preset hf:FIFO` blocked forever in the read (a FIFO's size is 0), `hf:/dev/zero` read until the kernel killed
    the process for memory."""
    import os

    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    for source in (fifo, "/dev/zero"):
        _one_line_error(capsys, ["presets", "--model", f"hf:{source}"], "is not a regular file")
        _one_line_error(capsys, ["plan", "--lengths", str(lengths), "--ranks", "4", "--preset", f"hf:{source}",
                                 "--hardware", "h100"], "is not a regular file")


def test_no_command_is_a_usage_error(capsys):
    """`fcp` alone printed the whole help on stdout (exit 2, nothing on stderr)."""
    with pytest.raises(SystemExit) as e:
        main([])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err.count("\n") == 1, (out, err)
    assert "a command is required: one of plan, compare" in err, err


def test_a_misspelt_name_gets_a_suggestion(capsys, lengths):
    """Unknown preset, hardware, solver and baseline names listed the valid ones only (a review of the CLI)."""
    base = ["plan", "--lengths", str(lengths), "--ranks", "4"]
    _one_line_error(capsys, [*base, "--preset", "Qwen3-8", "--hardware", "h100"], r"did you mean 'Qwen3-8B'\?")
    _one_line_error(capsys, [*base, "--preset", "qwen3-8b", "--hardware", "h10"], r"did you mean 'h100'\?")
    _one_line_error(capsys, ["compare", "--lengths", str(lengths), "--ranks", "4", *PRESET, "--baselines",
                             "static_cp"], r"did you mean 'static-cp'\?")
    _one_line_error(capsys, ["presets", "--hardware", "a10"], r"did you mean 'a100'\?")
    from fcp_data.plan import get_solver

    with pytest.raises(ValueError, match=r"did you mean 'fcp-pow2'\?"):
        get_solver("fcp_pow2")
    _one_line_error(capsys, [*base, *PRESET[:2], "--hardware", "nothing-like-it"], r"preset 'nothing-like-it'; valid")


def test_version_flag(capsys):
    """`fcp --version` prints the installed package version (the same as fcp_data.__version__)."""
    import fcp_data

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fcp {fcp_data.__version__}"


def test_index_summary_shows_an_example_per_error_reason(capsys, tmp_path):
    """A wrong --text-field made every sample an error; the summary gave only 'missing_field 320' and the user
    had to open errors.jsonl to learn which field was missing. Now the first error of each reason is shown."""
    from fcp_data._resources import data_path

    rc, out, err = _run(capsys, ["index", str(data_path("samples") / "text.jsonl"), "--spec", "text", "--out",
                                 str(tmp_path / "ix"), "--text-field", "body", "--no-progress"])
    assert rc == 1 and "exceeds --max-error-rate" in err
    assert "missing_field: " in out and "no string field 'body'" in out


# ---------------------------------------------------------------- fcp train / fcp profile (issue 15)
# Every case below used to end in a worker's traceback (exit 1), a hang (--nproc 100000) or a silent retry; it
# must be refused in the parent, before any process starts: one line on stderr, exit 2.

CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.fixture(scope="module")
def text_index(tmp_path_factory):
    from fcp_data._resources import data_path
    from fcp_data.index import build_index

    out = tmp_path_factory.mktemp("tix") / "ix"
    build_index([str(data_path("samples") / "text.jsonl")], "text", out, progress=False)
    return str(out)


@pytest.fixture(scope="module")
def bad_configs(tmp_path_factory):
    """Configs that transformers builds but that cannot train on the bundled data, or that fcp does not run."""
    import json

    d = tmp_path_factory.mktemp("cfg")
    small = json.loads((CONFIGS / "qwen3-tiny.json").read_text())
    small["vocab_size"] = 100
    ids = json.loads((CONFIGS / "qwen2_5_vl-tiny.json").read_text())
    ids["video_token_id"] = 7
    (d / "small_vocab.json").write_text(json.dumps(small))
    (d / "video_id.json").write_text(json.dumps(ids))
    (d / "gpt2.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2}))
    (d / "broken.json").write_text('{"model_type": ')
    return d


def test_train_bad_data(capsys, tmp_path, text_index):
    """--data that is a file, missing, a folder without manifest.json (an interrupted `fcp index`), or a text
    index for the video model: FileNotFoundError / ValueError tracebacks from the workers before."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "partial").mkdir()
    base = ["train", "--nproc", "2", "--steps", "1"]
    _one_line_error(capsys, [*base, "--data", str(afile)], "is a file, not a length index")
    _one_line_error(capsys, [*base, "--data", str(tmp_path / "missing")], "no such length index")
    _one_line_error(capsys, [*base, "--data", str(tmp_path / "partial")], r"no manifest\.json.*--resume")
    _one_line_error(capsys, [*base, "--model", "tiny-mllm", "--data", text_index], "text spec 'text'; tiny-mllm needs")


def test_train_bad_options(capsys):
    """Values the workers used to reject (or, for --nproc 100000, hang on in the rendezvous)."""
    base = ["train", "--steps", "1"]
    _one_line_error(capsys, [*base, "--planner", "ilp"], "solver='ilp' is time-limited")
    _one_line_error(capsys, [*base, "--planner", "nope"], "unknown planner 'nope'")
    _one_line_error(capsys, [*base, "--backend", "foo"], "unknown --backend 'foo'")
    _one_line_error(capsys, [*base, "--lr", "nan"], "lr and weight_decay must be finite")
    _one_line_error(capsys, [*base, "--num-workers", "-1"], "num_workers and prefetch must be >= 0")
    # found by fuzzing: 10**20 workers started processes until the machine thrashed (a hang), 10**20 sequences or
    # tokens overflowed numpy's int64 deep inside (a traceback)
    _one_line_error(capsys, [*base, "--num-workers", str(10**20)], "more DataLoader processes per rank than")
    for opt in ("--global-batch-size", "--max-tokens", "--prefetch", "--steps", "--tokens-per-rank"):
        _one_line_error(capsys, [*base, opt, str(10**20)], r"is beyond any real run \(at most 1099511627776\)")
    _one_line_error(capsys, [*base, "--nproc", "100000"], "more than 4 processes per CPU core")
    _one_line_error(capsys, [*base, "--nproc", "0"], "--nproc must be a positive integer")
    _one_line_error(capsys, [*base, "--model", "gpt-7"], "--model must be tiny-llm, tiny-mllm or hf:PATH")
    _one_line_error(capsys, [*base, "--grad-checkpointing"], "gradient checkpointing is available for hf: models")
    _one_line_error(capsys, [*base, "--planner", "static-cp:5", "--nproc", "2"], "degree 5 is not allowed")
    _one_line_error(capsys, [*base, "--amp", "float16", "--dtype", "float64"], "over float32 parameters: give --dtype")
    _one_line_error(capsys, [*base, "--amp", "float16", "--initial-loss-scale", "0"], "initial_loss_scale must be finite")
    _one_line_error(capsys, [*base, "--amp", "float16", "--initial-loss-scale", "inf"], "initial_loss_scale must be")
    _one_line_error(capsys, [*base, "--amp", "float16", "--loss-scale-window", "0"], "loss_scale_window must be >= 1")
    _one_line_error(capsys, [*base, "--read-errors-out", "/nonexistent-folder/e.jsonl"], "does not exist")
    for opt in ("--initial-loss-scale", "--loss-scale-window"):  # found by a CLI fuzz: silently ignored before
        for amp in ("none", "bfloat16"):
            _one_line_error(capsys, [*base, "--amp", amp, opt, "1024"], "set the loss scaler of --amp float16")
    _one_line_error(capsys, [*base, "--max-grad-norm", "-1"], "max_grad_norm must be finite and >= 0")
    _one_line_error(capsys, [*base, "--init", "pretrained"], r"--init pretrained needs --model hf:FOLDER holding")
    _one_line_error(capsys, [*base, "--save-model", "out"], r"--save-model writes a transformers checkpoint: it needs")
    _one_line_error(capsys, [*base, "--fsdp-mixed-precision", "bfloat16"], "give --reducer fsdp2, --dtype float32")
    _one_line_error(capsys, [*base, "--fsdp-mixed-precision", "bfloat16", "--reducer", "fsdp2", "--amp", "bfloat16"],
                    "and no --amp")
    _one_line_error(capsys, [*base, "--max-grad-norm", "nan"], "max_grad_norm must be finite and >= 0")
    _one_line_error(capsys, [*base, "--warmup-steps", "-2"], "warmup_steps must be >= 0")
    _one_line_error(capsys, [*base, "--lr-schedule", "cosine", "--min-lr", "0.5"], r"min_lr must be finite, >= 0 and <= lr")
    # options with no effect in the combination given were taken silently (a review of fcp train)
    _one_line_error(capsys, [*base, "--min-lr", "1e-4"], r"the constant schedule has none: it would have no effect")
    _one_line_error(capsys, [*base, "--num-synthetic", "5"], r"--num-synthetic sets the documents of --data synthetic")
    _one_line_error(capsys, [*base, "--retry-skipped", "--on-read-error", "raise"], r"--retry-skipped reads skipped")
    _one_line_error(capsys, [*base, "--init", "random"], r"--init applies to hf: models")


def test_train_bad_checkpoint_options(capsys, tmp_path):
    """--checkpoint/--checkpoint-every without each other, --resume of something that is not a complete checkpoint,
    or at a step --steps does not pass: one line before any process starts."""
    import json

    base = ["train", "--steps", "2", "--nproc", "2"]
    _one_line_error(capsys, [*base, "--checkpoint", str(tmp_path / "c")], "need both --checkpoint DIR and --checkpoint-every")
    _one_line_error(capsys, [*base, "--checkpoint-every", "2"], "need both --checkpoint DIR and --checkpoint-every")
    _one_line_error(capsys, [*base, "--resume", str(tmp_path / "missing")], "is not a folder")
    ck = tmp_path / "step-3"
    ck.mkdir()
    _one_line_error(capsys, [*base, "--resume", str(ck)], "has no .metadata: its model and optimizer were not saved")
    (ck / ".metadata").write_bytes(b"x")
    _one_line_error(capsys, [*base, "--resume", str(ck)], "has no sampler-rank0.json")
    (ck / "sampler-rank0.json").write_text("{not json")
    _one_line_error(capsys, [*base, "--resume", str(ck)], "is not a sampler state written by save_checkpoint")
    (ck / "sampler-rank0.json").write_text(json.dumps({"step": 3, "sampler": {}}))
    _one_line_error(capsys, [*base, "--resume", str(ck)], r"is at step 3; --steps 2 leaves nothing to train")


def test_train_nccl_without_gpus(capsys):
    """--backend nccl on a CPU-only machine: 'Distributed package doesn't have NCCL built in' from a worker before."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA GPUs: nccl is a valid choice here")
    _one_line_error(capsys, ["train", "--steps", "1", "--backend", "nccl"], "--backend nccl needs CUDA GPUs")


def test_train_bad_hf_configs(capsys, tmp_path, bad_configs, text_index):
    """hf: configs that do not exist, do not parse, are not supported, or do not fit the data (vocabulary,
    special token ids, a text index for a VL model) — each one line, found before any process starts."""
    transformers_models()
    base = ["train", "--nproc", "2", "--steps", "1", "--model"]
    _one_line_error(capsys, [*base, f"hf:{tmp_path / 'nope.json'}"], "does not exist; pass a local transformers config")
    _one_line_error(capsys, [*base, f"hf:{tmp_path}"], "holds no config.json")
    _one_line_error(capsys, [*base, f"hf:{bad_configs / 'broken.json'}"], "not a JSON model config")
    _one_line_error(capsys, [*base, f"hf:{bad_configs / 'gpt2.json'}"], "model_type 'gpt2' is not supported")
    _one_line_error(capsys, [*base, f"hf:{bad_configs / 'small_vocab.json'}"], "vocab_size is 100")
    _one_line_error(capsys, [*base, f"hf:{bad_configs / 'video_id.json'}"], r"special token ids: video 5 \(config 7\)")
    _one_line_error(capsys, [*base, f"hf:{CONFIGS / 'qwen2_vl-tiny.json'}", "--data", text_index],
                    "needs a Qwen-VL spec")


def test_profile_bad_options(capsys, tmp_path, bad_configs):
    """fcp profile: degrees above --nproc failed inside the workers; a bad preset or config likewise."""
    base = ["profile", "--out", str(tmp_path / "c.json")]
    _one_line_error(capsys, [*base, "--degrees", "4", "--nproc", "1"], "a degree cannot exceed the 1 process")
    _one_line_error(capsys, [*base, "--layer-like", "nope"], "unknown --layer-like preset 'nope'")
    _one_line_error(capsys, [*base, "--nproc", "100000"], "more than 4 processes per CPU core")
    _one_line_error(capsys, [*base, "--reps", "0"], r"--reps must be in \[1, 1000\]")
    # found by a review: a 10^15-token document reached the workers (a 40-line allocation traceback); a symlink loop
    # as --out was a RuntimeError traceback from Path.resolve
    _one_line_error(capsys, [*base, "--seq-lens", "1000000000000000"], r"expected integers in \[1, 16777216\]")
    _one_line_error(capsys, [*base, "--warmup", "100000"], r"--warmup must be in \[0, 1000\]")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    _one_line_error(capsys, ["profile", "--out", str(tmp_path / "a")], "cannot be resolved")
    _one_line_error(capsys, ["profile", "--out", str(tmp_path)], "is a directory")
    from fcp_exec.compat import hf_models_problem

    problem = hf_models_problem()  # transformers missing or not running on this torch: that line, first
    _one_line_error(capsys, [*base, "--model", f"hf:{bad_configs / 'gpt2.json'}"],
                    "'gpt2' is not supported" if problem is None else re.escape(problem))



def test_profile_refuses_before_timing_what_it_could_only_write_or_build_after(capsys, tmp_path, monkeypatch):
    """Found by a review of `fcp profile`: an --out/--report/--plot that cannot be written (a missing /proc entry), the
    same file for --out and --report (the report replaced the cost model), a --tokens-per-rank above the cost model's
    bound and an hf: config that parses but does not build (0 key/value heads: a rank's ZeroDivisionError traceback)
    or has no layers were each found after minutes of timing, or never; now one line before any process starts.
    The timing itself is made to fail the test if it is reached."""
    import json

    import fcp_exec.profiler as profiler

    monkeypatch.setattr(profiler, "run_profile", lambda *a, **k: pytest.fail("timed before refusing"))
    out = str(tmp_path / "c.json")
    base = ["profile", "--nproc", "1", "--seq-lens", "64,128,256", "--packed-docs", "none"]
    _one_line_error(capsys, [*base, "--out", "/proc/self/no/x.json"], "its folder does not exist")
    _one_line_error(capsys, [*base, "--out", "/proc/self/x.json"], r"--out /proc/self/x.json cannot be written")
    _one_line_error(capsys, [*base, "--out", out, "--report", out], "--report .* is the file --out writes too")
    _one_line_error(capsys, [*base, "--out", out, "--tokens-per-rank", str(2 ** 41)],
                    r"--tokens-per-rank must be in \[1, 1099511627776\]")
    assert not (tmp_path / "c.json").exists()  # the write probe leaves nothing behind
    cfg = json.loads((CONFIGS / "qwen3-tiny.json").read_text())
    (tmp_path / "kv0.json").write_text(json.dumps({**cfg, "num_key_value_heads": 0}))
    (tmp_path / "l0.json").write_text(json.dumps({**cfg, "num_hidden_layers": 0}))
    _one_line_error(capsys, [*base, "--out", out, "--model", f"hf:{tmp_path / 'kv0.json'}"],
                    "the model cannot be built from this config")
    _one_line_error(capsys, [*base, "--out", out, "--model", f"hf:{tmp_path / 'l0.json'}"],
                    "num_hidden_layers is 0")


def test_profile_refuses_a_fit_that_does_not_grow_with_tokens():
    """Equal times at every length (a grid too short for the machine's noise) fitted every compute coefficient 0 and
    the cost model was written: a group of 100 tokens then cost what one of 300,000 does. Refused, not written."""
    from fcp_data.commands import UsageError
    from fcp_exec.commands.profile import _check_fit
    from fcp_exec.profile_fit import ProfilePoint, fit_cost_model

    points = [ProfilePoint(seq_len=s, degree=d, time_s=0.05) for d in (1, 2) for s in (64, 128, 256, 512)]
    fit = fit_cost_model(points, bandwidth_intra=1e9, ranks_per_node=2, tokens_per_rank=4096, alpha3_default=100.0,
                         version=2)
    assert fit.cost_model.alpha1 == fit.cost_model.alpha2 == fit.cost_model.alpha_blk == 0.0
    with pytest.raises(UsageError, match="the measured times do not grow with the tokens"):
        _check_fit(fit.cost_model)
    grow = [ProfilePoint(seq_len=s, degree=1, time_s=1e-3 + 2e-6 * s) for s in (64, 128, 256, 512)]
    _check_fit(fit_cost_model(grow, bandwidth_intra=1e9, tokens_per_rank=4096).cost_model)  # a real fit passes


def test_argparse_errors_are_one_line(capsys):
    """argparse's usage + error (two lines and more) is one line too, and still exit code 2."""
    for argv in (["train", "--nproc", "x"], ["train", "--reducer", "nope"], ["nope"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "error:" in err and "usage:" not in err, err


def test_unknown_option_names_its_command(capsys):
    """An option the command does not have is that command's error and points at that command's --help; one
    before the command is the top level's."""
    for argv, prog in ((["plan", "--ranks", "2", "--bogus", "x"], "fcp plan"), (["presets", "--bogus"], "fcp presets"),
                       (["--bogus", "presets"], "fcp")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"{prog}: error: unrecognized arguments: --bogus") and f"(see `{prog} --help`)" in err, err


def test_debug_flag_shows_the_traceback(capsys):
    """--debug (before or after the command) prints the traceback of a user error, then the same line; exit 2."""
    for argv in (["--debug", "train", "--model", "gpt-7"], ["train", "--model", "gpt-7", "--debug"]):
        rc, out, err = _run(capsys, argv)
        assert rc == 2 and "Traceback" in err and err.rstrip().splitlines()[-1].startswith("fcp train: error: --model")


def test_python_m_cli_reports_usage_errors_in_one_line():
    """`python -m fcp_cli` and `python -m fcp_cli.main` (main.py as __main__: a UsageError class defined there would
    not be the one the commands raise, and every UsageError was a traceback with exit 1 that way)."""
    import subprocess
    import sys

    for module in ("fcp_cli", "fcp_cli.main"):
        r = subprocess.run([sys.executable, "-m", module, "train", "--model", "gpt-7"], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (module, r.stderr)


def _raise_value_error(msg):
    raise ValueError(msg)


def _raise_index_error():
    return [][1]


def test_worker_user_error_is_one_line_but_a_worker_bug_keeps_its_traceback():
    """A ValueError raised in a worker (a user error the parent could not see) reaches the user as its message;
    any other worker exception stays a RuntimeError with the traceback (a bug)."""
    from fcp_cli.main import _worker_user_error
    from fcp_exec.launch import launch

    with pytest.raises(RuntimeError) as e:
        launch(_raise_value_error, 2, "vocab_size too small; raise it", timeout=120)
    assert _worker_user_error(e.value) == "vocab_size too small; raise it"
    with pytest.raises(RuntimeError) as e:
        launch(_raise_index_error, 2, timeout=120)
    assert _worker_user_error(e.value) is None
    assert _worker_user_error(RuntimeError("something else")) is None


def test_internal_bug_keeps_its_traceback(monkeypatch):
    """Only user errors are turned into one line: any other exception (a bug) propagates with its traceback."""
    import fcp_data.commands.presets as presets

    def boom(args):
        return [][1]

    real = presets.register

    def register(sub, summary):
        real(sub, summary)
        sub.choices["presets"].set_defaults(func=boom)

    monkeypatch.setattr(presets, "register", register)
    with pytest.raises(IndexError):
        main(["presets"])


def test_an_empty_value_is_refused_by_every_option_of_every_command(capsys, tmp_path, monkeypatch):
    """Found by reading the fuzz's exit-0 cases: ``--cost ''``, ``--plot ''``, ``--checkpoint ''``, ``--backend ''``
    ... (an unset shell variable) were taken as "not given" and the command ran with the default. Every option
    that takes a string, of every command (read from the parsers), now refuses it before anything runs."""
    import argparse

    from fcp_cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    (tmp_path / "L.txt").write_text("100\n200\n")
    planning = ["--lengths", "L.txt", "--ranks", "4", *PRESET]
    bases = {"plan": planning, "compare": planning, "simulate": [*planning, "--global-batch-size", "2"],
             "index": ["L.txt", "--spec", "text", "--out", "idx"], "train": [], "profile": ["--out", "cost.json"]}
    tried = 0
    for command, base in bases.items():
        parser = build_parser(command).commands[command]
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0 or action.type not in (None, str) \
                    or isinstance(action, argparse._HelpAction):
                continue
            opt, argv = action.option_strings[-1], [command, *base]
            if opt in argv:
                argv[argv.index(opt) + 1] = ""
            else:
                argv += [opt, ""]
            _one_line_error(capsys, argv, f"{re.escape(opt)}: an empty value" if action.choices is None
                            else f"argument {re.escape(opt)}: invalid choice: ''")
            tried += 1
    assert tried >= 40, tried  # the parsers were read
    _one_line_error(capsys, ["index", "", "--spec", "text", "--out", "x"], "INPUT: an empty value")
    assert [p.name for p in tmp_path.iterdir()] == ["L.txt"]  # nothing was written


def test_a_key_field_no_record_has_is_a_warning(capsys, tmp_path):
    """Found by reading the fuzz's accepted cases: ``--key-field`` with a name no record has (a typo) keyed every
    sample file:line without a word. The index is still valid, so it is built; stderr says so."""
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"uid": "u{i}", "text": "a b c {i}"}}\n' for i in range(5)))
    base = ["index", str(data), "--spec", "text", "--no-progress"]
    assert main([*base, "--out", str(tmp_path / "a"), "--key-field", "uuid"]) == 0
    assert "warning: no record seems to have the field --key-field 'uuid'" in capsys.readouterr().err
    for field in ("uid", "id"):  # a field the records have; the default, whose fallback is documented
        assert main([*base, "--out", str(tmp_path / field), "--key-field", field]) == 0
        assert "warning" not in capsys.readouterr().err
