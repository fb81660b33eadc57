"""Validation of written files against the JSON Schemas the package ships."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from npumem import schemas

#: A list of more rows than this, at the top of a file, is validated through a sample of its
#: rows (`sample_rows`): jsonschema's validator takes about 0.2 ms a row, 40 s for the 200,000
#: events of the demo's trace.
SAMPLE_ROWS = 4096


def assert_valid(source: Path | dict[str, Any]) -> dict[str, Any]:
    """The file (or object) is valid against the schema its ``format`` field names; returns
    the object. A long list at the top of the object is checked through `sample_rows`."""
    obj = json.loads(source.read_text()) if isinstance(source, Path) else source
    schema = schemas.load(obj["format"])
    jsonschema.Draft202012Validator.check_schema(schema)
    checked = {
        key: sample_rows(value) if isinstance(value, list) else value for key, value in obj.items()
    }
    jsonschema.Draft202012Validator(schema).validate(checked)
    return obj


def sample_rows(rows: list[Any]) -> list[Any]:
    """`rows` itself if it has at most `SAMPLE_ROWS` rows; otherwise every row of a shape not
    seen before (`_shape`: the type of each field, and the text of each field that is a word),
    the last row, and rows at an even stride, in their order: about `SAMPLE_ROWS` rows, and
    every kind of row the list holds."""
    if len(rows) <= SAMPLE_ROWS:
        return rows
    stride = len(rows) // SAMPLE_ROWS + 1
    seen: set[object] = set()
    kept = []
    for i, row in enumerate(rows):
        shape = _shape(row)
        if i % stride == 0 or i == len(rows) - 1 or shape not in seen:
            seen.add(shape)
            kept.append(row)
    return kept


def _shape(value: Any) -> object:
    """What a schema tells rows apart by: types, keys, and words (a string of digits is a
    number written as text, one shape for all)."""
    if isinstance(value, list):
        return tuple(_shape(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _shape(v)) for k, v in value.items()))
    if isinstance(value, str):
        return "digits" if value.isdigit() else ("str", value[:32])
    return type(value).__name__
