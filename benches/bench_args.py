"""Argument types for the bench scripts' parsers: a bad value ends the script with argparse's
one-line error and exit status 2, never a traceback; and the reading and writing of the file
`--write` updates."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from npumem import fileio


def positive_int(text: str) -> int:
    """A whole number of at least 1."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """A whole number of at least 0."""
    return _int_at_least(text, 0)


def seed(text: str) -> int:
    """A seed of the planner's search: a whole number from 0 to 2^64 - 1."""
    value = non_negative_int(text)
    if value >= 1 << 64:
        raise argparse.ArgumentTypeError(f"must be at most 2^64 - 1, got {text!r}")
    return value


def positive_int_at_most(most: int) -> Callable[[str], int]:
    """An argument type: a whole number from 1 to `most`."""

    def check(text: str) -> int:
        value = positive_int(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most}, got {text!r}")
        return value

    return check


def positive_float(text: str) -> float:
    """A number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}")
    return value


def _int_at_least(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of at least {least}, got {text!r}"
        ) from None
    if value < least:
        raise argparse.ArgumentTypeError(
            f"must be a whole number of at least {least}, got {text!r}"
        )
    return value


def read_write_target(parser: argparse.ArgumentParser, path: str) -> str:
    """The text of the file `--write` names, read before anything is measured, or argparse's
    one-line refusal naming `--write`."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        parser.error(f"--write: cannot read {path}: {getattr(e, 'strerror', None) or e}")


def write_target(parser: argparse.ArgumentParser, path: str, text: str) -> bool:
    """Write `text` to the file `--write` names through `npumem.fileio` (atomically); `False`
    after one error line on stderr when it cannot be written."""
    try:
        fileio.write_text(path, text)
    except OSError as e:
        print(f"{parser.prog}: error: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return False
    return True
