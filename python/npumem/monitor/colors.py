"""Colours of the pictures and the HTML viewer: one colour per tag, the same in every file.

A tag's colour is a fixed function of its name: CRC-32 of the UTF-8 text, started from
`HASH_START`, into a palette of 48 colours without greys. So `resnet50.weights` has the same
colour in every address map, in the compaction picture and in `npumem view`, whatever else the
picture shows. Two names can hash to one colour; the start value is the first one under which
the demo's tags and common tag names (`weights`, `activations`, `kv-cache`, `scratch`) all
differ. Legends and the viewer's hover name every tag.

Greys are kept for what is not a block: free bytes, bytes cached in slabs, untracked bytes.
Cores get the colours of a separate qualitative palette, in core order.
"""

from __future__ import annotations

import zlib

__all__ = [
    "CORE_COLORS",
    "FREE_COLOR",
    "HASH_START",
    "NO_TAG",
    "SLAB_CACHE_COLOR",
    "TAG_PALETTE",
    "UNTRACKED_COLOR",
    "core_color",
    "tag_color",
]

# matplotlib's tab20, tab20b and tab20c without their greys, as hex (no matplotlib needed).
TAG_PALETTE: tuple[str, ...] = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
    "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
    "#dbdb8d", "#9edae5", "#393b79", "#5254a3", "#6b6ecf", "#9c9ede", "#637939", "#8ca252",
    "#b5cf6b", "#cedb9c", "#8c6d31", "#bd9e39", "#e7ba52", "#e7cb94", "#843c39", "#ad494a",
    "#d6616b", "#e7969c", "#7b4173", "#a55194", "#ce6dbd", "#de9ed6", "#3182bd", "#6baed6",
    "#e6550d", "#fd8d3c", "#31a354", "#74c476", "#756bb1", "#9e9ac8", "#fdae6b", "#a1d99b",
)  # fmt: skip
"""The colours tags are hashed into."""

HASH_START = 84
"""The value CRC-32 starts from when it hashes a tag name."""

CORE_COLORS: tuple[str, ...] = (
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7",
    "#9c755f", "#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d",
)  # fmt: skip
"""Core `i` is drawn in `CORE_COLORS[i % 16]`."""

FREE_COLOR = "#d9d9d9"
"""Free bytes."""
SLAB_CACHE_COLOR = "#a6a6a6"
"""Unused bytes inside slabs: reserved for their size class, free for the stats."""
UNTRACKED_COLOR = "#404040"
"""Allocated bytes that belong to no block (the Rust raw API)."""
NO_TAG = "(no tag)"
"""The label of blocks allocated without a tag."""


def tag_color(tag: str | None) -> str:
    """The colour of `tag` (hex `#rrggbb`), the same in every picture and every run."""
    name = NO_TAG if tag is None else tag
    return TAG_PALETTE[zlib.crc32(name.encode("utf-8"), HASH_START) % len(TAG_PALETTE)]


def core_color(core: int) -> str:
    """The colour of core pool `core`."""
    return CORE_COLORS[core % len(CORE_COLORS)]
