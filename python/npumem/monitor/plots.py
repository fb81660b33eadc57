"""Pictures (matplotlib; the `plot` extra): usage and fragmentation over time, the address
map of a snapshot (by tag, or by core with the owner of every chunk), two maps side by side
with what moved marked (before and after a compaction), a planner solution's offsets, and a
trace's live bytes over time.

Every function writes one picture to `path` and returns the path. The extension picks the
format: `.png`, `.svg` or `.pdf`; any other extension is refused before anything is
drawn. A tag has the same colour in every picture (`npumem.monitor.colors`), and every
legend names every colour and line the picture uses. Figures are made with matplotlib's object
API (no `pyplot`, no global backend switch), so they are safe from any thread and leave an
interactive session's backend alone.
"""

from __future__ import annotations

import bisect
import io
import itertools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from npumem._shown import shown
from npumem.errors import InvalidArgumentError, MissingDependencyError
from npumem.fileio import write_bytes
from npumem.monitor._mplconfig import use_writable_config_dir
from npumem.monitor.colors import (
    FREE_COLOR,
    NO_TAG,
    SLAB_CACHE_COLOR,
    UNTRACKED_COLOR,
    core_color,
    tag_color,
)
from npumem.monitor.kv_pages import PAGE_STATES, page_state
from npumem.sizes import byte_unit, format_bytes

if TYPE_CHECKING:
    from npumem.monitor.sampler import Sample, Thresholds
    from npumem.monitor.snapshot import BlockRecord, Snapshot
    from npumem.monitor.trace import Trace
    from npumem.plan import Solution

__all__ = [
    "chunk_owners",
    "moved_blocks",
    "picture_format",
    "plot_address_map",
    "plot_before_after",
    "plot_plan",
    "plot_timeline",
    "plot_trace",
    "save_figure",
]

MIB = 1 << 20
KV_PAGE_COLORS = {"free": "#c5b0d5", "exclusive": "#17becf", "shared": "#e377c2"}
"""Pages of paged KV caches, by state (address maps by tag)."""
MAX_ROWS = 128
DPI = 110
FORMATS = {".png": "png", ".svg": "svg", ".pdf": "pdf"}
"""Picture formats by file extension."""
GLOBAL_RUN_COLOR = "#2f2f2f"
GLOBAL_LABEL = "global run (chunks of the global pool)"
MOVED_EDGE = "#d62728"


def picture_format(path: str | os.PathLike[str]) -> str:
    """The format of the picture `path` names (`png`, `svg` or `pdf`, from its
    extension); `InvalidArgumentError` for any other extension."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InvalidArgumentError(
            f"{os.fspath(path)}: cannot write a picture with extension {suffix or '(none)'!r}: "
            "use .png, .svg or .pdf"
        )
    return FORMATS[suffix]


def _mpl() -> Any:
    """`(Figure, PolyCollection, colormaps, numpy)`, or a clear error without the extra."""
    use_writable_config_dir()
    try:
        import matplotlib
        import numpy
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError("pictures need matplotlib: pip install npumem[plot]") from exc
    return Figure, PolyCollection, matplotlib.colormaps, numpy


MAX_TEXT_LINE = 120
"""The most characters a line of text in a picture shows: a longer line (a pool name, a label
or a tag from a file) is cut and ends in an ellipsis. Laying out a line costs time that grows
faster than its length, and nobody reads a line wider than the picture."""


def shorten(text: str, limit: int = MAX_TEXT_LINE) -> str:
    """`text` with every line longer than `limit` characters cut to `limit`, the last one an
    ellipsis."""
    if len(text) <= limit:
        return text
    return "\n".join(
        line if len(line) <= limit else line[: limit - 1] + "\u2026" for line in text.split("\n")
    )


def save_figure(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Write `fig` to `path` in the format its extension names (`picture_format`), the same
    bytes for the same picture; returns the path. Every text is drawn as it is: pool names,
    labels and tags come from files, and matplotlib would read `$...$` in them as math; a line
    longer than `MAX_TEXT_LINE` characters is shortened (`shorten()`)."""
    use_writable_config_dir()
    import matplotlib
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_parse_math(False)
        content = text.get_text()
        if len(content) > MAX_TEXT_LINE:
            text.set_text(shorten(content))
    data = io.BytesIO()
    # SVG keeps its text as text (searchable, smaller) rather than as outlines.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(data, format=picture_format(path), dpi=DPI, metadata=_metadata(path))
    return write_bytes(path, data.getvalue())


