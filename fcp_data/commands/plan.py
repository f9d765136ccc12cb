"""``fcp plan``: plan one global batch of sequence lengths into CP groups (table or DESIGN §6 JSON).

Also holds the input options shared by ``plan``, ``compare`` and ``simulate`` (lengths file, visual tokens
file, cost model from ``--cost`` or ``--preset/--hardware``, overlong handling, Ulysses head counts).

The workload is exactly one of ``--lengths FILE`` (token counts) or ``--index DIR`` (a length index built
by ``fcp index``: lengths from its ``num_tokens`` column, visual tokens from ``num_visual_tokens`` and the
mask factor η of DESIGN §4 from its ``eta`` column, i.e. the spec's attention kind; ``--column``,
``--visual`` and ``--visual-column`` do not apply to it). ``--index`` on the same data plans exactly as
``--lengths`` + ``--visual`` (for a causal spec, η = 0, which ``--lengths`` assumes).

Visual tokens (cost model v2, DESIGN §4.1): ``--visual FILE`` gives one count per sequence, in the order
of ``--lengths`` and in the same formats (.txt one per line, .npy, .csv with ``--visual-column``; the file
may be the lengths CSV itself), 0 for text; each count is at most its sequence's length. They follow
``--on-overlong``: dropped with their sequence, clipped to a truncated length (so do an index's visual
tokens and η). Without ``--visual`` (or ``--index``) every sequence is text.
"""

from __future__ import annotations

import argparse
import json
import sys

from fcp_data.commands.solver_args import (BASELINES, SOLVER_CHOICES, add_robust_arg, check_options_apply,
                                          parse_baselines, parse_solvers, solver_options, solvers_epilog)
from fcp_data.plan.registry import solver_specs

__all__ = ["register", "add_input_args", "add_source_args", "add_cost_args", "add_visual_args", "load_cost",
           "load_inputs", "load_visual", "check_source", "load_source", "Workload", "source_visual", "solver_options",
           "parse_micro_batches", "format_plan", "degree_summary", "SOLVER_CHOICES", "BASELINES", "parse_baselines",
           "parse_solvers", "solvers_epilog", "check_ranks", "check_heads", "positive_seconds", "MAX_RANKS"]


def add_cost_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cost model (one of)")
    g.add_argument("--cost", metavar="COST.json", help="cost model JSON with the DESIGN §4 keys (and optionally the "
                   "§4.1 keys gamma, alpha_blk, alpha_vis)")
    g.add_argument("--preset", metavar="MODEL", help="model preset (see `fcp presets`), or hf:PATH: the model's Hugging "
                   "Face config.json (or its folder; MoE, multi-latent attention, sliding windows, vision towers), "
                   "with --hardware")
    g.add_argument("--shard-weights", action="store_true",
                   help="with --preset: weights and gradients sharded over the data-parallel ranks too (FSDP2 / "
                        "ZeRO-3; what MoE models need to fit), not only the optimizer state")
    g.add_argument("--hardware", metavar="HW", help="hardware preset: ascend-910c, h100, h200, a100")
    g.add_argument("--cost-model", choices=("v1", "v2"), default="v2",
                   help="with --preset: v2 (default, DESIGN §4.1: ring-step latency, block overhead and vision work "
                        "derived from the specs) or v1 (§4 terms only)")
    g.add_argument("--heads", type=int, default=None, help="attention heads for the Ulysses baseline (default: preset's, else 32)")
    g.add_argument("--kv-heads", type=int, default=None, help="KV heads for the Ulysses baseline (default: preset's, else 8)")
    add_robust_arg(g)


def add_source_args(p: argparse.ArgumentParser) -> None:
    """``--lengths FILE [--column C]`` or ``--index DIR`` (exactly one; checked by :func:`check_source`)."""
    g = p.add_argument_group("workload (exactly one of)")
    g.add_argument("--lengths", metavar="FILE", default=None,
                   help="token counts: .txt (one per line), .npy, .csv (with --column), or a Megatron indexed "
                        "dataset's .idx (its documents' counts, from tools/preprocess_data.py)")
    g.add_argument("--index", metavar="DIR", default=None,
                   help="a length index built by `fcp index`: lengths from num_tokens, visual tokens from "
                        "num_visual_tokens, η from the spec's attention kind (eta column)")
    g.add_argument("--column", default=None, help="column of a .csv lengths file (name or 0-based index)")


