"""Engines and resume: a killed job restarted with --resume, the local pool and Ray all give the same index
as an uninterrupted single-process run (the reference). A failure means the index depends on how it was
computed (engine, worker count, completion order, crashes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fcp_data._resources import data_path
from fcp_data.index import build_index
from fcp_data.index.build import EXIT_AFTER_ENV

SAMPLES = data_path("samples")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """8 shard tasks: the 4 bundled tar shards and text.jsonl split into 4 files."""
    d = tmp_path_factory.mktemp("in")
    lines = (SAMPLES / "text.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    for k in range(4):
        (d / f"text-{k}.jsonl").write_text("".join(lines[k::4]), encoding="utf-8")
    return [str(SAMPLES / "wds" / "shard-{000000..000003}.tar"), str(d / "text-*.jsonl")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, inputs) -> Path:
    out = tmp_path_factory.mktemp("ref") / "ix"
    build_index(inputs, "qwen3-vl", out, workers=1, progress=False)
    return out


def assert_same_index(a: Path, b: Path) -> None:
    """Every column byte-identical, same errors, same manifest."""
    da, db = (p / json.loads((p / "manifest.json").read_text())["data"] for p in (a, b))
    names = sorted(p.name for p in da.glob("*.npy"))
    assert names == sorted(p.name for p in db.glob("*.npy")) and len(names) == 17
    for n in names:
        x, y = np.load(da / n), np.load(db / n)
        assert x.dtype == y.dtype and np.array_equal(x, y), n
    assert (a / "errors.jsonl").read_text() == (b / "errors.jsonl").read_text()
    assert json.loads((a / "manifest.json").read_text()) == json.loads((b / "manifest.json").read_text())


def _cli(inputs, out, *extra, env=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "fcp_cli", "index", *inputs, "--spec", "qwen3-vl", "--out", str(out),
           "--workers", "2", "--no-progress", *extra]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


def test_pool_equals_single_process(tmp_path, inputs, reference):
    build_index(inputs, "qwen3-vl", tmp_path / "pool", workers=2, progress=False)
    assert_same_index(reference, tmp_path / "pool")


def test_killed_job_resumes_to_the_same_index(tmp_path, inputs, reference):
    """A worker that dies after 2 shards breaks the job; --resume reuses the finished parts and completes it."""
    out = tmp_path / "ix"
    r = _cli(inputs, out, env={EXIT_AFTER_ENV: "2"})
    assert r.returncode != 0, r.stdout + r.stderr
    assert not (out / "manifest.json").exists()
    parts = sorted((out / "parts").glob("*.npz"))
    assert 2 <= len(parts) < 8, [p.name for p in parts]
    for p in parts:  # atomic writes: no half-written part under its final name (a killed writer may leave a temp)
        with np.load(p) as z:
            assert len(z.files) > 0, p.name
    before = {p.name: p.stat().st_mtime_ns for p in parts}
    r = _cli(inputs, out, "--resume")
    assert r.returncode == 0, r.stderr
    after = {p.name: p.stat().st_mtime_ns for p in (out / "parts").glob("*.npz")}
    assert len(after) == 8 and all(after[n] == t for n, t in before.items())  # finished shards were skipped
    assert not list((out / "parts").glob(".*tmp*"))  # the killed run's temp files are gone after the resume
    assert_same_index(reference, out)


def test_resume_redoes_parts_of_another_spec(tmp_path, inputs, reference):
    """Parts written with a different spec are not reused by --resume (fingerprint check)."""
    out = tmp_path / "ix"
    build_index(inputs, "qwen2-vl", out, workers=1, progress=False)
    build_index(inputs, "qwen3-vl", out, workers=1, progress=False, resume=True)
    assert_same_index(reference, out)


def test_ray_engine_equals_local(tmp_path, inputs, reference):
    """The same per-shard function as Ray tasks on a local 2-CPU Ray gives the identical index."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        build_index(inputs, "qwen3-vl", tmp_path / "ray", engine="ray", progress=False)
    finally:
        ray.shutdown()
    assert_same_index(reference, tmp_path / "ray")
    shutil.rmtree(tmp_path / "ray")


def test_a_broken_pool_is_cleaned_up_before_the_error_reaches_the_caller(tmp_path, inputs, monkeypatch):
    """After a worker dies, the pool's manager thread has finished before BrokenProcessPool reaches the caller:
    `fcp index` prints its one-line error and exits at once, and a manager thread still closing its wake-up pipe
    then races CPython's exit hook, which prints an 'Exception ignored ... Bad file descriptor' traceback (seen in
    CI once under load). Reference: no live concurrent.futures manager thread once the error is raised."""
    import threading
    from concurrent.futures.process import BrokenProcessPool

    monkeypatch.setenv(EXIT_AFTER_ENV, "1")
    with pytest.raises(BrokenProcessPool):
        build_index(inputs, "qwen3-vl", tmp_path / "ix", workers=2, progress=False)
    alive = [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread" and t.is_alive()]
    assert not alive, f"the pool's manager thread still runs after the error was raised: {alive}"


def _interrupt_ray_index(big: Path, out: Path, delay: float) -> tuple[int, str]:
    """``fcp index --engine ray`` in a session of its own, SIGINT to the whole group (a terminal's Ctrl-C) ``delay`` s
    after Ray says it started; ``(exit code, stderr)``."""
    import signal
    import threading
    import time

    proc = subprocess.Popen([sys.executable, "-m", "fcp_cli", "index", str(big), "--spec", "qwen2.5-vl", "--out",
                             str(out), "--engine", "ray", "--no-progress"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # CI shells ignore it
    started, lines = threading.Event(), []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if "Started a local Ray instance" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    started.wait(60)  # Ray 2.60's log line; without it, interrupted after 60 s all the same
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    return rc, "".join(lines)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and Ray's local start: Linux")
def test_ctrl_c_of_a_ray_index_exits_130_not_with_a_crash(tmp_path):
    """Found by a review: Ctrl-C in a terminal (SIGINT to the whole process group: driver, GCS and raylet) during
    `fcp index --engine ray` printed "interrupted" and then died of SIGSEGV (exit -11/139) in Ray's exit handler after
    `main` had returned 130 — timing-dependent: 4 of 5 interrupts in one series here, 1 of 6 and 0 of 6 in others, so
    the old code fails this test only sometimes. Now exit 130 (fcp_cli.main.console leaves by os._exit once Ray was
    imported; 8 of 8 in the series that crashed 4 of 5), at two points of the run, and no index is written."""
    pytest.importorskip("ray")
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": "word " * (50 + i % 300)}) + "\n" for i in range(100_000)))
    for attempt, delay in enumerate((0.5, 1.5)):
        rc, err = _interrupt_ray_index(big, tmp_path / f"out{attempt}", delay)
        assert rc == 130 and "fcp index: interrupted" in err, (attempt, rc, err[-2000:])
        assert not (tmp_path / f"out{attempt}" / "manifest.json").exists()
