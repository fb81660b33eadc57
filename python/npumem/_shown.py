"""User values quoted in messages, cut to a bounded length.

An error message quotes the value it refuses (`format is 'npumem-snapshotx'`), and that value
comes from a file or an argument of any size: a string of 50 MB, a row of two million numbers,
an integer of 5,000 digits. `shown()` is the one function every such message uses, so that a
message stays one readable line whatever the input holds.
"""

from __future__ import annotations

__all__ = ["MAX_SHOWN", "number_of_digits", "shown", "shown_plain"]

MAX_SHOWN = 80
"""The most characters of a value a message shows; a longer value is cut there and followed
by `...` and its length."""


def shown(value: object) -> str:
    """`repr(value)` when it is at most `MAX_SHOWN` characters; a longer value is cut and its
    size given: `'xxxx...'... (50,000,002 characters)`, `999...999... (5,000 digits)`,
    `[0, 1, 2, ...] (a list of 2,000,000 values)`. Never builds the whole text of a large
    value, and never fails (an integer beyond Python's digit limit has no `repr`)."""
    if isinstance(value, str):
        if len(value) <= MAX_SHOWN:
            return repr(value)
        return f"{value[:MAX_SHOWN]!r}... ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool):
        digits = number_of_digits(value)
        if digits <= MAX_SHOWN:
            return repr(value)
        head = abs(value) // 10 ** (digits - MAX_SHOWN)
        sign = "-" if value < 0 else ""
        return f"{sign}{head}... ({digits:,} digits)"
    if isinstance(value, list | tuple | dict):
        return _container(value)
    text = repr(value)
    if len(text) <= MAX_SHOWN:
        return text
    return f"{text[:MAX_SHOWN]}... ({len(text):,} characters)"


def shown_plain(text: str) -> str:
    """`text` as it is (no quotes: a number, an option's value) when at most `MAX_SHOWN`
    characters, else `shown(text)`."""
    return text if len(text) <= MAX_SHOWN else shown(text)


def number_of_digits(value: int) -> int:
    """The decimal digits of `value` (its sign not counted), without making its text."""
    magnitude = abs(value)
    if magnitude < 10:
        return 1
    # log10(2) is 0.30102999...: the estimate is the count or one less.
    estimate = (magnitude.bit_length() - 1) * 30103 // 100000 + 1
    return estimate + 1 if magnitude >= 10**estimate else estimate


def _container(value: list[object] | tuple[object, ...] | dict[object, object]) -> str:
    """A list, tuple or dict as its `repr` when short, else its first entries (each
    `shown()`), `...` and how many entries it has."""
    if isinstance(value, dict):
        entries = (f"{shown(k)}: {shown(v)}" for k, v in value.items())
        opening, closing, kind = "{", "}", "an object"
    elif isinstance(value, tuple):
        entries = (shown(item) for item in value)
        opening, closing, kind = "(", ",)" if len(value) == 1 else ")", "a tuple"
    else:
        entries = (shown(item) for item in value)
        opening, closing, kind = "[", "]", "a list"
    parts: list[str] = []
    length = len(opening) + len(closing)
    for part in entries:
        if parts and length + len(part) + 2 > MAX_SHOWN:
            return (
                f"{opening}{', '.join(parts)}, ...{closing[-1]} ({kind} of {len(value):,} values)"
            )
        parts.append(part)
        length += len(part) + 2
    text = f"{opening}{', '.join(parts)}{closing}"
    if len(text) <= MAX_SHOWN or len(value) == 1:
        return text
    return f"{opening}{parts[0]}, ...{closing[-1]} ({kind} of {len(value):,} values)"
