"""Errors of :mod:`npumem.monitor`: unreadable snapshot and trace files, missing extras.

Both derive from :class:`npumem.errors.NpumemError`; a bad file is also a ``ValueError`` and a
missing extra an ``ImportError``. Bad arguments raise the package's own
:class:`npumem.errors.InvalidArgumentError` and :class:`npumem.errors.ArgumentTypeError`.
"""

from __future__ import annotations

from npumem.errors import NpumemError

__all__ = ["FileFormatError", "MissingDependencyError", "MonitorError"]


class MonitorError(NpumemError):
    """Base class of the errors :mod:`npumem.monitor` adds."""


class FileFormatError(MonitorError, ValueError):
    """A snapshot or trace file cannot be read: not JSON, another format or version, or a field
    with the wrong type. The message starts with the file and names the field at fault."""


class MissingDependencyError(MonitorError, ImportError):
    """An optional dependency is not installed (the message names the extra to install)."""
