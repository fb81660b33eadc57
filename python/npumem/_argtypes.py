"""Argument types shared by the `npumem` subcommands (argparse `type=` callables)."""

from __future__ import annotations

import argparse

from npumem.errors import InvalidArgumentError
from npumem.sizes import parse_bytes

__all__ = ["at_least_one", "byte_count", "non_negative", "positive_byte_count"]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def at_least_one(text: str) -> int:
    """An integer of at least 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative(text: str) -> int:
    """An integer of at least 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
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
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value
