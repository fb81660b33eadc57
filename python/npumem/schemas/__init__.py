"""The JSON Schemas of the files npumem writes, shipped with the package.

Each file starts with `format` and `version`; `FORMATS` maps the format name to the
schema file that describes it. `load("npumem-snapshot")` returns the schema as a dict (for
`jsonschema` or any other validator).

| format | written by | schema |
| --- | --- | --- |
| `npumem-snapshot` | `Snapshot.save`, `npumem demo` | `snapshot.schema.json` |
| `npumem-trace` | `Trace.save`, `npumem demo --trace` | `trace.schema.json` |
| `npumem-plan` | `Solution.to_json`, `npumem plan -o plan.json` | `plan.schema.json` |
| `npumem-tier-plan` | `TieredSolution.to_json`, `npumem plan --pool` | `tier-plan.schema.json` |
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from npumem._shown import shown
from npumem.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["FORMATS", "load"]

FORMATS: dict[str, str] = {
    "npumem-snapshot": "snapshot.schema.json",
    "npumem-trace": "trace.schema.json",
    "npumem-plan": "plan.schema.json",
    "npumem-tier-plan": "tier-plan.schema.json",
}
"""Format name (the `format` field of a file) to the schema file in this package."""


def load(fmt: str) -> dict[str, Any]:
    """The JSON Schema of the format named `fmt` (a key of `FORMATS`).

    A `fmt` that is not a `str` raises `ArgumentTypeError`; an unknown format,
    `InvalidArgumentError`.
    """
    known = ", ".join(FORMATS)
    if not isinstance(fmt, str):
        raise ArgumentTypeError(
            f"the format must be a str (one of {known}), got {type(fmt).__name__}"
        )
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"no schema for format {shown(fmt)} (known: {known})")
    name = FORMATS[fmt]
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
