"""Argument types shared by the `npumem` subcommands (argparse `type=` callables).

Each type refuses bad text with `argparse.ArgumentTypeError` and a message for the user, never
another exception (argparse would then print `invalid FUNCTION value`), and quotes the text it
refuses cut short (`npumem._shown`). Integers are written in ASCII digits, with a leading minus
sign where a negative value means something to refuse; `+5`, `1_000`, ` 5`, `5\\xa0` and
digits of other scripts (`٥`) are not integers here. Every integer option takes at most
`MAX_INTEGER` (64 bits). Byte counts take units and the spellings of `npumem.sizes`. A file
path is refused when no file name can hold it (`file_path`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable

from npumem._shown import shown, shown_plain
from npumem.errors import InvalidArgumentError
from npumem.sizes import MAX_BYTES, parse_bytes

__all__ = [
    "MAX_INTEGER",
    "at_least_one",
    "byte_count",
    "file_path",
    "integer_from",
    "non_negative",
    "non_negative_seconds",
    "positive_byte_count",
]

MAX_INTEGER = MAX_BYTES
"""The largest value of an integer option, `2**64 - 1`: every count and seed fits in 64
bits."""

_INTEGER = re.compile(r"-?[0-9]+")
_SECONDS = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# Beyond every bound: what `_integer` gives for text of more digits than `MAX_INTEGER` has,
# without converting thousands of digits.
_HUGE: int = 10 ** (len(str(MAX_INTEGER)) + 1)


def _integer(text: str) -> int:
    """The integer `text` spells in ASCII digits (a leading minus sign allowed); one of more
    digits than `MAX_INTEGER` is given as a value beyond every bound, with its sign."""
    if _INTEGER.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not an integer")
    digits = text.lstrip("-").lstrip("0")
    if len(digits) > len(str(MAX_INTEGER)):
        return -_HUGE if text.startswith("-") else _HUGE
    return int(text)


def _at_most_max(value: int, text: str) -> int:
    if value > MAX_INTEGER:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_INTEGER}, got {shown_plain(text)}")
    return value


def at_least_one(text: str) -> int:
    """An integer from 1 to `MAX_INTEGER`."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {shown_plain(text)}")
    return _at_most_max(value, text)


def non_negative(text: str) -> int:
    """An integer from 0 to `MAX_INTEGER`."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {shown_plain(text)}")
    return _at_most_max(value, text)


def integer_from(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer from `low` to `high`; anything else is refused with
    `'TEXT' is not an integer from LOW to HIGH (WHAT)`."""

    def integer(text: str) -> int:
        try:
            value = _integer(text)
        except argparse.ArgumentTypeError:
            value = low - 1
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{shown(text)} is not an integer from {low} to {high} ({what})"
            )
        return value

    return integer


def non_negative_seconds(text: str) -> float:
    """A finite number of seconds, at least 0, in decimal (`10`, `0.5`, `2e-3`)."""
    if _SECONDS.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds")
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {shown_plain(text)}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{shown_plain(text)} is too large a number of seconds")
    return value


def byte_count(text: str) -> int:
    """A byte count with an optional unit (`1048576`, `64MiB`, `1.5GiB`, `2 GB`; see
    `npumem.sizes`)."""
    try:
        return parse_bytes(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_byte_count(text: str) -> int:
    """A byte count (`byte_count()`) of at least 1."""
    value = byte_count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {shown(text)}")
    return value


def file_path(text: str) -> str:
    """A file path, as given, unless no file name can hold it: one with a NUL character, or
    with a character that the file system's encoding cannot write (a lone UTF-16 surrogate,
    which only a program calling `npumem.cli.main` can pass; the bytes of a name that is not
    UTF-8 come from the command line as the surrogates that `os.fsencode` writes back)."""
    if "\0" in text:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} contains a NUL character, which no file name can hold"
        )
    try:
        os.fsencode(text)
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        what = (
            "a lone surrogate"
            if "\ud800" <= char <= "\udfff"
            else f"a character that {sys.getfilesystemencoding()} file names cannot hold"
        )
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not a file name: it contains {what} ({shown(char)} at index "
            f"{exc.start:,})"
        ) from None
    return text
