"""Seeing the tiers: a snapshot of every tier at one moment (`TierSnapshot`), saved and
read back as JSON, and the text report of the tiers (`render_tiers`,
`tiers_report_text`).

A tier snapshot holds the tiered pool's `TierStats` and one
`npumem.monitor.Snapshot` per pool, labelled with its tier (`fast[0]`, `slow`), so
every picture and report of a pool snapshot works on each tier.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from npumem._shown import shown
from npumem.fileio import write_json
from npumem.monitor._files import Reader, read_json
from npumem.monitor.errors import FileFormatError
from npumem.monitor.snapshot import Snapshot
from npumem.sizes import format_bytes
from npumem.tiers.block import FAST, SLOW, Tier
from npumem.tiers.report import TierStats, TierUsage

__all__ = [
    "TIER_SNAPSHOT_FORMAT",
    "TierSnapshot",
    "is_tier_snapshot",
    "is_tier_snapshot_obj",
    "load_tier_snapshot",
    "render_tiers",
    "tiers_report_text",
]

TIER_SNAPSHOT_FORMAT = "npumem-tier-snapshot"
TIER_SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class TierSnapshot:
    """Every tier of a tiered pool at one moment (`mem.snapshot()`)."""

    stats: TierStats
    snapshots: dict[str, Snapshot]
    """One pool snapshot per tier, by tier name (`fast[0]`, ..., `slow`)."""
    label: str = ""

    # Compared by value, but not hashable (`snapshots` is a dict): `hash()` names this class.
    __hash__ = None  # type: ignore[assignment]

    def to_json_obj(self) -> dict[str, Any]:
        """The snapshot as a JSON-ready dict (format `npumem-tier-snapshot`, version 1)."""
        return {
            "format": TIER_SNAPSHOT_FORMAT,
            "version": TIER_SNAPSHOT_VERSION,
            "label": self.label,
            "stats": self.stats.as_dict(),
            "tiers": {name: snap.to_json_obj() for name, snap in self.snapshots.items()},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the snapshot as JSON to `path`; returns the path."""
        return write_json(path, self.to_json_obj())

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any], *, where: str = "tier snapshot") -> TierSnapshot:
        """Read a dict made by `to_json_obj`; `FileFormatError` says what is
        wrong."""
        r = Reader(where)
        r.header(obj, TIER_SNAPSHOT_FORMAT, (TIER_SNAPSHOT_VERSION,))
        s = r.field(obj, "stats", dict)
        st = Reader(f"{where}: stats")
        fast = tuple(
            _usage(where, t, f"stats.fast[{i}]", Tier(FAST, i))
            for i, t in enumerate(st.field(s, "fast", list))
        )
        stats = TierStats(
            st.field(s, "policy", str),
            fast,
            _usage(where, st.field(s, "slow", dict), "stats.slow", Tier(SLOW)),
            st.count(st.field(s, "accesses", int), "accesses"),
            st.count(s.get("bytes_accessed", 0), "bytes_accessed"),
        )
        rows = (*stats.fast, stats.slow)
        for total, part, what in (
            ("accesses", "hits", "hits"),
            ("bytes_accessed", "hit_bytes", "hit bytes"),
        ):
            served = sum(getattr(t, part) for t in rows)
            if served > getattr(stats, total):
                raise r.fail(
                    f"the tiers' {what} add up to {served}, more than stats.{total} "
                    f"({getattr(stats, total)})"
                )
        tiers = r.field(obj, "tiers", dict)
        names = [str(Tier(t.tier, t.core)) for t in rows]
        if sorted(tiers) != sorted(names):
            raise r.fail(
                f"tiers must hold one snapshot per tier of stats ({names}), got {list(tiers)}"
            )
        snapshots = {
            name: Snapshot.from_json_obj(tiers[name], where=f"{where}: tier {name}")
            for name in names
        }
        return cls(stats, snapshots, r.field(obj, "label", str) if "label" in obj else "")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TierSnapshot:
        """Read a tier snapshot saved by `save`."""
        obj = read_json(path, expected="a tier snapshot")
        return cls.from_json_obj(obj, where=str(path))


