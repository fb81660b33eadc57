"""`npumem plan`: plan a model's tensor offsets from the command line.

    npumem plan INPUT -o OUTPUT [--capacity N] [--time-limit S] [--seed N]
                [--dim NAME=N[,N...]] [--double-buffer NAME,...] [--in-flight K]

INPUT is a MiniMalloc CSV, a problem or graph JSON, or an ONNX model (told apart by extension,
else by content). OUTPUT's extension picks the format: `.csv` (MiniMalloc solution), `.json`,
`.h` (C header with the offset table). A dimension given several values (`--dim N=1,8,32`)
plans one arena per bucket, the weights shared, and writes one OUTPUT per bucket
(`plan.N8.h`), each the bucket's whole memory (the weights, then its activations);
`--capacity` then holds for every bucket, weights included. Exit status: 0 done, 1
`--capacity` not met (OUTPUT is then not written: the figures of the best packing found are
printed) or OUTPUT not written for a reason of the moment (a full disk), 2 bad arguments,
unreadable input or an OUTPUT path that cannot hold the file (`write_error_status`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from npumem._argtypes import (
    byte_count,
    integer_from,
    non_negative,
    non_negative_seconds,
    positive_byte_count,
)
from npumem._shown import shown, shown_plain
from npumem.errors import MissingDependencyError
from npumem.exit_status import ExitStatus, one_line, write_error_status
from npumem.fileio import check_output_path, is_same_file, write_texts
from npumem.plan.buckets import plan_buckets
from npumem.plan.c_header import c_identifier
from npumem.plan.errors import PlanError, PlanTooLargeError, ProblemFormatError
from npumem.plan.graph import GRAPH_FORMAT, Graph
from npumem.plan.inputs import (
    is_tier_plan,
    json_object,
    kind_of,
    path_argument,
    read_input,
    tier_plan_refused,
)
from npumem.plan.onnx_import import MAX_DIM, graph_from_onnx, parse_onnx
from npumem.plan.problem import MAX_IN_FLIGHT, PLAN_FORMAT, Problem, check_alignment
from npumem.plan.search import Progress, solve
from npumem.plan.solution import INFEASIBLE, NOT_MET, Solution
from npumem.plan.tiers import TieredSolution, parse_pools, solve_tiers

__all__ = ["add_parser", "load_problem", "run"]


def _dim(text: str) -> tuple[str, list[int]]:
    """`NAME=N[,N...]`: a dimension's name and its values, each a positive integer (a batch or
    a sequence of 0 plans nothing) given once."""
    name, sep, value = text.partition("=")
    values = [v.strip() for v in value.split(",")]
    if not sep or not name or not all(v.isdigit() and v.isascii() for v in values):
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is not NAME=INTEGER[,INTEGER...] (examples: batch=1, N=1,8,32)"
        )
    too_large = [v for v in values if len(v.lstrip("0")) > len(str(MAX_DIM)) or int(v) > MAX_DIM]
    if too_large:
        raise argparse.ArgumentTypeError(
            f"{shown_plain(name)}={shown_plain(too_large[0])} is too large: ONNX dimensions are "
            "at most "
            f"{MAX_DIM} (64 bits)"
        )
    numbers = [int(v) for v in values]
    if 0 in numbers:
        raise argparse.ArgumentTypeError(
            f"{shown(text)}: a dimension must be a positive integer, got 0"
        )
    repeated = [n for i, n in enumerate(numbers) if n in numbers[:i]]
    if repeated:
        raise argparse.ArgumentTypeError(
            f"{shown(text)} gives {shown_plain(name)}={repeated[0]} twice (each value plans one "
            "bucket)"
        )
    return name, numbers


class _DimAction(argparse.Action):
    """`--dim NAME=...`, repeatable for different names; naming a dimension twice is refused
    (the values of one dimension go in one `--dim`, comma-separated)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        name, numbers = values
        dims: dict[str, list[int]] = dict(getattr(namespace, self.dest) or {})
        if name in dims:
            raise argparse.ArgumentError(
                self,
                f"dimension {shown(name)} is given twice (give all its values in one --dim: "
                f"{name}=1,8,32)",
            )
        dims[name] = numbers
        setattr(namespace, self.dest, dims)


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{shown(text)} names no buffer (example: x,mask)")
    return names


