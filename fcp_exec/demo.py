"""``python -m fcp_exec.demo`` (what ``make demo`` runs): the whole pipeline on the bundled samples.

1. index the bundled text and video samples with ``fcp index`` (the text one's length chart with ``--plot``);
2. build one heterogeneous global batch (the longest text document and a dozen short text and video
   samples), plan it with ``fcp plan`` and compare FCP with the ILP and the baselines with ``fcp compare``;
   2b. answer "will FCP help on my data?" straight from the video index with ``fcp simulate --index``
   (lengths, visual tokens and η from the index; a bar chart and a Gantt chart with ``--plot``);
3. train tiny-mllm for a few steps on 2 processes with ``fcp train`` (FCPSampler → FCPCollator → ring
   attention), printing losses and the plans of every step;
4. draw a Gantt chart of one planned micro-batch with ``fcp simulate --plot``;
5. plan one real Wikipedia global batch (512 documents of ``../shared/workloads/wikipedia_flexsp.txt``,
   skipped when absent) on 64 Ascend 910C ranks for Qwen3-8B with ``fcp compare``, to show the gains at scale.

Every step runs the ``fcp`` command a user would type (echoed with ``$``), so the output doubles as a
tutorial. Outputs go to ``--out`` (default ``demo_out/``). Under 5 minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _header(title: str) -> None:
    print(f"\n{'=' * 78}\n{title}\n{'=' * 78}", flush=True)


def _fcp(*args: str, pretty: list[str] | None = None) -> None:
    """Echo and run ``fcp ARGS`` (through this interpreter, so the venv's fcp is used)."""
    shown = " ".join(shlex.quote(a) for a in (pretty or args))
    print(f"$ fcp {shown}", flush=True)
    t0 = time.perf_counter()
    rc = subprocess.call([sys.executable, "-m", "fcp_cli", *args])
    if rc:
        raise SystemExit(f"demo: `fcp {shown}` failed with exit code {rc}")
    print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(p)


def _pick_batch(out_dir: Path, num_ranks: int, tokens_per_rank: int, path: Path) -> tuple[list[int], str]:
    """A heterogeneous global batch from the combined text and video indexes: the longest text document and
    a dozen short samples (six video clips and six text documents at evenly spaced lengths among the
    samples of at most ``tokens_per_rank / 3`` tokens), trimmed so that it fits one micro-batch on
    ``num_ranks`` ranks. Writes the lengths to ``path``; returns them and a one-line description."""
    import numpy as np

    from fcp_data.index import LengthIndex

    text = np.asarray(LengthIndex.load(out_dir / "index-text").num_tokens)
    video = np.asarray(LengthIndex.load(out_dir / "index-video").num_tokens)
    longest = int(text.max())
    short_cap = tokens_per_rank // 3

    def spread(x: np.ndarray, k: int) -> list[int]:
        pool = np.sort(x[x <= short_cap])
        picks = np.linspace(0, pool.size - 1, min(k, pool.size)).round().astype(int)
        return [int(pool[i]) for i in picks]

    text_rest = np.delete(text, int(np.argmax(text)))
    shorts = spread(video, 6) + spread(text_rest, 6)
    while shorts and longest + sum(shorts) > num_ranks * tokens_per_rank:
        shorts.remove(max(shorts))
    lengths = [longest] + shorts
    path.write_text("\n".join(map(str, lengths)) + "\n")
    return lengths, (f"the longest text document ({longest} tokens) and {len(shorts)} short samples (video clips and "
                     f"text documents of at most {short_cap} tokens)")


def _wikipedia_batch(batch_size: int, num_ranks: int, cost, path: Path, scan: int = 8) -> Path | None:
    """Of the first ``scan`` global batches FCPSampler (seed 0) draws from the Wikipedia lengths workload, the
    one with the longest document (the long tail is what FCP is for); prints FCP's predicted gain over
    static CP on each of them for context. Writes its lengths to ``path``; None when the workload is absent."""
    here = Path(__file__).resolve()
    candidates = [Path.cwd().parent / "shared" / "workloads" / "wikipedia_flexsp.txt",
                  here.parents[2] / "shared" / "workloads" / "wikipedia_flexsp.txt",
                  here.parents[1] / "workloads" / "wikipedia_flexsp.txt"]
    src = next((c for c in candidates if c.is_file()), None)
    if src is None:
        return None
    import numpy as np

    from fcp_data import FCPSampler
    from fcp_data.plan import plan_batch
    from fcp_data.workloads import load_lengths

    lengths = load_lengths(src)
    sampler = FCPSampler(lengths, num_ranks=num_ranks, rank=0, cost_model=cost, global_batch_size=batch_size, seed=0,
                         on_overlong="truncate")
    batches = [sampler.num_tokens[sampler.global_batch_indices(g)] for g in range(scan)]
    gains = [plan_batch(b, num_ranks=num_ranks, cost_model=cost, solver="static-cp", micro_batches="auto").makespan
             / plan_batch(b, num_ranks=num_ranks, cost_model=cost, solver="fcp", micro_batches="auto").makespan
             for b in batches]
    g = int(np.argmax([b.max() for b in batches]))
    picked = batches[g]
    path.write_text("\n".join(str(int(x)) for x in picked) + "\n")
    print(f"{src.name}: {len(lengths):,} documents (p50 {int(np.median(lengths))}, max {int(lengths.max()):,} tokens)")
    print(f"FCP's predicted speed-up over static CP on the sampler's first {scan} global batches of {batch_size}: "
          + " ".join(f"{x:.2f}x" for x in gains) + f" (mean {np.mean(gains):.2f}x)")
    print(f"compared below: global batch {g}, the one with the longest document: {int(picked.sum()):,} tokens, "
          f"longest {int(picked.max()):,}, median {int(np.median(picked))}")
    return path


def _has_examples() -> bool:
    from fcp_data._resources import data_path

    try:
        return (data_path("examples") / "configs" / "qwen2_5_vl-tiny.json").exists()
    except FileNotFoundError:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fcp_exec.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="demo_out", help="output folder (default demo_out)")
    ap.add_argument("--steps", type=int, default=4, help="tiny-mllm training steps (default 4)")
    ap.add_argument("--nproc", type=int, default=2, help="training processes (default 2)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks of the planning example (default 8)")
    args = ap.parse_args(argv)
    import torch

    t_start = time.perf_counter()
    out = Path(args.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file of that name (FileExistsError), no permission: one line, not a traceback
        why = "is a file, not a folder" if out.exists() and not out.is_dir() else f"cannot be created ({e.strerror})"
        print(f"python -m fcp_exec.demo: error: --out {args.out} {why}", file=sys.stderr)
        return 2
    print("FCP demo — Flexible Context Parallelism on the bundled samples")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPU cores; "
          f"outputs in {_rel(out)}/")
    _step_index(out)
    cost_path, common, pretty, lengths = _step_plan(out, args.ranks)
    _step_simulate_index(out, args.ranks, cost_path)
    _step_train(out, args.nproc, args.steps)
    _step_gantt(out, common, pretty, lengths)
    _step_wikipedia(out)
    _header("Done")
    print(f"total {time.perf_counter() - t_start:.0f} s. Files in {_rel(out)}/:")
    for p in sorted(out.iterdir()):
        print(f"  {p.name}{'/' if p.is_dir() else ''}")
    print("next: `fcp profile --nproc 2 --out cost.json` fits the cost model on this machine; "
          "`fcp train --help`; `make test`.")
    return 0