def add_input_args(p: argparse.ArgumentParser, *, overlong_default: str = "error") -> None:
    add_source_args(p)
    p.add_argument("--ranks", type=int, required=True, metavar="N", help="number of ranks (devices)")
    p.add_argument("--on-overlong", choices=("error", "truncate", "drop"), default=overlong_default,
                   help=f"a sequence longer than ranks × tokens_per_rank: error, truncate or drop (default {overlong_default})")
    add_visual_args(p)
    add_cost_args(p)


def add_visual_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--visual", metavar="FILE", default=None,
                   help="visual tokens per sequence (cost model v2, alpha_vis): same order and formats as --lengths, "
                        "0 for text (default: all text; --index reads them from the index)")
    p.add_argument("--visual-column", default=None, help="column of a .csv --visual file (name or 0-based index)")


def _load_counts(path: str, column) -> list[int]:
    """Non-negative whole counts from a .txt/.npy/.csv file (the --lengths formats, zeros allowed)."""
    import csv
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"visual tokens file not found or not a regular file: {p}")
    if p.suffix.lower() == ".npy":
        from fcp_data.workloads import load_npy_vector

        return load_npy_vector(p).tolist()
    with p.open(newline="", encoding="utf-8-sig") as f:
        if p.suffix.lower() != ".csv":
            if column is not None:
                raise ValueError(f"--visual-column applies to .csv files only, got {p}")
            cells = [(f"{p}:{i}", line.split("#", 1)[0].strip()) for i, line in enumerate(f, 1)]
            cells = [c for c in cells if c[1]]
        else:
            try:
                rows = [r for r in csv.reader(f, strict=True) if any(c.strip() for c in r)]
            except csv.Error as e:
                raise ValueError(f"{p}: not a valid CSV ({e})") from None
            header = [c.strip() for c in rows[0]] if rows else []
            has_header = bool(rows) and not all(c.lstrip("-").replace(".", "", 1).isdigit() for c in header)
            if column is None and len(header) != 1:
                raise ValueError(f"{p} has {len(header)} columns; choose one with --visual-column")
            idx = 0 if column is None else int(column) if str(column).isdigit() else \
                header.index(column) if has_header and column in header else None
            if idx is None or idx >= len(header):
                raise ValueError(f"{p}: no column {column!r}; the columns: {', '.join(header)}")
            body = rows[1:] if has_header else rows
            cells = [(f"{p}:{i + 1 + has_header}", r[idx].strip() if idx < len(r) else "") for i, r in enumerate(body)]
    out = []
    for where, text in cells:
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"{where}: {text!r} is not a visual-token count") from None
        out.append(v)
    return out


def check_source(args: argparse.Namespace) -> None:
    """Exactly one of ``--lengths``/``--index``, and no lengths-file option with ``--index`` (``UsageError``),
    checked before any file is read."""
    from fcp_data.commands import UsageError

    lengths, index = getattr(args, "lengths", None), getattr(args, "index", None)
    if lengths is None and index is None:
        raise UsageError("give the workload: --lengths FILE (token counts) or --index DIR (a length index built by "
                         "`fcp index`)")
    if lengths is not None and index is not None:
        raise UsageError("give either --lengths FILE or --index DIR, not both")
    if index is not None:
        for opt in ("column", "visual", "visual_column"):
            if getattr(args, opt, None) is not None:
                flag = "--" + opt.replace("_", "-")
                raise UsageError(f"{flag} applies to --lengths only; with --index the index's columns give the "
                                 "lengths, visual tokens and η")