def _alignment(text: str) -> int:
    value = byte_count(text)
    try:
        return check_alignment(value)
    except ProblemFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_problem(obj: dict[str, Any], label: str) -> Graph | Problem:
    """The graph or the problem a JSON input holds: its `format` decides, else its content
    (`ops` or `tensors`: a graph); each reader refuses a header or content that is not its
    own."""
    fmt = obj.get("format")
    if is_tier_plan(obj):
        raise tier_plan_refused(
            label, "a problem, a graph or a plan of one arena", error=ProblemFormatError
        )
    if fmt == GRAPH_FORMAT or (fmt is None and ("ops" in obj or "tensors" in obj)):
        return Graph.from_json(obj, label=label)
    if fmt is None or fmt == PLAN_FORMAT:
        return Problem.from_json(obj, label=label)
    raise ProblemFormatError(
        f"{label}: format {shown(fmt)} is not a problem, a graph ({GRAPH_FORMAT!r}) or a plan "
        f"({PLAN_FORMAT!r})"
    )


def _no_weights(label: str, what: str) -> ProblemFormatError:
    """The error for weights to plan (`include_weights`) in an input that has none."""
    return ProblemFormatError(
        f"{label}: weights to plan (include_weights, --include-weights) are those of a graph "
        f"or an ONNX model, and this is {what}, whose buffers are all there is to plan"
    )


def load_problem(
    path: str | os.PathLike[str],
    *,
    dims: Mapping[str, int] | None = None,
    alignment: int | None = None,
    include_weights: bool = False,
) -> Problem:
    """Read INPUT as the command line does (CSV, problem JSON, graph JSON or ONNX), reading
    the file once (a pipe works too).

    `dims` binds symbolic dimensions of an ONNX model (refused for other inputs).
    `alignment` raises every buffer's alignment (graphs and ONNX default to 64 bytes, CSV and
    problem JSON keep their own). `include_weights` plans the weights of a graph or an ONNX
    model too; a CSV or problem JSON has no weights apart from its buffers, so it is refused
    for them (`ProblemFormatError`), as `dims` is for what is not ONNX.
    """
    source = path_argument(
        path, error=ProblemFormatError, what="an input file path (str or os.PathLike)"
    )
    if alignment is not None:
        check_alignment(alignment)
    data = read_input(source, error=ProblemFormatError)
    label = str(source)
    kind = kind_of(source, data)
    if dims and kind != "onnx":
        raise ProblemFormatError(
            f"{label}: dimensions to bind (dims, --dim {next(iter(dims))}) apply to ONNX "
            f"models only, and this is a {kind.upper()} file"
        )
    graph_alignment = 64 if alignment is None else alignment
    if kind == "onnx":
        proto = parse_onnx(data, label, source.parent)
        graph = graph_from_onnx(proto, dims=dims, label=label)
        return Problem.from_graph(
            graph, include_weights=include_weights, alignment=graph_alignment, label=label
        )
    if kind == "csv":
        if include_weights:
            raise _no_weights(label, "a CSV problem")
        problem = Problem.from_csv_bytes(data, label, name=source.stem)
    else:
        obj = json_object(
            data, label, error=ProblemFormatError, expected="a JSON object (a problem or a graph)"
        )
        read = _json_problem(obj, label)
        if isinstance(read, Graph):
            read.name = read.name or source.stem
            return Problem.from_graph(
                read, include_weights=include_weights, alignment=graph_alignment, label=label
            )
        if include_weights:
            plan = obj.get("format") == PLAN_FORMAT
            raise _no_weights(label, "a plan (JSON)" if plan else "a problem (JSON)")
        problem = read
        problem.name = problem.name or source.stem
    if alignment is not None:
        problem = problem.with_alignment(alignment)
    return problem


