"""``fcp profile``: time the real executor and fit the §4 cost-model coefficients."""

from __future__ import annotations

from pathlib import Path

from fcp_data.commands.argtypes import positive_float
from fcp_data.cost import MAX_RANKS  # a limit of --degrees and --packed-docs (fcp_data.cost imports no torch)

__all__ = ["register"]

EPILOG = """Runs forward + backward of the model with ring attention on --nproc real processes over a grid
of (sequence length, CP degree), measures the point-to-point bandwidth, fits alpha1, alpha2, beta1,
alpha3, beta2 and the cost model v2 terms gamma (s per ring step) and alpha_blk (s/token) (non-negative
least squares on relative errors) and writes a cost JSON with the DESIGN §4 keys plus gamma, alpha_blk and
alpha_vis (0 where not fitted) that `fcp plan --cost`, `fcp train --cost` and FCPSampler accept. Prints
measured vs predicted per point and the v1 (§4) vs v2 (§4.1) errors on the same points (mean, max, and
the high-degree short-document points). With --model tiny-mllm or a Hugging Face Qwen-VL model the vision
tower is timed apart (forward + backward per visual token) and gives alpha_vis; other models get alpha_vis = 0.
--fit v1 writes the §4 fit.

--model hf:CONFIG.json times a Hugging Face model (a model type `fcp train --help` lists; random weights
from a local config.json) the way `fcp train --model hf:...` runs it: apply_fcp + fcp_loss, whole model, on
packed text documents; the written model then plans for that architecture on this machine.

examples:
  fcp profile --nproc 2 --out cost.json --plot fit.png
  fcp profile --model hf:examples/configs/qwen3-tiny.json --nproc 2 --seq-lens 256,512,1024 --out qwen3.json
  fcp profile --nproc 2 --seq-lens 512,1024,2048,4096 --reps 5 --out cost.json   (fewer sweeps: faster, noisier)
  fcp profile --nproc 8 --layer-like qwen3-8b --dtype bfloat16 --out qwen3-8b-h200.json   (on GPUs)"""


_MAX_PROFILE_TOKENS = 1 << 24  # one profiled document (16.7M tokens: 2M per rank on 8 ranks); more fails to allocate
_MAX_SWEEPS = 1000  # --reps, --warmup: each sweep times the whole grid


def _ints(text: str, limit: int = _MAX_PROFILE_TOKENS) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1 or max(vals) > limit:
        raise ValueError(f"expected integers in [1, {limit}], got {text!r}")
    return vals


def register(subparsers, summary: str) -> None:
    import argparse

    p = subparsers.add_parser("profile", help=summary, description=summary, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=None,
                   help="processes (default 2, under torchrun its WORLD_SIZE); degrees 1..nproc are measured")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--model", default="tiny-llm", metavar="tiny-llm|tiny-mllm|hf:CONFIG.json",
                   help="time this model's language backbone (default tiny-llm), or a Hugging Face model from a local "
                        "config.json (hf:PATH; a model type `fcp train --help` lists)")
    g.add_argument("--layer-like", metavar="PRESET", default=None,
                   help="time one transformer layer shaped like a preset model (see `fcp presets`); the fit is "
                        "scaled to the preset's layer count")
    p.add_argument("--seq-lens", default="256,512,1024,2048", help="comma-separated lengths (default 256,512,1024,2048)")
    p.add_argument("--packed-docs", default="1,4,16",
                   help="documents per packed group (default 1,4,16; 'none' for single documents only)")
    p.add_argument("--packed-lens", default="64,128,256",
                   help="length of each packed document (default 64,128,256): packed points put k documents "
                        "of each length in one group, as training does, so the fit sees per-document costs")
    p.add_argument("--degrees", default=None, help="comma-separated degrees (default 1..nproc)")
    p.add_argument("--reps", type=int, default=9,
                   help="timed sweeps over the whole grid (default 9): each sweep times every point once, in a "
                        "shuffled order; a point's time is the minimum over the sweeps (its median/min spread is "
                        "printed). On a shared 2-core machine 9 sweeps kept the fit's mean error <= 10 %% in every "
                        "run measured, 5 in 3 of 5 (BENCHMARKS.md)")
    p.add_argument("--warmup", type=int, default=2, help="untimed sweeps over the whole grid first (default 2)")
    p.add_argument("--dtype", choices=("float32", "float64", "bfloat16"), default="float32",
                   help="parameter and activation dtype of the timed model (default float32 on every device; pass "
                        "bfloat16 on GPUs/NPUs)")
    p.add_argument("--tokens-per-rank", type=int, default=None,
                   help="memory budget to write (default: half the memory per process / activation bytes per token)")
    p.add_argument("--fit", choices=("v1", "v2"), default="v2",
                   help="cost model to write: v2 (default, DESIGN §4.1: adds gamma, alpha_blk, alpha_vis) or v1 (§4); "
                        "both are fitted and their errors compared either way")
    p.add_argument("--out", required=True, help="cost-model JSON to write")
    p.add_argument("--report", default=None,
                   help="also write a JSON report: measured points, both fits' coefficients, predictions and errors")
    p.add_argument("--plot", default=None, help="PNG of measured vs fitted times")
    p.add_argument("--bandwidth", type=positive_float, default=None, metavar="B/s",
                   help="P2P bandwidth inside a node to write (bytes/s), instead of the one measured between ranks 0 "
                        "and 1. With --nproc 1 nothing is measured: pass your interconnect's (`fcp presets` lists the "
                        "hardware presets'), else a placeholder of 1e10 is written and a warning says so")
    p.add_argument("--bandwidth-inter", type=positive_float, default=None, metavar="B/s",
                   help="bandwidth between nodes to write (bytes/s; default: the intra-node one — one profile runs "
                        "inside one node and cannot measure it)")
    p.add_argument("--backend", default=None, help="torch.distributed backend (default nccl/hccl/gloo by device)")
    p.set_defaults(func=run)


