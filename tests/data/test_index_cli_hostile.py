"""Hostile command lines for `fcp index`, run as the user runs them (a subprocess): a symlink loop as an input,
a spec file with wrong values, --out over an input folder, under a file or a link that leads nowhere, options given
alone that would do nothing, --plot of an index with no samples.

The promise: a bad argument or spec file is exactly one line on stderr that names it and says what is wrong, exit
2, no traceback; a bad input among good ones is an error record with its reason; nothing is silently ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fcp_data.index import LengthIndex
from fcp_data.specs import load_spec
from test_index_hostile import real_png, run_cli


def one_line_error(r, *needles: str) -> str:
    """The stderr of a run that must have failed as a usage error: one line, exit 2, every needle in it."""
    err = r.stderr
    assert r.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, (r.returncode, err)
    assert all(n in err for n in needles), err
    return err


def text_jsonl(path: Path, n: int = 3) -> str:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": f"doc {i}"}) + "\n" for i in range(n)))
    return str(path)


def test_a_symlink_loop_as_input_is_a_clear_error_alone_and_an_error_record_among_good(tmp_path):
    """Before, ``pp.resolve()`` raised ``RuntimeError: Symlink loop`` (a traceback, exit 1). A loop is now treated
    like a missing input: alone (or all a glob finds) one line that says it is a loop; among good inputs an
    ``unreadable_shard`` record with the reason, the run goes on."""
    os.symlink("loop2.jsonl", tmp_path / "loop.jsonl")
    os.symlink("loop.jsonl", tmp_path / "loop2.jsonl")
    out = str(tmp_path / "ix")
    one_line_error(run_cli([str(tmp_path / "loop.jsonl"), "--spec", "text", "--out", out]),
                   "none of the inputs exist", "loop.jsonl (a symlink loop)")
    one_line_error(run_cli([str(tmp_path / "loop*"), "--spec", "text", "--out", out]), "loop2.jsonl (a symlink loop)")
    good = text_jsonl(tmp_path / "good.jsonl")
    r = run_cli([str(tmp_path / "loop.jsonl"), good, "--spec", "text", "--out", out, "--max-error-rate", "1"])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    ix = LengthIndex.load(out)
    assert len(ix) == 3 and [e["reason"] for e in ix.errors] == ["unreadable_shard"]
    assert ix.errors[0]["key"].endswith("loop.jsonl") and "symbolic links" in ix.errors[0]["detail"]


def _spec(tmp_path: Path, name: str, edit) -> str:
    raw = load_spec(name).raw
    raw = json.loads(json.dumps(raw))
    edit(raw)
    path = tmp_path / f"{name}-bad.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize("name,edit,key", [
    ("text", lambda r: r.update(text=[1]), "text must be a JSON object"),  # was a TypeError traceback
    ("text", lambda r: r["text"].update(tokenizer=5), "text.tokenizer"),  # was a TypeError traceback
    ("text", lambda r: r.update(eta="abc"), "eta must be 0 (causal) or 1"),  # was "could not convert string to float"
    ("qwen2-vl", lambda r: r["vision"].update(patch_size=0), "vision.patch_size"),  # was every sample unexpected_error
    ("qwen2-vl", lambda r: r["vision"]["image"].update(max_pixels="big"), "vision.image.max_pixels"),
])
def test_a_spec_with_wrong_values_is_one_line_naming_the_file_and_key(tmp_path, name, edit, key):
    spec = _spec(tmp_path, name, edit)
    folder = tmp_path / "img"
    folder.mkdir()
    (folder / "a.png").write_bytes(real_png(64, 48))
    inputs = [text_jsonl(tmp_path / "t.jsonl")] if name == "text" else [str(folder)]
    one_line_error(run_cli([*inputs, "--spec", spec, "--out", str(tmp_path / "ix")]), f"spec {spec}: ", key)
    assert not (tmp_path / "ix").exists()  # refused before anything is written


def test_plot_of_an_index_without_samples_says_why_no_plot_was_written(tmp_path):
    """Before, --plot wrote nothing for an index of 0 samples and said nothing. The run's exit status is unchanged:
    1 for all-bad input above --max-error-rate, 0 with --max-error-rate 1. An empty file is refused (exit 2, one
    line): there is nothing to index."""
    pytest.importorskip("matplotlib")
    plot = tmp_path / "p.png"
    (tmp_path / "empty.jsonl").write_text("")
    r = run_cli([str(tmp_path / "empty.jsonl"), "--spec", "text", "--out", str(tmp_path / "a"), "--plot", str(plot)])
    assert r.returncode == 2 and "no samples found" in r.stderr and not plot.exists(), r.stderr
    assert not (tmp_path / "a").exists()
    (tmp_path / "bad.jsonl").write_text("{nope\n[1]\n")
    for rate, rc in (("1", 0), ("0.5", 1)):
        r = run_cli([str(tmp_path / "bad.jsonl"), "--spec", "text", "--out", str(tmp_path / f"b{rate}"), "--plot",
                     str(plot), "--max-error-rate", rate])
        assert r.returncode == rc and "no plot written" in r.stderr and "2 errors of 2 seen" in r.stderr, r.stderr
    assert not plot.exists()


def test_out_over_an_input_folder_is_refused(tmp_path):
    """Before, ``--out`` equal to the input folder was accepted and the second run indexed the first run's own
    files (manifest.json, errors.jsonl, the columns) as samples."""
    folder = tmp_path / "IMG"
    folder.mkdir()
    (folder / "a.png").write_bytes(real_png(64, 48))
    base = [str(folder), "--spec", "qwen2-vl"]
    one_line_error(run_cli([*base, "--out", str(folder)]), "is the input folder")
    one_line_error(run_cli([*base, "--out", str(folder / "idx")]), "is inside the input folder")
    one_line_error(run_cli([*base, "--out", str(tmp_path)]), "contains the input folder")
    os.symlink(folder, tmp_path / "link")  # the same folder through a link
    one_line_error(run_cli([*base, "--out", str(tmp_path / "link" / "idx")]), "is inside the input folder")
    assert sorted(p.name for p in folder.iterdir()) == ["a.png"]
    r = run_cli([*base, "--out", str(tmp_path / "idx")])  # beside it is fine
    assert r.returncode == 0 and len(LengthIndex.load(tmp_path / "idx")) == 1, r.stderr


def test_chat_template_without_chat_field_is_refused(tmp_path):
    """Before, ``--chat-template chatml`` (the default's name) alone was ignored without a word, while
    ``--media-root`` alone was refused."""
    t = text_jsonl(tmp_path / "t.jsonl")
    for template in ("chatml", "llama3"):
        one_line_error(run_cli([t, "--spec", "text", "--out", str(tmp_path / "ix"), "--chat-template", template]),
                       "--chat-template", "give both")


def test_bad_out_paths_are_one_line_in_words(tmp_path):
    """Before: ``[Errno 20] Not a directory`` for a path under a file, ``[Errno 17] File exists`` for a link loop."""
    t = text_jsonl(tmp_path / "t.jsonl")
    (tmp_path / "afile").write_text("x")
    os.symlink("oloop2", tmp_path / "oloop")
    os.symlink("oloop", tmp_path / "oloop2")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for out, needle in ((tmp_path / "afile" / "sub", f"{tmp_path / 'afile'} is a file, not a folder"),
                        (tmp_path / "oloop", "is a symlink loop"),
                        (tmp_path / "dangling", "which does not exist")):
        err = one_line_error(run_cli([t, "--spec", "text", "--out", str(out)]), f"--out {out}", needle)
        assert "Errno" not in err, err


def test_a_failed_run_keeps_the_index_it_would_replace(tmp_path):
    """A rerun over a good index whose every sample fails (here a wrong --text-field; a missing mount alike) wrote its
    empty index over the good one (a review of the CLI). Over --max-error-rate with an index there, that index is
    kept and the run's errors go beside it; within the rate, or into a new folder, the index is written as before."""
    from fcp_data.index import LengthIndex

    data, out = tmp_path / "d.jsonl", tmp_path / "ix"
    data.write_text("".join(f'{{"id": "s{i}", "text": "hello world {i}"}}\n' for i in range(5)))
    assert run_cli([str(data), "--spec", "text", "--out", str(out)]).returncode == 0
    good = LengthIndex.load(out).num_tokens.tolist()
    r = run_cli([str(data), "--spec", "text", "--out", str(out), "--text-field", "body"])
    assert r.returncode == 1 and "is kept, not replaced" in r.stderr and "index written" not in r.stdout, r.stderr
    assert LengthIndex.load(out).num_tokens.tolist() == good
    assert len((out / "errors-rejected.jsonl").read_text().splitlines()) == 5
    r = run_cli([str(data), "--spec", "text", "--out", str(out), "--text-field", "body", "--max-error-rate", "1"])
    assert r.returncode == 0 and len(LengthIndex.load(out)) == 0 and not (out / "errors-rejected.jsonl").exists()
    r = run_cli([str(data), "--spec", "text", "--out", str(tmp_path / "new"), "--text-field", "body"])
    assert r.returncode == 1 and "index written" in r.stdout and len(LengthIndex.load(tmp_path / "new")) == 0
