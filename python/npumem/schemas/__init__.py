"""The JSON Schemas of the files npumem writes, shipped with the package.

Each file starts with `format` and `version`; `FORMATS` maps the format name to the
schema file that describes it. `load("npumem-snapshot")` returns the schema as a dict (for
`jsonschema` or any other validator).

| format | written by | schema |
| --- | --- | --- |
| `npumem-snapshot` | `Snapshot.save`, `npumem demo` | `snapshot.schema.json` |
| `npumem-trace` | `Trace.save`, `npumem demo --trace` | `trace.schema.json` |
| `npumem-plan` | `Solution.to_json`, `npumem plan -o plan.json` | `plan.schema.json` |
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["FORMATS", "load"]

FORMATS: dict[str, str] = {
    "npumem-snapshot": "snapshot.schema.json",
    "npumem-trace": "trace.schema.json",
    "npumem-plan": "plan.schema.json",
}
"""Format name (the `format` field of a file) to the schema file in this package."""


def load(fmt: str) -> dict[str, Any]:
    """The JSON Schema of the format named `fmt` (a key of `FORMATS`)."""
    try:
        name = FORMATS[fmt]
    except KeyError:
        from npumem.errors import InvalidArgumentError

        known = ", ".join(FORMATS)
        raise InvalidArgumentError(f"no schema for format {fmt!r} (known: {known})") from None
    text = resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