def _metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Metadata without a date, so the same picture gives the same bytes."""
    fmt = picture_format(path)
    if fmt == "svg":
        return {"Date": None}
    if fmt == "pdf":
        return {"CreationDate": None, "ModDate": None}
    return {}


# ----- over time -----------------------------------------------------------------------------


def plot_timeline(
    samples: Sequence[Sample],
    path: str | os.PathLike[str],
    *,
    thresholds: Thresholds | None = None,
    title: str = "npumem: memory over time",
) -> Path:
    """Bytes in use, peak and capacity (top) and external fragmentation (bottom) over the
    samples' time; threshold lines when `thresholds` is given; red marks where allocations
    failed."""
    if not samples:
        raise InvalidArgumentError("plot_timeline needs at least one sample")
    picture_format(path)
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
    for i, x in enumerate(failed):
        top.axvline(x, color="tab:red", alpha=0.6, label="failed allocations" if i == 0 else None)
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
    return save_figure(fig, path)


def plot_trace(trace: Trace, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """A trace over time: bytes live (asked for, from alloc and free events) and live blocks
    (top), allocations per second (bottom); failed allocations in red, moves in green."""
    events = trace.events
    if not events:
        raise InvalidArgumentError("the trace has no events to plot")
    picture_format(path)
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
    span = max((events[-1].time_ns - t0) / 1e9, 1e-9)
    # One collection of lines each, at most one line per 1/2000 of the time axis (less than
    # a pixel apart, they would look the same): a trace with a hundred thousand failures made
    # as many line artists and took minutes to draw.
    for times_of, color, alpha, label in (
        (_thin(fails, span / _LINES_ACROSS), "tab:red", 0.5, "failed allocation"),
        (
            _thin(_compactions(moves), span / _LINES_ACROSS),
            "tab:green",
            0.6,
            "compaction (blocks moved)",
        ),
    ):
        if times_of:
            top.vlines(
                times_of,
                0,
                1,
                transform=top.get_xaxis_transform(),
                color=color,
                alpha=alpha,
                label=label,
            )
    top.set_ylabel(unit)
    twin = top.twinx()
    twin.step(
        x,
        np.array(counts) if counts else np.zeros(1),
        where="post",
        color="tab:gray",
        alpha=0.6,
        linewidth=0.8,
        label="live blocks (right axis)",
    )
    twin.set_ylabel("live blocks")
    lines, labels = top.get_legend_handles_labels()
    more_lines, more_labels = twin.get_legend_handles_labels()
    top.legend(lines + more_lines, labels + more_labels, loc="upper left", fontsize="small")
    bins = max(1, min(200, len(allocs) // 20 or 1))
    if allocs:
        hist, edges = np.histogram((np.array(allocs) - t0) / 1e9, bins=bins, range=(0, span))
        width = edges[1] - edges[0]
        bottom.bar(
            edges[:-1],
            hist / width,
            width=width,
            align="edge",
            color="tab:blue",
            alpha=0.6,
            label="allocations per second",
        )
        bottom.legend(loc="upper left", fontsize="small")
    bottom.set_ylabel("allocations / s")
    bottom.set_xlabel("seconds")
    c = trace.counts()
    top.set_title(
        title
        or f"trace of {trace.pool!r}: {c['alloc']:,} allocs, {c['free']:,} frees, "
        f"{c['failed']:,} failed, {c['move']:,} moves, {trace.dropped:,} dropped"
        + (f", {trace.discarded:,} discarded" if trace.discarded else "")
    )
    return save_figure(fig, path)


_LINES_ACROSS = 2000
"""Vertical lines a trace's picture draws at most across its time axis."""


def _thin(times: Sequence[float], step: float) -> list[float]:
    """`times` in order, leaving out each that is less than `step` after the last one kept."""
    out: list[float] = []
    for t in sorted(times):
        if not out or t - out[-1] >= step:
            out.append(t)
    return out


