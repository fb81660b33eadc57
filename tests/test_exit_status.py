"""Exit statuses: one definition (npumem.exit_status) used by every subcommand; sizes with
decimals and units wherever a subcommand takes one."""

from __future__ import annotations

import ast
import contextlib
import errno
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cli_contract import save_snapshot_and_trace
from npumem.cli import build_parser, main
from npumem.exit_status import ExitStatus

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "npumem"
DATA = Path(__file__).resolve().parent / "data" / "minimalloc"


def test_values() -> None:
    assert (ExitStatus.OK, ExitStatus.NOT_MET, ExitStatus.USAGE) == (0, 1, 2)
    assert all(isinstance(status, int) for status in ExitStatus)


def test_exit_statuses_are_defined_once() -> None:
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                assert not [n for n in names if n.startswith("EXIT_")], f"{path}: {names}"


def test_plan_statuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = str(DATA / "input.12.csv")
    assert main(["plan", src, "-q", "--capacity", "12B"]) is ExitStatus.OK
    assert (
        main(["plan", src, "-q", "--capacity", "11", "--time-limit", "0.2"]) is ExitStatus.NOT_MET
    )
    assert main(["plan", str(tmp_path / "missing.csv")]) is ExitStatus.USAGE
    bad = tmp_path / "bad.json"
    bad.write_text("[" * 100_000)
    assert main(["plan", str(bad)]) is ExitStatus.USAGE
    assert "bad.json: not readable JSON (nested too deeply)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["plan", "in.csv", "--capacity", "1.5GiB"], "capacity", 3 << 29),
        (["plan", "in.csv", "--alignment", "0.5KiB"], "alignment", 512),
        (["demo", "--capacity", "1.5GiB"], "capacity", 3 << 29),
        (["demo", "--capacity", "2 GB"], "capacity", 2_000_000_000),
        (["replay", "t.json", "--capacity", "1.5GiB"], "capacity", 3 << 29),
        (["replay", "t.json", "--chunk-size", "1e6"], "chunk_size", 1_000_000),
        (["replay", "t.json", "--min-block", "0.25KiB"], "min_block", 256),
        (["replay", "t.json", "--bank-size", "64k"], "bank_size", 64 << 10),
    ],
)
def test_every_size_option_takes_units_and_decimals(argv: list[str], dest: str, value: int) -> None:
    assert getattr(build_parser().parse_args(argv), dest) == value


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["plan", "in.csv", "--capacity=-1GiB"], "is not a byte count: it is negative"),
        (["demo", "--capacity", "0.3KiB"], "not a whole number"),
        (["replay", "t.json", "--capacity", "nan"], "must be a finite number"),
        (["plan", "in.csv", "--capacity", "-inf"], "'-inf' is not a byte count"),
        (["demo", "--capacity", "-NaN"], "'-NaN' is not a byte count"),
    ],
)
def test_bad_sizes_exit_usage(
    argv: list[str], text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == ExitStatus.USAGE
    assert text in capsys.readouterr().err


def test_host_memory_running_out_is_one_line_and_leaves_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import npumem.plan.cli

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(npumem.plan.cli, "solve", out_of_memory)
    out = tmp_path / "plan.csv"
    out.write_text("old plan\n")
    status = main(["plan", str(DATA / "input.12.csv"), "-q", "-o", str(out)])
    assert status is ExitStatus.NOT_MET
    assert capsys.readouterr().err == "npumem plan: error: out of host memory\n"
    assert out.read_text() == "old plan\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.csv"]


def test_a_module_that_cannot_load_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import npumem.cli

    def unloadable() -> None:
        raise ImportError("libfoo.so: failed to map segment from shared object")

    monkeypatch.setattr(npumem.cli, "build_parser", unloadable)
    assert main(["plan", "x.csv"]) is ExitStatus.NOT_MET
    assert capsys.readouterr().err == (
        "npumem: error: libfoo.so: failed to map segment from shared object\n"
    )


