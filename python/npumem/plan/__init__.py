"""Lifetime planning: static offsets for tensors whose live ranges are known ahead of time.

>>> from npumem import plan
>>> problem = plan.Problem.from_csv("model.csv")          # doctest: +SKIP
>>> solution = plan.solve(problem, time_limit=10.0)       # doctest: +SKIP
>>> solution.arena_size, solution.lower_bound, solution.gap  # doctest: +SKIP
>>> tiered = plan.solve(problem, pools=[("sram", 2 << 20), ("hbm", None)])  # doctest: +SKIP
>>> tiered.pool_of["conv1.out"], tiered.weight_placed, tiered.weight_bound  # doctest: +SKIP

See `docs/planner.md` for the formats and the algorithms.
"""

from __future__ import annotations

from npumem.errors import MissingDependencyError

# The graph builders of known networks (`plan.networks.resnet50(batch=8)`) and the makers of
# instances with a known optimum (`plan.generator`), reached as attributes of the package.
from npumem.plan import generator, networks
from npumem.plan.bounds import lower_bound
from npumem.plan.buckets import Bucket, BucketPlan, bucket_dims, plan_buckets
from npumem.plan.errors import (
    GraphError,
    PlanArgumentError,
    PlanArgumentTypeError,
    PlanError,
    PlanTooLargeError,
    PlanValidationError,
    ProblemFormatError,
)
from npumem.plan.graph import Graph, Op, Tensor
from npumem.plan.greedy import GREEDY_RULES, best_greedy, run_rule
from npumem.plan.problem import Alias, Buffer, Problem
from npumem.plan.search import Progress
from npumem.plan.solution import (
    FEASIBLE,
    INFEASIBLE,
    NOT_MET,
    OPTIMAL,
    SearchStats,
    Solution,
)

# Plans over several memory pools (`solve(problem, pools=[...])`); without `pools`, `solve`
# is npumem.plan.search.solve.
from npumem.plan.tiers import TieredSolution, solve

__all__ = [
    "FEASIBLE",
    "GREEDY_RULES",
    "INFEASIBLE",
    "NOT_MET",
    "OPTIMAL",
    "Alias",
    "Bucket",
    "BucketPlan",
    "Buffer",
    "Graph",
    "GraphError",
    "MissingDependencyError",
    "Op",
    "PlanArgumentError",
    "PlanArgumentTypeError",
    "PlanError",
    "PlanTooLargeError",
    "PlanValidationError",
    "Problem",
    "ProblemFormatError",
    "Progress",
    "SearchStats",
    "Solution",
    "Tensor",
    "TieredSolution",
    "best_greedy",
    "bucket_dims",
    "generator",
    "lower_bound",
    "networks",
    "plan_buckets",
    "run_rule",
    "solve",
]
