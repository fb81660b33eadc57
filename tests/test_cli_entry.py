"""The `npumem` command's entry point (`npumem._entry`, run by the console script and by
`python -m npumem`): Ctrl-C while the command is still loading, before `npumem.cli.main()`
takes SIGINT, and while the interpreter still loads the `npumem` package before the entry
point (`npumem._command_start`), ends as Ctrl-C while it works: `npumem: interrupted` and
status 130, no traceback."""

from __future__ import annotations

import importlib
import importlib.abc
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, NoReturn

import pytest

import npumem._command_start
import npumem.cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_and_python_m_run_the_entry_point() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"npumem": "npumem._entry:main"}
    main_module = (ROOT / "python" / "npumem" / "__main__.py").read_text()
    assert "from npumem._entry import main" in main_module


@pytest.fixture
def entry() -> Any:
    """The module `npumem._entry`."""
    return importlib.import_module("npumem._entry")


class _InterruptedImport(importlib.abc.MetaPathFinder):
    """Ctrl-C as the module `name` is being imported."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.name:
            raise KeyboardInterrupt
        return None


def test_ctrl_c_while_the_command_loads_is_one_line_and_130(
    entry: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delitem(sys.modules, "npumem.cli")
    monkeypatch.setattr(sys, "meta_path", [_InterruptedImport("npumem.cli"), *sys.meta_path])
    assert entry.main() == 130
    assert capsys.readouterr() == ("", "npumem: interrupted\n")


def test_ctrl_c_as_main_starts_is_one_line_and_130(
    entry: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before main() has taken SIGINT, Python's own handler raises KeyboardInterrupt there.
    def interrupted(argv: object = None) -> NoReturn:
        raise KeyboardInterrupt

    monkeypatch.setattr(npumem.cli, "main", interrupted)
    assert entry.main() == 130
    assert capsys.readouterr() == ("", "npumem: interrupted\n")


def test_the_entry_point_runs_the_command(
    entry: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["npumem", "report", str(ROOT / "no-such-file.json")])
    saved = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    try:
        assert entry.main() == 2
    finally:  # run as the program, main() leaves both signals ignored
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("npumem report: error: ")


# A module that npumem.cli imports, and that nothing imports before it when `python -m npumem`
# starts: in its place, a module that sends SIGINT to its own process as it is imported.
_CTRL_C_AS_IT_LOADS = """\
import signal

signal.raise_signal(signal.SIGINT)
"""


def test_ctrl_c_while_python_m_npumem_loads_is_one_line_and_130(tmp_path: Path) -> None:
    (tmp_path / "contextvars.py").write_text(_CTRL_C_AS_IT_LOADS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "npumem", "report", str(tmp_path / "no-such-file.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "npumem: interrupted\n")


# A module that the `npumem` package imports as it loads, after its first import
# (`npumem._command_start`) and before the entry point's module: in its place, one that sends
# SIGINT to its own process as it is imported.
def _run_with(
    tmp_path: Path, modules: dict[str, str], options: list[str]
) -> subprocess.CompletedProcess[str]:
    for name, text in modules.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    argv = [sys.executable, *options, "report", str(tmp_path / "no-such-file.json")]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_ctrl_c_while_the_package_loads_is_one_line_and_130(tmp_path: Path) -> None:
    for options in (["-m", "npumem"], ["-W", "ignore", "-Bm", "npumem"]):
        done = _run_with(tmp_path, {"typing.py": _CTRL_C_AS_IT_LOADS}, options)
        assert (done.returncode, done.stdout, done.stderr) == (130, "", "npumem: interrupted\n"), (
            options
        )


# Imported by `npumem.cli`, after the package has loaded: says which SIGINT handler is in place.
_SAYS_THE_HANDLER = """\
import signal
import sys

default = signal.getsignal(signal.SIGINT) is signal.default_int_handler
print("default" if default else "other", file=sys.stderr)
signal.raise_signal(signal.SIGINT)
"""


def test_once_the_package_is_loaded_python_s_handler_is_back(tmp_path: Path) -> None:
    done = _run_with(tmp_path, {"contextvars.py": _SAYS_THE_HANDLER}, ["-m", "npumem"])
    assert (done.returncode, done.stdout, done.stderr) == (
        130,
        "",
        "default\nnpumem: interrupted\n",
    )


def test_a_process_that_imports_the_package_keeps_its_sigint_handler() -> None:
    code = (
        "import signal, sys\n"
        "def mine(signum, frame): pass\n"
        "signal.signal(signal.SIGINT, mine)\n"
        "import npumem\n"
        "sys.exit(0 if signal.getsignal(signal.SIGINT) is mine else 1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["python", "/venv/bin/npumem", "report"], True),
        (["python", "-m", "npumem", "demo"], True),
        (["python", "-X", "dev", "-W", "ignore", "-m", "npumem"], True),
        (["python", "-Im", "npumem"], True),
        (["python", "-mnpumem"], True),
        (["python", "--check-hash-based-pycs", "always", "-m", "npumem"], True),
        (["python", "-m", "npumem.plan"], False),
        (["python", "-m", "pytest", "-m", "npumem"], False),
        (["python", "-c", "import npumem", "-m", "npumem"], False),
        (["python", "script.py", "-m", "npumem"], False),
        (["python", "-"], False),
        (["python"], False),
    ],
)
def test_the_command_is_told_from_other_processes(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], command: bool
) -> None:
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert npumem._command_start._is_the_command() is command
