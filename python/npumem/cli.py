"""The `npumem` command: one entry point, a subcommand per job.

Each subcommand lives next to the code it drives and registers itself through an
`add_parser(subparsers)` function that returns the parser, with `func` set to a callable
`(args) -> int` exit status (`npumem.exit_status.ExitStatus`).

Bad arguments are refused like every other bad input: one line on stderr,
`npumem SUBCOMMAND: error: MESSAGE` (`npumem: error: MESSAGE` before a subcommand is known),
nothing on stdout, exit status 2; `--help` prints the full usage. A value that starts with a
minus sign and a digit is taken as a value (`--capacity -1MiB` is refused by the size parser,
not taken for an unknown option). Every argument taken as plain text is a file path: text that
no file name can hold (a NUL character, a lone surrogate) is a bad argument too.

Output that cannot be written to stdout (a full disk, `>/dev/full`) is reported the same way:
one line, `npumem SUBCOMMAND: error: cannot write to stdout: REASON`, and exit status 1, for
`--help` and `--version` too. A pipe whose reader has gone (`npumem report x | head`) ends the
command with exit status 1 and no line: the reader stopped on purpose. The files a command
wrote before that are complete and stay; only its printed summary is lost. An output file that
cannot be written is one line too, `npumem SUBCOMMAND: error: cannot write PATH: REASON`, with
the status `npumem.exit_status.write_error_status` gives: 2 for a path that cannot hold the
file, 1 for a write that fails for a reason of the moment (a full disk).

Ctrl-C (SIGINT) and `kill` (SIGTERM) stop a command that is still working with one line,
`npumem SUBCOMMAND: interrupted` (status 130) or `npumem SUBCOMMAND: terminated` (143);
Ctrl-C while the command is still starting gives `npumem: interrupted` (`npumem._entry`, and
`npumem._command_start` while the package loads; only while the interpreter itself starts,
before it loads the package, Python's own traceback). The
output file is left as it was, unless the command had already put its new file in place: then
only the summary it was printing is cut short (a command blocked printing to a full pipe can
still be stopped). Once the command's result is final (it has returned: its files are in place
and its report is printed; or it has failed), they no longer change it (`main`).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import errno
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from npumem._argtypes import file_path
from npumem._shown import MAX_SHOWN, shown
from npumem.exit_status import ExitStatus, one_line

__all__ = ["OneLineErrorParser", "build_parser", "main"]


_PARSING: contextvars.ContextVar[str] = contextvars.ContextVar("npumem_parsing", default="npumem")
"""The `prog` of the innermost `OneLineErrorParser` that has started parsing (`npumem`,
`npumem plan`)."""


class OneLineErrorParser(argparse.ArgumentParser):
    """An `ArgumentParser` that refuses bad arguments with one line on stderr,
    `PROG: error: MESSAGE`, and exit status 2, without the usage lines `argparse` prints first.

    Its subcommands' parsers are of the same class (`add_subparsers` makes them so), and an
    unknown argument after a subcommand is refused by that subcommand's parser, so the line
    names the subcommand.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A value that starts with a minus sign and a digit (`--capacity -1MiB`, `--seed -3`),
        # or is minus infinity or NaN, is a value, not an option, so that its option's type
        # refuses it with its own message; no option of npumem starts with a digit, `inf` or
        # `nan`.
        self._negative_number_matcher = re.compile(r"^-(\.?[0-9]|inf|nan)", re.IGNORECASE)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        """`arg_string` converted by `action`'s type. A type that fails with `ValueError` or
        `TypeError` rather than `argparse.ArgumentTypeError` would be reported with its
        function's name (`invalid _in_flight value`); it is reported as a bad value instead.

        An argument taken as plain text (no type, no choices) is a file path in every
        subcommand (an input file, `--output`): text that no file name can hold, with a NUL
        character or a lone surrogate, is refused here (`npumem._argtypes.file_path`), so that
        no subcommand meets it where it opens or stats the file."""
        if action.type is None and action.choices is None and isinstance(arg_string, str):
            try:
                file_path(arg_string)
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(action, str(exc)) from None
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            if isinstance(exc.__context__, TypeError | ValueError):
                raise argparse.ArgumentError(
                    action, f"{shown(arg_string)} is not a valid value"
                ) from None
            raise

    def error(self, message: str) -> NoReturn:
        # argparse quotes the refused values in full (an unknown argument, an invalid choice):
        # each word of the message is cut as a quoted value is (`npumem._shown`).
        words = (
            w if len(w) <= MAX_SHOWN else f"{w[:MAX_SHOWN]}... ({len(w):,} characters)"
            for w in message.split()
        )
        self.exit(ExitStatus.USAGE, f"{self.prog}: error: {' '.join(words)}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # A subcommand's parser runs inside its parent's: the last one to start is the
        # command whose --help a failed write to stdout is reported under.
        _PARSING.set(self.prog)
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self._chosen_parser(parsed).error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def _chosen_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the (innermost) subcommand `parsed` chose, or this one."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(parsed, action.dest, None)
                chosen = action.choices.get(name) if isinstance(name, str) else None
                if isinstance(chosen, OneLineErrorParser):
                    return chosen._chosen_parser(parsed)
        return self


def build_parser() -> argparse.ArgumentParser:
    from npumem._core import __version__
    from npumem.monitor import cli as monitor_cli
    from npumem.plan import cli as plan_cli
    from npumem.workloads import cli as workloads_cli

    parser = OneLineErrorParser(
        prog="npumem",
        description="npumem: accelerator-memory manager "
        "(demo, replay, plan, report, plot, view, export).",
    )
    parser.add_argument("--version", action="version", version=f"npumem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    workloads_cli.add_parsers(sub)  # demo, replay
    plan_cli.add_parser(sub)
    monitor_cli.add_parsers(sub)  # report, plot, view, export
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `npumem` command with the arguments `argv` (default: the process's, as the
    `npumem` script and `python -m npumem` run it) and return its exit status
    (`npumem.exit_status.ExitStatus`, or 128 plus the number of the signal that stopped it).

    SIGINT raises `KeyboardInterrupt` and SIGTERM `SystemExit(143)` while the command works, so
    that the file being written is cleaned up and the status is 130 or 143. A file the command
    has already put in place stays: a signal that comes while it prints its summary cuts only
    the summary short. Once its result is final (the subcommand has returned, its files in
    place and its report printed, or it has failed), neither changes the status any more: a
    signal that comes while main() finishes is dropped. Without `argv`, main() is the program
    and what follows it is the interpreter's exit, where a signal would still end a finished
    command with status 130 or 143: main() leaves both signals ignored then, and a later
    main() in the same process (a program that sets `sys.argv` and runs the command again)
    takes them as the first one did, unless something gave them another handler since. With
    `argv` (a program or a test that runs the command), main() puts their handlers back as it
    returns.

    Only from the main thread, and only for a signal with Python's own handler (SIGINT's
    `signal.default_int_handler`, SIGTERM's `SIG_DFL`) or one an earlier main() left
    ignored: a program that handles them itself, or a shell that ignores SIGINT for a
    background job, keeps its handler.
    """
    signals = _Signals()
    program = argv is None
    with (
        _taken(signal.SIGINT, signal.default_int_handler, signals.interrupt, program=program),
        _terminate_as_exit(signals, program=program),
        _finalizers_quiet_when_memory_runs_out(),
        _stdout_checked(),
    ):
        return _run(argv, signals)


def _run(argv: Sequence[str] | None, signals: _Signals) -> int:
    prog = "npumem"
    failure: str | None = None
    # argparse's exit (--help, --version, a refused argument) or SIGTERM's, raised again once
    # stdout is flushed.
    leaving: SystemExit | None = None
    status: int = ExitStatus.NOT_MET
    lost = False  # whether a write to stdout failed
    args: argparse.Namespace | None = None
    _PARSING.set(prog)
    try:
        try:
            parser = build_parser()
            args = parser.parse_args(argv)
            if isinstance(parser, OneLineErrorParser):
                prog = parser._chosen_parser(args).prog
            status = args.func(args)
        finally:
            # The result is final, whether the call returned or raised: set with no call in
            # between, where the interpreter would run a signal's handler.
            signals.final = True
    except _Terminated:
        # SIGTERM: the file being written was cleaned up as for Ctrl-C; one line, as the
        # shell's own status for SIGTERM.
        failure, status = "terminated", 128 + signal.SIGTERM
    except SystemExit as exc:
        leaving = exc
    except _StdoutError as exc:
        failure, status, lost = exc.message, ExitStatus.NOT_MET, True
    except KeyboardInterrupt:
        # Ctrl-C: the file being written was cleaned up on the way out; one line, as the
        # shell's own status for SIGINT.
        failure, status = "interrupted", 128 + signal.SIGINT
    except MemoryError as exc:
        # Memory ran out where no subcommand expected it: the host's (an address-space limit,
        # a full machine: a bare MemoryError) or a pool's (npumem's errors say which); the
        # file being written was cleaned up as for Ctrl-C.
        reason = "out of host memory" if type(exc) is MemoryError else one_line(exc)
        failure, status = f"error: {reason}", ExitStatus.NOT_MET
    except ImportError as exc:
        # A module of npumem or of a dependency that cannot be loaded (a broken install, or
        # no address space left to map a shared library).
        failure, status = f"error: {one_line(exc)}", ExitStatus.NOT_MET
    if args is None:  # stopped while parsing (--help, --version): name the command parsed
        prog = _PARSING.get()
    # What is still buffered goes now, while a failure can be reported, not as the interpreter
    # exits (where it would be a traceback-like warning, or lost).
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except _StdoutError as exc:
        lost = True
        if failure is None:
            failure, status = exc.message, ExitStatus.NOT_MET
    if lost:
        _discard_stdout()
        if leaving is not None and not leaving.code:  # --help, --version: their text is lost
            leaving = None
    # The line is printed once the exception is gone: its frames held what filled the memory.
    if failure is not None:
        with contextlib.suppress(OSError):
            print(f"{prog}: {failure}", file=sys.stderr)
    if leaving is not None:
        raise leaving
    return status


class _StdoutError(Exception):
    """A write to stdout that failed (`error`, an `OSError`: a full disk, a closed pipe).

    Not an `OSError`, so that a command's `except OSError` about the files it writes does not
    take it for its own; `main()` reports it."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error
        # A reader that went away (`| head`) stopped on purpose: nothing to report.
        self.message: str | None = (
            None
            if error.errno == errno.EPIPE
            else f"error: cannot write to stdout: {error.strerror or error}"
        )


class _CheckedStdout:
    """`sys.stdout` while a command runs: the same stream, but a failed write or flush raises
    `_StdoutError`."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> Any:
        try:
            return self._stream.write(text)  # what the stream returns (a count, or None)
        except OSError as exc:
            raise _StdoutError(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise _StdoutError(exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _stdout_checked() -> Iterator[None]:
    """While a command runs, `sys.stdout` raises `_StdoutError` for a write that fails
    (`_CheckedStdout`); the stream it wraps is put back afterwards."""
    stream = sys.stdout
    if stream is None:  # no stdout at all (pythonw): nothing to check
        yield
        return
    sys.stdout = _CheckedStdout(stream)
    try:
        yield
    finally:
        sys.stdout = stream


def _discard_stdout() -> None:
    """After a failed write to stdout: point file descriptor 1 at `os.devnull`, as Python's
    documentation advises for a broken pipe, so that what is still buffered is dropped quietly
    as the interpreter exits rather than failing again there. A stdout that is no file
    descriptor (a test's capture) is left alone."""
    with contextlib.suppress(OSError, ValueError):
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)


@contextlib.contextmanager
def _finalizers_quiet_when_memory_runs_out() -> Iterator[None]:
    """While a command runs, a finalizer that fails for want of host memory (a generator
    closed while an exception unwinds its frame) is not reported: the command's one line says
    that memory ran out. Any other failure goes to the hook as before."""
    hook = sys.unraisablehook

    def report(unraisable: Any) -> None:
        if not issubclass(unraisable.exc_type, MemoryError):
            hook(unraisable)

    sys.unraisablehook = report
    try:
        yield
    finally:
        sys.unraisablehook = hook


class _Terminated(SystemExit):
    """SIGTERM's exit (see `_terminate_as_exit`)."""


class _Signals:
    """SIGINT's and SIGTERM's handlers while `main()` runs: each raises its exception until the
    command's result is `final`, and does nothing after."""

    def __init__(self) -> None:
        self.final = False
        """Whether the command has returned its status or failed (set by `main()`)."""

    def interrupt(self, signum: int, frame: object) -> None:
        """SIGINT: `KeyboardInterrupt`, as Python's own handler raises it."""
        if not self.final:
            raise KeyboardInterrupt

    def terminate(self, signum: int, frame: object) -> None:
        """SIGTERM: `_Terminated(143)`."""
        if not self.final:
            raise _Terminated(128 + signum)


_IGNORED_BY_MAIN: set[int] = set()
"""The signals that a `main()` run as the program left ignored for the interpreter's exit
(`_taken`), and that nothing has given another handler since: a later `main()` in the same
process (a program that runs the command again) takes them as the first one did."""


@contextlib.contextmanager
def _taken(
    signum: int, default: Any, handler: Callable[[int, Any], None], *, program: bool
) -> Iterator[None]:
    """While the block runs, `handler` takes the signal `signum` if it has the handler
    `default`, or is ignored because an earlier `main()` left it so (`_IGNORED_BY_MAIN`);
    afterwards the signal gets the handler it had back, or is ignored when `program` (the
    process has nothing left to do but exit). Only from the main thread, where Python runs
    signal handlers; a signal with another handler keeps it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signum)
    if before != signal.SIG_IGN:
        _IGNORED_BY_MAIN.discard(signum)  # given another handler since
    if before != default and signum not in _IGNORED_BY_MAIN:
        yield
        return
    signal.signal(signum, handler)
    try:
        yield
    finally:
        if program:
            signal.signal(signum, signal.SIG_IGN)
            _IGNORED_BY_MAIN.add(signum)
        else:
            signal.signal(signum, before)


def _terminate_as_exit(
    signals: _Signals | None = None, *, program: bool = False
) -> contextlib.AbstractContextManager[None]:
    """While a command runs, SIGTERM (`kill`, a job scheduler's time limit) raises
    `_Terminated(143)` rather than ending the process where it stands, so that a file being
    written is cleaned up as for Ctrl-C: the output stays as it was and no temporary file is
    left next to it; once `signals.final`, it does nothing. Only from the main thread, and only
    when SIGTERM has its default action (a program that calls `main()` and handles SIGTERM
    itself keeps its handler); afterwards SIGTERM has it again, or is ignored when `program`
    (`_taken`)."""
    handler = (signals or _Signals()).terminate
    return _taken(signal.SIGTERM, signal.SIG_DFL, handler, program=program)


if __name__ == "__main__":
    sys.exit(main())
