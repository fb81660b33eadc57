"""Versioned JSON files: every file npumem.monitor writes starts with `format` and `version`.

Readers check both and every field they use, so a wrong or damaged file fails with a message
that names the file and the field instead of a `KeyError` deep inside.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npumem import fileio
from npumem._shown import shown
from npumem.monitor.errors import FileFormatError
from npumem.sizes import MAX_BYTES

__all__ = ["Reader", "file_kind", "path_argument", "read_json", "write_json"]

SNAPSHOT_FORMAT = "npumem-snapshot"
TRACE_FORMAT = "npumem-trace"
PLAN_FORMAT = "npumem-plan"
TIER_PLAN_FORMAT = "npumem-tier-plan"
"""A plan over several pools (`npumem.plan.TieredSolution.to_json`), which `npumem plot`
draws; `load_saved_file` refuses it, naming it."""
KINDS = {SNAPSHOT_FORMAT: "snapshot", TRACE_FORMAT: "trace", PLAN_FORMAT: "plan"}
HANDLE_BITS = 96
"""Bits of a packed block handle: pool id, slot and generation, 32 bits each (the Rust core's
`Handle::to_bits`)."""
MAX_HANDLE = (1 << HANDLE_BITS) - 1
_MAX_HANDLE_DIGITS = len(str(MAX_HANDLE))


def write_json(path: str | os.PathLike[str], obj: Mapping[str, Any]) -> Path:
    """Write `obj` as compact JSON, atomically (files are for programs first). Returns the
    path."""
    return fileio.write_json(path, obj)


def path_argument(path: Any) -> Path:
    """`path` as a `Path` (`fileio.path_argument`): a `str` or an `os.PathLike` of `str`.
    Anything else (None, a number, which `open` would take for a file descriptor, bytes) raises
    `ArgumentTypeError`; an empty path or one with a NUL character raises `FileFormatError`."""
    return fileio.path_argument(path, "a file path", error=FileFormatError)


def read_json(path: str | os.PathLike[str], *, expected: str = "a JSON object") -> dict[str, Any]:
    """Read a JSON object from `path` (`path_argument`); `FileFormatError` for anything else
    (`expected` describes the wanted object in the message)."""
    return fileio.read_json_object(path_argument(path), error=FileFormatError, expected=expected)


def file_kind(obj: Mapping[str, Any], where: str) -> str:
    """`"snapshot"`, `"trace"` or `"plan"` from a file's `format` field; a plan over several
    pools is refused as such (`TieredSolution.from_json` reads it)."""
    fmt = obj.get("format")
    if fmt == TIER_PLAN_FORMAT:
        raise FileFormatError(
            f"{where} is a plan over several pools ({TIER_PLAN_FORMAT!r}), not a snapshot, a "
            "trace or a plan of one arena; npumem plot draws it and "
            "npumem.plan.TieredSolution.from_json reads it"
        )
    if not isinstance(fmt, str) or fmt not in KINDS:
        raise FileFormatError(
            f"{where}: not an npumem snapshot, trace or plan (format is {shown(fmt)}, expected "
            f"{SNAPSHOT_FORMAT!r}, {TRACE_FORMAT!r} or {PLAN_FORMAT!r})"
        )
    return KINDS[fmt]


class Reader:
    """Typed field access with messages that say which file and field are wrong."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, message: str) -> FileFormatError:
        """The error to raise for `message` about this file."""
        return FileFormatError(f"{self.where}: {message}")

    def header(self, obj: Any, fmt: str, versions: tuple[int, ...]) -> int:
        """Check that `obj` is an object with `format` `fmt` and a `version` in `versions`;
        returns the version."""
        if not isinstance(obj, Mapping):
            found = "null" if obj is None else type(obj).__name__
            raise self.fail(f"expected a JSON object of format {shown(fmt)}, found {found}")
        if obj.get("format") != fmt:
            raise self.fail(f"format is {shown(obj.get('format'))}, expected {fmt!r}")
        got = obj.get("version")
        if isinstance(got, bool) or not isinstance(got, int) or got not in versions:
            known = " and ".join(str(v) for v in versions)
            raise self.fail(
                f"{fmt} version {shown(got)} is not supported (this npumem reads version {known})"
            )
        return int(got)

    def handle(self, value: Any, what: str, version: int) -> int:
        """A block handle, in `0..MAX_HANDLE`: decimal text without leading zeros from version
        2 on (exact in any JSON reader), an integer in version 1."""
        if version >= 2:
            canonical = (
                isinstance(value, str)
                and 0 < len(value) <= _MAX_HANDLE_DIGITS
                and value.isascii()
                and value.isdigit()
                and (value == "0" or not value.startswith("0"))
            )
            if not canonical:
                raise self.fail(
                    f"{what}: handle must be decimal text of at most {_MAX_HANDLE_DIGITS} digits "
                    f"without leading zeros, got {shown(value)}"
                )
            handle = int(value)
        else:
            handle = self.non_negative(value, what)
        if handle > MAX_HANDLE:
            raise self.fail(
                f"{what}: handle {handle} does not fit in {HANDLE_BITS} bits (at most {MAX_HANDLE})"
            )
        return handle

    def field(self, obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
        """`obj[key]`, which must be of `kind` (bools are not ints here)."""
        if key not in obj:
            raise self.fail(f"missing field {shown(key)}")
        value = obj[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds:
            ok = False
        elif float in kinds and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        else:
            ok = isinstance(value, kinds)
        if not ok:
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(f"field {shown(key)} must be {names}, got {type(value).__name__}")
        return value

    def int_row(self, row: Any, width: int, what: str, index: int) -> list[Any]:
        """A list of `width` entries (`what` number `index` of the file)."""
        if not isinstance(row, list) or len(row) != width:
            raise self.fail(f"{what} {index} must be a list of {width} values, got {shown(row)}")
        return row

    def non_negative(self, value: Any, what: str) -> int:
        """An int >= 0."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(f"{what} must be an integer >= 0, got {shown(value)}")
        return value

    def count(self, value: Any, what: str) -> int:
        """An int in `0..MAX_BYTES`: a byte count or any other figure the Rust core keeps in
        64 bits."""
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BYTES:
            raise self.fail(
                f"{what} must be an integer between 0 and {MAX_BYTES}, got {shown(value)}"
            )
        return value
