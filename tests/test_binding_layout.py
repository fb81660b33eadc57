"""The crates keep the layout the design asks for: `npumem-core` has no PyO3 in it, and the
binding releases the GIL only through its one helper (`rust/python/src/gil.rs`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "rust" / "core"
BINDING = ROOT / "rust" / "python" / "src"

# What releases the GIL in PyO3: `Python::detach` (formerly `allow_threads`), called on a
# `Python` token (`py`, `self.py`, `obj.py()`).
RELEASES_GIL = re.compile(r"\bpy(\(\))?\s*\.\s*detach\s*\(|\ballow_threads\b|Python::detach\b")


def rust_files(root: Path) -> list[Path]:
    files = sorted(root.rglob("*.rs"))
    assert files, f"no Rust sources under {root}"
    return files


def test_the_core_crate_has_no_pyo3() -> None:
    manifest = (CORE / "Cargo.toml").read_text()
    assert "pyo3" not in manifest
    users = [p for p in rust_files(CORE) if "pyo3" in p.read_text()]
    assert users == [], f"PyO3 in npumem-core: {users}"


def test_the_binding_releases_the_gil_only_through_its_helper() -> None:
    helper = BINDING / "gil.rs"
    assert RELEASES_GIL.search(helper.read_text()), "the helper itself releases the GIL"
    others = [
        f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
        for p in rust_files(BINDING)
        if p != helper
        for text in [p.read_text()]
        for m in RELEASES_GIL.finditer(text)
    ]
    assert others == [], f"GIL released outside rust/python/src/gil.rs: {others}"