def test_a_pool_running_out_is_named_as_such(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import npumem
    import npumem.plan.cli

    def pool_full(*args: object, **kwargs: object) -> None:
        pool = npumem.Pool(1 << 20, backing="none", cores=1)
        pool.alloc(2 << 20)

    monkeypatch.setattr(npumem.plan.cli, "solve", pool_full)
    status = main(["plan", str(DATA / "input.12.csv"), "-q"])
    assert status is ExitStatus.NOT_MET
    err = capsys.readouterr().err
    assert err.startswith("npumem plan: error: ") and "out of host memory" not in err
    assert len(err.splitlines()) == 1


# ----- stdout that cannot be written ------------------------------------------------------------


class _FullStdout(io.StringIO):
    """A stdout whose device is full (`>/dev/full`): every write, or every flush, fails."""

    def __init__(self, fail_on: str) -> None:
        super().__init__()
        self.fail_on = fail_on

    def write(self, text: str) -> int:
        if self.fail_on == "write":
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)

    def flush(self) -> None:
        if self.fail_on == "flush":
            raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture(scope="module")
def saved_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A snapshot and a trace of a few blocks."""
    return save_snapshot_and_trace(tmp_path_factory.mktemp("saved"), "stdout")


STDOUT_COMMANDS = [
    (["--version"], None),
    (["--help"], None),
    (["report", "--help"], None),
    (["report", "{snapshot}"], None),
    (["report", "--json", "{snapshot}"], None),
    (["replay", "{trace}"], None),
    (["replay", "--json", "{trace}"], None),
    (["export", "{trace}", "-o", "{out}/e.json"], "e.json"),
    (["view", "{snapshot}", "-o", "{out}/v.html"], "v.html"),
    (["plot", "{snapshot}", "-o", "{out}/p.png"], "p.png"),
    (
        ["plan", str(DATA / "input.12.csv"), "-o", "{out}/plan.csv", "--time-limit", "0.2"],
        "plan.csv",
    ),
]


@pytest.mark.parametrize("fail_on", ["write", "flush"])
@pytest.mark.parametrize(("argv", "written"), STDOUT_COMMANDS)
def test_a_stdout_that_cannot_be_written_is_one_line_and_status_1(
    argv: list[str],
    written: str | None,
    fail_on: str,
    saved_files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every command, `--help` and `--version` too: one line naming stdout, status 1, no
    traceback; the files the command wrote before are complete and stay."""
    names = {**{k: str(v) for k, v in saved_files.items()}, "out": str(tmp_path)}
    monkeypatch.setattr(sys, "stdout", _FullStdout(fail_on))
    try:
        status = main([a.format(**names) for a in argv])
    except SystemExit as exc:  # argparse's exit: status 0 would mean the text was lost unsaid
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == ExitStatus.NOT_MET, err
    assert err.endswith(": error: cannot write to stdout: No space left on device\n"), err
    assert len(err.splitlines()) == 1 and err.startswith("npumem")
    if written is not None:
        assert (tmp_path / written).stat().st_size > 0


def test_the_demo_with_a_full_stdout_keeps_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdout", _FullStdout("write"))
    out = tmp_path / "demo"
    argv = ["demo", "--quick", "--requests", "5", "--workers", "1", "--no-tiers", "-o", str(out)]
    assert main(argv) is ExitStatus.NOT_MET
    assert capsys.readouterr().err == (
        "npumem demo: error: cannot write to stdout: No space left on device\n"
    )
    assert (out / "snapshot.json").stat().st_size > 0


@pytest.mark.parametrize("stdout", ["/dev/full", "closed pipe"])
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["plan", "--help"]])
def test_a_stdout_that_fails_in_a_real_process_is_one_line(stdout: str, argv: list[str]) -> None:
    """As a process: no traceback, no `Exception ignored` as the interpreter exits, status 1;
    a closed pipe (`| head` gone) is EPIPE: status 1 and nothing on stderr."""
    if stdout == "/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        with open(stdout, "w") if stdout == "/dev/full" else os.fdopen(write_end, "w") as out:
            done = subprocess.run(
                [sys.executable, "-m", "npumem", *argv],
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                timeout=120,
                check=False,
            )
    finally:
        with contextlib.suppress(OSError):
            os.close(write_end)
    assert done.returncode == ExitStatus.NOT_MET, done.stderr
    if stdout == "/dev/full":
        prog = "npumem plan" if argv[0] == "plan" else "npumem"  # the command whose help it is
        assert done.stderr == f"{prog}: error: cannot write to stdout: No space left on device\n"
    else:
        assert done.stderr == ""


