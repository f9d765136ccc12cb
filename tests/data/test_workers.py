"""fcp_data.workers: the DataLoader's start method in a multi-threaded rank (CPython's fork deadlock gh-112275).

The deadlock itself is a race (a few forks in a thousand, ``benchmarks/fork_deadlock.py``), so the test checks the
mechanism that removes it: on an affected interpreter the workers are not forked from the threaded process (their
parent is the forkserver) while C threads enter Python throughout, and they deliver exactly the batches that the
loader without workers does."""

from __future__ import annotations

import importlib
import json
import os
import sys
import textwrap

import pytest
from _procs import run as run_process

from fcp_data.workers import _imported_under, _modules, fork_may_deadlock, worker_context


@pytest.mark.parametrize("version, implementation, affected", [
    ((3, 11, 7), "cpython", True), ((3, 11, 9), "cpython", True), ((3, 11, 10), "cpython", False),
    ((3, 10, 14), "cpython", True), ((3, 10, 15), "cpython", False), ((3, 9, 19), "cpython", True),
    ((3, 8, 20), "cpython", False), ((3, 7, 17), "cpython", True), ((3, 12, 0), "cpython", False),
    ((3, 13, 1), "cpython", False), ((3, 10, 13), "pypy", False)])
def test_fork_may_deadlock_names_the_interpreters_without_the_fix(version, implementation, affected):
    assert fork_may_deadlock(version, implementation) is affected


def test_worker_context_without_workers_or_with_a_named_method():
    assert worker_context(0) is None
    assert worker_context(2, start_method="spawn").get_start_method() == "spawn"
    with pytest.raises(ValueError, match="start method 'threads' is not available here"):
        worker_context(2, start_method="threads")


def test_the_modules_a_worker_imports_are_found_inside_the_objects():
    """What a worker imports to unpickle the dataset and collate function: the module of every class, function and
    instance inside them (not only their own types'), up to the size limit; never ``__main__``; an object that does
    not pickle names its own type's module and raises nothing (the DataLoader reports it)."""
    import decimal
    import fractions
    import functools
    import json

    collate = functools.partial(json.dumps, cls=json.JSONEncoder)
    dataset = [{"price": decimal.Decimal("1.5")}, fractions.Fraction(1, 3)]
    found = _modules([collate, dataset])
    assert {"functools", "json", "json.encoder", "decimal", "fractions"} <= set(found), found
    assert "__main__" not in found and "builtins" not in found
    early, late = decimal.Decimal("2"), fractions.Fraction(2, 3)
    capped = _modules([[early, bytes(1 << 18), late]], limit=1 << 16)  # stops 64 KiB in, keeps what it met
    assert "decimal" in capped and "fractions" not in capped, capped
    assert _modules([lambda x: x]) == [__name__]  # a lambda does not pickle: its module only


def test_the_imported_modules_of_a_package_are_listed_without_aliases():
    importlib.import_module("json.decoder")  # imported, so listed

    listed = _imported_under(["json.decoder", "os"])
    assert {"json", "json.decoder", "json.scanner", "os"} <= set(listed)
    assert "os.path" not in listed  # an alias of posixpath (its spec names posixpath)
    assert not any(m.partition(".")[0] not in ("json", "os") for m in listed)


