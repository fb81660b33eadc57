"""The C ABI: the header and library shipped in the package, a C program built against them with
the system compiler (four threads, pattern fill, overlap check, misuse), the header as C++, and
the PyTorch allocator functions on a pool without backing at a fake base address."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from npumem import clib

C_TESTS = Path(__file__).parent / "c"


def compiler(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(f"no compiler ({' or '.join(names)}) on this machine")


def build(tmp_path: Path, source: Path, *, cxx: bool = False) -> Path:
    """Compile and link `source` against the installed header and library."""
    library = Path(clib.get_library())
    exe = tmp_path / source.stem
    cc = compiler("c++", "g++", "clang++") if cxx else compiler("cc", "gcc", "clang")
    std = ["-std=c++11"] if cxx else ["-std=c99", "-pthread"]
    flags = ["-Wall", "-Wextra", "-pedantic", "-Werror", "-O2"]
    command = [cc, *std, *flags, f"-I{clib.get_include()}", str(source), str(library)]
    command += [f"-Wl,-rpath,{library.parent}", "-o", str(exe)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}{done.stderr}"
    return exe


def test_the_package_holds_the_header_and_the_library() -> None:
    assert (Path(clib.get_include()) / "npumem.h").is_file()
    library = Path(clib.get_library())
    assert library.is_file()
    assert library.parent == Path(clib.get_include()).parent


def test_c_program_threads_and_misuse(tmp_path: Path) -> None:
    exe = build(tmp_path, C_TESTS / "capi_threads.c")
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "ok"
    assert "no overlap" in run.stdout


def test_the_header_is_cxx(tmp_path: Path) -> None:
    exe = build(tmp_path, C_TESTS / "header_cxx.cpp", cxx=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
