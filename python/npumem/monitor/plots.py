"""Pictures (PNG, matplotlib's Agg renderer; the ``plot`` extra): usage and fragmentation over
time, the address map of a snapshot, two maps side by side (before and after a compaction), a
planner solution's offsets, and a trace's live bytes over time.

Every function writes one PNG to ``path`` and returns the path. Figures are made with
matplotlib's object API (no ``pyplot``, no global backend switch), so they are safe from any
thread and leave an interactive session's backend alone.
"""

from __future__ import annotations

import io
import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumem.errors import InvalidArgumentError, MissingDependencyError
from npumem.fileio import write_bytes
from npumem.monitor.kv_pages import PAGE_STATES, page_state
from npumem.sizes import byte_unit, format_bytes

if TYPE_CHECKING:
    from npumem.monitor.sampler import Sample, Thresholds
    from npumem.monitor.snapshot import Snapshot
    from npumem.monitor.trace import Trace
    from npumem.plan import Solution

__all__ = [
    "plot_address_map",
    "plot_before_after",
    "plot_plan",
    "plot_timeline",
    "plot_trace",
]

MIB = 1 << 20
FREE_COLOR = "#d9d9d9"
UNTRACKED_COLOR = "#404040"
SLAB_CACHE_COLOR = "#c7c7c7"  # unused bytes inside slabs: reserved for their size class
KV_PAGE_COLORS = {"free": "#c5b0d5", "exclusive": "#17becf", "shared": "#e377c2"}
MAX_ROWS = 128
DPI = 110


def _mpl() -> Any:
    """``(Figure, PolyCollection, colormaps, numpy)``, or a clear error without the extra."""
    try:
        import matplotlib
        import numpy
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError("pictures need matplotlib: pip install npumem[plot]") from exc
    return Figure, PolyCollection, matplotlib.colormaps, numpy


def _save(fig: Any, path: str | os.PathLike[str]) -> Path:
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    return write_bytes(path, png.getvalue())


# ----- over time -----------------------------------------------------------------------------


def plot_timeline(
    samples: Sequence[Sample],
    path: str | os.PathLike[str],
    *,
    thresholds: Thresholds | None = None,
    title: str = "npumem: memory over time",
) -> Path:
    """Bytes in use, peak and capacity (top) and external fragmentation (bottom) over the
    samples' time; threshold lines when ``thresholds`` is given; red marks where allocations
    failed."""
    if not samples:
        raise InvalidArgumentError("plot_timeline needs at least one sample")
    Figure, _, _, np = _mpl()
    t = np.array([s.time for s in samples])
    t = t - t[0]
    div, unit = _axis_unit(max(s.usable_capacity for s in samples))
    used = np.array([s.bytes_in_use for s in samples]) / div
    peak = np.array([s.peak_bytes_in_use for s in samples]) / div
    cap = samples[-1].usable_capacity / div
    frag = np.array([s.external_fragmentation for s in samples]) * 100
    fig = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.fill_between(t, used, step="post", alpha=0.35, color="tab:blue")
    top.step(t, used, where="post", color="tab:blue", label="bytes in use")
    top.step(t, peak, where="post", color="tab:orange", linestyle="--", label="peak")
    top.axhline(cap, color="black", linewidth=1, label="usable capacity")
    if thresholds is not None and thresholds.usage is not None:
        top.axhline(cap * thresholds.usage, color="tab:red", linestyle=":", label="usage alert")
    failed = [
        s.time - samples[0].time
        for prev, s in itertools.pairwise(samples)
        if s.failed_allocs > prev.failed_allocs
    ]
    for x in failed:
        top.axvline(x, color="tab:red", alpha=0.6)
    top.set_ylabel(unit)
    top.set_ylim(0, cap * 1.05)
    top.legend(loc="upper left", fontsize="small")
    top.set_title(title + (f" ({len(failed)} samples with failed allocations)" if failed else ""))
    bottom.step(t, frag, where="post", color="tab:purple", label="external fragmentation")
    if thresholds is not None and thresholds.fragmentation is not None:
        bottom.axhline(
            thresholds.fragmentation * 100, color="tab:red", linestyle=":", label="alert"
        )
    bottom.set_ylim(0, 100)
    bottom.set_ylabel("fragmentation %")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left", fontsize="small")
    return _save(fig, path)


