"""``fcp plan``: plan one global batch of sequence lengths into CP groups (table or DESIGN §6 JSON).

Also holds the input options shared by ``plan``, ``compare`` and ``simulate`` (lengths file, cost model
from ``--cost`` or ``--preset/--hardware``, overlong handling, Ulysses head counts).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register", "add_input_args", "add_cost_args", "load_cost", "load_inputs", "solver_options",
           "parse_micro_batches", "format_plan", "degree_summary", "SOLVER_CHOICES", "BASELINES", "parse_baselines",
           "check_ranks", "check_heads", "positive_seconds", "MAX_RANKS"]


def add_cost_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cost model (one of)")
    g.add_argument("--cost", metavar="COST.json", help="cost model JSON with the DESIGN §4 keys")
    g.add_argument("--preset", metavar="MODEL", help="model preset (see `fcp presets`), with --hardware")
    g.add_argument("--hardware", metavar="HW", help="hardware preset: ascend-910c, h100, h200, a100")
    g.add_argument("--heads", type=int, default=None, help="attention heads for the Ulysses baseline (default: preset's, else 32)")
    g.add_argument("--kv-heads", type=int, default=None, help="KV heads for the Ulysses baseline (default: preset's, else 8)")


def add_input_args(p: argparse.ArgumentParser, *, overlong_default: str = "error") -> None:
    p.add_argument("--lengths", required=True, metavar="FILE", help="token counts: .txt (one per line), .npy, or .csv")
    p.add_argument("--column", default=None, help="column of a .csv lengths file (name or 0-based index)")
    p.add_argument("--ranks", type=int, required=True, metavar="N", help="number of ranks (devices)")
    p.add_argument("--on-overlong", choices=("error", "truncate", "drop"), default=overlong_default,
                   help=f"a sequence longer than ranks × tokens_per_rank: error, truncate or drop (default {overlong_default})")
    add_cost_args(p)


def load_cost(args: argparse.Namespace):
    from fcp_data.cli import UsageError
    from fcp_data.cost import CostModel

    if args.cost and (args.preset or args.hardware):
        raise UsageError("give either --cost FILE or --preset MODEL --hardware HW, not both")
    if args.cost:
        return CostModel.load(args.cost)
    if not (args.preset and args.hardware):
        raise UsageError("a cost model is needed: --cost COST.json, or --preset MODEL --hardware HW (see `fcp presets`)")
    return CostModel.preset(args.preset, args.hardware)


def solver_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per-solver keyword options: Ulysses head counts (from the preset unless given)."""
    heads, kv = 32, 8
    if getattr(args, "preset", None):
        from fcp_data.presets import model_heads

        heads, kv = model_heads(args.preset)
    heads = args.heads if args.heads is not None else heads
    kv = args.kv_heads if args.kv_heads is not None else kv
    out: dict[str, dict[str, Any]] = {"ulysses": {"num_heads": heads, "num_kv_heads": kv}}
    if getattr(args, "time_limit", None) is not None:
        out["ilp"] = {"time_limit": args.time_limit}
    return out


# Literal copy of fcp_data.cost.MAX_RANKS so that building the parser imports no numpy (tested equal).
MAX_RANKS = 4096


def check_ranks(ranks: int) -> None:
    """``--ranks`` within 1..MAX_RANKS, checked before any file is read."""
    from fcp_data.cli import UsageError

    if ranks < 1:
        raise UsageError(f"--ranks must be >= 1, got {ranks}")
    if ranks > MAX_RANKS:
        raise UsageError(f"--ranks {ranks} is more than the planner supports ({MAX_RANKS}); plan the context-parallel "
                         "ranks of one data-parallel replica, not the whole cluster")


def check_heads(args: argparse.Namespace) -> None:
    """``--heads``/``--kv-heads`` (Ulysses baseline) positive, heads a multiple of kv-heads."""
    from fcp_data.cli import UsageError

    for name in ("heads", "kv_heads"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    if args.heads is not None and args.kv_heads is not None and args.heads % args.kv_heads:
        raise UsageError(f"--heads {args.heads} must be a multiple of --kv-heads {args.kv_heads}")


def load_inputs(args: argparse.Namespace):
    """``(lengths, cost_model, cap_report)`` from the shared options."""
    from fcp_data.workloads import apply_cap, load_lengths

    check_ranks(args.ranks)
    check_heads(args)
    cm = load_cost(args)
    lengths = load_lengths(args.lengths, args.column)
    lengths, report = apply_cap(lengths, args.ranks * cm.tokens_per_rank, args.on_overlong)
    return lengths, cm, report


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


def parse_baselines(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [n for n in names if n not in BASELINES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown baseline(s) {', '.join(bad)}; valid: {', '.join(BASELINES)}")
    return names


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

    if args.solver != "ilp" and args.time_limit is not None:
        from fcp_data.cli import UsageError

        raise UsageError(f"--time-limit applies to --solver ilp only (got --solver {args.solver})")
    lengths, cm, report = load_inputs(args)
    opts = solver_options(args).get(args.solver, {})
    plan = plan_batch(lengths, num_ranks=args.ranks, cost_model=cm, solver=args.solver,
                      micro_batches=args.micro_batches, **opts)
    if args.json:
        print(json.dumps(plan.to_dict()))
    else:
        if report.num_overlong:
            print(report.summary())
        print(format_plan(plan, lengths, cm))
    return 0


# Literal copy of fcp_data.plan.SOLVER_NAMES so that building the parser imports no numpy (tested equal).
SOLVER_CHOICES = ("fcp", "fcp-dp", "ilp", "exhaustive", "static-cp", "ulysses", "megatron-dynamic", "fcp-pow2")
BASELINES = ("static-cp", "ulysses", "megatron-dynamic", "fcp-pow2")


EPILOG = """lengths files: .txt (one integer per line, '#' comments), .npy (1-D integers), .csv (--column NAME|INDEX).
examples:
  fcp plan --lengths lengths.txt --ranks 8 --preset Qwen3-8B --hardware h100
  fcp plan --lengths lengths.npy --ranks 64 --cost cost.json --micro-batches auto --json
  fcp plan --lengths batch.csv --column num_tokens --ranks 16 --preset Llama3-8B --hardware a100 --on-overlong truncate
exit codes: 0 ok, 2 bad input (one line on stderr)."""


def register(subparsers, summary: str) -> None:
    p = subparsers.add_parser("plan", help=summary, description=summary + ". Prints a table, or the plan JSON with --json.",
                              epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_input_args(p)
    p.add_argument("--solver", choices=SOLVER_CHOICES, default="fcp", help="solver (default fcp)")
    p.add_argument("--micro-batches", type=parse_micro_batches, default=1, metavar="auto|M",
                   help="plan as one micro-batch (default), exactly M, or 'auto' (fewest that fit, best of a few)")
    p.add_argument("--time-limit", type=positive_seconds, default=None, metavar="S",
                   help="--solver ilp: time budget in seconds for the whole batch, all micro-batches and 'auto' "
                        "candidates together (default 30)")
    p.add_argument("--json", action="store_true", help="print the DESIGN §6 plan JSON")
    p.set_defaults(func=run)
