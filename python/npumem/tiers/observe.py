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

from npumem.fileio import read_json_object, write_json
from npumem.monitor.errors import FileFormatError
from npumem.monitor.snapshot import Snapshot
from npumem.sizes import format_bytes
from npumem.tiers.block import Tier
from npumem.tiers.report import TierStats, TierUsage

__all__ = [
    "TIER_SNAPSHOT_FORMAT",
    "TierSnapshot",
    "is_tier_snapshot",
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
        if obj.get("format") != TIER_SNAPSHOT_FORMAT:
            raise FileFormatError(f"{where}: not an {TIER_SNAPSHOT_FORMAT} file")
        if obj.get("version") != TIER_SNAPSHOT_VERSION:
            raise FileFormatError(
                f"{where}: version {obj.get('version')!r} is not supported "
                f"(expected {TIER_SNAPSHOT_VERSION})"
            )
        try:
            s = obj["stats"]
            stats = TierStats(
                str(s["policy"]),
                tuple(_usage(t) for t in s["fast"]),
                _usage(s["slow"]),
                int(s["accesses"]),
                int(s.get("bytes_accessed", 0)),
            )
            tiers = obj["tiers"]
            snapshots = {
                str(name): Snapshot.from_json_obj(snap, where=f"{where}: tier {name}")
                for name, snap in tiers.items()
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FileFormatError(f"{where}: malformed tier snapshot ({exc!r})") from None
        return cls(stats, snapshots, str(obj.get("label", "")))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TierSnapshot:
        """Read a tier snapshot saved by `save`."""
        obj = read_json_object(path, error=FileFormatError, expected="a tier snapshot")
        return cls.from_json_obj(obj, where=str(path))


def _usage(d: Mapping[str, Any]) -> TierUsage:
    return TierUsage(
        d["tier"],
        None if d["core"] is None else int(d["core"]),
        int(d["capacity"]),
        int(d["bytes_in_use"]),
        int(d["blocks"]),
        int(d["hits"]),
        int(d["hit_bytes"]),
        int(d["allocs"]),
        int(d["promotions"]),
        int(d["demotions"]),
        int(d["spills"]),
    )


def is_tier_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` is a tier snapshot (`False` for anything unreadable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return TIER_SNAPSHOT_FORMAT.encode() in head


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
