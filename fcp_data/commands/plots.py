"""The charts of the planning commands (matplotlib, the ``plot`` extra): a bar chart of one number per solver next
to Gantt charts of plans (ranks × time, one colour per CP group) — ``fcp simulate --plot`` (mean step times, FCP's
first micro-batch) and ``fcp compare --plot`` (makespans, FCP's plan and the best other solver's) — and the check
that a ``--plot`` path can be written, made before any planning so a bad path fails at once."""

from __future__ import annotations

from typing import Any

__all__ = ["check_plot_path", "plot_bars_and_gantts"]


def plot_bars_and_gantts(path: str, bars: dict[str, float], ylabel: str, title: str,
                         gantts: list[tuple[str, Any]]) -> None:
    """``bars`` (``"fcp"`` highlighted) and, per ``(label, plan)`` in ``gantts``, a Gantt chart of the plan's first
    micro-batch, side by side on one shared time axis, into ``path``."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'fcp[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