def _step_index(out: Path) -> None:
    from fcp_data._resources import data_path

    samples = data_path("samples")
    shards = sorted((samples / "wds").glob("shard-*.tar"))
    _header("1. Index the bundled samples (token count of every sample, no tokenisation at train time)")
    chart = out / "index_text_lengths.png"  # the long tail: a histogram and the share of tokens per length
    _fcp("index", str(samples / "text.jsonl"), "--spec", "text", "--out", str(out / "index-text"), "--no-progress",
         "--plot", str(chart), pretty=["index", _rel(samples / "text.jsonl"), "--spec", "text", "--out",
                                       _rel(out / "index-text"), "--plot", _rel(chart)])
    _fcp("index", *map(str, shards), "--spec", "qwen2-vl", "--out", str(out / "index-video"), "--workers", "2",
         "--no-progress",
         pretty=["index", _rel(samples / "wds") + "/shard-*.tar", "--spec", "qwen2-vl", "--out",
                 _rel(out / "index-video"), "--workers", "2"])


def _step_plan(out: Path, ranks: int):
    from fcp_exec.train import builtin_cost_model

    _header(f"2. Plan one heterogeneous global batch on {ranks} ranks; compare with the ILP and baselines")
    cost_path = out / "cost-tiny-mllm.json"
    cost = builtin_cost_model(2304, ranks)
    cost.save(cost_path)
    print(f"cost model: the built-in CPU model of the tiny models (tokens_per_rank {cost.tokens_per_rank}), written "
          f"to {_rel(cost_path)}; `fcp profile` fits one on your machine")
    lengths_path = out / "batch_lengths.txt"
    lengths, what = _pick_batch(out, ranks, cost.tokens_per_rank, lengths_path)
    print(f"global batch: {what}; {len(lengths)} samples, {sum(lengths)} tokens, lengths "
          f"{sorted(lengths, reverse=True)} -> {_rel(lengths_path)}")
    print("what to look for: static CP must give every group the long document's degree, so the short samples pay "
          "ring traffic for nothing; FCP gives the long document just the ranks it needs and packs the short ones "
          "on single ranks (the 'groups' column: ⟨degree⟩×count)")
    common = ["--lengths", str(lengths_path), "--ranks", str(ranks), "--cost", str(cost_path)]
    pretty = ["--lengths", _rel(lengths_path), "--ranks", str(ranks), "--cost", _rel(cost_path)]
    _fcp("plan", *common, pretty=["plan", *pretty])
    _fcp("compare", *common, "--ilp", "--time-limit", "20", pretty=["compare", *pretty, "--ilp", "--time-limit", "20"])
    return cost_path, common, pretty, lengths


