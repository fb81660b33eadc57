"""Errors of `npumem.monitor`: unreadable snapshot and trace files, missing extras.

Both derive from `npumem.errors.NpumemError`; a bad file is also a `ValueError`. A
missing extra raises `npumem.errors.MissingDependencyError` (an `ImportError`, named
here too). Bad arguments raise the package's own
`npumem.errors.InvalidArgumentError` and `npumem.errors.ArgumentTypeError`.
"""

from __future__ import annotations

from npumem.errors import MissingDependencyError, NpumemError

__all__ = ["FileFormatError", "MissingDependencyError", "MonitorError"]


class MonitorError(NpumemError):
    """Base class of the errors `npumem.monitor` adds."""


class FileFormatError(MonitorError, ValueError):
    """A snapshot or trace file cannot be read: not JSON, another format or version, or a field
    with the wrong type. The message starts with the file and names the field at fault."""
