"""Validation of written files against the JSON Schemas the package ships."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from npumem import schemas


def assert_valid(source: Path | dict[str, Any]) -> dict[str, Any]:
    """The file (or object) is valid against the schema its ``format`` field names; returns
    the object."""
    obj = json.loads(source.read_text()) if isinstance(source, Path) else source
    schema = schemas.load(obj["format"])
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(obj)
    return obj