def _step_simulate_index(out: Path, ranks: int, cost_path: Path) -> None:
    _header("2b. Will FCP help on my data? Simulate straight from the length index")
    print("`fcp simulate --index` reads the index `fcp index` wrote: lengths (num_tokens), visual tokens "
          "(num_visual_tokens, the vision encoder's work in cost model v2) and η (the spec's attention kind); it "
          "draws global batches, plans each with every solver and prints the mean step times; 'FCP speedup' above "
          "1 is FCP's predicted gain on your data, a tie (1.000x) means one sequence's group sets the step time "
          "whatever the solver")
    sim_index = out / "simulate_index.png"
    _fcp("simulate", "--index", str(out / "index-video"), "--ranks", str(ranks), "--cost", str(cost_path),
         "--global-batch-size", "16", "--steps", "2", "--plot", str(sim_index), "--no-progress",
         pretty=["simulate", "--index", _rel(out / "index-video"), "--ranks", str(ranks), "--cost", _rel(cost_path),
                 "--global-batch-size", "16", "--steps", "2", "--plot", _rel(sim_index)])


def _step_train(out: Path, nproc: int, steps: int) -> None:
    from fcp_data._resources import data_path

    _header(f"3. Train tiny-mllm for {steps} steps on {nproc} processes "
            "(FCPSampler -> FCPCollator -> ring attention -> AdamW)")
    print("each line: global-batch mean loss, label tokens, the plan (⟨degree⟩×groups, '|' between "
          "micro-batches), step time, time spent waiting for the planner")
    _fcp("train", "--model", "tiny-mllm", "--nproc", str(nproc), "--steps", str(steps),
         "--data", str(out / "index-video"), "--global-batch-size", "8",
         pretty=["train", "--model", "tiny-mllm", "--nproc", str(nproc), "--steps", str(steps),
                 "--data", _rel(out / "index-video"), "--global-batch-size", "8"])
    hf_cfg = data_path("examples") / "configs" / "qwen2_5_vl-tiny.json" if _has_examples() else None
    _header("3b. The same pipeline on a stock Hugging Face Qwen2.5-VL (tiny random config) with FSDP2")
    from fcp_exec.compat import hf_models_problem

    problem = hf_models_problem() or (None if hf_cfg else "needs examples/configs from a source checkout")
    if problem is not None:
        print(f"skipped: {problem}")
        return
    print("apply_fcp puts ring attention into the model through transformers' AttentionInterface; the vision tower "
          "encodes each frame once per CP group; positions come from the model's own get_rope_index; ranks the "
          "plan leaves idle run a zero-weighted dummy so FSDP2's collectives stay in step")
    _fcp("train", "--model", f"hf:{hf_cfg}", "--reducer", "fsdp2", "--nproc", str(nproc), "--steps", "2",
         "--global-batch-size", "8",
         pretty=["train", "--model", "hf:examples/configs/qwen2_5_vl-tiny.json", "--reducer", "fsdp2", "--nproc",
                 str(nproc), "--steps", "2", "--global-batch-size", "8"])


def _step_gantt(out: Path, common: list[str], pretty: list[str], lengths) -> None:
    _header("4. Gantt chart of one planned micro-batch")
    gantt = out / "gantt.png"
    _fcp("simulate", *common, "--global-batch-size", str(len(lengths)), "--steps", "1", "--plot", str(gantt),
         "--no-progress", pretty=["simulate", *pretty, "--global-batch-size", str(len(lengths)), "--steps", "1",
                                  "--plot", _rel(gantt)])


def _step_wikipedia(out: Path) -> None:
    from fcp_data import CostModel

    _header("5. At scale: one real Wikipedia global batch (512 documents) on 64 Ascend 910C ranks, Qwen3-8B")
    wiki = _wikipedia_batch(512, 64, CostModel.preset("qwen3-8b", "ascend-910c"), out / "wikipedia_batch.txt")
    if wiki is None:
        print("skipped: ../shared/workloads/wikipedia_flexsp.txt (the Wikipedia length workload) is not in this "
              "checkout")
        return
    _fcp("compare", "--lengths", str(wiki), "--ranks", "64", "--preset", "qwen3-8b", "--hardware", "ascend-910c",
         "--micro-batches", "auto",
         pretty=["compare", "--lengths", _rel(wiki), "--ranks", "64", "--preset", "qwen3-8b", "--hardware",
                 "ascend-910c", "--micro-batches", "auto"])
    print("(times are the cost model's predictions for that hardware; `fcp simulate` runs many batches)")


if __name__ == "__main__":
    sys.exit(main())
