"""How the wheel and the sdist are made: the build script's copy of the C library, which cargo
watches, and pyproject.toml's packaging settings."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = ROOT / "rust" / "python" / "build.rs"


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def tool(name: str) -> str:
    """The command `name`, from this interpreter's environment first."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.skip(f"no {name} on this machine")
    return found


def trusting_checkout() -> dict[str, str]:
    """This environment, with git told to trust the checkout: a clone that another user owns
    (a container's mounted checkout, a CI runner's) is otherwise refused as of dubious
    ownership. `safe.directory` counts only from protected configuration, which the
    `GIT_CONFIG_*` variables are; entries already there are kept."""
    env = dict(os.environ)
    count = int(env.get("GIT_CONFIG_COUNT") or 0)
    env[f"GIT_CONFIG_KEY_{count}"] = "safe.directory"
    env[f"GIT_CONFIG_VALUE_{count}"] = str(ROOT)
    env["GIT_CONFIG_COUNT"] = str(count + 1)
    return env


@pytest.fixture(scope="module")
def build_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rust/python/build.rs, compiled on its own."""
    rustc = tool("rustc")
    script = tmp_path_factory.mktemp("build-script") / "build-script"
    compiled = subprocess.run(
        [rustc, "--edition", "2021", "-C", "debuginfo=0", "-o", script, BUILD_SCRIPT],
        capture_output=True,
        text=True,
    )
    assert compiled.returncode == 0, compiled.stderr
    return script


# Stands in for cargo in the build script's inner run: records its arguments and its build
# directory, and writes the library where cargo would (`<target-dir>/[<triple>/]<profile>/`).
FAKE_CARGO = """#!{python}
import json, os, pathlib, sys
args = sys.argv[1:]
value = lambda flag, default=None: args[args.index(flag) + 1] if flag in args else default
folder = pathlib.Path(value("--target-dir"))
if "--target" in args:
    folder /= value("--target")