def test_a_stdout_whose_write_returns_nothing_is_used_as_it_is(
    saved_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file-like stdout may return None from `write` (not a count): the command runs on."""

    class Quiet(io.StringIO):
        def write(self, text: str) -> None:  # type: ignore[override]
            super().write(text)

    stream = Quiet()
    monkeypatch.setattr(sys, "stdout", stream)
    assert main(["report", str(saved_files["snapshot"])]) is ExitStatus.OK
    assert "snapshot of pool 'stdout'" in stream.getvalue()


# ----- signals once the result is final ---------------------------------------------------------

# `npumem export` run as the program (`main()` without arguments, as the `npumem` script calls
# it), with the signal sent at each point in turn where its handler could raise once the
# subcommand has returned, its file in place and its report printed: as a call returns and as
# a function starts (a profile hook's `c_return` events, and `call` events of functions that
# are not generators), up to the return of `main()`. Every run must end as a finished one:
# status 0, the new file, no temporary file. It prints one line per run that did not, then the
# number of points tried.
_SIGNAL_AT_EVERY_POINT_AFTER_THE_RESULT = r"""
import os
import signal
import sys
from pathlib import Path

import npumem.cli
from npumem.monitor import cli as monitor_cli

trace, folder, sig = sys.argv[1], Path(sys.argv[2]), signal.Signals[sys.argv[3]]
out = folder / "out.json"
RETURNED, MAIN = monitor_cli.run_export.__code__, npumem.cli.main.__code__
GENERATOR = 0x20  # inspect.CO_GENERATOR


def hook_at(point, where):
    seen = 0
    after = False

    def hook(frame, event, arg):
        nonlocal seen, after
        if event == "return" and frame.f_code in (RETURNED, MAIN):
            after = frame.f_code is RETURNED
        elif after and (
            event == "c_return" or (event == "call" and not frame.f_code.co_flags & GENERATOR)
        ):
            if seen == point:
                name = getattr(arg, "__qualname__", "") if event == "c_return" else ""
                where.append(f"{event} {name} in {frame.f_code.co_name}:{frame.f_lineno}")
                signal.raise_signal(sig)
            seen += 1

    return hook


points = 0
while True:
    for name in os.listdir(folder):
        os.unlink(folder / name)
    out.write_text("old")
    # As a new process has them: main() leaves them ignored once it is done.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.argv = ["npumem", "export", trace, "-o", str(out)]
    where = []
    sys.setprofile(hook_at(points, where))
    try:
        status = npumem.cli.main()
    except BaseException as exc:  # a signal's exception that escaped main()
        status = type(exc).__name__
    finally:
        sys.setprofile(None)
    names = os.listdir(folder)
    if status != 0 or names != ["out.json"] or out.read_text() == "old":
        print(f"at {where}: status {status}, files {names}")
    points += 1
    if not where:  # main() returned before the point: every point was tried
        break
print(points)
"""


def _run_script(
    script: str, *args: object, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `script` in a new interpreter that imports this one's npumem, with `args`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_once_the_result_is_final_changes_nothing(
    sig: str, saved_files: dict[str, Path], tmp_path: Path
) -> None:
    """Ctrl-C or `kill` after the command has written its file and printed its report, at any
    point up to the return of main(): status 0, nothing on stderr, the new file."""
    done = _run_script(
        _SIGNAL_AT_EVERY_POINT_AFTER_THE_RESULT, saved_files["trace"], tmp_path, sig, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    *lines, summary = done.stdout.splitlines()
    assert [line for line in lines if not line.startswith("wrote ")] == []
    assert int(summary) > 10


# The signal sent as the interpreter exits after main(): from an `atexit` callback, and from
# a finalizer that runs as the interpreter tears the modules down, after it has stopped taking
# signals in Python (their default action would end the process there).
_SIGNAL_AS_THE_INTERPRETER_EXITS = r"""
import atexit
import os
import signal
import sys

from npumem.cli import main

trace, out, sig = sys.argv[1], sys.argv[2], signal.Signals[sys.argv[3]]
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)


