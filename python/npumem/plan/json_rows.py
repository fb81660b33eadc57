"""Plan and problem JSON text written row by row in Python string formatting.

`npumem.fileio.json_text(obj, indent=1)` writes each buffer of a problem or a plan as one row
(`{"id": "a", "lower": 0, "upper": 2, "size": 64, "offset": 0}`), encoding every row in a call
of its own to `json`'s encoder: a few microseconds a row, most of the time a plan of a
million buffers takes to write. The rows here are the same text built with f-strings (the
ids and names through `json`'s C string encoder), and `json_text` writes the rest of the
object, into which the rows are spliced: the text is byte for byte what `json_text` gives.
Where a row could come out differently (a field of a subclass of `int` or `str`, which
`json_text` spreads over lines, or a slot name that is not a string, for which it falls back
to `json.dumps`), the row functions return `None` and the callers write the whole object
with `json_text`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quote
from operator import attrgetter
from typing import Any

from npumem.fileio import json_text
from npumem.plan.buffers import Buffer

__all__ = ["buffer_rows", "rows_json", "tensor_rows"]

_FIELDS = tuple(attrgetter(f) for f in ("lower", "upper", "size", "alignment"))
_ID = attrgetter("id")
_OFFSET = attrgetter("offset")
_SIZE = attrgetter("size")
_WEIGHT = attrgetter("weight")
_NONE = type(None)


def _only(values: Iterable[object], *types: type) -> bool:
    """Whether every value is of exactly one of `types` (subclasses not)."""
    return set(map(type, values)) <= set(types)


def _quoted_ids(buffers: Sequence[Buffer]) -> list[str] | None:
    """The buffers' ids as JSON strings, or `None` when one is not exactly a `str`."""
    ids = list(map(_ID, buffers))
    return list(map(_quote, ids)) if _only(ids, str) else None


def buffer_rows(
    buffers: Sequence[Buffer], offsets: Sequence[int] | None = None
) -> list[str] | None:
    """Each buffer's row as `Problem.to_json_obj` (with `offsets`: as `Solution.to_json_obj`)
    has it, encoded as `json_text` encodes a row: `id`, `lower`, `upper`, `size`, then
    `alignment` when not 1, `offset` where the buffer is pinned, `weight` when given; with
    `offsets`, every buffer's offset from `offsets`, where its pin is or else last. `None`
    when a field is of a type whose text could differ (see the module docstring)."""
    ids = _quoted_ids(buffers)
    pins = list(map(_OFFSET, buffers))
    weights = list(map(_WEIGHT, buffers))
    if (
        ids is None
        or not all(_only(map(field, buffers), int) for field in _FIELDS)
        or not _only(pins, int, _NONE)
        or not _only(weights, int, float, _NONE)
        or (offsets is not None and not _only(offsets, int))
    ):
        return None
    heads = [
        f'{{"id": {q}, "lower": {b.lower}, "upper": {b.upper}, "size": {b.size}'
        if b.alignment == 1
        else f'{{"id": {q}, "lower": {b.lower}, "upper": {b.upper}, "size": {b.size}, '
        f'"alignment": {b.alignment}'
        for q, b in zip(ids, buffers, strict=True)
    ]
    if offsets is None:
        offsets = pins
    if weights.count(None) == len(weights):  # the common case: one field more, or none
        return [
            f'{head}, "offset": {offset}}}' if offset is not None else head + "}"
            for head, offset in zip(heads, offsets, strict=True)
        ]
    rows: list[str] = []
    for head, offset, pin, weight in zip(heads, offsets, pins, weights, strict=True):
        if weight is None:
            rows.append(head + "}" if offset is None else f'{head}, "offset": {offset}}}')
        elif pin is not None:  # pinned: the offset where the pin is, before the weight
            rows.append(f'{head}, "offset": {offset}, "weight": {weight!r}}}')
        elif offset is None:
            rows.append(f'{head}, "weight": {weight!r}}}')
        else:
            rows.append(f'{head}, "weight": {weight!r}, "offset": {offset}}}')
    return rows


def tensor_rows(
    buffers: Sequence[Buffer], offsets: Sequence[int], others: Mapping[str, tuple[int, int]]
) -> list[str] | None:
    """The rows of a plan's `tensors` list (`{"name", "offset", "size"}` for each entry of
    `Solution.tensor_offsets()`: the buffers at `offsets`, then `others`, the aliases and
    empty tensors by name), encoded as `json_text` encodes them, or `None` (see the module
    docstring)."""
    ids = _quoted_ids(buffers)
    if (
        ids is None
        or not _only(map(_SIZE, buffers), int)
        or not _only(offsets, int)
        or not _only(others, str)
        or not _only((v for pair in others.values() for v in pair), int)
    ):
        return None
    rows = [
        f'{{"name": {q}, "offset": {offset}, "size": {b.size}}}'
        for q, offset, b in zip(ids, offsets, buffers, strict=True)
    ]
    rows += [
        f'{{"name": {_quote(name)}, "offset": {offset}, "size": {size}}}'
        for name, (offset, size) in others.items()
    ]
    return rows


def rows_json(frame: dict[str, Any], rows: Mapping[str, list[str] | None]) -> str | None:
    """`json_text(obj, indent=1)` of the object `frame` holds, where each key of `rows` maps
    to an empty list in `frame` and the object has that key's rows (already encoded) there.
    `None` when some rows are `None`, or when `frame` has a key that is not a string (nested
    too), which `json_text` writes another way."""
    if any(r is None for r in rows.values()) or not _string_keys(frame):
        return None
    text = json_text(frame, indent=1)
    for key, encoded in rows.items():
        assert encoded is not None
        if not encoded:
            continue
        # A top-level entry starts a line with one space; a string in the text holds no line
        # break, and a nested entry starts with more spaces: this is the entry, once.
        empty = f"\n {_quote(key)}: []"
        at = text.find(empty)
        if at < 0 or text.find(empty, at + 1) >= 0:
            return None
        spread = "[\n  " + ",\n  ".join(encoded) + "\n ]"
        text = text[: at + len(empty) - 2] + spread + text[at + len(empty) :]
    return text


def _string_keys(value: object) -> bool:
    """Whether every dict key in `value` (nested in dicts and lists too) is a string."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _string_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_string_keys(v) for v in value)
    return True