folder /= value("--profile", "debug")
folder.mkdir(parents=True, exist_ok=True)
(folder / "libnpumem.so").write_text("built with " + " ".join(args))
record = {{"args": args, "build_dir": os.environ.get("CARGO_BUILD_BUILD_DIR")}}
pathlib.Path(os.environ["FAKE_CARGO_RECORD"]).write_text(json.dumps(record))
"""


@pytest.mark.parametrize(
    ("out_dir", "triple", "profile"),
    [
        ("target/dist/build/npumem-python-0123/out", None, "dist"),
        ("target/release/build/npumem-python-0123/out", None, "release"),
        ("target/debug/build/npumem-python-0123/out", None, None),
        (
            "target/aarch64-unknown-linux-gnu/dist/build/npumem-python-0123/out",
            "aarch64-unknown-linux-gnu",
            "dist",
        ),
        # cargo's newer layout: a folder per package, then one per hash, under `build/`
        ("build-dir/dist/build/npumem-python/0123/out", None, "dist"),
    ],
)
def test_the_build_script_builds_the_c_library_with_its_own_profile(
    build_script: Path, tmp_path: Path, out_dir: str, triple: str | None, profile: str | None
) -> None:
    """The C library is built with the profile of the extension's build (`dist` for a wheel:
    link-time optimized), read from the output folder above `build/`, in the build directory
    of its own inner run, and copied next to the Python sources."""
    manifest_dir = tmp_path / "rust" / "python"
    manifest_dir.mkdir(parents=True)
    (tmp_path / "python" / "npumem").mkdir(parents=True)
    out = tmp_path / out_dir
    out.mkdir(parents=True)
    cargo = tmp_path / "cargo"
    cargo.write_text(FAKE_CARGO.format(python=sys.executable))
    cargo.chmod(0o755)
    record = tmp_path / "record.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"NPUMEM_C_LIBRARY", "CARGO_BUILD_BUILD_DIR", "CARGO_TARGET_DIR"}
    }
    env |= {
        "CARGO": str(cargo),
        "CARGO_MANIFEST_DIR": str(manifest_dir),
        "CARGO_FEATURE_C_LIBRARY": "1",
        "CARGO_CFG_TARGET_OS": "linux",
        "OUT_DIR": str(out),
        "PROFILE": "release" if profile else "debug",
        "TARGET": triple or "x86_64-unknown-linux-gnu",
        "HOST": "x86_64-unknown-linux-gnu",
        "FAKE_CARGO_RECORD": str(record),
    }
    ran = subprocess.run([build_script], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    inner = json.loads(record.read_text())
    args = inner["args"]
    assert args[:2] == ["build", "--package"] and "npumem-capi" in args
    assert ("--profile" in args) == (profile is not None)
    if profile is not None:
        assert args[args.index("--profile") + 1] == profile
    assert (args[args.index("--target") + 1] if "--target" in args else None) == triple
    target_dir = args[args.index("--target-dir") + 1]
    assert Path(target_dir).is_relative_to(out) and inner["build_dir"] == target_dir
    copy = tmp_path / "python" / "npumem" / "libnpumem.so"
    assert copy.read_text() == "built with " + " ".join(args)


def test_the_build_script_watches_its_copy_of_the_library_dated_to_its_start(
    build_script: Path, tmp_path: Path
) -> None:
    """Cargo reruns a build script when a file it watches is gone, or newer than the start of the
    script's last run (`invoked.timestamp`, beside `OUT_DIR`). The copy is watched and dated to
    that start: an untouched copy leaves the script alone, a deleted or replaced one reruns it."""
    script = build_script
    # A workspace of its own: the script copies to <workspace>/python/npumem/.
    manifest_dir = tmp_path / "rust" / "python"
    manifest_dir.mkdir(parents=True)
    (tmp_path / "python" / "npumem").mkdir(parents=True)
    library = tmp_path / "built" / "libnpumem.so"
    library.parent.mkdir()
    library.write_bytes(b"the C library")
    run = tmp_path / "run"
    (run / "out").mkdir(parents=True)
    started = run / "invoked.timestamp"
    started.write_text("")
    os.utime(library, ns=(1_700_000_000_000_000_000,) * 2)
    os.utime(started, ns=(1_700_000_100_123_456_789,) * 2)
    env = {
        **os.environ,
        "CARGO_MANIFEST_DIR": str(manifest_dir),
        "CARGO_FEATURE_C_LIBRARY": "1",
        "CARGO_CFG_TARGET_OS": "linux",
        "OUT_DIR": str(run / "out"),
        "NPUMEM_C_LIBRARY": str(library),
    }
    ran = subprocess.run([script], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    copy = manifest_dir / "../../python/npumem/libnpumem.so"
    assert copy.read_bytes() == library.read_bytes()
    assert f"cargo:rerun-if-changed={copy}" in ran.stdout.splitlines()
    assert f"cargo:rerun-if-changed={library}" in ran.stdout.splitlines()
    assert copy.stat().st_mtime_ns == started.stat().st_mtime_ns


def test_the_wheel_includes_the_c_library_under_each_platform_s_name() -> None:
    """Each name under which build.rs writes the C library is in the wheel's `include`: the
    library is ignored by git, so maturin adds it only as named there."""
    names = set(re.findall(r'"((?:lib)?npumem\.(?:so|dylib|dll))"', BUILD_SCRIPT.read_text()))
    assert names == {"libnpumem.so", "libnpumem.dylib", "npumem.dll"}
    include = pyproject()["tool"]["maturin"]["include"]
    in_wheel = {entry["path"] for entry in include if entry.get("format") == "wheel"}
    assert {f"python/npumem/{name}" for name in names} <= in_wheel


def test_the_license_is_an_spdx_expression_with_its_texts() -> None:
    """PEP 639: the wheel's metadata says `License-Expression`, and carries the license files."""
    project = pyproject()["project"]
    cargo = tomllib.loads((ROOT / "Cargo.toml").read_text())
    assert project["license"] == cargo["workspace"]["package"]["license"] == "MIT OR Apache-2.0"
    assert project["license-files"] == ["LICENSE-MIT", "LICENSE-APACHE"]
    assert all((ROOT / name).is_file() for name in project["license-files"])


def test_the_sdist_builds_with_its_cargo_lock(tmp_path: Path) -> None:
    """The sdist's workspace is the checkout's, so its Cargo.lock still matches and a build with
    `--locked` (cargo resolves the workspace first, as `cargo metadata` does here) goes through."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the sdist holds the files that git tracks")
    maturin, cargo = tool("maturin"), tool("cargo")
    made = subprocess.run(
        [maturin, "sdist", "--out", tmp_path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=trusting_checkout(),
    )
    assert made.returncode == 0, made.stderr
    [sdist] = tmp_path.glob("npumem-*.tar.gz")
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    [unpacked] = (path for path in tmp_path.iterdir() if path.is_dir())
    locked = subprocess.run(
        [cargo, "metadata", "--locked", "--format-version", "1"],
        cwd=unpacked,
        capture_output=True,
        text=True,
    )
    assert locked.returncode == 0, locked.stderr


def test_make_wheel_keeps_pyproject_s_profile() -> None:
    """`make wheel` builds with the `dist` profile (link-time optimized, no debug information),
    which `--release` or `--profile` would replace."""
    make = tool("make")
    planned = subprocess.run(
        [make, "-n", "wheel"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    [build] = [line for line in planned.splitlines() if "maturin build" in line]
    assert "--sdist" in build.split() and "--locked" in build.split()
    assert "--out dist" in build
    assert "--release" not in build and "--profile" not in build
