"""The text report: stats, largest free runs, bytes by tag, per-core and per-class figures, and
the monitor's history, as rich tables.

`render_report()` prints to a `rich` console; `report_text()` returns plain text.
Per-class figures appear when the stats carry `size_classes` (pools with slab caches); the
report never invents them.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from npumem.sizes import format_bytes

if TYPE_CHECKING:
    from npumem import PoolStats
    from npumem.monitor.kv_pages import KVPages
    from npumem.monitor.sampler import Alert, Sample
    from npumem.monitor.snapshot import Snapshot
    from npumem.tiers.observe import TierSnapshot

__all__ = ["render_report", "report_json", "report_text", "stats_dict", "tier_report_json"]


def stats_dict(stats: PoolStats | Mapping[str, Any]) -> dict[str, Any]:
    """Stats as a plain dict, from a `PoolStats` or a dict (as snapshots and traces keep)."""
    if isinstance(stats, Mapping):
        return dict(stats)
    return stats.as_dict()


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "-"


def _table(title: str, *, show_header: bool = True) -> Table:
    """A table whose title never wraps (it is at least as wide as its title). The title is
    plain text, never Rich markup: pool names, labels and tags come from files and may hold
    brackets."""
    return Table(
        title=Text(title), title_justify="left", show_header=show_header, min_width=len(title) + 2
    )


def _add_row(table: Table, *cells: str) -> None:
    """Add a row of plain-text cells (never Rich markup, like `_table`'s title)."""
    table.add_row(*(Text(c) for c in cells))


def _stats_table(s: Mapping[str, Any], title: str) -> Table:
    t = _table(title, show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("", justify="right", style="dim")
    usable = s.get("usable_capacity", s.get("capacity", 0))
    peak = s["peak_bytes_in_use"]
    rows: list[tuple[str, str, str]] = [
        ("capacity", format_bytes(s["capacity"]), f"{s['capacity']:,} B"),
        ("usable", format_bytes(usable), f"{usable:,} B"),
        ("bytes in use", format_bytes(s["bytes_in_use"]), _pct(s["bytes_in_use"], usable)),
        ("bytes free", format_bytes(s["bytes_free"]), _pct(s["bytes_free"], usable)),
        *(
            [
                (
                    "cached in slabs",
                    format_bytes(s["slab_cached_bytes"]),
                    _pct(s["slab_cached_bytes"], usable),
                )
            ]
            if "slab_cached_bytes" in s
            else []
        ),
        ("peak bytes in use", format_bytes(peak), _pct(peak, usable)),
    ]
    if "requested_bytes_in_use" in s:
        waste = s["bytes_in_use"] - s["requested_bytes_in_use"]
        rows.append(("rounding waste", format_bytes(waste), _pct(waste, s["bytes_in_use"])))
    largest = s["largest_free_block"]
    rows += [
        ("largest free block", format_bytes(largest), f"{largest:,} B, one allocation"),
        ("external fragmentation", f"{s['external_fragmentation']:.1%}", "1 - largest / free"),
        ("live blocks", f"{s.get('blocks_in_use', 0):,}", ""),
        ("allocations", f"{s.get('alloc_count', 0):,}", ""),
        ("frees", f"{s.get('free_count', 0):,}", ""),
        ("failed allocations", f"{s.get('failed_allocs', 0):,}", "target 0"),
        ("overflow allocations", f"{s.get('overflow_allocs', 0):,}", "served by another core"),
    ]
    if "core_allocs" in s:
        rows.append(
            (
                "served by",
                f"slab {s.get('slab_allocs', 0):,} / core {s['core_allocs']:,} / "
                f"global {s.get('global_allocs', 0):,}",
                "",
            )
        )
    if "chunks" in s:
        rows.append(
            (
                "chunks",
                f"{s['chunks']:,}",
                f"free {s.get('chunks_free', 0)}, cores {s.get('chunks_in_cores', 0)}, "
                f"runs {s.get('chunks_in_runs', 0)}",
            )
        )
    for row in rows:
        _add_row(t, *row)
    return t


def _per_core_table(per_core: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> Table:
    title = "Per core (allocs: buddy and global"
    if s.get("slab_allocs"):
        title += f"; the {s['slab_allocs']:,} slab allocations are not split"
    t = _table(title + ")")
    for col in ("core", "chunks", "in use", "free", "allocs", "frees", "overflow", "failed"):
        t.add_column(col, justify="right")
    for c in per_core:
        _add_row(
            t,
            str(c["core"]),
            f"{c['chunks']:,}",
            format_bytes(c["bytes_in_use"]),
            format_bytes(c["bytes_free"]),
            f"{c['alloc_count']:,}",
            f"{c['free_count']:,}",
            f"{c['overflow_allocs']:,}",
            f"{c['failed_allocs']:,}",
        )
    return t


def _per_class_table(entries: Sequence[Any]) -> Table:
    """Whatever columns the pool reports per size class (dicts, or objects with `as_dict`),
    in its order."""
    classes = [e.as_dict() if hasattr(e, "as_dict") else dict(e) for e in entries]
    t = _table("Per size class")
    columns = list(classes[0].keys()) if classes else []
    for col in columns:
        t.add_column(Text(col.replace("_", " ")), justify="right")
    for row in classes:
        _add_row(t, *(f"{v:,}" if isinstance(v, int) else str(v) for v in row.values()))
    return t


def _shown(shown: int, total: int, what: str) -> str:
    """`"8 of 10 runs"` when a table shows fewer rows than there are, else `"3 runs"`."""
    return f"{shown:,} of {total:,} {what}" if shown < total else f"{total:,} {what}"


def _free_runs_table(snap: Snapshot, top: int) -> Table:
    free = snap.bytes_free
    runs = snap.largest_free_runs(top)
    t = _table(
        f"Largest free runs ({_shown(len(runs), len(snap.free_runs), 'runs')}, "
        f"{format_bytes(free)} free)"
    )
    for col in ("#", "offset", "length", "bytes", "of free"):
        t.add_column(col, justify="right")
    for i, r in enumerate(runs, 1):
        _add_row(
            t,
            str(i),
            f"{r.offset:#x}",
            format_bytes(r.length),
            f"{r.length:,}",
            _pct(r.length, free),
        )
    return t


def _by_tag_table(snap: Snapshot, top: int) -> Table:
    used = snap.bytes_in_blocks
    groups = list(snap.bytes_by("tag").items())
    tags = f", top {top} of {len(groups)} tags" if len(groups) > top else ""
    t = _table(f"Live blocks by tag ({len(snap.blocks):,} blocks{tags})")
    for col, just in (("tag", "left"), ("blocks", "right"), ("bytes", "right"), ("share", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for tag, (n, b) in groups[:top]:
        _add_row(t, tag, f"{n:,}", format_bytes(b), _pct(b, used))
    if len(groups) > top:
        rest = groups[top:]
        _add_row(
            t,
            f"({len(rest)} more)",
            f"{sum(n for _, (n, _) in rest):,}",
            format_bytes(sum(b for _, (_, b) in rest)),
            _pct(sum(b for _, (_, b) in rest), used),
        )
    return t


def _kv_table(k: KVPages) -> Table:
    """A paged KV cache: pages by state, tokens, waste beside vLLM's, bytes saved by sharing."""
    s = k.stats
    counts = k.counts()
    held = counts["exclusive"] + counts["shared"]
    in_use = held * k.page_bytes
    t = _table(f"KV cache {k.tag!r} ({format_bytes(k.page_bytes)} pages)", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("", justify="right", style="dim")
    total = len(k.pages) if s.get("preallocated") else held
    for state in ("exclusive", "shared", "free"):
        if state == "free" and not s.get("preallocated"):
            continue
        n = counts[state]
        _add_row(t, f"pages {state}", f"{n:,}", _pct(n, total))
    waste = int(s.get("waste_bytes", 0))
    saved = int(s.get("shared_saved_bytes", 0))
    for row in (
        ("sequences", f"{s.get('sequences', 0):,}", f"{s.get('tokens', 0):,} tokens"),
        ("KV waste", format_bytes(waste), f"{_pct(waste, in_use)} (vLLM: under 4%)"),
        (
            "saved by sharing",
            format_bytes(saved),
            f"{s.get('pages_logical', 0):,} pages without sharing",
        ),
        (
            "copied on write",
            f"{s.get('copies', 0):,} pages",
            format_bytes(int(s.get("bytes_copied", 0))),
        ),
    ):
        _add_row(t, *row)
    return t


def _history_table(history: Sequence[Sample], alerts: Sequence[Alert]) -> Table:
    t = _table("Over time (monitor)", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    span = history[-1].time - history[0].time
    usages = [s.usage for s in history]
    frags = [s.external_fragmentation for s in history]
    fired = [a for a in alerts if a.firing]
    kinds = sorted({a.kind for a in fired})
    for row in (
        ("samples", f"{len(history):,} over {span:.1f} s"),
        ("usage", f"{min(usages):.1%} to {max(usages):.1%}"),
        ("fragmentation", f"{min(frags):.1%} to {max(frags):.1%}"),
        ("alerts fired", f"{len(fired)}" + (f" ({', '.join(kinds)})" if kinds else "")),
    ):
        _add_row(t, *row)
    return t


def _slab_line(snap: Snapshot) -> str:
    """Slab space without live objects: the unused bytes of slabs that hold objects (the
    snapshot's `slab_cached`, what `slab_cached_bytes` counts). A slab whose objects are all
    free is free space, inside the free runs."""
    return (
        f"slab space without live objects: {format_bytes(snap.bytes_in_slab_caches)} in slabs "
        "that hold objects (cached in slabs); slabs whose objects are all free count as free "
        "space (an allocation takes them back)"
    )


def render_report(
    console: Console,
    *,
    stats: PoolStats | Mapping[str, Any] | None = None,
    snapshot: Snapshot | None = None,
    history: Sequence[Sample] = (),
    alerts: Sequence[Alert] = (),
    title: str = "npumem report",
    top: int = 8,
) -> None:
    """Print the report to `console`. `stats` defaults to the snapshot's; at least one of
    the two is needed."""
    if stats is None:
        if snapshot is None:
            from npumem.errors import InvalidArgumentError

            raise InvalidArgumentError("render_report needs stats or a snapshot")
        stats = snapshot.stats
    s = stats_dict(stats)
    where = f" (snapshot {snapshot.label})" if snapshot is not None and snapshot.label else ""
    console.print(_stats_table(s, f"{title}{where}"))
    if snapshot is not None:
        console.print(_free_runs_table(snapshot, top))
        console.print(
            "[dim]a run: free bytes side by side; one allocation may get less "
            "(the largest free block above)[/]"
        )
        if snapshot.blocks:
            console.print(_by_tag_table(snapshot, top))
        if snapshot.slab_cached:
            console.print(_slab_line(snapshot))
        if snapshot.untracked:
            n = sum(e.length for e in snapshot.untracked)
            console.print(f"untracked allocated bytes (raw API): {format_bytes(n)}")
        for kv in snapshot.kv:
            console.print(_kv_table(kv))
    if s.get("per_core"):
        console.print(_per_core_table(s["per_core"], s))
    classes = s.get("size_classes")
    if classes:
        console.print(_per_class_table(classes))
    else:
        console.print("[dim]per size class: not reported by this pool (no slab caches)[/]")
    if history:
        console.print(_history_table(history, alerts))


def report_text(width: int = 100, **kwargs: Any) -> str:
    """The report as plain text (the keyword arguments of `render_report()`)."""
    out = io.StringIO()
    render_report(Console(file=out, width=width, color_system=None), **kwargs)
    return out.getvalue()


def report_json(snapshot: Snapshot, *, top: int = 10) -> dict[str, Any]:
    """The figures of the report of `snapshot` as a JSON-ready dict (format
    `npumem-report`, version 1): what `npumem report --json` prints. Byte counts are
    integers; handles do not appear."""
    s = stats_dict(snapshot.stats)
    cached = snapshot.bytes_in_slab_caches
    in_use_slabs = min(int(s.get("slab_cached_bytes", 0)), cached)
    return {
        "format": "npumem-report",
        "version": 1,
        "pool": snapshot.pool,
        "label": snapshot.label,
        "time_ns": snapshot.time_ns,
        "stats": s,
        "free_runs": len(snapshot.free_runs),
        "bytes_free": snapshot.bytes_free,
        "largest_free_runs": [
            {"offset": r.offset, "length": r.length} for r in snapshot.largest_free_runs(top)
        ],
        "by_tag": [
            {"tag": tag, "blocks": n, "bytes": b}
            for tag, (n, b) in snapshot.bytes_by("tag").items()
        ],
        "slab_space": {
            "total": cached,
            "in_slabs_with_objects": in_use_slabs,
            "in_empty_slabs": cached - in_use_slabs,
        },
        "untracked_bytes": sum(e.length for e in snapshot.untracked),
    }


def tier_report_json(snapshot: TierSnapshot, *, top: int = 10) -> dict[str, Any]:
    """The figures of the report of a tier snapshot as a JSON-ready dict (format
    `npumem-tier-report`, version 1): what `npumem report --json` prints for one. The tiers'
    figures (`TierStats.as_dict()`), then each tier's pool report (`report_json()`) by tier
    name."""
    return {
        "format": "npumem-tier-report",
        "version": 1,
        "label": snapshot.label,
        "stats": snapshot.stats.as_dict(),
        "tiers": {name: report_json(tier, top=top) for name, tier in snapshot.snapshots.items()},
    }