_OUTPUT_KINDS = {".csv": "csv", ".json": "json", ".h": "h", ".hpp": "h"}


def _output_kind(output: Path, fmt: str | None) -> str | None:
    """The format to write `output` in: `fmt`, else from the extension (None: unknown)."""
    return fmt or _OUTPUT_KINDS.get(output.suffix.lower())


def _render(solution: Solution | TieredSolution, output: Path, fmt: str | None) -> str:
    """The text of `output`: the solution in the format of `fmt` or of the extension (a C
    header's names come from the file name)."""
    kind = _output_kind(output, fmt)
    if kind == "json":
        return solution.to_json()
    if kind == "h":
        return solution.to_c_header(prefix=c_identifier(output.stem))
    return solution.to_csv()


def _write_all(files: dict[Path, str], err: Any) -> int | None:
    """Write every file or none (`fileio.write_texts`); None once written, else the exit
    status (`write_error_status`), with one line on `err` naming the file that could not be
    written."""
    try:
        write_texts(files)
    except OSError as exc:
        err.print(
            f"npumem plan: error: cannot write {exc.filename}: {exc.strerror or exc}",
            markup=False,
        )
        return write_error_status(exc)
    return None


def _in_flight(args: argparse.Namespace) -> int:
    """`--in-flight`, 2 when not given."""
    return 2 if args.in_flight is None else int(args.in_flight)


def _bucket_output(output: Path, label: str) -> Path:
    tag = re.sub(r"[^0-9A-Za-z_-]", "", label.replace(",", "_"))
    return output.with_name(f"{output.stem}.{tag}{output.suffix}")


