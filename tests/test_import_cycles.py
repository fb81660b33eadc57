"""scripts/check_import_cycles.py finds exactly the import cycles of small Rust and Python trees."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "check_import_cycles.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


cycles = _load()


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], list[str]]:
    code = cycles.main(list(args))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def edges(root: Path) -> set[tuple[str, str]]:
    found = cycles.rust_edges(root) if (root / "lib.rs").exists() else cycles.python_edges(root)
    return {(e.src, e.dst) for e in found}


# --- Rust -------------------------------------------------------------------------------------

RUST_CLEAN = {
    "lib.rs": """
        //! Docs may name crate::pool::Pool and `use crate::gate;` freely.
        mod gate;
        mod pool;
        pub use pool::{alloc::Reach, Pool};
    """,
    "gate.rs": """
        pub struct Gate;
    """,
    "pool/mod.rs": """
        mod alloc;
        mod pool;
        pub use self::pool::Pool;
    """,
    "pool/pool.rs": """
        use crate::gate::Gate;
        pub struct Pool { gate: Gate }
        pub(in crate::pool) fn helper() {}
    """,
    "pool/alloc.rs": """
        use super::pool::Pool;
        pub struct Reach;
        const S: &str = "use crate::Pool; crate::lib";
        const C: char = '"';
        const R: &str = r#"crate::gate "quoted" use crate::Pool;"#;
        const B: &[u8] = br"crate::lib";
        fn f<'a>(p: &'a Pool) -> &'a Pool { p }
        #[cfg(test)]
        mod tests {
            use super::*;
            use super::super::pool::Pool as P;
            /* crate::Pool in a comment /* nested */ still a comment */
        }
    """,
}


def test_rust_tree_without_cycles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, RUST_CLEAN)
    assert edges(tmp_path) == {
        ("lib.rs", "pool/mod.rs"),
        ("lib.rs", "pool/alloc.rs"),
        ("pool/mod.rs", "pool/pool.rs"),
        ("pool/pool.rs", "gate.rs"),
        ("pool/alloc.rs", "pool/pool.rs"),
    }
    assert run(capsys, str(tmp_path)) == (0, [], [])


def test_rust_cycle_through_lib_rs_reexports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = dict(RUST_CLEAN)
    files["gate.rs"] = """
        pub struct Gate;
        fn g() -> crate::Pool { todo!() }
    """
    write(tmp_path, files)
    code, out, err = run(capsys, str(tmp_path))
    root = str(tmp_path)
    assert (code, err) == (1, [])
    assert out == [
        f"cycle: {root}/gate.rs -> {root}/lib.rs -> {root}/pool/alloc.rs -> {root}/pool/pool.rs"
        f" -> {root}/gate.rs",
        f"    {root}/gate.rs:2: fn g() -> crate::Pool {{ todo!() }}",
        f"    {root}/lib.rs:4: pub use pool::{{alloc::Reach, Pool}};",
        f"    {root}/pool/alloc.rs:1: use super::pool::Pool;",
        f"    {root}/pool/pool.rs:1: use crate::gate::Gate;",
        f"cycle: {root}/gate.rs -> {root}/lib.rs -> {root}/pool/mod.rs -> {root}/pool/pool.rs"
        f" -> {root}/gate.rs",
        f"    {root}/gate.rs:2: fn g() -> crate::Pool {{ todo!() }}",
        f"    {root}/lib.rs:4: pub use pool::{{alloc::Reach, Pool}};",
        f"    {root}/pool/mod.rs:3: pub use self::pool::Pool;",
        f"    {root}/pool/pool.rs:1: use crate::gate::Gate;",
        "2 import cycle(s) among 5 file(s)",
    ]


def test_rust_sibling_cycle_with_groups_super_and_inline_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path / "src",
        {
            "lib.rs": "mod a;\nmod b;\nmod c;\n",
            "a.rs": "use crate::{b::{B, Other}, c::C};\n",
            "b.rs": "pub struct B;\nfn f() { super::a::g(); }\n",
            "c.rs": "pub struct C;\n",
        },
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "src")
    assert code == 1
    assert out == [
        "cycle: src/a.rs -> src/b.rs -> src/a.rs",
        "    src/a.rs:1: use crate::{b::{B, Other}, c::C};",
        "    src/b.rs:2: fn f() { super::a::g(); }",
        "1 import cycle(s) among 2 file(s)",
    ]
    assert edges(tmp_path / "src") == {("a.rs", "b.rs"), ("a.rs", "c.rs"), ("b.rs", "a.rs")}


def test_rust_mod_declarations_and_inline_test_modules_are_not_edges(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "lib.rs": "mod x;\n#[cfg(test)]\nmod tests { use super::x::X; }\n",
            "x.rs": "mod y;\npub struct X;\n#[cfg(loom)]\nmod loom_models { use super::*; }\n",
            "x/y.rs": "use super::X;\nuse self::inner::Z;\nmod inner { pub struct Z; }\n",
        },
    )
    # lib.rs's inline test module belongs to lib.rs: its `use super::x::X` is lib.rs -> x.rs.
    assert edges(tmp_path) == {("lib.rs", "x.rs"), ("x/y.rs", "x.rs")}


def test_rust_paths_in_literals_and_comments_are_not_edges(tmp_path: Path) -> None:
    padding = "// " + "x" * 200 + "\n"
    write(
        tmp_path,
        {
            "lib.rs": "mod a;\nmod b;\nmod c;\n",
            "a.rs": padding * 3
            + 'const R: &str = r#"crate::b "quoted" x"#;\n'
            + 'const Q: &str = "crate::b \\" crate::b";\n'
            + "fn f<'x>(s: &'x str) -> char { let _ = s; '\\'' }\n"
            + "/* crate::b /* nested */ crate::b */\n"
            + "fn g() -> crate::c::C { todo!() }\n",
            "b.rs": "",
            "c.rs": "pub struct C;\n",
        },
    )
    assert edges(tmp_path) == {("a.rs", "c.rs")}


def test_rust_self_in_group_and_glob(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(
        tmp_path,
        {
            "lib.rs": "mod p;\nmod q;\n",
            "p/mod.rs": "mod r;\npub use r::*;\n",
            "p/r.rs": "use crate::q::{self, Q};\n",
            "q.rs": "pub struct Q;\nuse crate::p::{self};\n",
        },
    )
    assert edges(tmp_path) == {("p/mod.rs", "p/r.rs"), ("p/r.rs", "q.rs"), ("q.rs", "p/mod.rs")}
    code, out, _ = run(capsys, "--graph", str(tmp_path))
    root = str(tmp_path)
    assert code == 1
    assert out[:3] == [
        f"{root}/p/mod.rs -> {root}/p/r.rs  (2: pub use r::*;)",
        f"{root}/p/r.rs -> {root}/q.rs  (1: use crate::q::{{self, Q}};)",
        f"{root}/q.rs -> {root}/p/mod.rs  (2: use crate::p::{{self}};)",
    ]
    assert out[3] == f"cycle: {root}/p/mod.rs -> {root}/p/r.rs -> {root}/q.rs -> {root}/p/mod.rs"


# --- Python -----------------------------------------------------------------------------------

PY_CLEAN = {
    "pkg/__init__.py": """
        from pkg.a import A
        from pkg.sub import helper
        from . import b
        import pkg._ext
    """,
    "pkg/a.py": """
        from __future__ import annotations
        from typing import TYPE_CHECKING
        from pkg import b
        import json
        if TYPE_CHECKING:
            from pkg.sub.helper import Helper
        class A: ...
    """,
    "pkg/b.py": """
        import os
        def f() -> None:
            from .sub import helper
    """,
    "pkg/_ext.pyi": "thing: int\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/helper.py": """
        from .. import _ext
        from pkg._ext import thing
        class Helper: ...
    """,
}


def test_python_package_without_cycles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, PY_CLEAN)
    assert edges(tmp_path / "pkg") == {
        ("__init__.py", "a.py"),
        ("__init__.py", "sub/helper.py"),
        ("__init__.py", "b.py"),
        ("a.py", "b.py"),
        ("b.py", "sub/helper.py"),
    }
    assert run(capsys, str(tmp_path / "pkg")) == (0, [], [])


def test_python_child_importing_its_package_init_is_a_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = dict(PY_CLEAN)
    files["pkg/sub/helper.py"] = """
        from pkg import A
        class Helper: ...
    """
    write(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "pkg")
    assert code == 1
    assert out == [
        "cycle: pkg/__init__.py -> pkg/sub/helper.py -> pkg/__init__.py",
        "    pkg/__init__.py:2: from pkg.sub import helper",
        "    pkg/sub/helper.py:1: from pkg import A",
        "cycle: pkg/__init__.py -> pkg/b.py -> pkg/sub/helper.py -> pkg/__init__.py",
        "    pkg/__init__.py:3: from . import b",
        "    pkg/b.py:3: from .sub import helper",
        "    pkg/sub/helper.py:1: from pkg import A",
        "cycle: pkg/__init__.py -> pkg/a.py -> pkg/b.py -> pkg/sub/helper.py -> pkg/__init__.py",
        "    pkg/__init__.py:1: from pkg.a import A",
        "    pkg/a.py:3: from pkg import b",
        "    pkg/b.py:3: from .sub import helper",
        "    pkg/sub/helper.py:1: from pkg import A",
        "3 import cycle(s) among 4 file(s)",
    ]


def test_python_import_in_else_of_type_checking_counts(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "m/__init__.py": "",
            "m/x.py": """
                import typing
                if typing.TYPE_CHECKING:
                    import m.y
                else:
                    import m.z
            """,
            "m/y.py": "import m.x\n",
            "m/z.py": "from m.x import something\n",
        },
    )
    assert edges(tmp_path / "m") == {("x.py", "z.py"), ("y.py", "x.py"), ("z.py", "x.py")}


# --- Command line -----------------------------------------------------------------------------


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for args in (["--no-such-option"], [str(tmp_path / "missing")], [str(tmp_path / "empty")]):
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, args
        assert done.stdout == ""
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("check_import_cycles.py: error: ")


def test_default_roots_are_this_repository() -> None:
    assert cycles.DEFAULT_ROOTS == (
        "rust/core/src",
        "rust/python/src",
        "rust/capi/src",
        "python/npumem",
    )
    for root in cycles.DEFAULT_ROOTS:
        assert (ROOT / root).is_dir()
