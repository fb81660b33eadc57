"""Output files that cannot be written: every subcommand that writes one follows one rule
(`npumem.exit_status.write_error_status`), status 2 for a path that cannot hold the file and 1
for a write that fails for a reason of the moment, with one line on stderr, the old file as it
was and no temporary file."""

from __future__ import annotations

import builtins
import errno
import os
import re
from pathlib import Path
from typing import Any

import pytest

from cli_contract import run_cli, save_snapshot_and_trace
from npumem.cli import main
from npumem.exit_status import ExitStatus, write_error_status

DATA = Path(__file__).resolve().parent / "data" / "minimalloc"

# Each command that writes files: its arguments (`{out}` the output given) and the names of
# the files it writes in the folder of `{out}` (for the demo, in `{out}`).
COMMANDS: dict[str, tuple[list[str], str, list[str]]] = {
    "plan": (
        ["plan", str(DATA / "input.12.csv"), "-q", "--time-limit", "0.2", "-o", "{out}"],
        "plan.csv",
        ["plan.csv"],
    ),
    "plan --pool": (
        [
            "plan",
            str(DATA / "input.12.csv"),
            "-q",
            "--time-limit",
            "0.2",
            "--pool",
            "sram=1MiB",
            "--pool",
            "hbm",
            "-o",
            "{out}",
        ],
        "plan.json",
        ["plan.json"],
    ),
    "plan --dim N=1,8": (
        ["plan", "{model}", "-q", "--time-limit", "0.2", "--dim", "batch=1,8", "-o", "{out}"],
        "plan.json",
        ["plan.batch1.json", "plan.batch8.json"],
    ),
    "plot": (["plot", "{snapshot}", "-o", "{out}"], "map.svg", ["map.svg"]),
    "view": (["view", "{trace}", "-o", "{out}"], "page.html", ["page.html"]),
    "export": (["export", "{trace}", "-o", "{out}"], "trace.json", ["trace.json"]),
    "demo": (
        ["demo", "--quick", "--requests", "5", "--workers", "1", "--no-tiers", "-o", "{out}"],
        "demo",
        ["snapshot.json"],
    ),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A snapshot and a trace of a few blocks, and (with onnx) a model with a batch
    dimension."""
    folder = tmp_path_factory.mktemp("inputs")
    files = {k: str(v) for k, v in save_snapshot_and_trace(folder, "writes").items()}
    try:
        import onnx

        from test_plan_onnx import small_model
    except ImportError:
        return files
    onnx.save(small_model(), str(folder / "small.onnx"))
    return {**files, "model": str(folder / "small.onnx")}


def _argv(command: str, inputs: dict[str, str], out: Path) -> list[str]:
    if command == "plot":
        pytest.importorskip("matplotlib")
    if command.startswith("plan --dim") and "model" not in inputs:
        pytest.skip("onnx is not installed")
    argv, _, _ = COMMANDS[command]
    return [a.format(out=out, **inputs) for a in argv]


def _prog(command: str) -> str:
    return "npumem " + command.split()[0]


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (errno.ENOENT, ExitStatus.USAGE),
        (errno.ENOTDIR, ExitStatus.USAGE),
        (errno.EISDIR, ExitStatus.USAGE),
        (errno.EINVAL, ExitStatus.USAGE),
        (errno.ENAMETOOLONG, ExitStatus.USAGE),
        (errno.ELOOP, ExitStatus.USAGE),
        (errno.EACCES, ExitStatus.USAGE),
        (errno.EPERM, ExitStatus.USAGE),
        (errno.EROFS, ExitStatus.USAGE),
        (errno.ENOSPC, ExitStatus.NOT_MET),
        (errno.EDQUOT, ExitStatus.NOT_MET),
        (errno.EIO, ExitStatus.NOT_MET),
        (errno.EMFILE, ExitStatus.NOT_MET),
        (errno.EEXIST, ExitStatus.NOT_MET),
        (None, ExitStatus.NOT_MET),
    ],
)
def test_the_status_of_a_write_goes_by_its_error(code: int | None, status: ExitStatus) -> None:
    error = OSError("no reason given") if code is None else OSError(code, os.strerror(code))
    assert write_error_status(error) is status


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_output_under_a_file_is_status_2(
    command: str, inputs: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path whose folder is a regular file cannot hold the file: a bad argument, refused
    in one line, nothing written."""
    blocker = tmp_path / "file"
    blocker.write_text("x\n")
    out = blocker / COMMANDS[command][1]
    status, out_text, err = run_cli(_argv(command, inputs, out), capsys)
    assert status == ExitStatus.USAGE
    assert re.fullmatch(
        f"{_prog(command)}: error: cannot write {re.escape(str(blocker))}/\\S+: "
        f"{os.strerror(errno.ENOTDIR)}\n",
        err,
    ), err
    assert out_text == ""
    assert blocker.read_text() == "x\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_full_disk_is_status_1_and_leaves_the_old_files(
    command: str,
    inputs: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A disk that fills up as the file is written (`fsync` reports it, as it does where the
    file system allocates late): the path was fine, the write failed for a reason of the
    moment. One line, status 1, the old files as they were and no temporary file."""
    _, name, written = COMMANDS[command]
    out = tmp_path / name
    folder = out if command == "demo" else tmp_path
    folder.mkdir(exist_ok=True)
    for old in written:
        (folder / old).write_text("old\n")
    argv = _argv(command, inputs, out)

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    capsys.readouterr()
    status = main(argv)
    out_text, err = capsys.readouterr()
    assert status == ExitStatus.NOT_MET
    assert err == (
        f"{_prog(command)}: error: cannot write {folder / written[0]}: "
        f"{os.strerror(errno.ENOSPC)}\n"
    )
    assert out_text == ""
    assert sorted(p.name for p in folder.iterdir()) == sorted(written)
    assert all((folder / old).read_text() == "old\n" for old in written)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_folder_without_write_permission_is_status_2(
    command: str,
    inputs: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A folder the user may not write in cannot hold the file: a bad argument. The file calls
    refuse what would go into the folder, as the kernel does for a user without the right
    (root writes into any folder, so `chmod` alone would not refuse it)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked / COMMANDS[command][1]
    real_open, real_mkdir = builtins.open, os.mkdir

    def check(path: object) -> None:
        if isinstance(path, (str, os.PathLike)) and locked in Path(os.fspath(path)).parents:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))

    def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(c in mode for c in "wxa+"):
            check(file)
        return real_open(file, mode, *args, **kwargs)

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        check(path)
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    status, out_text, err = run_cli(_argv(command, inputs, out), capsys, output=out)
    assert status == ExitStatus.USAGE
    assert err.startswith(f"{_prog(command)}: error: cannot ")
    assert err.endswith(f": {os.strerror(errno.EACCES)}\n"), err
    assert out_text == ""
    assert list(locked.iterdir()) == []


@pytest.mark.parametrize("where", ["name", "folder"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_name_too_long_is_status_2(
    command: str,
    where: str,
    inputs: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A name longer than the file system takes (the output's own, or a folder's on the way)
    cannot hold the file: one line, status 2, nothing written. Checks that look at the path
    before the command runs (`Path.exists()`, `Path.is_dir()`) raise that error too."""
    name = COMMANDS[command][1]
    long_name = "x" * 300 + Path(name).suffix
    out = tmp_path / long_name if where == "name" else tmp_path / ("x" * 300) / name
    status, out_text, err = run_cli(_argv(command, inputs, out), capsys)
    assert status == ExitStatus.USAGE
    assert re.fullmatch(
        f"{_prog(command)}: error: cannot write {re.escape(str(tmp_path))}/\\S+: "
        f"{os.strerror(errno.ENAMETOOLONG)}\n",
        err,
    ), err
    assert out_text == ""
    assert list(tmp_path.iterdir()) == []
