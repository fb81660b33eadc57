"""Errors of the lifetime planner.

Every planner error derives from `npumem.errors.NpumemError` through `PlanError`.
Errors about input (a file, a graph, a problem given in code) also derive from `ValueError`, so
`except ValueError` keeps working for callers who do not know npumem's hierarchy. A missing
extra raises `npumem.errors.MissingDependencyError` (named here too).
"""

from __future__ import annotations

from npumem.errors import MissingDependencyError, NpumemError

__all__ = [
    "GraphError",
    "MissingDependencyError",
    "PlanError",
    "PlanValidationError",
    "ProblemFormatError",
]


class PlanError(NpumemError):
    """Base class of every error the planner raises."""


class ProblemFormatError(PlanError, ValueError):
    """A problem (a CSV or JSON file, or buffers given in code) is malformed or inconsistent.

    For files the message starts with the file name and the line (CSV) or entry (JSON) at fault.
    """


class GraphError(ProblemFormatError):
    """A graph (our JSON format, an ONNX model, or one built in code) cannot be turned into
    lifetimes: a cycle, an unknown tensor, a tensor without a known size, ..."""


class PlanValidationError(PlanError, ValueError):
    """A solution breaks a rule: an unplaced or misaligned buffer, two live buffers sharing bytes,
    a fixed offset moved, or an arena above the capacity."""