_USAGE_COUNTS = (
    "capacity",
    "bytes_in_use",
    "blocks",
    "hits",
    "hit_bytes",
    "allocs",
    "promotions",
    "demotions",
    "spills",
)


def _usage(where: str, d: Any, what: str, tier: Tier) -> TierUsage:
    """The `TierUsage` at `what` in the file `where`, which must be the figures of `tier`."""
    u = Reader(f"{where}: {what}")
    if not isinstance(d, Mapping):
        raise u.fail(f"must be an object, got {type(d).__name__}")
    kind, core = u.field(d, "tier", str), d.get("core")
    exact = "core" in d and type(core) is type(tier.core)  # 0.0 or True is not core 0
    if kind != tier.kind or core != tier.core or not exact:
        raise u.fail(
            f"must be the figures of tier {tier} (tier {shown(tier.kind)}, core "
            f"{'null' if tier.core is None else tier.core}), got tier {shown(kind)}, core "
            f"{shown(core)}"
        )
    n = {key: u.count(u.field(d, key, int), key) for key in _USAGE_COUNTS}
    if n["bytes_in_use"] > n["capacity"]:
        raise u.fail(
            f"bytes_in_use ({n['bytes_in_use']}) is more than the capacity ({n['capacity']})"
        )
    return TierUsage(tier.kind, tier.core, **n)


def is_tier_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` holds a tier snapshot (`False` for anything unreadable or
    another kind of file). A path that is not a `str` or `os.PathLike` raises
    `ArgumentTypeError`. To read the file too, read it once and test its object with
    `is_tier_snapshot_obj`."""
    try:
        obj = read_json(path)
    except FileFormatError:
        return False
    return is_tier_snapshot_obj(obj)


def is_tier_snapshot_obj(obj: Any) -> bool:
    """Whether `obj`, a file's JSON object, says it is a tier snapshot (format
    `npumem-tier-snapshot`)."""
    return isinstance(obj, Mapping) and obj.get("format") == TIER_SNAPSHOT_FORMAT


def load_tier_snapshot(path: str | os.PathLike[str]) -> TierSnapshot:
    """Read a tier snapshot saved by `TierSnapshot.save`."""
    return TierSnapshot.load(path)


def render_tiers(console: Console, stats: TierStats, *, title: str = "memory tiers") -> None:
    """Print the tiers' figures to `console`: a line of totals, then a table with one row
    per tier (bytes in use and the share of the capacity, blocks, accesses served and their
    share of all accesses, blocks promoted into and demoted out of a fast tier, spills)."""
    # Text, not markup: the title and the policy may come from a file and hold brackets.
    console.print(
        Text.assemble(
            (title, "bold"),
            f" ({stats.policy}): {stats.accesses:,} accesses, fast-tier hit rate "
            f"{stats.hit_rate:.1%} ({stats.byte_hit_rate:.1%} of the bytes), "
            f"{stats.promotions:,} promotions, {stats.demotions:,} demotions, "
            f"{stats.spills:,} spills",
        )
    )
    table = Table(box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("tier", "in use", "blocks", "hits", "share", "moved in/out", "spills"):
        table.add_column(name, justify="left" if name == "tier" else "right", no_wrap=True)
    for t in (*stats.fast, stats.slow):
        share = f"{t.hits / stats.accesses:.0%}" if stats.accesses else "-"
        used = f" ({t.bytes_in_use / t.capacity:.0%})" if t.capacity else ""
        table.add_row(
            Text(str(Tier(t.tier, t.core))),
            format_bytes(t.bytes_in_use) + used,
            f"{t.blocks:,}",
            f"{t.hits:,}",
            share,
            f"{t.promotions:,}/{t.demotions:,}" if t.tier == "fast" else "",
            f"{t.spills:,}" if t.tier == "fast" else "",
        )
    console.print(table)


def tiers_report_text(stats: TierStats, width: int = 110, **kwargs: Any) -> str:
    """The tiers' report (`render_tiers`) as plain text."""
    out = io.StringIO()
    render_tiers(Console(file=out, width=width, color_system=None), stats, **kwargs)
    return out.getvalue()
