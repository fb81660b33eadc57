"""Byte counts as people write them: parsing (`1.5GiB`, `64MiB`, `1e6`) and formatting.

`parse_bytes()` is the one reader of byte counts written as text: every command-line option
that takes bytes (`--capacity`, `--chunk-size`, `--pool sram=2MiB`, ...) and the Python calls
that take such text (`parse_bytes()` itself, the pools of `npumem.plan`) read them with it, so
they accept and refuse the same texts, with the same messages. Its grammar:

```text
byte count = space* sign? number space* unit? space*     (unit in any letter case)
number     = digits ("." digits?)? exponent? | "." digits exponent?
exponent   = ("e" | "E") sign? digits
digits     = digit ("_"? digit)*                         (ASCII digits 0-9)
sign       = "+" | "-"
```

That is a number as Python writes one (`int()`, `float()`): an integer (`1048576`), a
decimal (`1.5`, `.5`) or scientific notation (`1e6`, `2.5E3`), with `_` grouping digits
(`1_000_000`, `1e1_0`): one `_` between two digits (`_1`, `1_`, `1__0` and `1_.5` are
refused). No other form: no `0x` prefix, no thousands commas, no spaces inside the number.
The units:

* binary units (powers of 1024): `KiB`, `MiB`, `GiB`, `TiB`, and their one-letter
  shorthands `K`, `M`, `G`, `T` (so `100k` is 102 400 bytes, as in `dd` and `ls -h`);
* decimal (SI) units (powers of 1000): `kB`, `MB`, `GB`, `TB`;
* `B` or no unit: bytes.

The value is exact (no floating point): the number times the unit must be a whole number of
bytes, not negative, and below `2**64`: `1.5KiB` is 1536 bytes and `1e3KiB` 1 024 000, while
`0.3KiB` (307.2 bytes), `1.5`, `-1MiB`, `nan` and `inf` are refused with
`InvalidArgumentError`, whose message gives the text and the rule.

Formatting (`format_bytes()`) picks the largest binary unit that keeps the number at least 1
(`byte_unit()`): `1536` is `"1.5 KiB"`. `short=True` drops a zero fraction
(`"2 MiB"`), for labels.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from npumem._shown import shown
from npumem.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["MAX_BYTES", "UNITS", "byte_unit", "format_bytes", "parse_bytes"]

MAX_BYTES = (1 << 64) - 1
"""The largest byte count, offset or alignment npumem reads from a file or writes into one: the
core's sizes are 64 bits wide, and so are the C header's offsets."""

UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
"""Unit suffixes (lower case) and the bytes each stands for."""

_EXAMPLES = "examples: 1048576, 64MiB, 1.5GiB, 2 GB, 512K, 1e6"


def _refuse(text: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{shown(text)} is not a byte count: {why}")


_SIZE = re.compile(
    r"""\s*
    (   [+-]? [0-9_.]* [0-9] [0-9_.]* (?: [eE] [+-]? [0-9_]* [0-9] [0-9_]* )?   # a number
      | [+-]? [A-Za-z]+                                                       # nan, inf
    )
    \s* ([A-Za-z]*) \s*                                                       # the unit
    """,
    re.VERBOSE,
)
# An `_` without a digit on each side (Decimal itself takes `_1`, `1_` and `1__0`); the
# other misplaced characters (a second `.`, a `.` in the exponent) Decimal refuses.
_MISPLACED_UNDERSCORE = re.compile(r"(?<![0-9])_|_(?![0-9])")
_LARGEST = 1 << 64
_FORMAT_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def parse_bytes(text: str) -> int:
    """The byte count `text` names (see the module docstring for the units).

    Raises `InvalidArgumentError` for text that is not a byte count, a
    negative count or one that is not a whole number of bytes.
    """
    if not isinstance(text, str):
        raise ArgumentTypeError(f"a byte count must be text, got {type(text).__name__}")
    match = _SIZE.fullmatch(text)
    if match is None:
        raise _refuse(text, _EXAMPLES)
    number, unit = match.group(1), match.group(2).lower()
    if unit not in UNITS:
        known = "B, K, KiB, M, MiB, G, GiB, T, TiB, kB, MB, GB, TB"
        raise _refuse(text, f"unknown unit {shown(match.group(2))} (known units: {known})")
    if _MISPLACED_UNDERSCORE.search(number):
        raise _refuse(text, "an `_` must stand alone between two digits (1_000_000)")
    try:
        value = Decimal(number)
    except InvalidOperation:
        raise _refuse(text, _EXAMPLES) from None
    if not value.is_finite():
        raise _refuse(text, "it must be a finite number")
    if value < 0:
        raise _refuse(text, "it is negative")
    if value > _LARGEST:
        raise _refuse(text, "it must be below 2**64 bytes")
    if value == 0:
        return 0
    if value.adjusted() < -40:  # far below a byte, in every unit: keeps the arithmetic small
        raise _refuse(text, "it is a fraction of a byte")
    scaled = Fraction(value) * UNITS[unit]  # exact
    if scaled >= _LARGEST:
        raise _refuse(text, "it must be below 2**64 bytes")
    if scaled.denominator != 1:
        raise _refuse(text, f"it is about {float(scaled):.12g} bytes, not a whole number")
    return int(scaled)


def byte_unit(n: float, *, at_least: float = 1) -> tuple[int, str]:
    """The largest binary unit in which `n` bytes are at least `at_least` units, as
    `(bytes per unit, name)`: `byte_unit(3 << 20)` is `(1 << 20, "MiB")`; `(1, "B")`
    below 1 KiB. Plots ask for `at_least=4` so that axis ticks stay readable numbers."""
    for name, div in _FORMAT_UNITS:
        if abs(n) >= at_least * div:
            return div, name
    return 1, "B"


def format_bytes(n: float, *, short: bool = False) -> str:
    """`n` bytes in the largest binary unit that keeps the number at least 1.

    `1536` gives `"1.5 KiB"` and `3 << 20` `"3.0 MiB"`; counts below 1 KiB stay in
    bytes (`"1000 B"`). With `short=True` a zero fraction is dropped: `"3 MiB"`.
    """
    div, name = byte_unit(n)
    if div == 1:
        return f"{int(n)} B"
    scaled = n / div
    if short and scaled == int(scaled):
        return f"{int(scaled)} {name}"
    return f"{scaled:,.1f} {name}"