def _full_dict(cm) -> dict:
    """The cost JSON with every §4 and §4.1 key (a v2 key that is 0 is written as 0, not left out)."""
    from fcp_data.cost import COST_KEYS, COST_KEYS_V2

    return {k: getattr(cm, k) for k in COST_KEYS + COST_KEYS_V2}


def _fit_dict(fit) -> dict:
    from fcp_exec.profile_fit import fit_errors

    return {"cost_model": _full_dict(fit.cost_model), "errors": fit_errors(fit), "predicted_s": list(fit.predicted),
            "rel_errors": list(fit.rel_errors), "unidentified": list(fit.unidentified)}


def _report(fit, raw, written: str) -> dict:
    """JSON report of a profile run: points, the v1 and v2 fits (coefficients, predictions, errors)."""
    from fcp_exec.profile_fit import alpha_blk_evidence, degree_slopes

    ev, cpu_pts = alpha_blk_evidence(fit.points), _cpu_points(fit, raw)
    ev_cpu = alpha_blk_evidence(cpu_pts) if cpu_pts else None
    return {"written": written, "points": [p.to_dict() for p in fit.points], "bandwidth": raw["bandwidth"],
            "bandwidth_source": raw.get("bandwidth_source"),
            "rep_times_s": raw.get("rep_times"), "rep_cpu_times_s": raw.get("rep_cpu_times"),
            "alpha3_analytic": raw.get("alpha3_default"),
            "degree_slopes": {str(d): c for d, c in degree_slopes(fit.points).items()},
            "alpha_blk_evidence": None if ev is None else {"alpha2": ev[0], "alpha_blk": ev[1]},
            "alpha_blk_evidence_cpu_time": None if ev_cpu is None else {"alpha2": ev_cpu[0], "alpha_blk": ev_cpu[1]},
            "vision": [{"visual_tokens": n, "time_s": t} for n, t in raw.get("vision") or ()],
            "alpha_vis": raw.get("alpha_vis", 0.0), "layers_scaled": raw.get("layers_scaled", 1),
            "fits": {"v1": _fit_dict(fit.v1), "v2": _fit_dict(fit)}}


def _cpu_points(fit, raw) -> list:
    """The fit's points with their minimum per-rank CPU time instead of wall time (empty without CPU times or when
    the times were scaled to a preset's layers)."""
    from fcp_exec.profile_fit import ProfilePoint

    cpu = raw.get("rep_cpu_times")
    if not cpu or raw.get("layers_scaled", 1) != 1 or len(cpu) != len(fit.points) or min(map(min, cpu)) <= 0:
        return []
    return [ProfilePoint(seq_len=p.seq_len, degree=p.degree, eta=p.eta, num_docs=p.num_docs, time_s=min(ts))
            for p, ts in zip(fit.points, cpu)]


def _print_cpu_evidence(fit, raw) -> None:
    """The model-free alpha_blk check on per-rank CPU times (blind to descheduling by other jobs)."""
    from fcp_exec.profile_fit import alpha_blk_evidence, degree_slopes

    pts = _cpu_points(fit, raw)
    ev = alpha_blk_evidence(pts) if pts else None
    if ev is not None:
        print("same check on per-rank CPU time (blind to other jobs and to waiting for a peer): "
              + ", ".join(f"d={d}: {c:.3g}" for d, c in degree_slopes(pts).items())
              + f" s/token; alpha_blk = {ev[1]:.3g} s/token (alpha2 {ev[0]:.3g})")


