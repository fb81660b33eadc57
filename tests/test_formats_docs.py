"""The JSON examples of docs/formats.md: each matches its format's JSON Schema, and each that
is written out in full (no `"..."` standing for what was left out) is read by the format's
reader, as a file a user copies from the page would be."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from npumem import schemas
from npumem.monitor.saved_file import saved_file_from_json_obj
from npumem.plan import TieredSolution

PAGE = Path(__file__).resolve().parents[1] / "docs" / "formats.md"
# Whole files only: a block that starts with its format (the others show one member).
WHOLE_FILE = re.compile(r'```json\n(\{"format".*?)```', re.S)
EXAMPLES = [json.loads(block) for block in WHOLE_FILE.findall(PAGE.read_text())]


def elided(obj: Any) -> bool:
    """Whether the example leaves something out (a `"..."` key or value anywhere)."""
    if isinstance(obj, dict):
        return any(k == "..." or elided(v) for k, v in obj.items())
    if isinstance(obj, list):
        return any(elided(v) for v in obj)
    return obj == "..."


def test_the_page_shows_an_example_of_every_format_with_a_schema() -> None:
    shown = {example["format"] for example in EXAMPLES}
    assert set(schemas.FORMATS) <= shown


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["format"] for e in EXAMPLES])
def test_every_full_example_is_read_back(example: dict[str, Any]) -> None:
    if example["format"] in schemas.FORMATS and not elided(example):
        jsonschema.validate(example, schemas.load(example["format"]))
    if elided(example):
        # Cut short on purpose: the page says so with "...", and the readers would refuse it.
        return
    if example["format"] == "npumem-tier-plan":
        plan = TieredSolution.from_json(example, label="docs/formats.md")
        assert [name for name, _ in plan.pools] == [p["name"] for p in example["pools"]]
    else:
        read = saved_file_from_json_obj(example, where="docs/formats.md")
        assert read is not None


def test_the_full_examples_include_both_plan_formats() -> None:
    full = {example["format"] for example in EXAMPLES if not elided(example)}
    assert {"npumem-plan", "npumem-tier-plan"} <= full
