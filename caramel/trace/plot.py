"""PNG timelines of a few steps: one row per rank and lane, measured above predicted.

Each panel (measured, predicted) has its own time origin, the forward start of its first plotted
step, so the two line up at step boundaries and their lengths compare directly on one shared axis.
Overlapping collectives of one lane are drawn on thin sub-rows (the same sub-lanes as the Chrome
trace), so a pipelined bucket shows as a staircase rather than a smear.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from caramel.errors import CaramelError
from caramel.trace.chrome import assign_sublanes
from caramel.trace.events import LANES, Trace

# one colour per event kind; anything unknown is grey
KIND_COLORS = {
    "forward": "#4C72B0", "backward": "#55A868", "deferred": "#1B5E20", "optimizer": "#8172B2", "apply": "#8172B2",
    "comm": "#DD8452", "wait": "#C44E52", "step": "#999999", "sync": "#937860",
}


@dataclass
class PlotConfig:
    """What to draw: `num_steps` steps starting at step index `first_step` (0 = first recorded)."""

    first_step: int = 1
    num_steps: int = 3
    width_in: float = 12.0
    row_height_in: float = 0.35
    dpi: int = 110
    title: str | None = None


def step_window(trace: Trace, first_step: int, num_steps: int) -> tuple[float, float, list[int]]:
    """[start, end) in trace seconds covering the chosen steps, and the iterations they are.

    A step starts at the earliest forward of its iteration on any rank; the window ends where the
    step after the last one starts, or at the trace's last event when there is none. When the
    trace has fewer steps than asked, the last `num_steps` are shown (at least one).
    """
    fwd: dict[int, float] = {}
    for e in trace.events:
        if e.kind == "forward":
            fwd[e.iteration] = min(fwd.get(e.iteration, float("inf")), e.start_s)
    iters = sorted(fwd)
    if not iters:
        raise CaramelError(f"the {trace.source} trace has no 'forward' events, so its steps cannot be found")
    if first_step < 0 or num_steps < 1:
        raise CaramelError(f"steps to plot must be first >= 0 and count >= 1, got first={first_step} count={num_steps}")
    first = min(first_step, max(len(iters) - num_steps, 0))
    chosen = iters[first:first + num_steps]
    t0 = fwd[chosen[0]]
    after = first + len(chosen)
    t1 = fwd[iters[after]] if after < len(iters) else max(e.end_s for e in trace.events)
    return t0, t1, chosen


def _draw_panel(ax, trace: Trace, cfg: PlotConfig, label: str) -> float:
    """Draw one trace's window into `ax`; return the window length in ms."""
    t0, t1, chosen = step_window(trace, cfg.first_step, cfg.num_steps)
    ranks = sorted({e.rank for e in trace.events})
    rows = [(r, lane) for r in ranks for lane in LANES]
    yticks, ylabels = [], []
    for row, (rank, lane) in enumerate(rows):
        y = len(rows) - 1 - row  # rank 0 compute on top
        yticks.append(y)
        ylabels.append(f"r{rank} {lane}")
        evs = [e for e in trace.events if e.rank == rank and e.lane == lane and e.end_s >= t0 and e.start_s <= t1]
        # parents first, so nested events (an apply inside a forward) are drawn on top of them
        intervals = sorted((e for e in evs if e.duration_s > 0), key=lambda e: (e.start_s, -e.duration_s))
        instants = [e for e in evs if e.duration_s == 0]
        subs = assign_sublanes([(round(e.start_s * 1e9), round(e.end_s * 1e9)) for e in intervals])
        depth = max(subs, default=0) + 1
        h = 0.8 / depth
        for e, sub in zip(intervals, subs):
            x = (max(e.start_s, t0) - t0) * 1e3
            w = (min(e.end_s, t1) - max(e.start_s, t0)) * 1e3
            if w <= 0:
                continue
            # nested events (apply inside forward) sit on the same sub-row; a lighter shade keeps both visible
            nested_alpha = 0.95 if e.kind not in ("optimizer", "apply") else 0.75
            ax.broken_barh([(x, w)], (y - 0.4 + sub * h, h * 0.92), facecolors=KIND_COLORS.get(e.kind, "#AAAAAA"),
                           edgecolor="none", alpha=nested_alpha)
        ready = [(e.start_s - t0) * 1e3 for e in instants if e.kind == "ready" and t0 <= e.start_s <= t1]
        if ready:
            ax.plot(ready, [y + 0.42] * len(ready), "v", color="black", markersize=3)
    for k in chosen[1:]:
        starts = [e.start_s for e in trace.events if e.kind == "forward" and e.iteration == k]
        ax.axvline((min(starts) - t0) * 1e3, color="black", linewidth=0.6, linestyle=":")
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels, fontsize=7)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    steps = f"step {chosen[0]}" if len(chosen) == 1 else f"steps {chosen[0]}-{chosen[-1]}"
    ax.set_title(f"{label}: {steps}, {(t1 - t0) * 1e3:.2f} ms", fontsize=9, loc="left")
    return (t1 - t0) * 1e3


def plot_timeline(measured: Trace | None, path: str | os.PathLike, predicted: Trace | None = None,
                  config: PlotConfig | None = None) -> str:
    """Write a PNG of a few steps of `measured` (and `predicted` below it when given) to `path`."""
    cfg = config or PlotConfig()
    panels = [(t, t.source) for t in (measured, predicted) if t is not None]
    if not panels:
        raise CaramelError("nothing to plot: give a measured trace, a predicted trace, or both")
    for trace, _ in panels:
        step_window(trace, cfg.first_step, cfg.num_steps)  # bad step choices fail before any drawing
    # a bare Figure renders with Agg and leaves pyplot's global state (and the user's backend) alone
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    heights = [len({e.rank for e in t.events}) * len(LANES) for t, _ in panels]
    fig_h = sum(heights) * cfg.row_height_in + 1.2 * len(panels) + 0.6
    fig = Figure(figsize=(cfg.width_in, fig_h))
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, (trace, label) in zip(axes[:, 0], panels):
        _draw_panel(ax, trace, cfg, label)
        ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    axes[-1, 0].set_xlabel("ms from the first plotted step's forward start")
    kinds = sorted({e.kind for t, _ in panels for e in t.events if e.duration_s > 0})
    handles = [Patch(color=KIND_COLORS.get(k, "#AAAAAA"), label=k) for k in kinds]
    axes[0, 0].legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7,
                      ncol=len(handles), frameon=False)
    if cfg.title:
        fig.suptitle(cfg.title, fontsize=10)
    fig.tight_layout()
    try:
        fig.savefig(os.fspath(path), dpi=cfg.dpi, format="png")
    except OSError as e:
        raise CaramelError(f"{path}: cannot write the PNG ({e.strerror or e})") from None
    return os.fspath(path)