class Workload:
    """Sequences of one workload before ``--on-overlong``: ``lengths`` (int64), ``visual`` and ``etas``
    (float64, one per sequence, or None: all text / all causal) and a one-line ``source`` description."""

    __slots__ = ("lengths", "visual", "etas", "source")

    def __init__(self, lengths, visual=None, etas=None, source: str = ""):
        self.lengths, self.visual, self.etas, self.source = lengths, visual, etas, source


def _load_index_workload(path: str) -> Workload:
    from pathlib import Path

    import numpy as np

    from fcp_data.index import LengthIndex

    p = Path(path)
    if not p.exists():
        raise ValueError(f"--index {p}: no such folder; build a length index with `fcp index INPUTS --spec SPEC --out {p}`")
    if not p.is_dir():
        raise ValueError(f"--index {p} is a file, not a length index folder; for a file of token counts use --lengths {p}")
    try:
        ix = LengthIndex.load(p)
        n = len(ix)
        spec = ix.spec_name
        s = np.asarray(ix.num_tokens, dtype=np.int64)
        v = np.asarray(ix.num_visual_tokens, dtype=np.float64)
        e = np.asarray(ix.eta, dtype=np.float64)
    except KeyError as e:
        raise ValueError(f"--index {p}: manifest.json lacks {e}; the index is damaged, rebuild it") from None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        msg = " ".join(str(e).split())
        raise ValueError(f"--index: {msg}" if str(p) in msg else f"--index {p}: {msg}") from None
    if n == 0:
        raise ValueError(f"--index {p}: the index has no samples (see {p / 'errors.jsonl'} for the ones that failed)")
    bad = np.flatnonzero(s <= 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"--index {p}: sample {i} ({ix.keys[i]!r}) has {int(s[i])} tokens; lengths must be >= 1, "
                         "rebuild the index")
    bad = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v > s))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"--index {p}: sample {i} ({ix.keys[i]!r}) has {v[i]:g} visual tokens for {int(s[i])} tokens; "
                         "the index is damaged, rebuild it")
    bad = np.flatnonzero(~((e == 0.0) | (e == 1.0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"--index {p}: sample {i} ({ix.keys[i]!r}) has eta {e[i]:g}; η is 0 (causal) or 1 (full), "
                         "rebuild the index")
    num_vis = int(np.count_nonzero(v))
    etas_note = "" if not e.any() else (", full attention (η=1)" if e.all() else f", {int(np.count_nonzero(e))} with η=1")
    source = (f"index {p}: {n} samples (spec {spec}), {num_vis} with visual tokens{etas_note}")
    return Workload(s, v if num_vis else None, e if e.any() else None, source)


def load_source(args: argparse.Namespace) -> Workload:
    """The workload of ``--lengths FILE`` (visual tokens: see :func:`source_visual`) or ``--index DIR``."""
    if getattr(args, "index", None) is not None:
        return _load_index_workload(args.index)
    from fcp_data.workloads import load_lengths

    raw = load_lengths(args.lengths, args.column)
    return Workload(raw, None, None, f"lengths {args.lengths}: {raw.size} sequences")


def source_visual(args: argparse.Namespace, work: Workload, lengths, report):
    """Visual tokens aligned with the capped ``lengths``: the index's (dropped or clipped with their sequence,
    as ``--visual``), else :func:`load_visual`."""
    if getattr(args, "index", None) is None:
        return load_visual(args, work.lengths, lengths, report)
    if work.visual is None:
        return None
    import numpy as np

    return np.minimum(work.visual[report.kept], lengths)


def load_visual(args: argparse.Namespace, raw, lengths, report):
    """The ``--visual`` counts (float64, aligned with the capped ``lengths``) or None; ``raw``: the lengths file's
    sequences, before ``--on-overlong`` (each count is checked against its own sequence before it follows the cap)."""
    if getattr(args, "visual", None) is None:
        if getattr(args, "visual_column", None) is not None:
            from fcp_data.commands import UsageError

            raise UsageError("--visual-column needs --visual FILE")
        return None
    import numpy as np

    from fcp_data.plan.inputs import validate_visual

    v = np.asarray(_load_counts(args.visual, args.visual_column), dtype=np.float64)
    if v.size != len(raw):
        raise ValueError(f"--visual {args.visual} has {v.size} entries but --lengths has {len(raw)}; give one count per "
                         "sequence (0 for text)")
    bad = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v > raw))  # before the cap's clipping could hide it
    if bad.size:
        raise ValueError(f"--visual {args.visual}: entry {int(bad[0])} is {v[bad[0]]:g}; a count is >= 0 and at most "
                         f"its sequence's {int(raw[bad[0]])} tokens")
    return validate_visual(np.minimum(v[report.kept], lengths), lengths)  # dropped or clipped with its sequence


