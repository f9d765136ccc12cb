"""`fcp train` findings of a review: a run's deadline, the ranks' agreement check under --json and torchrun, label
options the data ignores, the --json stdout contract, configs and values that failed inside the workers, a killed
rank, silently dropped samples, the `python -m fcp_cli` guard, an early Ctrl-C, a global batch beyond the data.

Most checks run in this process (config validation, the preflight, the error boundary with the launch replaced);
three start processes: torchrun with 2 ranks, one hf: run with --json, and a forkserver probe.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fcp_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--nproc", "1", "--steps", "1", "--data", "synthetic"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _fake_result(checksums, rank=0) -> dict:
    step = {"step": 0, "loss": 1.0, "num_tokens": 10, "step_time_s": 0.1, "planner_wait_s": 0.0, "num_idle": 0,
            "skipped_samples": [], "degrees": [[1]], "lr": 1e-3, "grad_norm": 1.0}
    return {"steps": [step], "eval": [], "checksums": list(checksums), "param_checksum": checksums[rank],
            "rank": rank}


# ---------------------------------------------------------------- 1. no overall deadline; a timeout is no user error
def test_run_training_gives_the_launch_no_deadline(monkeypatch):
    """run_training launched every multi-process run with timeout=1800: the ranks were killed after 30 minutes
    whatever --steps asked for. Now the launch has no deadline (inf); hangs end at the process group's timeout."""
    import fcp_exec.launch
    import fcp_exec.train
    from fcp_exec.train import TrainConfig, run_training

    seen = {}

    def fake_launch(fn, nproc, *args, **kw):
        seen.update(kw)
        return [{"param_checksum": 1.0}] * nproc

    for mod in (fcp_exec.launch, fcp_exec.train):
        monkeypatch.setattr(mod, "launch", fake_launch, raising=False)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    res = run_training(TrainConfig(), 2)
    assert res["checksums"] == [1.0, 1.0]
    assert seen["timeout"] == math.inf, seen


def test_a_launcher_timeout_is_not_a_user_error(monkeypatch, capsys):
    """TimeoutError is an OSError: the boundary reported a launcher's deadline as a bad input (exit 2)."""
    import fcp_exec.train

    def times_out(cfg, nproc, backend=None):
        raise TimeoutError("train: ranks [0, 1] did not finish within 1800 s")

    monkeypatch.setattr(fcp_exec.train, "run_training", times_out)
    with pytest.raises(TimeoutError):
        main(["train", *TINY])


# ---------------------------------------------------------------- 2. --json checks the ranks' agreement too
def test_json_mode_reports_ranks_that_disagree(monkeypatch, capsys):
    """With --json the all-ranks parameter check was skipped: diverged ranks exited 0. Now one stderr line, exit 1,
    and stdout holds only the step objects."""
    import fcp_exec.train

    monkeypatch.setattr(fcp_exec.train, "run_training", lambda cfg, nproc, backend=None: _fake_result([1.0, 2.0]))
    assert main(["train", "--json", *TINY]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "parameters differ" in err, (out, err)
    assert main(["train", *TINY]) == 1  # text mode: as before
    assert "identical on all 2 ranks: NO" in capsys.readouterr().out
    monkeypatch.setattr(fcp_exec.train, "run_training", lambda cfg, nproc, backend=None: _fake_result([3.0, 3.0]))
    assert main(["train", "--json", *TINY]) == 0
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- 3. torchrun: every rank's checksum, rank 0 reports
def test_torchrun_compares_every_rank_and_rank_0_reports():
    """Under torchrun every rank printed its own `done:` line, each comparing only its own checksum ("identical on
    all 1 ranks"). Now the checksums are all-gathered and rank 0 alone prints the summary."""
    for _ in range(2):  # torch's gloo under torchrun aborts a rank at exit now and then, with HEAD's code too (~5 %
        # of runs on a loaded 2-core machine: "terminate called without an active exception" after the run's output)
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                            "-m", "fcp_cli", "train", "--steps", "1", "--data", "synthetic"], capture_output=True,
                           text=True, timeout=300, cwd=ROOT, env=_env())
        if "terminate called without an active exception" not in r.stderr:
            break
    assert r.returncode == 0, r.stderr[-3000:]
    done = [line for line in r.stdout.splitlines() if line.startswith("done:")]
    assert len(done) == 1 and done[0].endswith("parameters identical on all 2 ranks: yes"), r.stdout


# ---------------------------------------------------------------- 4, 9, 12. the preflight knows the data
def test_label_options_the_data_ignores_are_refused():
    """--sample-labels on data without labels and --caption-labels on data without an index's images/videos
    changed nothing, silently. The preflight refuses them (ValueError: one line, exit 2)."""
    from fcp_exec.commands.train import preflight
    from fcp_exec.train import TrainConfig

    with pytest.raises(ValueError, match="--sample-labels .* would have no effect"):
        preflight(TrainConfig(data="synthetic", sample_labels=True), 1)
    with pytest.raises(ValueError, match="--caption-labels .* would have no effect"):
        preflight(TrainConfig(data="synthetic", caption_labels=True), 1)
    with pytest.raises(ValueError, match="--caption-labels"):
        preflight(TrainConfig(caption_labels=True), 1)  # the bundled text samples