class SignalAsTheModulesGo:
    def __del__(self):
        os.kill(os.getpid(), sig)


at_teardown = SignalAsTheModulesGo()
atexit.register(os.kill, os.getpid(), sig)
sys.argv = ["npumem", "export", trace, "-o", out]
sys.exit(main())
"""


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_while_the_interpreter_exits_changes_nothing(
    sig: str, saved_files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    done = _run_script(_SIGNAL_AS_THE_INTERPRETER_EXITS, saved_files["trace"], out, sig)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"wrote {out} ")
    assert json.loads(out.read_text())["traceEvents"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_main_with_arguments_gives_the_handlers_back(saved_files: dict[str, Path]) -> None:
    """A program or a test that runs the command keeps its signals' handlers."""
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    assert main(["report", str(saved_files["snapshot"])]) is ExitStatus.OK
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


# `main()` run as the program twice in one process (a program that sets `sys.argv` and calls
# it again): the first leaves SIGINT and SIGTERM ignored for the interpreter's exit; the
# second must take them all the same, and a child process it starts must not inherit an
# ignored SIGINT. The signal comes while the second export writes its file.
_MAIN_AGAIN_AS_THE_PROGRAM = r"""
import os
import signal
import subprocess
import sys

import npumem.cli
import npumem.monitor.perfetto as perfetto

trace, out, sig = sys.argv[1], sys.argv[2], signal.Signals[sys.argv[3]]
sys.argv = ["npumem", "export", trace, "-o", out]
print("first", npumem.cli.main())
ignored = [signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)]
print("ignored after the first", ignored)
write = perfetto.write_chrome_trace


def interrupted_write(*args, **kwargs):
    child = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
        capture_output=True, text=True, check=True,
    )
    print("child's SIGINT", child.stdout.strip())
    os.kill(os.getpid(), sig)
    return write(*args, **kwargs)


perfetto.write_chrome_trace = interrupted_write
os.unlink(out)
print("second", npumem.cli.main())
print("file", os.path.exists(out))
ignored = [signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)]
print("ignored after the second", ignored)
"""


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_main_run_as_the_program_again_takes_the_signals_again(
    sig: str, status: int, saved_files: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    done = _run_script(_MAIN_AGAIN_AS_THE_PROGRAM, saved_files["trace"], out, sig)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("wrote ")]
    assert lines == [
        "first 0",
        "ignored after the first [True, True]",
        "child's SIGINT <built-in function default_int_handler>",
        f"second {status}",
        "file False",
        "ignored after the second [True, True]",
    ]
    word = "interrupted" if sig == "SIGINT" else "terminated"
    assert done.stderr == f"npumem export: {word}\n"


def test_main_after_a_handler_set_since_the_program_main_keeps_it(
    saved_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal that main() left ignored, given a handler of the program's since, keeps it;
    one still ignored is taken again and ignored again afterwards."""
    import npumem.cli
    from npumem.monitor import cli as monitor_cli

    def mine(signum: int, frame: object) -> None:
        pass

    monkeypatch.setattr(npumem.cli, "_IGNORED_BY_MAIN", {signal.SIGINT, signal.SIGTERM})
    saved = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    seen: list[object] = []

    def report(args: object) -> int:
        seen.extend((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
        return ExitStatus.OK

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, mine)
        monkeypatch.setattr(monitor_cli, "run_report", report)
        assert main(["report", str(saved_files["snapshot"])]) == ExitStatus.OK
        assert seen[0] not in (signal.SIG_IGN, signal.SIG_DFL), "SIGINT taken"
        assert seen[1] is mine, "SIGTERM keeps the program's handler"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is mine
        assert set(npumem.cli._IGNORED_BY_MAIN) == {signal.SIGINT}
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
