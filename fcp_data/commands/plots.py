"""The charts of the planning commands (matplotlib, the ``plot`` extra): a bar chart of one number per solver next
to Gantt charts of plans (ranks × time, one colour per CP group) — ``fcp simulate --plot`` (mean step times, FCP's
first micro-batch) and ``fcp compare --plot`` (makespans, FCP's plan and the best other solver's) —, the length
chart of ``fcp index --plot`` (:func:`plot_lengths`: the long tail a length index holds), and the check that a
``--plot`` path can be written, made before any planning or indexing so a bad path fails at once."""

from __future__ import annotations

from typing import Any

__all__ = ["check_plot_path", "plot_bars_and_gantts", "plot_lengths", "length_stats"]

KIND_NAMES = ("text", "image", "video")  # fcp_data.index.format's KIND_TEXT, KIND_IMAGE, KIND_VIDEO


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend; a ValueError naming the extra when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'fcp[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_bars_and_gantts(path: str, bars: dict[str, float], ylabel: str, title: str,
                         gantts: list[tuple[str, Any]]) -> None:
    """``bars`` (``"fcp"`` highlighted) and, per ``(label, plan)`` in ``gantts``, a Gantt chart of the plan's first
    micro-batch, side by side on one shared time axis, into ``path``."""
    plt = _pyplot()

    fig, axes = plt.subplots(1, 1 + len(gantts), figsize=(6.5 * (1 + len(gantts)), 5))
    ax1, gantt_axes = axes[0], list(axes[1:])
    names = list(bars)
    ax1.bar(names, [bars[n] for n in names], color=["C0" if n == "fcp" else "C7" for n in names])
    ax1.set_ylabel(ylabel)
    ax1.set_title(title)
    ax1.tick_params(axis="x", rotation=30)
    longest = max((plan.micro_batches[0].makespan for _, plan in gantts), default=0.0)
    for ax, (label, plan) in zip(gantt_axes, gantts):
        _gantt(ax, plt.get_cmap("tab20"), label, plan)
        ax.set_xlim(0.0, longest * 1.05 or 1.0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _gantt(ax, cmap, label: str, plan: Any) -> None:
    mb = plan.micro_batches[0]
    for k, g in enumerate(sorted(mb.groups, key=lambda g: g.ranks[0])):
        ax.barh(list(g.ranks), [g.time] * g.degree, left=0.0, height=1.0, color=cmap(k % 20), edgecolor="none")
        if g.degree >= 2 or len(mb.groups) <= 16:
            ax.text(g.time * 0.02, sum(g.ranks) / g.degree, f"⟨{g.degree}⟩ {len(g.seq_ids)} seqs", va="center",
                    fontsize=7)
    ax.axvline(mb.makespan, color="k", linestyle="--", linewidth=1)
    ax.set_xlabel("time [s]")
    ax.set_ylabel("rank")
    ax.yaxis.get_major_locator().set_params(integer=True)
    more = f" (micro-batch 0 of {len(plan.micro_batches)})" if len(plan.micro_batches) > 1 else ""
    ax.set_title(f"{label}{more}: {len(mb.groups)} groups, makespan {mb.makespan:.3f} s")
    ax.invert_yaxis()


def length_stats(num_tokens: Any, kind: Any, bins: int = 40) -> dict:
    """What :func:`plot_lengths` draws, computed once: log-spaced bin ``edges`` over the token counts, per-kind
    ``counts`` in them (every sample in one bin; a 0-token sample in the first), the ``p50``/``p90``/``p99``
    lengths (as ``fcp index`` prints them), the lengths sorted and the cumulative share of all tokens held by the
    samples up to each (``mass``), and ``top1_share``: the share of the tokens held by the longest 1 % of the
    samples (at least one sample)."""
    import numpy as np

    from fcp_data.index.merge import token_percentiles

    n = np.asarray(num_tokens, dtype=np.int64)
    k = np.asarray(kind, dtype=np.int64)
    if n.size == 0:
        raise ValueError("the index holds no samples: nothing to plot")
    lo, hi = max(int(n.min()), 1), max(int(n.max()), 2)
    edges = np.unique(np.geomspace(lo, hi + 1, bins + 1).round().astype(np.int64))
    counts = {name: np.histogram(np.maximum(n[k == code], lo), bins=edges)[0] for code, name in enumerate(KIND_NAMES)
              if (k == code).any()}
    order = np.sort(n)
    mass = np.cumsum(order, dtype=np.float64) / max(float(order.sum()), 1.0)
    top = max(1, int(np.ceil(0.01 * n.size)))
    top1 = float(order[-top:].sum()) / max(float(order.sum()), 1.0)
    q = token_percentiles(n)  # the ones `fcp index` prints (nearest rank)
    return {"edges": edges, "counts": counts, "p50": q["p50"], "p90": q["p90"], "p99": q["p99"], "sorted": order,
            "mass": mass, "top1_share": top1}


def plot_lengths(path: str, num_tokens: Any, kind: Any, title: str) -> dict:
    """Two panels into ``path``: a histogram of the samples' token counts (log-spaced bins, stacked by kind, the
    p50/p90/p99 marked) and the share of all tokens held by the samples up to each length — the long tail that
    fixed-size context parallelism pays for. Returns :func:`length_stats`."""
    plt = _pyplot()

    st = length_stats(num_tokens, kind)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    edges, bottom = st["edges"], 0
    for name, c in st["counts"].items():
        ax1.bar(edges[:-1], c, width=edges[1:] - edges[:-1], bottom=bottom, align="edge", label=name)
        bottom = bottom + c
    for q, style in (("p50", ":"), ("p90", "--"), ("p99", "-.")):
        ax1.axvline(st[q], color="k", linestyle=style, linewidth=1, label=f"{q} {st[q]:,.0f}")
    ax1.set(xscale="log", xlabel="tokens per sample", ylabel="samples", title=title)
    ax1.legend(fontsize=8)
    ax2.plot(st["sorted"], st["mass"], color="C3")
    ax2.set(xscale="log", xlabel="tokens per sample", ylabel="share of all tokens in samples up to this length",
            ylim=(0, 1.02), title=f"the longest 1 % of samples hold {st['top1_share']:.1%} of the tokens")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return st


def check_plot_path(path: str) -> None:
    """Fail before planning when ``--plot`` cannot be written: no matplotlib, missing or read-only folder,
    a folder as the target, or a suffix matplotlib cannot write."""
    import os
    from pathlib import Path

    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'fcp[plot]'") from None
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"--plot {path}: is a directory; give a file such as {p / 'plot.png'}")
    if not parent.is_dir():
        raise ValueError(f"--plot {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ValueError(f"--plot {path}: folder {parent} is not writable")
    kinds = FigureCanvasBase.get_supported_filetypes()
    if p.suffix.lower().lstrip(".") not in kinds:
        raise ValueError(f"--plot {path}: the file name needs an image suffix, one of "
                         f"{', '.join('.' + k for k in sorted(kinds))}")
