"""fcp_exec.script.run_main (what a training script's user errors look like) and init_distributed's refusal of a
partial torchrun environment. Reference: the contract itself — one line ``prog: error: message`` on stderr and
exit 2 for an error about the input; a bug keeps its traceback."""

from __future__ import annotations

import pytest

from fcp_data.read_errors import SampleReadError
from fcp_exec.devices import init_distributed
from fcp_exec.optim import TrainingDiverged
from fcp_exec.script import run_main


def _fails_with(exc: BaseException):
    def main():
        raise exc
    return main


@pytest.mark.parametrize("exc", [ValueError("bad --cost:\n  line two"), FileNotFoundError("no index at x"),
                                 TrainingDiverged("step 3: the loss is nan"), SampleReadError("12 of 20 failed")])
def test_an_input_error_is_one_line_and_exit_2(exc, capsys, monkeypatch):
    monkeypatch.delenv("FCP_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        run_main(_fails_with(exc), prog="train.py")
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert err.splitlines() == [f"train.py: error: {'; '.join(s.strip() for s in str(exc).splitlines())}"]


def test_fcp_debug_keeps_the_traceback(capsys, monkeypatch):
    monkeypatch.setenv("FCP_DEBUG", "1")
    with pytest.raises(SystemExit):
        run_main(_fails_with(ValueError("bad")), prog="train.py")
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith("train.py: error: bad")


@pytest.mark.parametrize("exc", [KeyError("a bug"), RuntimeError("CUDA error"), IndexError("a bug")])
def test_a_bug_keeps_its_exception(exc):
    with pytest.raises(type(exc)):
        run_main(_fails_with(exc), prog="train.py")


def test_interrupt_is_130_and_success_returns(capsys):
    with pytest.raises(SystemExit) as e:
        run_main(_fails_with(KeyboardInterrupt()), prog="train.py")
    assert e.value.code == 130 and capsys.readouterr().err == "train.py: interrupted\n"
    assert run_main(lambda: None) is None


@pytest.mark.parametrize("env, missing", [({"RANK": "0"}, "WORLD_SIZE, MASTER_ADDR, MASTER_PORT"),
                                          ({"MASTER_ADDR": "h", "MASTER_PORT": "1"}, "RANK, WORLD_SIZE")])
def test_a_partial_torchrun_environment_is_named(env, missing, monkeypatch):
    """Only some of the rendezvous variables (a cluster that exports MASTER_ADDR, a stray RANK): a ValueError
    naming the missing ones, before torch's rendezvous would fail deep inside (nothing is initialised)."""
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=f"set but not {missing}: start the script with torchrun"):
        init_distributed("gloo")
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_output_dir_is_a_folder_that_can_be_made(tmp_path):
    """check_output_dir (the --checkpoint / --save-model / --output-dir check): a new nested folder or an existing
    one is fine; a file, a path under a file, an empty or NUL path is a ValueError naming the path."""
    from fcp_data.commands.argtypes import check_output_dir

    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and not (tmp_path / "a").exists()
    assert check_output_dir(tmp_path) == tmp_path
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match=f"--checkpoint {tmp_path / 'f'} exists and is not a folder"):
        check_output_dir(tmp_path / "f", "--checkpoint")
    with pytest.raises(ValueError, match=f"{tmp_path / 'f' / 'x' / 'y'} cannot be created: {tmp_path / 'f'} is not a"):
        check_output_dir(tmp_path / "f" / "x" / "y")
    for bad in ("", "a\x00b"):
        with pytest.raises(ValueError, match="not a path"):
            check_output_dir(bad)