def _compactions(moves: Sequence[float], gap: float = 1e-3) -> list[float]:
    """The first time of each group of moves less than `gap` seconds apart."""
    out: list[float] = []
    last = -math.inf
    for t in sorted(moves):
        if t - last > gap:
            out.append(t)
        last = t
    return out


# ----- address maps --------------------------------------------------------------------------


def _extent(snap: Snapshot) -> int:
    """The offsets the map shows: the usable arena, or up to the last region of a pool that
    grew."""
    return max([snap.usable_capacity, *(r.end for r in snap.regions)])


def _absent(snap: Snapshot) -> list[tuple[int, int]]:
    """`(offset, length)` of the bytes between regions (no memory behind them)."""
    gaps, at = [], 0
    for r in snap.regions:
        if r.offset > at:
            gaps.append((at, r.offset - at))
        at = max(at, r.end)
    return gaps


def _row_bytes(snap: Snapshot) -> int:
    chunk = _chunk_size(snap)
    usable = max(_extent(snap), 1)
    rows = math.ceil(usable / chunk)
    return chunk * math.ceil(rows / MAX_ROWS)


def _chunk_size(snap: Snapshot) -> int:
    return int(snap.config.get("chunk_size", MIB))


def _segments(offset: int, length: int, row: int) -> list[tuple[int, float, float]]:
    """`(row, start, end)` pieces of `[offset, offset + length)` cut at row boundaries."""
    out = []
    end = offset + length
    while offset < end:
        r = offset // row
        stop = min(end, (r + 1) * row)
        out.append((r, float(offset - r * row), float(stop - r * row)))
        offset = stop
    return out


def _label(block: BlockRecord, color_by: str) -> str:
    if color_by == "tag":
        return block.tag if block.tag is not None else NO_TAG
    return f"core {block.core}"


def _color(label: str, color_by: str) -> str:
    if color_by == "tag":
        return tag_color(None if label == NO_TAG else label)
    return core_color(int(label.split()[1]))


def chunk_owners(snap: Snapshot) -> dict[int, int | str]:
    """The owner of every chunk that holds a live block: the core pool whose blocks lie in it,
    or `"global"` for a chunk of a run (a block of a chunk or more, served by the global
    pool). Chunks without a live block are left out: a free chunk may sit in a core's reserve
    or in the global pool, which a snapshot does not record."""
    owners: dict[int, int | str] = {}
    for first, last in _global_chunks(snap):
        for c in range(first, last + 1):
            owners[c] = "global"
    owners.update(_core_chunks(snap))
    return owners


