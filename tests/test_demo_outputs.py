"""``npumem demo`` writes its files all or none: a failed write, Ctrl-C or SIGTERM at any point
leaves every file that was in its folder byte for byte as it was, and no new or temporary file
behind."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import npumem.fileio
import npumem.monitor.plots
import npumem.workloads.demo
from npumem.cli import main
from npumem.workloads.demo import OUTPUT_NAMES, DemoResult

ARGV = ["demo", "--requests", "20", "--workers", "1", "--trace", "-o"]
WRITTEN = ("snapshot.json", "snapshot-end.json", "trace.json", "tiers.json")
"""The files the demo writes without pictures, in the order it writes them."""


@pytest.fixture(scope="module")
def result() -> DemoResult:
    """One small run of the demo (as `ARGV` asks for it), shared by the tests: they are about
    writing its files."""
    return npumem.workloads.demo.run_demo(requests=20, workers=1, trace=True, tiers=True)


@pytest.fixture
def demo(
    result: DemoResult, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str]]:
    """`npumem demo ARGV FOLDER` serving `result` rather than a run of its own, without pictures
    unless asked for; returns the exit status and the last line on stderr."""
    monkeypatch.setattr(npumem.workloads.demo, "run_demo", lambda **kwargs: result)

    def run(folder: Path, *, pictures: bool = False) -> tuple[int, str]:
        if not pictures:
            find_spec = importlib.util.find_spec
            with monkeypatch.context() as m:
                m.setattr(
                    importlib.util,
                    "find_spec",
                    lambda name, *args: None if name == "matplotlib" else find_spec(name, *args),
                )
                status = main([*ARGV, str(folder)])
        else:
            status = main([*ARGV, str(folder)])
        err = capsys.readouterr().err.strip().splitlines()
        return status, err[-1] if err else ""

    return run


def _old_folder(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A folder holding an old file of every name the demo writes, and one of the user's."""
    folder = tmp_path / "out"
    folder.mkdir(parents=True)
    for name in (*OUTPUT_NAMES, "keep.txt"):
        (folder / name).write_bytes(f"old {name}\n".encode())
    return folder, _contents(folder)


def _contents(folder: Path) -> dict[str, bytes]:
    """Every entry of `folder`, hidden ones too, and its bytes."""
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _fail_at_write(
    monkeypatch: pytest.MonkeyPatch, at: int | str, failure: BaseException
) -> list[Path]:
    """Make a file write (JSON or picture) raise `failure`: the `at`th, or the one of the file
    named `at`; returns the paths written to, in order."""
    paths: list[Path] = []
    write_bytes = npumem.fileio.write_bytes

    def failing(path: Any, data: bytes) -> Path:
        paths.append(Path(path))
        if at in (len(paths), Path(path).name):
            if isinstance(failure, OSError):
                failure.filename = str(path)
            raise failure
        return write_bytes(path, data)

    monkeypatch.setattr(npumem.fileio, "write_bytes", failing)
    monkeypatch.setattr(npumem.monitor.plots, "write_bytes", failing)
    return paths


@pytest.mark.parametrize("n", range(1, len(WRITTEN) + 1))
@pytest.mark.parametrize(
    ("failure", "status"),
    [
        (KeyboardInterrupt(), 130),
        (SystemExit(143), 143),  # SIGTERM, as main() raises it
        (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 1),
    ],
    ids=["ctrl-c", "sigterm", "disk-full"],
)
def test_a_write_that_fails_leaves_every_old_file_as_it_was(
    n: int,
    failure: BaseException,
    status: int,
    demo: Callable[..., tuple[int, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder, before = _old_folder(tmp_path)
    paths = _fail_at_write(monkeypatch, n, failure)
    if isinstance(failure, SystemExit):
        with pytest.raises(SystemExit) as stopped:
            demo(folder)
        assert stopped.value.code == status
    else:
        got, last = demo(folder)
        assert got == status
        if isinstance(failure, OSError):
            assert last == f"npumem demo: error: cannot write {folder / WRITTEN[n - 1]}: " + (
                os.strerror(errno.ENOSPC)
            )
    assert [p.name for p in paths] == list(WRITTEN[:n])
    assert _contents(folder) == before


def test_a_picture_that_fails_last_leaves_every_old_file_as_it_was(
    demo: Callable[..., tuple[int, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    folder, before = _old_folder(tmp_path)
    paths = _fail_at_write(monkeypatch, OUTPUT_NAMES[-1], KeyboardInterrupt())  # tiers.png
    assert demo(folder, pictures=True) == (130, "npumem demo: interrupted")
    assert paths[-1].name == OUTPUT_NAMES[-1] and "timeline.png" in {p.name for p in paths}
    assert _contents(folder) == before


def test_ctrl_c_while_the_files_move_into_place_comes_once_all_have(
    demo: Callable[..., tuple[int, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C between the renames that put the new files in place waits for the last of them:
    the folder holds every new file, then the command is interrupted."""
    folder, before = _old_folder(tmp_path)
    replace = os.replace
    renames = 0

    def replace_then_interrupt(src: Any, dst: Any) -> None:
        nonlocal renames
        if Path(dst).parent == folder:
            renames += 1
            if renames == 2:
                signal.raise_signal(signal.SIGINT)
        replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_interrupt)
    assert demo(folder) == (130, "npumem demo: interrupted")
    assert renames == len(WRITTEN)
    after = _contents(folder)
    assert sorted(after) == sorted(before)  # no temporary file
    changed = {name for name in after if after[name] != before[name]}
    assert changed == set(WRITTEN)


def test_a_link_is_written_through(demo: Callable[..., tuple[int, str]], tmp_path: Path) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept.json").write_text("old\n")
    (folder / "snapshot.json").symlink_to(elsewhere / "kept.json")
    assert demo(folder)[0] == 0
    assert (folder / "snapshot.json").is_symlink()
    assert json.loads((elsewhere / "kept.json").read_text())["format"] == "npumem-snapshot"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["kept.json"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(WRITTEN)