_SCRIPT = textwrap.dedent("""
    import ctypes, os, threading
    import torch
    from torch.utils.data import DataLoader
    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset, bundled_index
    from fcp_data.presets import ModelConfig
    from fcp_data.workers import fork_may_deadlock, started_forkserver, worker_context
    from fcp_exec import forkserver as fcp_forkserver

    libc = ctypes.CDLL(None)
    entry = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(lambda arg: None)
    entered, stop = [0], False

    def churn():  # C threads entering Python: what makes a fork unsafe on an affected interpreter
        tid = ctypes.c_ulong()
        while not stop:
            libc.pthread_create(ctypes.byref(tid), None, entry, None)
            libc.pthread_join(tid, None)
            entered[0] += 1

    def ppid(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])

    if __name__ == "__main__":
        for _ in range(2):
            threading.Thread(target=churn, daemon=True).start()
        data = IndexedDataset(bundled_index("text"))
        shape = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=32000)
        cost = CostModel.preset(shape, "a100").replace(tokens_per_rank=1024)
        dataset, collate = FCPDataset(data), FCPCollator(pad_token_id=data.pad_token_id)
        ctx = worker_context(2, dataset, collate)
        assert ctx.get_start_method() == ("forkserver" if fork_may_deadlock() else "fork"), ctx
        if fork_may_deadlock():
            assert ctx.get_start_method() == "forkserver"
            preload = started_forkserver()[1]
            # FCPDataset's own type is fcp_data.slots; the index reader inside it and torch's modules the rank has
            # imported are preloaded too (a worker would import them when it unpickles and runs the dataset)
            assert {"fcp_data.slots", "fcp_data.readers", "torch.utils.data"} <= set(preload), preload
            fcp_forkserver._adopt()
            assert fcp_forkserver._pid == started_forkserver()[0] is not None, "fcp_exec.forkserver adopts it"
        epochs = []
        for workers, context in ((0, None), (2, ctx)):
            sampler = FCPSampler(data.index, 2, 0, cost_model=cost, global_batch_size=4096, seed=0,
                                 on_overlong="truncate")
            loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate,
                                multiprocessing_context=context, timeout=60 if workers else 0)
            for epoch in range(3):  # new workers every epoch
                it = iter(loader)
                batches = list(it) if not workers else [next(it)]
                if workers:
                    parents = {ppid(w.pid) for w in it._workers}
                    assert (os.getpid() not in parents) is fork_may_deadlock(), (os.getpid(), parents)
                    batches += list(it)
                epochs.append(batches)
        stop = True
        for plain, loaded in zip(epochs[:3], epochs[3:]):
            assert len(plain) == len(loaded) > 0
            for a, b in zip(plain, loaded):
                assert a.keys() == b.keys()
                for k in a:
                    assert (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]), k
        assert entered[0] > 100, entered
        print("ok", len(epochs[0]), "batches per epoch;", entered[0], "C-thread entries;", ctx)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and calls pthread_create")
def test_loader_workers_of_a_threaded_process_deliver_the_same_batches_and_are_not_forked_from_it(tmp_path):
    """In a fresh process (a forkserver started here would stay for the rest of the suite) with two C threads
    entering Python throughout: ``worker_context``'s loader yields exactly the batches of the loader without workers
    over three epochs (new workers each), and on an affected interpreter none of its workers is a child of the
    threaded process."""
    script = tmp_path / "threaded_rank.py"
    script.write_text(_SCRIPT)
    r = run_process([sys.executable, str(script)], timeout=240, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


@pytest.mark.parametrize("num_workers", ["2", None, 2.0, True])
def test_worker_context_refuses_a_worker_count_that_is_no_int(num_workers):
    """Found in review: a bare "'<=' not supported" TypeError; now one naming the argument."""
    with pytest.raises(TypeError, match="num_workers must be an int"):
        worker_context(num_workers)


_PACKAGE = {
    "__init__.py": "",
    # parses the program's command line at import: in the forkserver (argv ['-c']) argparse raises SystemExit
    "cli.py": "import argparse\np = argparse.ArgumentParser()\np.add_argument('--run-dir', required=True)\n"
              "ARGS = p.parse_args()\n",
    "needs_setup.py": "import os\nif 'FCP_PROBE_SET_UP' not in os.environ:\n    raise RuntimeError('not set up')\n",
    "data.py": textwrap.dedent("""
        import sys

        class Probe:
            def __len__(self):
                return 4

            def __getitem__(self, i):
                return i, "tabnanny" in sys.modules
    """),
}

_LOADER = textwrap.dedent("""
    import json, os
    from torch.utils.data import DataLoader
    import fcp_probe_pkg.cli, fcp_probe_pkg.data
    os.environ["FCP_PROBE_SET_UP"] = "1"
    import fcp_probe_pkg.needs_setup
    from fcp_data.workers import started_forkserver, worker_context

    if __name__ == "__main__":
        ctx = worker_context(2, fcp_probe_pkg.data.Probe())
        items = list(DataLoader(fcp_probe_pkg.data.Probe(), batch_size=None, num_workers=2, multiprocessing_context=ctx,
                                timeout=60))
        print(json.dumps({"items": items, "preload": started_forkserver()[1]}))
""")


@pytest.fixture(scope="module")
def preloaded_loader(tmp_path_factory):
    """One loader run in a fresh process whose dataset's package has two modules that import only in this process
    (one parses the command line, one needs state the program set up), with ``FCP_FORKSERVER_PRELOAD=tabnanny``."""
    if not fork_may_deadlock():
        pytest.skip("worker_context starts no forkserver on this interpreter")
    root = tmp_path_factory.mktemp("loader")
    (root / "fcp_probe_pkg").mkdir()
    for name, text in _PACKAGE.items():
        (root / "fcp_probe_pkg" / name).write_text(text)
    (root / "loader.py").write_text(_LOADER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               FCP_FORKSERVER_PRELOAD="tabnanny")
    env.pop("FCP_PROBE_SET_UP", None)
    return run_process([sys.executable, str(root / "loader.py"), "--run-dir", str(root)], timeout=120, cwd=root, env=env)


def test_a_module_of_the_dataset_package_that_fails_in_the_server_is_skipped(preloaded_loader):
    """Found in review: worker_context preloads every module of the dataset's package the rank imported; one whose
    import raises in the server other than ImportError (SystemExit from argparse, RuntimeError) ended the server,
    and the loader failed with "EOFError: unexpected EOF". Now the server skips it and the loader yields every item."""
    r = preloaded_loader
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert [i for i, _ in out["items"]] == [0, 1, 2, 3]
    assert {"fcp_probe_pkg.cli", "fcp_probe_pkg.needs_setup"} <= set(out["preload"]), out["preload"]


def test_the_environment_adds_modules_to_worker_contexts_forkserver(preloaded_loader):
    """Found in review: ``FCP_FORKSERVER_PRELOAD`` ("for every forkserver fcp starts") reached the launcher's
    forkserver only; the workers of worker_context's imported the module themselves."""
    r = preloaded_loader
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "tabnanny" in out["preload"] and all(seen for _, seen in out["items"]), out


_UNGUARDED = textwrap.dedent("""
    import torch
    from torch.utils.data import DataLoader
    from fcp_data import CostModel, FCPCollator, FCPDataset, FCPSampler, IndexedDataset, bundled_index
    from fcp_data.presets import ModelConfig
    from fcp_data.workers import worker_context

    data = IndexedDataset(bundled_index("text"))
    shape = ModelConfig(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=32000)
    cost = CostModel.preset(shape, "a100").replace(tokens_per_rank=1024)
    dataset, collate = FCPDataset(data), FCPCollator(pad_token_id=data.pad_token_id)
    runs = []
    for workers in (0, 2):
        sampler = FCPSampler(data.index, 2, 0, cost_model=cost, global_batch_size=4096, seed=0, on_overlong="truncate")
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=workers, collate_fn=collate, timeout=60 if
                            workers else 0, multiprocessing_context=worker_context(workers, dataset, collate))
        runs.append([b["input_ids"] for b in loader])
    assert len(runs[0]) == len(runs[1]) > 0 and all(torch.equal(a, b) for a, b in zip(*runs))
    print("ok", len(runs[0]))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and forkserver: Linux")
def test_a_main_script_without_a_main_guard_gets_workers_and_a_warning_not_a_crash(tmp_path):
    """Found by a review of FCPTrainer: a training script without ``if __name__ == "__main__":`` and
    ``dataloader_num_workers=2`` crashed ("DataLoader worker exited unexpectedly", the script's training run again
    inside the forkserver that imports the main script) where the stock Trainer (plain fork) trains. Now
    ``worker_context`` sees the unguarded script (its AST: a top-level call, no guard) and forks the workers as torch
    does, with one warning naming the script and the deadlock that fork risks on this Python; the batches equal those
    of the loader without workers. A guarded script is not named (the AST check, below)."""
    from fcp_data.workers import main_script_unguarded

    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED)
    r = run_process([sys.executable, str(script)], timeout=240, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
    assert ("runs its work at import (no `if __name__" in r.stderr) is fork_may_deadlock(), r.stderr[-2000:]
    main = sys.modules["__main__"]
    for text, unguarded in (("import os\nx = 1\ndef f():\n    f()\n", False), ("print(1)\n", True),
                            ("import os\nif __name__ == '__main__':\n    print(1)\n", False),
                            ("t = Trainer()\nif __name__ == '__main__':\n    t.train()\n", False),
                            ("class A:\n    pass\nA().run()\n", True)):
        (tmp_path / "m.py").write_text(text)
        old = getattr(main, "__file__", None)
        main.__file__ = str(tmp_path / "m.py")
        try:
            assert (main_script_unguarded() is not None) is unguarded, text
        finally:
            main.__file__ = old