def _print_spread(rep_times) -> None:
    """One line: how much contention the repetitions saw (median/min − 1 per point: median and max over points)."""
    from fcp_exec.profile_fit import timing_estimate

    if not rep_times or min(len(ts) for ts in rep_times) < 2:
        return
    spreads = sorted(timing_estimate(ts)[2] for ts in rep_times)
    print(f"timing spread (median/min - 1 of each point's {len(rep_times[0])} repetitions): median "
          f"{spreads[len(spreads) // 2] * 100:.0f}%, max {spreads[-1] * 100:.0f}% over {len(spreads)} points")


def _print_results(fit, raw, layer_like) -> None:
    """Bandwidth, alpha_vis, the fit table with v1 vs v2, the CPU-time alpha_blk check and the timing spread."""
    from fcp_exec.profiler import format_fit

    if layer_like:
        print(f"(times above are per layer; the table and fit below are scaled to {raw['layers_scaled']} layers)")
    if raw["bandwidth"]:
        print(f"P2P bandwidth rank 0 <-> 1: {raw['bandwidth'] / 1e9:.2f} GB/s")
    if raw.get("alpha_vis"):
        print(f"vision tower: alpha_vis = {raw['alpha_vis']:.4g} s per visual token (forward + backward)")
    print(format_fit(fit))
    _print_cpu_evidence(fit, raw)
    _print_spread(raw.get("rep_times"))


def _warn_bandwidth(raw, *, written_to: str, inter_given: bool) -> None:
    """One stderr line when the written bandwidth was not measured nor given (one process), and what to pass."""
    import sys

    from fcp_exec.profiler import PLACEHOLDER_BANDWIDTH

    if raw["bandwidth_source"] == "placeholder":
        print(f"warning: one process measures no bandwidth: {written_to} holds a placeholder of "
              f"{PLACEHOLDER_BANDWIDTH:.0e} B/s for bandwidth_intra{'' if inter_given else '/bandwidth_inter'} "
              "(harmless for degree-1 plans, wrong for rings); pass --bandwidth B/s (your interconnect's) or "
              "profile with --nproc 2 or more", file=sys.stderr)


def _check_numbers(args) -> None:
    """--reps, --warmup, --tokens-per-rank and the --out/--report paths, before any process starts."""
    from pathlib import Path

    from fcp_data.commands import UsageError

    if not 1 <= args.reps <= _MAX_SWEEPS:
        raise UsageError(f"--reps must be in [1, {_MAX_SWEEPS}], got {args.reps}")
    if not 0 <= args.warmup <= _MAX_SWEEPS:
        raise UsageError(f"--warmup must be in [0, {_MAX_SWEEPS}], got {args.warmup}")
    from fcp_data.cost import MAX_TOKENS_PER_RANK

    if args.tokens_per_rank is not None and not 1 <= args.tokens_per_rank <= MAX_TOKENS_PER_RANK:
        raise UsageError(f"--tokens-per-rank must be in [1, {MAX_TOKENS_PER_RANK}], got {args.tokens_per_rank}")
    seen: dict[Path, str] = {}
    for flag, path in (("--out", args.out), ("--report", args.report), ("--plot", args.plot)):
        if not path:
            continue
        try:
            bad = Path(path).is_dir() or not Path(path).resolve().parent.is_dir()
            where = Path(path).resolve()
        except (OSError, RuntimeError):  # RuntimeError: a symlink loop (Path.resolve before Python 3.13)
            raise UsageError(f"{flag} {path}: the path cannot be resolved (a symlink loop?)") from None
        if bad:
            raise UsageError(f"{flag} {path}: {'is a directory' if Path(path).is_dir() else 'its folder does not exist'}")
        if where in seen:  # the later write would replace the earlier one (a cost model lost to its report)
            raise UsageError(f"{flag} {path} is the file {seen[where]} writes too: give them different files")
        seen[where] = flag
        _check_writable(flag, Path(path))


def _check_writable(flag: str, path: Path) -> None:
    """Open ``path`` for appending (nothing written; a file this creates is removed again), so that a file that
    cannot be written fails now, not after minutes of timing (``os.access`` says yes to root on /sys)."""
    from fcp_data.commands import UsageError

    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path} cannot be written: {e.strerror or e}") from None
    finally:
        if not existed:
            path.unlink(missing_ok=True)


def _check_builds(hf_path: str) -> None:
    """Build the model of an ``hf:`` config on the meta device (no memory, no weights) before any process starts:
    a config that parses but cannot build (0 key/value heads) is one line here, not a rank's traceback."""
    import torch

    from fcp_data.commands import UsageError
    from fcp_exec.commands.train import load_hf_config
    from fcp_exec.integrations import hf

    config = load_hf_config(hf_path)  # UsageError unless fcp supports its model type
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "num_hidden_layers", None) == 0:
        raise UsageError(f"--model hf:{hf_path}: num_hidden_layers is 0, no attention to time")
    try:
        with torch.device("meta"):
            hf.apply_fcp(hf.build_model(config))
    except Exception as e:  # noqa: BLE001 - whatever transformers raises on a config it cannot build
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UsageError(f"--model hf:{hf_path}: the model cannot be built from this config "
                         f"({type(e).__name__}: {first[:200]})") from None


