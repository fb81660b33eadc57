"""Errors of the lifetime planner.

Every planner error derives from `npumem.errors.NpumemError` through `PlanError`.
Errors about input (a file, a graph, a problem given in code) also derive from `ValueError`, so
`except ValueError` keeps working for callers who do not know npumem's hierarchy. An argument
that a planner call cannot take (a time limit, a capacity, the pools of `solve(pools=...)`)
raises `PlanArgumentError`, an `npumem.errors.InvalidArgumentError` (so a `ValueError`), or, for
an argument of the wrong type, `PlanArgumentTypeError`, an `npumem.errors.ArgumentTypeError` (so
a `TypeError`): the same classes whether one arena or several pools are planned. A missing extra
raises `npumem.errors.MissingDependencyError` (named here too).
"""

from __future__ import annotations

from npumem.errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    MissingDependencyError,
    NpumemError,
)

__all__ = [
    "GraphError",
    "MissingDependencyError",
    "PlanArgumentError",
    "PlanArgumentTypeError",
    "PlanError",
    "PlanTooLargeError",
    "PlanValidationError",
    "ProblemFormatError",
]


class PlanError(NpumemError):
    """Base class of every error the planner raises."""


class PlanArgumentError(PlanError, InvalidArgumentError):
    """An argument value a planner call cannot take: a time limit that is not a finite number of
    seconds >= 0, a negative capacity, pools that are not a list of distinct names with
    capacities, an option `solve(pools=...)` does not take. Also an `InvalidArgumentError` and a
    `ValueError`."""


class PlanArgumentTypeError(PlanArgumentError, ArgumentTypeError):
    """An argument of a planner call of the wrong type (`time_limit="1"`, a pool that is no
    pair). Also an `ArgumentTypeError` and a `TypeError`."""


class ProblemFormatError(PlanError, ValueError):
    """A problem (a CSV or JSON file, or buffers given in code) is malformed or inconsistent.

    For files the message starts with the file name and the line (CSV) or entry (JSON) at fault.
    """


class GraphError(ProblemFormatError):
    """A graph (our JSON format, an ONNX model, or one built in code) cannot be turned into
    lifetimes: a cycle, an unknown tensor, a tensor without a known size, ..."""


class PlanTooLargeError(PlanError, ValueError):
    """`solve` found no plan within the 2^63 - 1 bytes a plan can address
    (`npumem.plan.problem.MAX_PLAN_BYTES`), for a problem whose buffers each fit on their own.
    `proven` tells whether no such plan exists (the search proved a bound beyond it) or none was
    found in the time given. Also a `ValueError`."""

    def __init__(self, message: str, *, proven: bool = False) -> None:
        super().__init__(message)
        self.proven = proven


class PlanValidationError(PlanError, ValueError):
    """A solution breaks a rule: an unplaced or misaligned buffer, an offset that is not an
    integer >= 0 or a buffer that ends beyond the 2^63 - 1 bytes a plan can address, two live
    buffers sharing bytes, a fixed offset moved, or an arena above the capacity."""