def load_cost(args: argparse.Namespace):
    from fcp_data.commands import UsageError
    from fcp_data.cost import CostModel

    if args.cost and (args.preset or args.hardware):
        raise UsageError("give either --cost FILE or --preset MODEL --hardware HW, not both")
    if args.cost and (getattr(args, "cost_model", "v2") != "v2" or getattr(args, "shard_weights", False)):
        raise UsageError("--cost-model and --shard-weights apply to --preset; a cost JSON is v1 or v2 by its keys")
    if args.cost:
        return CostModel.load(args.cost)
    if not (args.preset and args.hardware):
        raise UsageError("a cost model is needed: --cost COST.json, or --preset MODEL --hardware HW (see `fcp presets`)")
    return CostModel.preset(args.preset, args.hardware, v2=getattr(args, "cost_model", "v2") == "v2",
                            shard_weights=bool(getattr(args, "shard_weights", False)))


# Literal copy of fcp_data.cost.MAX_RANKS so that building the parser imports no numpy (tested equal).
MAX_RANKS = 4096


def check_ranks(ranks: int) -> None:
    """``--ranks`` within 1..MAX_RANKS, checked before any file is read."""
    from fcp_data.commands import UsageError

    if ranks < 1:
        raise UsageError(f"--ranks must be >= 1, got {ranks}")
    if ranks > MAX_RANKS:
        raise UsageError(f"--ranks {ranks} is more than the planner supports ({MAX_RANKS}); plan the context-parallel "
                         "ranks of one data-parallel replica, not the whole cluster")


