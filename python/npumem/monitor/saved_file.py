"""Open a saved file without knowing in advance whether it holds a snapshot or a trace."""

from __future__ import annotations

import os

from npumem.monitor._files import file_kind, read_json
from npumem.monitor.snapshot import Snapshot
from npumem.monitor.trace import Trace

__all__ = ["load_saved_file"]


def load_saved_file(path: str | os.PathLike[str]) -> Snapshot | Trace:
    """The snapshot or trace in ``path``, told apart by the file's ``format`` field.

    Raises :class:`~npumem.monitor.errors.FileFormatError` for a file that is neither.
    """
    where = os.fspath(path)
    obj = read_json(path)
    if file_kind(obj, where) == "snapshot":
        return Snapshot.from_json_obj(obj, where=where)
    return Trace.from_json_obj(obj, where=where)
