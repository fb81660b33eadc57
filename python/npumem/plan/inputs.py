"""The planner's input files: path arguments checked, each file read once, its kind told.

Every reader of the plan package takes its path through `path_argument()` (anything but a
`str` or `os.PathLike` of text, or a path with a NUL character, is refused with the caller's
error type) and reads the bytes once with `read_input()`, so that a pipe (`<(cat model.csv)`)
works as well as a file: the kind is told from those bytes (`kind_of()`) and the same bytes are
parsed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npumem import fileio
from npumem._shown import shown
from npumem.plan.errors import PlanError

__all__ = [
    "TIER_PLAN_FORMAT",
    "TIER_PLAN_VERSION",
    "check_header",
    "content_kind",
    "decode_text",
    "is_tier_plan",
    "json_object",
    "kind_of",
    "path_argument",
    "read_input",
    "tier_plan_refused",
]

KINDS = ("csv", "json", "onnx")
"""The kinds of planner input: MiniMalloc CSV, problem/graph/plan JSON, ONNX model."""
TIER_PLAN_FORMAT = "npumem-tier-plan"
"""The `format` field of a plan over several pools (`TieredSolution.to_json()`, `npumem plan
--pool ... -o plan.json`): `TieredSolution.from_json()` reads it back and `npumem plot` draws
it; the readers of problems and graphs refuse it (`tier_plan_refused`)."""
TIER_PLAN_VERSION = 1
"""The version of the plans over several pools this npumem writes and reads."""


def path_argument(
    source: object, *, error: type[PlanError], what: str = "a file path (str or os.PathLike)"
) -> Path:
    """`source` as a `Path`. Anything but a `str` or an `os.PathLike` of text raises `error`
    saying that `what` was expected; so does a path with a NUL character, which no file
    system accepts, and an empty path (which would name the current folder)."""
    text = os.fspath(source) if isinstance(source, str | os.PathLike) else None
    if not isinstance(text, str):
        raise error(f"expected {what}, got {type(source).__name__}")
    if not text:
        raise error("a file path is empty")
    if "\x00" in text:
        raise error(f"{shown(text)}: a file path cannot contain a NUL character")
    return Path(text)


# Compressed files and archives, by their first bytes. None of them starts a CSV or JSON text;
# gzip's and zip's cannot start a protobuf (an ONNX model), and the others do not start a model
# that an ONNX writer wrote (its first field is `ir_version`, the byte 0x08).
_PACKED = (
    (b"\x1f\x8b", "a gzip-compressed file; decompress it first (gunzip)"),
    (b"PK\x03\x04", "a zip archive; extract the file first (unzip)"),
    (b"\xfd7zXZ\x00", "an xz-compressed file; decompress it first (unxz)"),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file; decompress it first (unzstd)"),
    (
        tuple(b"BZh%d" % level for level in range(1, 10)),
        "a bzip2-compressed file; decompress it first (bunzip2)",
    ),
)


def read_input(path: Path, *, error: type[PlanError]) -> bytes:
    """The bytes of the file (or pipe) at `path`, read once; a file that cannot be read raises
    `error` naming it and saying why (`fileio.read_bytes`), and so does a compressed file or an
    archive (gzip, zip, xz, zstd, bzip2), which no planner reader takes as it is."""
    data = fileio.read_bytes(path, error=error)
    what = _packed_kind(data)
    if what is not None:
        raise error(f"{path}: {what}")
    return data


def _packed_kind(data: bytes) -> str | None:
    """What `data` is, with advice, when it starts as a compressed file or an archive does
    (`"a gzip-compressed file; decompress it first (gunzip)"`); else `None`."""
    return next((what for magic, what in _PACKED if data.startswith(magic)), None)


def content_kind(data: bytes) -> str | None:
    """`"json"` or `"csv"` when the bytes start like one (a `{`, or a header naming `id` or
    `lower`), else `None`."""
    head = data[:4096].lstrip()
    if head.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
        head = head[3:].lstrip()
    if head.startswith(b"{"):
        return "json"
    if head[:2].lower() == b"id" or b",lower" in head[:200].lower():
        return "csv"
    return None


def kind_of(path: Path, data: bytes) -> str:
    """The kind of an input: from the extension (`.csv`, `.json`, `.onnx`), else from the
    content (`content_kind()`); anything else is taken for an ONNX model."""
    suffix = path.suffix.lower()[1:]
    if suffix in KINDS:
        return suffix
    return content_kind(data) or "onnx"


def decode_text(data: bytes, label: str, *, error: type[PlanError]) -> str:
    """The bytes as UTF-8 text (a byte-order mark is dropped; `fileio.decode_text`)."""
    return fileio.decode_text(data, label, error=error)


def json_object(
    data: bytes, label: str, *, error: type[PlanError], expected: str = "a JSON object"
) -> dict[str, Any]:
    """The JSON object the bytes hold, with the errors `npumem.fileio.read_json_object` gives
    for a file: the line and column of bad JSON, nesting too deep, `NaN`, not an object."""
    text = decode_text(data, label, error=error)
    return fileio.json_object_from_text(text, label, error=error, expected=expected)


def is_tier_plan(obj: Mapping[str, Any]) -> bool:
    """Whether a JSON object is a plan over several pools: its `format` says so, or, without a
    header, it has the `pools` and `weight_bound` such a plan has."""
    if "format" in obj or "version" in obj:
        return obj.get("format") == TIER_PLAN_FORMAT
    return "pools" in obj and "weight_bound" in obj


def tier_plan_refused(label: str, expected: str, *, error: type[PlanError]) -> PlanError:
    """The error (of class `error`) of a reader given a plan over several pools, which only
    `TieredSolution.from_json` and `npumem plot` read: it says what the file is, that it is not
    `expected`, and what reads it."""
    return error(
        f"{label} is a plan over several pools ({TIER_PLAN_FORMAT!r}, written by npumem plan "
        f"--pool), not {expected}; npumem plot draws it and TieredSolution.from_json reads it"
    )


def check_header(
    obj: Mapping[str, Any], label: str, fmt: str, version: int, *, error: type[PlanError]
) -> None:
    """Refuse a JSON object whose `format` is not `fmt` or whose `version` is not `version`.

    Files written by hand may leave both out; a file that gives either must give both, as
    npumem writes them (`version` an integer, not text).
    """
    if "format" not in obj and "version" not in obj:
        return
    found = obj.get("format")
    if found != fmt:
        raise error(f"{label}: format is {shown(found)}, expected {shown(fmt)}")
    found_version = obj.get("version")
    if (
        isinstance(found_version, bool)
        or not isinstance(found_version, int)
        or found_version != version
    ):
        raise error(
            f"{label}: {fmt} version {shown(found_version)} is not supported (this npumem reads "
            f"version {version})"
        )