def test_samples_left_out_for_max_tokens_are_said(capsys):
    """tiny-mllm's bundled samples longer than --max-tokens were left out without a word; the data line says how
    many now (and under --json a stderr line). --caption-labels on those image/video samples is accepted."""
    from fcp_exec.commands.train import preflight
    from fcp_exec.train import TrainConfig

    data = preflight(TrainConfig(model="tiny-mllm", max_tokens=300, caption_labels=True), 2)
    assert data.num_dropped > 0
    assert f"{data.num_dropped} left out (longer than --max-tokens)" in data.description, data.description
    assert capsys.readouterr().err == ""  # text mode: the [fcp train] data line says it
    preflight(TrainConfig(model="tiny-mllm", max_tokens=300, json_lines=True, verbose=False), 2)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{data.num_dropped} sample(s)" in err and "--max-tokens 300" in err, err


def test_a_global_batch_beyond_the_data_is_a_warning(capsys):
    """--global-batch-size above the number of samples silently became the dataset size."""
    from fcp_exec.commands.train import preflight
    from fcp_exec.train import TrainConfig

    preflight(TrainConfig(data="synthetic", global_batch_size=100), 1)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--global-batch-size 100 is more than the 24 sample(s)" in err, err
    preflight(TrainConfig(data="synthetic", global_batch_size=24), 1)
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------- 5. --json stdout: JSON objects only, documented
def test_json_stdout_holds_only_documented_json_objects(tmp_path):
    """--json with --checkpoint and --save-model printed undocumented objects and DeepSpeed's "[WARNING] ... Setting
    accelerator to CPU" line (from save_pretrained) on stdout. Every stdout line is a JSON object now, of a kind the
    epilog lists."""
    pytest.importorskip("transformers")
    from fcp_exec.commands.train import EPILOG

    r = subprocess.run([sys.executable, "-m", "fcp_cli", "train", "--model", "hf:examples/configs/qwen3-tiny.json",
                        "--nproc", "1", "--steps", "1", "--data", "synthetic", "--json", "--checkpoint",
                        str(tmp_path / "ck"), "--checkpoint-every", "1", "--save-model", str(tmp_path / "sm")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    kinds = []
    for line in r.stdout.splitlines():
        obj = json.loads(line)  # a non-JSON line fails here
        kinds.append(next(k for k in ("step", "eval", "checkpoint", "saved_model") if k in obj))
    assert kinds == ["step", "checkpoint", "saved_model"], r.stdout
    for key in ('"checkpoint"', '"resumes_at_step"', '"saved_model"', '"eval"'):  # documented
        assert key in EPILOG, key


# ---------------------------------------------------------------- 6, 7, smaller ones: refused before ranks start
def test_pad_token_outside_the_vocabulary_is_refused(tmp_path):
    """pad_token_id >= vocab_size failed in every rank's nn.Embedding (AssertionError tracebacks)."""
    pytest.importorskip("transformers")
    from fcp_exec.commands.train import load_hf_config

    cfg = json.loads((ROOT / "examples/configs/qwen3-tiny.json").read_text())
    path = tmp_path / "pad_oob.json"
    path.write_text(json.dumps({**cfg, "pad_token_id": int(cfg["vocab_size"]) + 10}))
    with pytest.raises(ValueError, match="pad_token_id .* outside the vocabulary"):
        load_hf_config(str(path))


def test_config_values_that_failed_in_the_workers():
    """--initial-loss-scale above float32's largest value failed in every rank ("cannot be converted to type float
    without overflow"); --max-tokens 10**9 blamed a cost model the user never passed."""
    import torch

    from fcp_exec.train import TrainConfig, builtin_cost_model

    with pytest.raises(ValueError, match="initial_loss_scale"):
        TrainConfig(amp="float16", initial_loss_scale=1e39)
    TrainConfig(amp="float16", initial_loss_scale=float(torch.finfo(torch.float32).max))
    with pytest.raises(ValueError, match="^--max-tokens 1000000000 "):
        builtin_cost_model(10**9, 2)


def test_a_file_where_a_folder_belongs(tmp_path, capsys):
    """`--cache-dir FILE` said "[Errno 17] File exists"; `python -m fcp_exec.demo --out FILE` was a traceback."""
    from fcp_exec.demo import main as demo
    from fcp_exec.train import TrainConfig

    f = tmp_path / "afile"
    f.write_text("")
    with pytest.raises(ValueError, match="--cache-dir .* is a file, not a folder"):
        TrainConfig(cache_dir=str(f))
    assert demo(["--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a folder" in err, err


# ---------------------------------------------------------------- 8. a rank killed by a signal: one line, not 2
def test_a_killed_rank_is_one_line_naming_it(monkeypatch, capsys):
    """A SIGKILLed rank gave ~70 lines of tracebacks, the cause last (its peer's gloo error first). Now one line
    naming the rank and the signal, exit 1 (a failure, not a bad input); --debug adds the tracebacks."""
    import fcp_exec.train
    from fcp_exec.launch import WorkerFailure, WorkerPool

    class Dead:  # what WorkerPool._died reads of a rank's process
        exitcode = -signal.SIGKILL

        def join(self, timeout=None):
            pass

    pool = WorkerPool.__new__(WorkerPool)
    pool._procs = [None, Dead()]
    errors = {0: ("RuntimeError", "ring attention: rank 0 ... Connection reset by peer", "Traceback ...gloo"),
              1: pool._died(1)}

    def killed(cfg, nproc, backend=None):
        raise WorkerFailure(errors, "train")

    monkeypatch.setattr(fcp_exec.train, "run_training", killed)
    assert main(["train", *TINY]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "rank 1 was killed by SIGKILL (out of memory?); the other ranks stopped" in err, err
    assert main(["--debug", "train", *TINY]) == 1
    assert "Traceback" in capsys.readouterr().err


# ---------------------------------------------------------------- 10. python -m fcp_cli is guarded
def test_python_m_fcp_cli_is_guarded():
    """fcp_cli/__main__.py ran the command at import: a DataLoader's forkserver would run it again, so fcp warned
    about its own file and forked the workers instead."""
    from fcp_data.workers import _unguarded

    path = ROOT / "fcp_cli" / "__main__.py"
    st = path.stat()
    assert _unguarded(str(path), st.st_mtime_ns, st.st_size) is None
    r = subprocess.run([sys.executable, "-m", "fcp_cli", "--version"], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env=_env())
    assert r.returncode == 0 and r.stdout.startswith("fcp "), (r.stdout, r.stderr)


# ---------------------------------------------------------------- 11. Ctrl-C while the forkserver imports
_PROBE = textwrap.dedent("""
    import signal, sys, time
    from multiprocessing import forkserver as mfs
    from fcp_exec import forkserver
    forkserver.start(["_fcp_slow_preload"])
    pid = mfs._forkserver._forkserver_pid
    time.sleep(1.0)  # the server is importing _fcp_slow_preload (4 s)
    status = open(f"/proc/{pid}/status").read()
    mask = int(next(l for l in status.splitlines() if l.startswith("SigIgn")).split()[1], 16)
    print("ignored" if mask & (1 << (signal.SIGINT - 1)) else "default",
          signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_forkserver_ignores_ctrl_c_while_it_imports(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group: `fcp train`'s forkserver, still importing its preload,
    printed a KeyboardInterrupt traceback under "fcp train: interrupted". It ignores SIGINT from its start now; the
    command itself keeps its handler."""
    (tmp_path / "_fcp_slow_preload.py").write_text("import time\ntime.sleep(4)\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    t0 = time.monotonic()
    # as a terminal starts it: SIGINT at its default (a background job of a non-interactive shell, e.g. CI, inherits
    # it ignored, and Python then installs no KeyboardInterrupt handler)
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ignored", "True"], (r.stdout, r.stderr, time.monotonic() - t0)


def test_an_index_of_a_larger_vocabulary_than_the_tiny_models_is_one_line(tmp_path, capsys):
    """An index built with a model's own tokenizer (more ids than tiny-llm's embedding of the bundled tokenizer's
    2,000) given to ``fcp train --model tiny-llm`` ended in an ``IndexError`` traceback in the embedding at the first
    such id: one line naming the fix, exit 2, before any rank starts. Reference: the same data with the bundled
    tokenizer trains (checked by the rest of the suite; here only the refusal)."""
    from tokenizers import AddedToken, Tokenizer

    from fcp_data._resources import data_path
    from fcp_data.index import build_index

    tok = Tokenizer.from_file(str(data_path("tokenizers") / "tiny-bpe.json"))
    tok.add_special_tokens([AddedToken(f"<|extra_{i}|>", special=True) for i in range(300)])
    tok.save(str(tmp_path / "tokenizer.json"))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": "some words here <|extra_299|> " * (3 + i)}) + "\n"
                            for i in range(6)))
    build_index([str(docs)], "text", tmp_path / "ix", tokenizer=str(tmp_path / "tokenizer.json"), progress=False)
    capsys.readouterr()
    rc = main(["train", "--model", "tiny-llm", "--data", str(tmp_path / "ix"), "--nproc", "1", "--steps", "1"])
    out, err = capsys.readouterr()
    assert rc == 2 and err.count("\n") == 1 and err.startswith("fcp train: error:"), (rc, err[-2000:])
    assert "tokenizer of 2300 ids but tiny-llm embeds 2000" in err and "--model hf:CONFIG" in err, err