def _run_buckets(args: argparse.Namespace, dims: dict[str, list[int]], out: Any, err: Any) -> int:
    if Path(args.input).suffix.lower() in (".csv", ".json"):
        err.print(
            "npumem plan: error: several values of a dimension (shape buckets) need an ONNX "
            "model as INPUT",
            markup=False,
        )
        return ExitStatus.USAGE
    if args.pool:
        err.print(
            "npumem plan: error: --pool plans one model over several pools; give each "
            "dimension one value (one --dim NAME=N) to use it",
            markup=False,
        )
        return ExitStatus.USAGE
    try:
        plan = plan_buckets(
            args.input,
            dims=dims,
            include_weights=args.include_weights,
            alignment=64 if args.alignment is None else args.alignment,
            pipelined=args.double_buffer,
            in_flight=_in_flight(args),
            time_limit=args.time_limit,
            seed=args.seed,
        )
        # Each bucket's whole memory, the shared weights included: what its file holds.
        solutions = [plan.solution_of(bucket) for bucket in plan.buckets]
        for solution in solutions:
            solution.validate()
        met = args.capacity is None or plan.arena_size <= args.capacity
        texts: dict[Path, str] = {}
        if args.output is not None and met:
            output = Path(args.output)
            # Each file rendered under its own name: a C header's table and macros are named
            # after the file, so two buckets' headers can go into one program.
            files = [_bucket_output(output, bucket.label) for bucket in plan.buckets]
            texts = {
                path: _render(solution, path, args.format)
                for path, solution in zip(files, solutions, strict=True)
            }
    except (PlanError, MissingDependencyError, ValueError) as exc:
        err.print(f"npumem plan: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    if texts:
        failed = _write_all(texts, err)
        if failed is not None:
            return failed
    if not args.quiet:
        out.print(f"input        {args.input} ({len(plan.buckets)} buckets)", markup=False)
        if plan.weights is not None:
            out.print(f"weights      {plan.weights_size:,} bytes, shared", markup=False)
        out.print(
            f"{'bucket':<14} {'buffers':>8} {'arena':>16} {'lower bound':>16} {'gap':>7}",
            markup=False,
        )
        for bucket, sol in zip(plan.buckets, solutions, strict=True):
            out.print(
                f"{bucket.label:<14} {len(sol.problem):>8} {sol.arena_size:>16,} "
                f"{sol.lower_bound:>16,} {sol.gap:>7.2%}",
                markup=False,
            )
        out.print(
            f"largest      {plan.arena_size:,} bytes ({plan.largest.label}"
            + (", weights included)" if plan.weights is not None else ")"),
            markup=False,
        )
        if args.output is not None and met:
            written = ", ".join(
                str(_bucket_output(Path(args.output), b.label)) for b in plan.buckets
            )
            out.print(f"written      {written}", markup=False)
    if not met:
        # The reason goes to stderr with --quiet too: it hides the figures, not a failure.
        unwritten = "; no bucket's file written" if args.output is not None else ""
        err.print(
            f"npumem plan: capacity {args.capacity:,} not met: the largest bucket needs "
            f"{plan.arena_size:,} bytes ({plan.largest.label}){unwritten}",
            markup=False,
        )
        return ExitStatus.NOT_MET
    return ExitStatus.OK


def run(args: argparse.Namespace) -> int:
    """Run `npumem plan` with parsed arguments; returns the exit status."""
    from rich.console import Console

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    if args.output is not None and not args.output:
        err.print("npumem plan: error: the output path is empty", markup=False)
        return ExitStatus.USAGE
    if args.output is not None and _output_kind(Path(args.output), args.format) is None:
        err.print(
            f"npumem plan: error: cannot tell the format of {args.output} from its extension "
            "(use .csv, .json or .h, or name one with --format csv|json|h)",
            markup=False,
        )
        return ExitStatus.USAGE
    if args.output is not None and is_same_file(args.output, args.input):
        err.print(
            f"npumem plan: error: {args.output} is the input file; write the plan elsewhere",
            markup=False,
        )
        return ExitStatus.USAGE
    if args.output is not None:
        # Before the search: a FIFO, a device or a directory is refused, not replaced, and
        # refused now rather than after the time limit.
        try:
            check_output_path(args.output)
        except OSError as exc:
            err.print(
                f"npumem plan: error: cannot write {args.output}: {exc.strerror or exc}",
                markup=False,
            )
            return write_error_status(exc)
    if args.in_flight is not None and not args.double_buffer:
        err.print(
            "npumem plan: error: --in-flight sets the inferences in flight of --double-buffer; "
            "name the buffers to load ahead with --double-buffer NAME,...",
            markup=False,
        )
        return ExitStatus.USAGE
    dims: dict[str, list[int]] = args.dim or {}
    if any(len(v) > 1 for v in dims.values()):
        return _run_buckets(args, dims, out, err)
    try:
        problem = load_problem(
            args.input,
            dims={k: v[0] for k, v in dims.items()},
            alignment=args.alignment,
            include_weights=args.include_weights,
        )
        if args.double_buffer:
            problem = problem.pipelined(args.double_buffer, _in_flight(args))
    except (PlanError, MissingDependencyError, ValueError) as exc:
        err.print(f"npumem plan: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    if args.pool:
        return _run_tiers(args, problem, out, err)

    show_progress = not args.quiet and err.is_terminal
    status_line = err.status("searching...") if show_progress else None

    def progress(p: Progress) -> None:
        if status_line is not None:
            status_line.update(
                f"searching: best {p.arena_size:,} bytes, lower bound {p.lower_bound:,}, "
                f"{p.seconds:.1f} s"
            )

    if status_line is not None:
        status_line.start()
    try:
        solution = solve(
            problem,
            capacity=args.capacity,
            time_limit=args.time_limit,
            seed=args.seed,
            progress=progress,
        )
    except PlanTooLargeError as exc:
        # No plan fits what a plan addresses: bad input when that is proven, else a goal
        # (a plan at all) not met in the time given.
        err.print(f"npumem plan: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE if exc.proven else ExitStatus.NOT_MET
    finally:
        if status_line is not None:
            status_line.stop()
    solution.validate()
    met = solution.status not in (NOT_MET, INFEASIBLE)
    if args.output is not None and met:  # a run that fails writes no file
        text = _render(solution, Path(args.output), args.format)
        failed = _write_all({Path(args.output): text}, err)
        if failed is not None:
            return failed
    if not args.quiet:
        s = solution.stats
        lines = [
            f"input        {args.input} ({len(problem)} buffers)",
            f"arena size   {solution.arena_size:,} bytes",
            f"lower bound  {solution.lower_bound:,} bytes",
            f"gap          {solution.gap:.2%}",
            f"no reuse     {solution.naive_size:,} bytes",
            f"greedy       {s.greedy_arena:,} bytes "
            f"({s.greedy_rule}, {s.greedy_seconds * 1e3:.1f} ms)",
            f"status       {solution.status}",
            f"time         {s.seconds:.3f} s",
        ]
        if args.capacity is not None:
            fit = "fits" if solution.fits else "does NOT fit"
            lines.insert(2, f"capacity     {args.capacity:,} bytes: {fit}")
        for name, ids in problem.slots.items():
            slot_text = ", ".join(f"{solution.offsets[i]:,}" for i in ids)
            lines.append(
                f"slots        {name}: iteration i uses slot i % {len(ids)} at {slot_text}"
            )
        if args.output is not None:
            lines.append(f"written      {args.output}" if met else "written      nothing")
        for line in lines:
            out.print(line, markup=False)
    if solution.status in (NOT_MET, INFEASIBLE):
        # The reason goes to stderr with --quiet too: it hides the figures, not a failure.
        why = (
            "proven impossible"
            if solution.status == INFEASIBLE
            else f"no packing found in {args.time_limit:g} s"
        )
        unwritten = f"; {args.output} not written" if args.output is not None else ""
        err.print(
            f"npumem plan: capacity {args.capacity:,} not met ({why}); best arena "
            f"{solution.arena_size:,} bytes{unwritten}",
            markup=False,
        )
        return ExitStatus.NOT_MET
    return ExitStatus.OK


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `plan` subcommand to an `argparse` subparsers object; `func` runs it."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="plan static tensor offsets (MiniMalloc CSV, graph JSON or ONNX in)",
        description="Plan static tensor offsets: every buffer of a model gets an offset in one "
        "arena, as small as the search finds in the time limit. INPUT is a MiniMalloc CSV, a "
        "problem or graph JSON, or an ONNX model (told apart by extension, else by content). "
        "OUTPUT's extension picks the format: .csv (MiniMalloc solution), .json (an npumem-plan "
        "file, or with --pool an npumem-tier-plan file; npumem plot draws both) or .h (C header "
        "with the offset table); --format names it for any other name.",
        epilog="Exit status: 0 done, 1 --capacity not met (OUTPUT is not written) or OUTPUT "
        "could not be written (a full disk, an I/O error), 2 bad arguments or input, or an "
        "OUTPUT path that cannot hold the file (no such folder, no permission).",
    )
    parser.add_argument("input", metavar="INPUT", help="MiniMalloc CSV, problem/graph JSON or ONNX")
    parser.add_argument(
        "-o", "--output", metavar="OUTPUT", help="solution file: .csv, .json or .h (C header)"
    )
    parser.add_argument(
        "--format", choices=("csv", "json", "h"), help="output format (default: from OUTPUT)"
    )
    parser.add_argument(
        "--capacity",
        type=positive_byte_count,
        metavar="N",
        help="stop at the first packing within N bytes, at least 1 (1048576, 64MiB, 1.5GiB, "
        "...); exit 1 if none",
    )
    parser.add_argument(
        "--time-limit",
        type=non_negative_seconds,
        default=10.0,
        metavar="S",
        help="seconds to search (default 10)",
    )
    parser.add_argument(
        "--seed", type=non_negative, default=0, metavar="N", help="search seed (default 0)"
    )
    parser.add_argument(
        "--dim",
        type=_dim,
        action=_DimAction,
        metavar="NAME=N[,N...]",
        help="bind a symbolic ONNX dimension, or give the value of an integer scalar input "
        "such as a loop's trip count (repeatable); several values plan one arena per bucket, "
        "the weights shared",
    )
    parser.add_argument(
        "--double-buffer",
        type=_names,
        default=[],
        metavar="NAME,...",
        help="buffers loaded for the next inference while this one computes: one slot each per "
        "inference in flight",
    )
    parser.add_argument(
        "--in-flight",
        type=integer_from(1, MAX_IN_FLIGHT, "inferences in flight"),
        metavar="K",
        help="inferences in flight for --double-buffer (default 2); needs --double-buffer",
    )
    parser.add_argument(
        "--alignment",
        type=_alignment,
        metavar="N",
        help="minimum alignment of every buffer (graphs and ONNX: default 64)",
    )
    parser.add_argument(
        "--include-weights", action="store_true", help="plan weights too (graphs and ONNX)"
    )
    parser.add_argument(
        "--pool",
        type=_pool,
        action="append",
        metavar="NAME[=BYTES]",
        help="a memory pool, fastest first (repeatable): --pool sram=2MiB --pool hbm",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing on success (a failure still prints its reason on stderr)",
    )
    parser.set_defaults(func=run)
    return parser


# ----- plans over several pools (--pool) ---------------------------------------------------------
#
#     npumem plan INPUT -o OUTPUT --pool sram=2MiB --pool hbm [--time-limit S]
#
# Pools fastest first; only the last may have no capacity. The buffers are spread over them, the
# most weight in the first (npumem.plan.tiers): a `pool` column in CSV, a field in JSON, a table
# per pool in the C header. Exit status 1 when a pool's capacity is not met.


def _pool(text: str) -> tuple[str, int | None]:
    try:
        return parse_pools([text])[0]
    except (PlanError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_tiers(args: argparse.Namespace, problem: Problem, out: Any, err: Any) -> int:
    """`npumem plan --pool ...`: spread the buffers over the pools, write, report."""
    try:
        if args.capacity is not None:
            raise PlanError("--capacity plans one arena; with --pool give each pool a capacity")
        pools = parse_pools(args.pool)
    except PlanError as exc:
        err.print(f"npumem plan: error: {one_line(exc)}", markup=False)
        return ExitStatus.USAGE
    solution: TieredSolution = solve_tiers(
        problem, pools, time_limit=args.time_limit, seed=args.seed
    )
    solution.validate(capacities=False)
    if args.output is not None and solution.fits:  # a run that fails writes no file
        text = _render(solution, Path(args.output), args.format)
        failed = _write_all({Path(args.output): text}, err)
        if failed is not None:
            return failed
    if not args.quiet:
        out.print(f"input        {args.input} ({len(problem)} buffers)", markup=False)
        for name, cap in solution.pools:
            sol = solution.solutions[name]
            within = "" if cap is None else f" of {cap:,}"
            out.print(
                f"pool {name:<8} {len(sol.offsets)} buffers, arena {sol.arena_size:,} bytes"
                f"{within}, weight {solution.weight_in(name):,.0f}",
                markup=False,
            )
        out.print(
            f"weight       {solution.weight_placed:,.0f} in {solution.pools[0][0]}, at most "
            f"{solution.weight_bound:,.0f} (gap {solution.weight_gap:.2%})",
            markup=False,
        )
        out.print(f"status       {solution.status}", markup=False)
        out.print(f"time         {solution.seconds:.3f} s", markup=False)
        if args.output is not None:
            out.print(f"written      {args.output if solution.fits else 'nothing'}", markup=False)
    if not solution.fits:
        # The reason goes to stderr with --quiet too: it hides the figures, not a failure.
        over = [
            f"pool {name}'s arena is {solution.solutions[name].arena_size:,} bytes, over its "
            f"{cap:,}"
            for name, cap in solution.pools
            if cap is not None and solution.solutions[name].arena_size > cap
        ]
        unwritten = f"; {args.output} not written" if args.output is not None else ""
        err.print(
            f"npumem plan: capacity not met: {'; '.join(over) or 'a pool is over'}{unwritten}",
            markup=False,
        )
        return ExitStatus.NOT_MET
    return ExitStatus.OK