def check_heads(args: argparse.Namespace) -> None:
    """``--heads``/``--kv-heads`` (Ulysses baseline) positive, heads a multiple of kv-heads."""
    from fcp_data.commands import UsageError

    for name in ("heads", "kv_heads"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.heads is not None and args.kv_heads is not None and args.heads % args.kv_heads:
        raise UsageError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")


def load_inputs(args: argparse.Namespace):
    """``(lengths, cost_model, cap_report, visual, etas)`` from the shared options (``visual`` None: all text;
    ``etas`` None: all causal; both follow ``--on-overlong``)."""
    from fcp_data.workloads import apply_cap

    check_ranks(args.ranks)
    check_heads(args)
    check_source(args)
    cm = load_cost(args)
    work = load_source(args)
    lengths, report = apply_cap(work.lengths, args.ranks * cm.tokens_per_rank, args.on_overlong)
    etas = None if work.etas is None else work.etas[report.kept]
    return lengths, cm, report, source_visual(args, work, lengths, report), etas


def parse_micro_batches(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        m = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a positive integer, got {text!r}") from None
    if m < 1:
        raise argparse.ArgumentTypeError(f"micro-batches must be >= 1, got {m}")
    return m


def positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not (v > 0 and v < float("inf")):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds and finite, got {text}")
    return v


def degree_summary(degrees) -> str:
    """Groups as ⟨d⟩×count, largest degree first (the FCP paper's Table 6 notation)."""
    counts: dict[int, int] = {}
    for d in degrees:
        counts[int(d)] = counts.get(int(d), 0) + 1
    return " ".join(f"⟨{d}⟩×{counts[d]}" for d in sorted(counts, reverse=True))


def _ranks_text(ranks) -> str:
    r = list(ranks)
    if len(r) > 1 and r == list(range(r[0], r[-1] + 1)):
        return f"{r[0]}-{r[-1]}"
    return ",".join(map(str, r))


def format_plan(plan, lengths, cost_model) -> str:
    lines = [f"{plan.solver}: {len(lengths)} sequences, {int(sum(lengths))} tokens on {plan.num_ranks} ranks, "
             f"{len(plan.micro_batches)} micro-batch(es)"]
    for m, mb in enumerate(plan.micro_batches):
        lines.append(f"micro-batch {m}: {len(mb.groups)} groups {degree_summary(mb.degrees)}, makespan {mb.makespan:.4f} s")
        lines.append(f"  {'degree':>6}  {'ranks':<16} {'node':<6} {'seqs':>5} {'tokens':>9} {'time [s]':>10}")
        for g in sorted(mb.groups, key=lambda g: (-g.degree, g.ranks)):
            node = "intra" if cost_model.is_intra_node(g.ranks) else "inter"
            toks = int(sum(int(lengths[i]) for i in g.seq_ids))
            lines.append(f"  {g.degree:>6}  {_ranks_text(g.ranks):<16} {node:<6} {len(g.seq_ids):>5} {toks:>9} {g.time:>10.4f}")
        idle = plan.num_ranks - sum(mb.degrees)
        if idle:
            lines.append(f"  idle ranks: {idle}")
    lines.append(f"makespan {plan.makespan:.4f} s   solve {plan.solve_ms:.1f} ms")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from fcp_data.plan import plan_batch

    check_options_apply(args, [args.solver])
    lengths, cm, report, visual, etas = load_inputs(args)
    opts = solver_options(args).get(args.solver, {})
    plan = plan_batch(lengths, num_ranks=args.ranks, cost_model=cm, solver=args.solver, etas=etas,
                      micro_batches=args.micro_batches, visual=visual, **opts)
    if report.num_overlong:  # beside --json on stderr: its stdout stays one JSON object
        print(report.summary(), file=sys.stderr if args.json else sys.stdout)
    print(json.dumps(report.to_input(plan.to_dict())) if args.json else format_plan(plan, lengths, cm))
    return 0


EPILOG = """workload: --lengths FILE, or --index DIR (a length index from `fcp index`: lengths, visual tokens and η).
lengths files: .txt (one integer per line, '#' comments), .npy (1-D integers), .csv (--column NAME|INDEX).
examples:
  fcp plan --lengths lengths.txt --ranks 8 --preset Qwen3-8B --hardware h100
  fcp plan --lengths lengths.npy --ranks 64 --cost cost.json --micro-batches auto --json
  fcp plan --lengths batch.csv --column num_tokens --ranks 16 --preset Llama3-8B --hardware a100 --on-overlong truncate
  fcp plan --lengths batch.csv --column num_tokens --visual batch.csv --visual-column num_visual --ranks 8 --cost v2.json
  fcp plan --index my-index --ranks 8 --cost v2.json --micro-batches auto
exit codes: 0 ok, 2 bad input (one line on stderr)."""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("plan", help=summary, description=summary + ". Prints a table, or the plan JSON with --json.",
                              epilog=EPILOG + "\n" + solvers_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--solver", choices=SOLVER_CHOICES, default="fcp", metavar="NAME",
                   help=f"a registered solver (default fcp): {', '.join(SOLVER_CHOICES)}; see the list below")
    p.add_argument("--micro-batches", type=parse_micro_batches, default=1, metavar="auto|M",
                   help="plan as one micro-batch (default), exactly M, or 'auto' (fewest that fit, best of a few)")
    limited = "/".join(s.name for s in solver_specs() if s.time_limited)
    p.add_argument("--time-limit", type=positive_seconds, default=None, metavar="S",
                   help=f"--solver {limited}: time budget in seconds for the whole batch, all micro-batches and 'auto' "
                        "candidates together (default 30)")
    p.add_argument("--json", action="store_true", help="print the DESIGN §6 plan JSON")
    p.set_defaults(func=run)