def _global_chunks(snap: Snapshot) -> list[tuple[int, int]]:
    """`(first, last)` chunks of the runs of the global pool (blocks of a chunk or more, or
    across chunks), in order and merged."""
    chunk = _chunk_size(snap)
    spans = sorted(
        (b.offset // chunk, (b.end - 1) // chunk)
        for b in snap.blocks
        if b.block_bytes >= chunk or b.offset // chunk != (b.end - 1) // chunk
    )
    merged: list[tuple[int, int]] = []
    for first, last in spans:
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _core_chunks(snap: Snapshot) -> dict[int, int]:
    """The chunks of core pools that hold a live block, and their core (see
    `chunk_owners()`): at most one entry per block, however large the arena."""
    chunk = _chunk_size(snap)
    runs = _global_chunks(snap)
    starts = [first for first, _ in runs]
    owners: dict[int, int] = {}
    for b in snap.blocks:
        c = b.offset // chunk
        if b.block_bytes >= chunk or c != (b.end - 1) // chunk:
            continue
        i = bisect.bisect_right(starts, c) - 1
        if i < 0 or runs[i][1] < c:
            owners.setdefault(c, b.core)
    return owners


def _split_by_core(
    offset: int, length: int, chunk: int, owned: Sequence[int], owners: dict[int, int]
) -> list[tuple[int | None, int, int]]:
    """`(core or None, offset, length)` pieces of a free run: the parts in chunks of a core
    pool (`owned`: their indexes, in order), and the parts between them."""
    end = offset + length
    pieces: list[tuple[int | None, int, int]] = []
    at = offset
    i = bisect.bisect_left(owned, offset // chunk)
    while i < len(owned) and owned[i] * chunk < end:
        c = owned[i]
        start, stop = max(offset, c * chunk), min(end, (c + 1) * chunk)
        if start > at:
            pieces.append((None, at, start - at))
        pieces.append((owners[c], start, stop - start))
        at = stop
        i += 1
    if at < end:
        pieces.append((None, at, end - at))
    return pieces


def _draw_map(
    ax: Any,
    snap: Snapshot,
    color_by: str,
    title: str,
    *,
    moved: frozenset[int] = frozenset(),
    moved_from: Sequence[BlockRecord] = (),
) -> list[Any]:
    """Draw `snap` on `ax`; returns the legend handles of everything drawn. `moved`: the
    handles of blocks to outline as moved; `moved_from`: old places of moved blocks."""
    _, PolyCollection, _, _ = _mpl()
    from matplotlib.patches import Patch

    row = _row_bytes(snap)
    rows = max(1, math.ceil(_extent(snap) / row))
    div, unit = _axis_unit(row)
    by_core = color_by == "core"
    chunk = _chunk_size(snap)
    core_chunks = _core_chunks(snap) if by_core else {}
    global_starts = [c * chunk for c, _ in _global_chunks(snap)] if by_core else []
    global_ends = [(c + 1) * chunk for _, c in _global_chunks(snap)] if by_core else []
    owned = sorted(core_chunks)

    def in_global_run(offset: int) -> bool:
        i = bisect.bisect_right(global_starts, offset) - 1
        return i >= 0 and offset < global_ends[i]

    def rect(r: int, x0: float, x1: float, y0: float = 0.0, y1: float = 0.9) -> Any:
        return [(x0 / div, r + y0), (x1 / div, r + y0), (x1 / div, r + y1), (x0 / div, r + y1)]

    groups: dict[str, list[Any]] = {}
    outlined: list[Any] = []
    # Paged KV caches: their pages by state instead of their tag's colour.
    kv_tags = {k.tag for k in snap.kv} if color_by == "tag" else set()
    kv_groups: dict[str, list[Any]] = {}
    for k in snap.kv if kv_tags else ():
        for offset, refs in k.pages:
            kv_groups.setdefault(f"KV page, {page_state(refs)}", []).extend(
                rect(r, x0, x1) for r, x0, x1 in _segments(offset, k.page_bytes, row)
            )
    for b in snap.blocks:
        pieces = [rect(r, x0, x1) for r, x0, x1 in _segments(b.offset, b.block_bytes, row)]
        label = _label(b, color_by)
        if label in kv_tags:
            continue
        if by_core and in_global_run(b.offset):
            label = GLOBAL_LABEL
        groups.setdefault(label, []).extend(pieces)
        if b.handle in moved:
            outlined.extend(pieces)
    min_width = row / 1200  # a one-pixel hole stays visible
    free: list[Any] = []
    free_in_core: dict[int, list[Any]] = {}
    for e in snap.free_runs:
        pieces = (
            _split_by_core(e.offset, e.length, chunk, owned, core_chunks)
            if by_core
            else [(None, e.offset, e.length)]
        )
        for owner, start, length in pieces:
            into = free if owner is None else free_in_core.setdefault(owner, [])
            into.extend(
                rect(r, y0, max(y1, y0 + min_width)) for r, y0, y1 in _segments(start, length, row)
            )
    untracked = [
        rect(r, x0, x1) for e in snap.untracked for r, x0, x1 in _segments(e.offset, e.length, row)
    ]
    cached = [
        rect(r, x0, x1)
        for e in snap.slab_cached
        for r, x0, x1 in _segments(e.offset, e.length, row)
    ]
    handles: list[Any] = []
    outline = len(snap.blocks) <= 4000
    order = sorted(groups, key=lambda k: (-len(groups[k]), k))
    if by_core:
        order = sorted(groups, key=lambda k: (k == GLOBAL_LABEL, k))
    for label in order:
        color = GLOBAL_RUN_COLOR if label == GLOBAL_LABEL else _color(label, color_by)
        ax.add_collection(
            PolyCollection(
                groups[label],
                facecolors=color,
                edgecolors="white" if outline else "none",
                linewidths=0.3 if outline else 0,
            )
        )
        handles.append(Patch(facecolor=color, label=label))
    for state in PAGE_STATES:
        label = f"KV page, {state}"
        if kv_groups.get(label):
            color = KV_PAGE_COLORS[state]
            ax.add_collection(PolyCollection(kv_groups[label], facecolors=color, edgecolors="none"))
            handles.append(Patch(facecolor=color, label=label))
    for core, verts in sorted(free_in_core.items()):
        color = core_color(core)
        ax.add_collection(PolyCollection(verts, facecolors=color, alpha=0.25, edgecolors="none"))
        handles.append(Patch(facecolor=color, alpha=0.25, label=f"free in a chunk of core {core}"))
    for label, verts, color in (
        ("free" if not by_core else "free (chunk of no core seen)", free, FREE_COLOR),
        ("cached in slabs (free objects)", cached, SLAB_CACHE_COLOR),
        ("untracked (raw API)", untracked, UNTRACKED_COLOR),
    ):
        if verts:
            ax.add_collection(PolyCollection(verts, facecolors=color, edgecolors="none"))
            handles.append(Patch(facecolor=color, label=label))
    if moved_from:
        old = [
            rect(r, x0, x1)
            for b in moved_from
            for r, x0, x1 in _segments(b.offset, b.block_bytes, row)
        ]
        ax.add_collection(
            PolyCollection(
                old, facecolors="none", edgecolors=MOVED_EDGE, hatch="xxx", linewidths=0.8
            )
        )
        handles.append(
            Patch(facecolor="none", edgecolor=MOVED_EDGE, hatch="xxx", label="moved away from")
        )
    if outlined:
        ax.add_collection(
            PolyCollection(outlined, facecolors="none", edgecolors=MOVED_EDGE, linewidths=1.4)
        )
        handles.append(
            Patch(facecolor="none", edgecolor=MOVED_EDGE, linewidth=1.4, label="moved here")
        )
    absent = [rect(r, x0, x1) for o, n in _absent(snap) for r, x0, x1 in _segments(o, n, row)]
    if absent:
        ax.add_collection(
            PolyCollection(absent, facecolors="white", hatch="..", edgecolors="#bbbbbb")
        )
        handles.append(
            Patch(facecolor="white", edgecolor="#bbbbbb", hatch="..", label="between regions")
        )
    tail = _extent(snap) - (rows - 1) * row
    if tail < row:
        ax.add_collection(
            PolyCollection(
                [rect(rows - 1, tail, row)],
                facecolors="white",
                hatch="//",
                edgecolors="#bbbbbb",
            )
        )
        handles.append(
            Patch(facecolor="white", edgecolor="#bbbbbb", hatch="//", label="past the arena")
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
        f"{title}\n{len(snap.blocks):,} blocks, {_short(s.bytes_in_use)} in use, "
        f"{len(snap.free_runs):,} free runs, largest free {_short(s.largest_free_block)}, "
        f"fragmentation {s.external_fragmentation:.1%}",
        fontsize="medium",
    )
    return handles


def _legend(ax: Any, handles: Sequence[Any]) -> None:
    if handles:
        ax.legend(
            handles=list(handles),
            loc="upper left",
            bbox_to_anchor=(1.01, 1),
            fontsize="small",
            ncols=1 if len(handles) <= 30 else 2,
        )


def _axis_unit(n: float) -> tuple[int, str]:
    """The unit of an axis that reaches `n` bytes (ticks of at least 4 units)."""
    return byte_unit(n, at_least=4)


def _short(n: int) -> str:
    """Byte counts for labels: `2 MiB`, `1.5 GiB`."""
    return format_bytes(n, short=True)


def _check_color_by(color_by: str) -> None:
    if color_by not in ("tag", "core"):
        raise InvalidArgumentError(f"color_by must be 'tag' or 'core', got {shown(color_by)}")


def plot_address_map(
    snapshot: Snapshot,
    path: str | os.PathLike[str],
    *,
    color_by: Literal["tag", "core"] = "tag",
    title: str | None = None,
) -> Path:
    """The arena of `snapshot` as rows of addresses (one chunk per row, or several when the
    arena is large): blocks coloured by tag or by core, free runs in light grey (at least one
    pixel wide, so every hole shows), bytes cached in slabs in mid grey, untracked bytes dark.
    By tag, the pages of paged KV caches in the snapshot (`Snapshot.with_kv`) are coloured by
    state: free, exclusive, shared. By core, the chunks show their owner: blocks of a core pool
    in the core's colour, free bytes of its chunks in a light tint of it, runs of the global
    pool in dark grey (see `chunk_owners()`)."""
    _check_color_by(color_by)
    picture_format(path)
    Figure, _, _, _ = _mpl()
    fig = Figure(figsize=(11, 7), layout="constrained")
    ax = fig.subplots()
    label = f" ({snapshot.label})" if snapshot.label else ""
    what = "by tag" if color_by == "tag" else "by core, with the owner of every chunk"
    title = title or f"address map of {snapshot.pool!r}{label}, {what}"
    _legend(ax, _draw_map(ax, snapshot, color_by, title))
    return save_figure(fig, path)


def moved_blocks(before: Snapshot, after: Snapshot) -> list[tuple[BlockRecord, BlockRecord]]:
    """`(old, new)` records of every block that is in both snapshots at different offsets
    (a block keeps its handle when it moves)."""
    old = {b.handle: b for b in before.blocks}
    return [
        (old[b.handle], b)
        for b in after.blocks
        if b.handle in old and old[b.handle].offset != b.offset
    ]


def plot_before_after(
    before: Snapshot,
    after: Snapshot,
    path: str | os.PathLike[str],
    *,
    color_by: Literal["tag", "core"] = "tag",
    titles: tuple[str, str] = ("before", "after"),
) -> Path:
    """Two address maps side by side (before and after a compaction, or any two moments of
    one pool). Blocks that moved are outlined in red where they are after, and their old
    places are hatched red before; the headline says how many moved and what the largest
    free block became."""
    _check_color_by(color_by)
    picture_format(path)
    Figure, _, _, _ = _mpl()
    fig = Figure(figsize=(16, 7), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=False)
    moves = moved_blocks(before, after)
    moved = frozenset(new.handle for _, new in moves)
    nbytes = sum(new.block_bytes for _, new in moves)
    a = _draw_map(left, before, color_by, titles[0], moved_from=[old for old, _ in moves])
    b = _draw_map(right, after, color_by, titles[1], moved=moved)
    unique: dict[str, Any] = {}
    for h in a + b:
        unique.setdefault(h.get_label(), h)
    _legend(right, list(unique.values()))
    s0, s1 = before.stats, after.stats
    what = f"{len(moves):,} blocks moved ({_short(nbytes)})" if moves else "no block moved"
    fig.suptitle(
        f"{what}; largest free block "
        f"{_short(s0.largest_free_block)} -> {_short(s1.largest_free_block)}, "
        f"fragmentation {s0.external_fragmentation:.1%} -> {s1.external_fragmentation:.1%}",
    )
    return save_figure(fig, path)


# ----- planner -------------------------------------------------------------------------------


def plot_plan(
    solution: Solution,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    name: str | None = None,
) -> Path:
    """A planner solution: every buffer as a rectangle, its live range across (time steps) and
    its bytes up (offsets); lines at the arena size and the lower bound. The default title
    starts with `name` (default: the problem's name) and gives the figures of the plan."""
    picture_format(path)
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
    ax.add_collection(
        PolyCollection(
            verts,
            facecolors=colors,
            edgecolors="black",
            linewidths=0.3,
            label=f"buffers ({len(buffers)}; colours tell neighbours apart)",
        )
    )
    end = max(b.upper for b in buffers)
    start = min(b.lower for b in buffers)
    ax.axhline(solution.arena_size / div, color="black", linewidth=1, label="arena")
    ax.axhline(solution.lower_bound / div, color="tab:red", linestyle="--", label="lower bound")
    ax.set_xlim(start, end)
    ax.set_ylim(0, solution.arena_size / div * 1.05)
    ax.set_xlabel("time step")
    ax.set_ylabel(f"offset ({unit})")
    ax.legend(loc="upper right", fontsize="small")
    name = name or solution.problem.name or "plan"
    ax.set_title(
        title
        or f"{name}: {len(buffers)} buffers, arena {_short(solution.arena_size)} "
        f"(lower bound {_short(solution.lower_bound)}, gap {solution.gap:.1%}, "
        f"no reuse {_short(solution.naive_size)})"
    )
    return save_figure(fig, path)