def _check_fit(cost_model) -> None:
    """A fit whose compute terms are all 0 says a group's time does not grow with its tokens: the measured times did
    not (a grid too short for this machine's noise). Such a model would plan every split alike: refused, not
    written."""
    from fcp_data.commands import UsageError

    if not (cost_model.alpha1 > 0 or cost_model.alpha2 > 0 or getattr(cost_model, "alpha_blk", 0.0) > 0):
        raise UsageError("the measured times do not grow with the tokens (every compute coefficient fitted 0), so no "
                         "cost model is written: give longer --seq-lens, more --reps, or a quieter machine")


def run(args) -> int:
    from fcp_data.commands import UsageError
    from fcp_exec.commands import check_launch
    from fcp_exec.commands.train import resolve_model

    model, hf_path = resolve_model(args.model)
    _check_numbers(args)
    seq_lens = _ints(args.seq_lens)
    degrees = _ints(args.degrees, MAX_RANKS) if args.degrees else None
    packed_docs = () if args.packed_docs.strip().lower() in ("none", "") else _ints(args.packed_docs, MAX_RANKS)
    packed_lens = _ints(args.packed_lens) if packed_docs else ()
    if args.plot:
        from fcp_data.commands.plots import check_plot_path

        check_plot_path(args.plot)  # matplotlib and the suffix (its file: _check_numbers)
    if args.layer_like:
        from fcp_data.presets import MODELS

        names = {k.lower(): k for k in MODELS}  # `--layer-like qwen3-8b` as well as Qwen3-8B
        if args.layer_like.lower() not in names:
            raise UsageError(f"unknown --layer-like preset {args.layer_like!r}; choose one of {', '.join(MODELS)}")
        args.layer_like = names[args.layer_like.lower()]
    args.nproc, backend = check_launch(args.nproc, args.backend)
    if degrees and max(degrees) > args.nproc:
        raise UsageError(f"--degrees {args.degrees}: a degree cannot exceed the {args.nproc} process(es); pass "
                         f"--nproc {max(degrees)} or drop the larger degrees")
    from fcp_exec.profiler import profile_grid, run_profile

    cells = profile_grid(seq_lens, packed_docs, packed_lens)
    if len(cells) * len(degrees or range(args.nproc)) < 3:
        raise UsageError("the grid needs at least 3 (length, degree) points; give more --seq-lens")
    if hf_path:  # a bad or unsupported config, or one that does not build: one line here, not a worker traceback
        _check_builds(hf_path)
    what = f"one layer like {args.layer_like}" if args.layer_like else args.model
    packed = (f", packed groups of {list(packed_docs)} documents of {list(packed_lens)} tokens" if packed_docs
              else "")
    print(f"[fcp profile] {what}, {args.dtype}, {args.nproc} process(es), lengths {list(seq_lens)}{packed}, "
          f"degrees {list(degrees or range(1, args.nproc + 1))}, {args.warmup} warm-up + {args.reps} timed sweeps "
          f"(min kept)", flush=True)
    fit, raw = run_profile(args.nproc, model=model, layer_like=args.layer_like, seq_lens=seq_lens,
                           degrees=degrees, reps=args.reps, dtype=args.dtype, tokens_per_rank=args.tokens_per_rank,
                           backend=backend, packed_docs=packed_docs, packed_lens=packed_lens, version=2,
                           warmup=args.warmup, bandwidth=args.bandwidth, bandwidth_inter=args.bandwidth_inter)
    _print_results(fit, raw, args.layer_like)
    _write(fit, raw, args)
    return 0


def _write(fit, raw, args) -> None:
    """The cost JSON (refused when its compute terms are all 0), the bandwidth warning, the report and the plot."""
    import json

    from fcp_exec.profiler import plot_fit

    written = fit if args.fit == "v2" else fit.v1
    _check_fit(written.cost_model)
    # the v2 keys always appear (0: not fitted, or a v1 model)
    Path(args.out).write_text(json.dumps(_full_dict(written.cost_model), indent=2) + "\n")
    print(f"cost model ({args.fit}) written to {args.out}")
    _warn_bandwidth(raw, written_to=args.out, inter_given=args.bandwidth_inter is not None)
    if args.report:
        Path(args.report).write_text(json.dumps(_report(fit, raw, args.fit), indent=2) + "\n")
        print(f"report written to {args.report}")
    if args.plot:
        plot_fit(fit, args.plot)
        print(f"plot written to {args.plot}")
