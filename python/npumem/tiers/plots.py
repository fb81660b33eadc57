"""Pictures of tiers (PNG, SVG or PDF, by the file's extension; the `plot` extra): the
tiers' use and hits (`plot_tiers`), and a static plan over several pools, one panel per pool
(`plot_tiered_plan`). Made like `npumem.monitor.plots` (matplotlib's object API,
safe from any thread); each pool's address map is `npumem.monitor.plot_address_map` of
its snapshot in a `TierSnapshot`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumem.errors import InvalidArgumentError, MissingDependencyError
from npumem.monitor._mplconfig import use_writable_config_dir
from npumem.monitor.plots import picture_format, save_figure
from npumem.sizes import byte_unit, format_bytes
from npumem.tiers.block import Tier
from npumem.tiers.observe import TierSnapshot
from npumem.tiers.report import TierStats

if TYPE_CHECKING:
    from npumem.plan.tiers import TieredSolution

__all__ = ["plot_tiered_plan", "plot_tiers"]


def _mpl() -> Any:
    use_writable_config_dir()
    try:
        import matplotlib
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError("pictures need matplotlib: pip install npumem[plot]") from exc
    return Figure, PolyCollection, matplotlib.colormaps


def plot_tiers(
    tiers: TierStats | TierSnapshot, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Two panels, one bar per tier: bytes in use against capacity (as a share), and the
    accesses each tier served; the title gives the fast-tier hit rate and the moves."""
    stats = tiers.stats if isinstance(tiers, TierSnapshot) else tiers
    picture_format(path)
    Figure, _, _ = _mpl()
    rows = [*stats.fast, stats.slow]
    names = [str(Tier(t.tier, t.core)) for t in rows]
    colors = ["tab:orange" if t.tier == "fast" else "tab:blue" for t in rows]
    fig = Figure(figsize=(max(8, 1.1 * len(rows) + 4), 5), layout="constrained")
    used_ax, hits_ax = fig.subplots(1, 2)
    used = [t.bytes_in_use / t.capacity * 100 if t.capacity else 0 for t in rows]
    bars = used_ax.bar(names, used, color=colors)
    for bar, t in zip(bars, rows, strict=True):
        held, whole = format_bytes(t.bytes_in_use, short=True), format_bytes(t.capacity, short=True)
        used_ax.annotate(
            f"{held}\nof {whole}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize="x-small",
        )
    used_ax.set_ylim(0, 115)
    used_ax.set_ylabel("in use (% of capacity)")
    used_ax.set_title("bytes in use")
    hits_ax.bar(names, [t.hits for t in rows], color=colors)
    hits_ax.set_ylabel("accesses served")
    hits_ax.set_title("hits")
    for ax in (used_ax, hits_ax):
        ax.tick_params(axis="x", labelrotation=45)
    fig.suptitle(
        title
        or f"tiers ({stats.policy}): fast-tier hit rate {stats.hit_rate:.1%}, "
        f"{stats.promotions} promotions, {stats.demotions} demotions, {stats.spills} spills"
    )
    return save_figure(fig, path)


def plot_tiered_plan(
    solution: TieredSolution, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """A plan over several pools: one panel per pool, every buffer as a rectangle (live range
    across, bytes up), with the pool's capacity as a line."""
    picture_format(path)
    Figure, PolyCollection, colormaps = _mpl()
    if not solution.problem.buffers:
        raise InvalidArgumentError("the solution has no buffers to plot")
    pools = solution.pools
    fig = Figure(figsize=(11, 3.2 * len(pools) + 0.6), layout="constrained")
    axes = fig.subplots(len(pools), 1, squeeze=False)[:, 0]
    start = min(b.lower for b in solution.problem.buffers)
    end = max(b.upper for b in solution.problem.buffers)
    palette = colormaps["tab20"]
    for ax, (name, cap) in zip(axes, pools, strict=True):
        sub = solution.solutions[name]
        top = max(sub.arena_size, cap or 0, 1)
        div, unit = byte_unit(top, at_least=4)
        verts = []
        for b in sub.problem.buffers:
            lo, hi = sub.offsets[b.id] / div, (sub.offsets[b.id] + b.size) / div
            verts.append([(b.lower, lo), (b.upper, lo), (b.upper, hi), (b.lower, hi)])
        colors = [palette(i % 20) for i in range(len(verts))]
        ax.add_collection(
            PolyCollection(verts, facecolors=colors, edgecolors="black", linewidths=0.3)
        )
        if cap is not None:
            ax.axhline(cap / div, color="tab:red", linestyle="--", label="capacity")
            ax.legend(loc="upper right", fontsize="small")
        ax.set_xlim(start, end)
        ax.set_ylim(0, top / div * 1.05)
        ax.set_ylabel(f"offset ({unit})")
        ax.set_title(
            f"{name}: {len(verts)} buffers, arena {format_bytes(sub.arena_size, short=True)}, "
            f"weight {solution.weight_in(name):,.0f}",
            loc="left",
            fontsize="medium",
        )
    axes[-1].set_xlabel("time step")
    first = pools[0][0]
    fig.suptitle(
        title
        or f"{solution.problem.name or 'plan'}: weight in {first} {solution.weight_placed:,.0f} "
        f"of at most {solution.weight_bound:,.0f} (gap {solution.weight_gap:.1%})"
    )
    return save_figure(fig, path)