def plot_trace(trace: Trace, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """A trace over time: bytes live (asked for, from alloc and free events) and live blocks
    (top), allocations per second (bottom); failed allocations in red, moves in green."""
    events = trace.events
    if not events:
        raise InvalidArgumentError("the trace has no events to plot")
    Figure, _, _, np = _mpl()
    t0 = events[0].time_ns
    sizes: dict[int, int] = {}
    live = 0
    times, lives, counts, fails, moves, allocs = [], [], [], [], [], []
    for e in events:
        if e.kind == "alloc":
            sizes[e.handle] = e.size
            live += e.size
            allocs.append(e.time_ns)
        elif e.kind == "free":
            live -= sizes.pop(e.handle, 0)
        elif e.kind == "failed":
            fails.append((e.time_ns - t0) / 1e9)
            continue
        else:
            moves.append((e.time_ns - t0) / 1e9)
            continue
        times.append((e.time_ns - t0) / 1e9)
        lives.append(live)
        counts.append(len(sizes))
    capacity = int(trace.config["capacity"])
    div, unit = _axis_unit(capacity)
    fig = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    x = np.array(times) if times else np.zeros(1)
    y = np.array(lives, dtype=float) / div if lives else np.zeros(1)
    top.step(x, y, where="post", color="tab:blue", label="bytes live (asked for)")
    top.axhline(capacity / div, color="black", linewidth=1, label="capacity")
    for f in fails:
        top.axvline(f, color="tab:red", alpha=0.5)
    for m in moves:
        top.axvline(m, color="tab:green", alpha=0.3)
    top.set_ylabel(unit)
    top.legend(loc="upper left", fontsize="small")
    twin = top.twinx()
    twin.step(
        x,
        np.array(counts) if counts else np.zeros(1),
        where="post",
        color="tab:gray",
        alpha=0.6,
        linewidth=0.8,
    )
    twin.set_ylabel("live blocks")
    span = max((events[-1].time_ns - t0) / 1e9, 1e-9)
    bins = max(1, min(200, len(allocs) // 20 or 1))
    if allocs:
        hist, edges = np.histogram((np.array(allocs) - t0) / 1e9, bins=bins, range=(0, span))
        width = edges[1] - edges[0]
        bottom.bar(edges[:-1], hist / width, width=width, align="edge", color="tab:blue", alpha=0.6)
    bottom.set_ylabel("allocations / s")
    bottom.set_xlabel("seconds")
    c = trace.counts()
    top.set_title(
        title
        or f"trace of {trace.pool!r}: {c['alloc']:,} allocs, {c['free']:,} frees, "
        f"{c['failed']:,} failed, {c['move']:,} moves, {trace.dropped:,} dropped"
    )
    return _save(fig, path)


# ----- address maps --------------------------------------------------------------------------


def _row_bytes(snap: Snapshot) -> int:
    chunk = int(snap.config.get("chunk_size", MIB))
    usable = max(snap.usable_capacity, 1)
    rows = math.ceil(usable / chunk)
    return chunk * math.ceil(rows / MAX_ROWS)


def _segments(offset: int, length: int, row: int) -> list[tuple[int, float, float]]:
    """``(row, start, end)`` pieces of ``[offset, offset + length)`` cut at row boundaries."""
    out = []
    end = offset + length
    while offset < end:
        r = offset // row
        stop = min(end, (r + 1) * row)
        out.append((r, float(offset - r * row), float(stop - r * row)))
        offset = stop
    return out


def _palette(snaps: Sequence[Snapshot], color_by: str) -> dict[str, Any]:
    """Colours for the largest groups (by bytes over all ``snaps``), so maps drawn side by side
    agree; the rest share one colour."""
    _, _, colormaps, _ = _mpl()
    totals: dict[str, int] = {}
    for snap in snaps:
        for name, (_, nbytes) in snap.bytes_by(color_by).items():
            totals[name] = totals.get(name, 0) + nbytes
    order = sorted(totals, key=lambda k: (-totals[k], k))[:18]
    palette = colormaps["tab20"]
    return {name: palette(i % 20) for i, name in enumerate(order)}


def _draw_map(
    ax: Any, snap: Snapshot, color_by: str, title: str, legend: bool, colors: dict[str, Any]
) -> None:
    _, PolyCollection, _, _ = _mpl()
    row = _row_bytes(snap)
    rows = max(1, math.ceil(snap.usable_capacity / row))
    div, unit = _axis_unit(row)
    groups: dict[str, list[Any]] = {}
    shown = list(colors)
    colors = dict(colors)
    other = "(other tags)" if color_by == "tag" else "(other cores)"
    colors[other] = "#8c564b"

    def rect(r: int, x0: float, x1: float) -> list[tuple[float, float]]:
        return [(x0 / div, r), (x1 / div, r), (x1 / div, r + 0.9), (x0 / div, r + 0.9)]

    # Paged KV caches: their pages by state instead of their tag's colour.
    kv_tags = {k.tag for k in snap.kv} if color_by == "tag" else set()
    kv_groups: dict[str, list[Any]] = {}
    for k in snap.kv if kv_tags else ():
        for offset, refs in k.pages:
            kv_groups.setdefault(f"KV page, {page_state(refs)}", []).extend(
                rect(r, x0, x1) for r, x0, x1 in _segments(offset, k.page_bytes, row)
            )
    for b in snap.blocks:
        label = (b.tag or "(no tag)") if color_by == "tag" else f"core {b.core}"
        if label in kv_tags:
            continue
        if label not in colors:
            label = other
        groups.setdefault(label, []).extend(
            rect(r, x0, x1) for r, x0, x1 in _segments(b.offset, b.block_bytes, row)
        )
    min_width = row / 1200  # a one-pixel hole stays visible
    free: list[Any] = []
    for e in snap.free_runs:
        for r, x0, x1 in _segments(e.offset, e.length, row):
            free.append(rect(r, x0, max(x1, x0 + min_width)))
    untracked = [
        rect(r, x0, x1) for e in snap.untracked for r, x0, x1 in _segments(e.offset, e.length, row)
    ]
    cached = [
        rect(r, x0, x1)
        for e in snap.slab_cached
        for r, x0, x1 in _segments(e.offset, e.length, row)
    ]
    handles = []
    from matplotlib.patches import Patch

    for label, verts, color in (
        [(lbl, groups[lbl], colors[lbl]) for lbl in [*shown, other] if lbl in groups]
        + [
            (label, kv_groups.get(label, []), KV_PAGE_COLORS[state])
            for state in PAGE_STATES
            for label in [f"KV page, {state}"]
        ]
        + [
            ("free", free, FREE_COLOR),
            ("slab cache", cached, SLAB_CACHE_COLOR),
            ("untracked", untracked, UNTRACKED_COLOR),
        ]
    ):
        if not verts:
            continue
        outline = label not in ("free", "slab cache", "untracked") and len(snap.blocks) <= 4000
        ax.add_collection(
            PolyCollection(
                verts,
                facecolors=color,
                edgecolors="white" if outline else "none",
                linewidths=0.3 if outline else 0,
            )
        )
        handles.append(Patch(facecolor=color, label=label))
    tail = snap.usable_capacity - (rows - 1) * row
    if tail < row:
        ax.add_collection(
            PolyCollection(
                [rect(rows - 1, tail, row)], facecolors="white", hatch="//", edgecolors="#bbbbbb"
            )
        )
    ax.set_xlim(0, row / div)
    ax.set_ylim(rows, 0)
    ax.set_xlabel(f"offset within row ({unit})")
    ax.set_ylabel(f"row ({_short(row)} each)")
    step = max(1, rows // 8)
    ax.set_yticks([r + 0.45 for r in range(0, rows, step)])
    ax.set_yticklabels([_short(r * row) for r in range(0, rows, step)], fontsize="small")
    s = snap.stats
    ax.set_title(
        f"{title}\n{len(snap.blocks):,} blocks, {_short(s['bytes_in_use'])} in use, "
        f"{len(snap.free_runs):,} free runs, fragmentation {s['external_fragmentation']:.1%}",
        fontsize="medium",
    )
    if legend and handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")


def _axis_unit(n: float) -> tuple[int, str]:
    """The unit of an axis that reaches ``n`` bytes (ticks of at least 4 units)."""
    return byte_unit(n, at_least=4)


def _short(n: int) -> str:
    """Byte counts for labels: ``2 MiB``, ``1.5 GiB``."""
    return format_bytes(n, short=True)


def _check_color_by(color_by: str) -> None:
    if color_by not in ("tag", "core"):
        raise InvalidArgumentError(f"color_by must be 'tag' or 'core', got {color_by!r}")


def plot_address_map(
    snapshot: Snapshot,
    path: str | os.PathLike[str],
    *,
    color_by: str = "tag",
    title: str | None = None,
) -> Path:
    """The arena of ``snapshot`` as rows of addresses (one chunk per row, or several when the
    arena is large): blocks coloured by tag or core, free runs in grey (at least one pixel
    wide, so every hole shows), untracked bytes dark. By tag, the pages of paged KV caches in the
    snapshot (``Snapshot.with_kv``) are coloured by state: free, exclusive, shared."""
    _check_color_by(color_by)
    Figure, _, _, _ = _mpl()
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax = fig.subplots()
    label = f" ({snapshot.label})" if snapshot.label else ""
    title = title or f"address map of {snapshot.pool!r}{label}"
    _draw_map(ax, snapshot, color_by, title, True, _palette([snapshot], color_by))
    return _save(fig, path)


def plot_before_after(
    before: Snapshot,
    after: Snapshot,
    path: str | os.PathLike[str],
    *,
    color_by: str = "tag",
    titles: tuple[str, str] = ("before", "after"),
) -> Path:
    """Two address maps side by side (before and after a compaction, or any two moments of
    one pool)."""
    _check_color_by(color_by)
    Figure, _, _, _ = _mpl()
    fig = Figure(figsize=(16, 7), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=False)
    colors = _palette([before, after], color_by)
    _draw_map(left, before, color_by, titles[0], False, colors)
    _draw_map(right, after, color_by, titles[1], True, colors)
    return _save(fig, path)


# ----- planner -------------------------------------------------------------------------------


def plot_plan(
    solution: Solution, path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """A planner solution: every buffer as a rectangle, its live range across (time steps) and
    its bytes up (offsets); lines at the arena size and the lower bound."""
    Figure, PolyCollection, colormaps, _ = _mpl()
    buffers = solution.problem.buffers
    if not buffers:
        raise InvalidArgumentError("the solution has no buffers to plot")
    div, unit = _axis_unit(max(solution.arena_size, 1))
    verts = []
    for b in buffers:
        lo = solution.offsets[b.id] / div
        hi = (solution.offsets[b.id] + b.size) / div
        verts.append([(b.lower, lo), (b.upper, lo), (b.upper, hi), (b.lower, hi)])
    palette = colormaps["tab20"]
    colors = [palette(i % 20) for i in range(len(buffers))]
    fig = Figure(figsize=(11, 6), layout="constrained")
    ax = fig.subplots()
    ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="black", linewidths=0.3))
    end = max(b.upper for b in buffers)
    start = min(b.lower for b in buffers)
    ax.axhline(solution.arena_size / div, color="black", linewidth=1, label="arena")
    ax.axhline(solution.lower_bound / div, color="tab:red", linestyle="--", label="lower bound")
    ax.set_xlim(start, end)
    ax.set_ylim(0, solution.arena_size / div * 1.05)
    ax.set_xlabel("time step")
    ax.set_ylabel(f"offset ({unit})")
    ax.legend(loc="upper right", fontsize="small")
    name = solution.problem.name or "plan"
    ax.set_title(
        title
        or f"{name}: {len(buffers)} buffers, arena {_short(solution.arena_size)} "
        f"(lower bound {_short(solution.lower_bound)}, gap {solution.gap:.1%}, "
        f"no reuse {_short(solution.naive_size)})"
    )
    return _save(fig, path)
