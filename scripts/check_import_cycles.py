#!/usr/bin/env python3
"""Prove that no module imports itself through a circle of other modules.

Checks the Rust crates (a `src` folder with `lib.rs` or `main.rs`) and Python packages (a folder of
`.py` files) named on the command line; by default the core crate, the binding crate, the C ABI
crate and the Python facade of this repository. Standard library only.

Rust: every source file is a node. File A has an edge to file B when A names a path that resolves
into B's module: `use crate::x::y::Z`, `crate::x::y::Z` inline, `super::y`, `self::y`, or a path
that starts with the name of one of A's own child modules (`pub use child::Z`). A path resolves to
the deepest module on it whose file exists; a path to an item of `x.rs` or `x/mod.rs` is an edge to
that file. `mod x;` declarations and visibility paths (`pub(in crate::x)`) are not edges. Inline
modules (`mod tests { ... }`, loom models) belong to their file. `#[path]` is not supported.

Python: every module file is a node. `import a.b` and `from a.b import c` anywhere in a file, except
under `if TYPE_CHECKING:`, are edges to module `a.b`, or to `a.b.c` when `c` is a submodule.
Relative imports are resolved against the importing module's package.

Output: one line per cycle with its chain of files, then the line that makes each edge of it.
Exit status: 0 no cycle, 1 cycles found, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOTS = ("rust/core/src", "rust/python/src", "rust/capi/src", "python/npumem")


class UsageError(Exception):
    """A bad argument: reported as one line, exit status 2."""


@dataclass(frozen=True, order=True)
class Edge:
    """File `src` depends on file `dst` because of line `line` of `src` (`text`)."""

    src: str
    dst: str
    line: int
    text: str


# A module's path inside its crate or package, and the file that holds it.
ModPath = tuple[str, ...]


# --- Rust -------------------------------------------------------------------------------------

_RUST_KEYWORD_ROOTS = {"crate", "$crate", "self", "super"}
_VISIBILITY = re.compile(r"\bpub\s*\(\s*in\b[^)]*\)")
_USE = re.compile(r"(?<![\w$])use\b")
_INLINE_MOD = re.compile(r"(?<![\w$])mod\s+([A-Za-z_]\w*)\s*\{")
_PATH = re.compile(r"(?<![\w:$])(\$crate|[A-Za-z_]\w*)((?:\s*::\s*[A-Za-z_]\w*)+)")
_RAW_STRING = re.compile(r'b?r(#*)"')
_USE_TOKEN = re.compile(r"\$crate|[A-Za-z_]\w*|::|[{},*;]")


def blank_rust(source: str) -> str:
    """`source` with comments, string and character literals replaced by spaces.

    Newlines stay, so offsets and line numbers are those of the source.
    """
    out = list(source)
    n = len(source)
    i = 0

    def blank(start: int, end: int) -> None:
        for k in range(start, min(end, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = source[i]
        if source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            blank(i, end)
            i = end
        elif source.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if source.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif source.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif (
            c in "br"
            and (raw := _RAW_STRING.match(source, i))
            and (i == 0 or not _word(source[i - 1]))
        ):
            close = '"' + raw.group(1)
            end = source.find(close, raw.end())
            end = n if end < 0 else end + len(close)
            blank(i, end)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and source[j] != '"':
                j += 2 if source[j] == "\\" else 1
            blank(i, j + 1)
            i = j + 1
        elif c == "'":
            # A character literal ('a', '\n', '\u{1F600}', '"') or a lifetime ('a, 'static).
            if source.startswith("\\", i + 1):
                end = source.find("'", i + 2)
                end = n if end < 0 else end + 1
                blank(i, end)
                i = end
            elif i + 2 < n and source[i + 2] == "'":
                blank(i, i + 3)
                i += 3
            else:
                i += 1
        else:
            i += 1
    return "".join(out)


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def rust_module_path(rel: Path) -> ModPath:
    """The module path of a source file relative to the crate's `src` folder."""
    parts = rel.with_suffix("").parts
    if parts in (("lib",), ("main",)):
        return ()
    if parts[-1] == "mod":
        return tuple(parts[:-1])
    return tuple(parts)


@dataclass
class _RustFile:
    rel: str
    module: ModPath
    source: str
    text: str  # blanked
    # (start offset, end offset, inline module path) of each inline module, outermost first.
    inline: list[tuple[int, int, ModPath]]

    def module_at(self, offset: int) -> ModPath:
        """The module (this file's, or one of its inline modules) that holds `offset`."""
        best = self.module
        for start, end, path in self.inline:
            if start <= offset < end and len(path) > len(best):
                best = path
        return best


def _inline_modules(text: str, module: ModPath) -> list[tuple[int, int, ModPath]]:
    """The inline modules of a blanked file, with the span of their bodies."""
    found: list[tuple[int, int, ModPath]] = []
    opens = {m.end() - 1: m.group(1) for m in _INLINE_MOD.finditer(text)}
    stack: list[tuple[int, int, ModPath]] = []  # (brace depth, body start, path)
    depth = 0
    for i, c in enumerate(text):
        if c == "{":
            depth += 1
            if i in opens:
                outer = stack[-1][2] if stack else module
                stack.append((depth, i, (*outer, opens[i])))
        elif c == "}":
            if stack and stack[-1][0] == depth:
                _, start, path = stack.pop()
                found.append((start, i + 1, path))
            depth -= 1
    for _, start, path in stack:  # unbalanced braces: the module runs to the end
        found.append((start, len(text), path))
    return sorted(found, key=lambda f: (f[0], len(f[2])))


def _use_paths(text: str, start: int) -> tuple[list[tuple[list[str], int]], int]:
    """The paths of the `use` tree that starts at `start`, each with the offset of its last name.

    Returns them with the offset just past the closing `;`.
    """
    tokens: list[tuple[str, int]] = []
    pos = start
    for m in _USE_TOKEN.finditer(text, start):
        if text[pos : m.start()].strip():
            break  # something a use tree cannot hold: stop there
        tokens.append((m.group(), m.start()))
        pos = m.end()
        if m.group() == ";":
            break
    paths: list[tuple[list[str], int]] = []
    index = 0

    def tree(prefix: list[str]) -> None:
        nonlocal index
        segments = list(prefix)
        last = tokens[index - 1][1] if index else start
        while index < len(tokens):
            tok, at = tokens[index]
            if tok == "{":
                index += 1
                while index < len(tokens) and tokens[index][0] not in ("}", ";"):
                    if tokens[index][0] == ",":
                        index += 1
                        continue
                    tree(segments)
                if index < len(tokens) and tokens[index][0] == "}":
                    index += 1
                return
            if tok == "*":
                index += 1
                paths.append((segments, at))
                return
            if tok in (",", "}", ";"):
                break
            if tok == "::":
                index += 1
                continue
            if tok == "as":
                index += 2  # the alias
                break
            segments = [*segments, tok]
            last = at
            index += 1
        if segments:
            paths.append((segments, last))

    if tokens and tokens[0][0] == "::":
        return [], pos  # a path into an external crate (`use ::std::...`)
    tree([])
    return paths, pos


def _resolve_rust(
    segments: Sequence[str], here: ModPath, modules: dict[ModPath, str]
) -> str | None:
    """The file a path written in module `here` resolves into, or None when it leaves the crate."""
    first = segments[0]
    rest = list(segments[1:])
    if first in ("crate", "$crate"):
        absolute: list[str] = []
    elif first == "self":
        absolute = list(here)
    elif first == "super":
        ups = 1
        while rest and rest[0] == "super":
            ups, rest = ups + 1, rest[1:]
        if ups > len(here):
            return None
        absolute = list(here[: len(here) - ups])
    elif (*here, first) in modules:
        absolute, rest = [*here, first], rest
    else:
        return None
    absolute += [s for s in rest if s != "self"]
    for length in range(len(absolute), -1, -1):
        found = modules.get(tuple(absolute[:length]))
        if found is not None:
            return found
    return None


def rust_edges(root: Path) -> list[Edge]:
    """The edges among the source files of the crate whose `src` folder is `root`."""
    files: list[_RustFile] = []
    for path in sorted(root.rglob("*.rs")):
        rel = path.relative_to(root)
        source = path.read_text(encoding="utf-8")
        text = _VISIBILITY.sub(lambda m: " " * len(m.group()), blank_rust(source))
        module = rust_module_path(rel)
        files.append(_RustFile(rel.as_posix(), module, source, text, _inline_modules(text, module)))
    modules: dict[ModPath, str] = {}
    for f in files:
        modules[f.module] = f.rel
    for f in files:
        for _, _, inline in f.inline:
            modules.setdefault(inline, f.rel)

    edges: dict[tuple[str, str], Edge] = {}

    def add(f: _RustFile, segments: Sequence[str], offset: int) -> None:
        target = _resolve_rust(segments, f.module_at(offset), modules)
        if target is None or target == f.rel:
            return
        line = _line_of(f.text, offset)
        edge = Edge(f.rel, target, line, f.source.splitlines()[line - 1].strip())
        known = edges.get((f.rel, target))
        if known is None or edge.line < known.line:
            edges[(f.rel, target)] = edge

    for f in files:
        covered: list[tuple[int, int]] = []
        for m in _USE.finditer(f.text):
            paths, end = _use_paths(f.text, m.end())
            covered.append((m.start(), end))
            for segments, offset in paths:
                add(f, segments, offset)
        for m in _PATH.finditer(f.text):
            if any(start <= m.start() < end for start, end in covered):
                continue
            segments = [m.group(1), *(s.strip() for s in m.group(2).split("::")[1:])]
            add(f, segments, m.start())
    return sorted(edges.values())


# --- Python -----------------------------------------------------------------------------------


def python_modules(root: Path) -> tuple[dict[str, Path], set[str]]:
    """The modules of a package folder (with `__init__.py`) or of a folder of modules.

    Returns module name -> file for the `.py` files (the nodes), and the names of the modules
    that have no `.py` file: compiled extensions and stubs (`_core.pyi`, `_core.*.so`).
    """
    base = root.parent if (root / "__init__.py").is_file() else root
    found: dict[str, Path] = {}
    compiled: set[str] = set()
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".py", ".pyi", ".so", ".pyd"):
            continue
        parts = list(path.relative_to(base).parts)
        parts[-1] = parts[-1].split(".")[0]
        if parts[-1] == "__init__":
            parts.pop()
        if not parts or not all(p.isidentifier() for p in parts):
            continue
        if path.suffix == ".py":
            found[".".join(parts)] = path
        else:
            compiled.add(".".join(parts))
    return found, compiled - set(found)


def _type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, except those under `if TYPE_CHECKING:`."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def python_edges(root: Path) -> list[Edge]:
    """The edges among the module files of the Python package (or folder) `root`."""
    modules, compiled = python_modules(root)
    edges: dict[tuple[str, str], Edge] = {}
    for name, path in modules.items():
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        is_package = path.name == "__init__.py"
        targets: list[tuple[str, int]] = []
        for node in _imports(ast.parse(source, filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [(alias.name, node.lineno) for alias in node.names]
                continue
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                if node.level - 1 > len(package):
                    continue
                package = package[: len(package) - (node.level - 1)]
                module = ".".join([*package, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}" if module else alias.name
                if sub in compiled:
                    continue  # a submodule without a file to check
                targets.append((sub if sub in modules else module, node.lineno))
        for target, line in targets:
            if target not in modules or target == name:
                continue  # outside the package, or not a module file (an extension, a stub)
            dst = modules[target].relative_to(root).as_posix()
            edge = Edge(rel, dst, line, lines[line - 1].strip())
            known = edges.get((rel, dst))
            if known is None or edge.line < known.line:
                edges[(rel, dst)] = edge
    return sorted(edges.values())


# --- Cycles -----------------------------------------------------------------------------------


def strongly_connected(nodes: Iterable[str], succ: dict[str, list[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[set[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(succ.get(start, [])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ.get(child, []))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group: set[str] = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.add(top)
                    if top == node:
                        break
                groups.append(group)
    return groups


def find_cycles(edges: Sequence[Edge]) -> list[list[Edge]]:
    """One shortest cycle through each edge that lies on a cycle, without repeats.

    Every edge that takes part in a circle appears in at least one reported cycle; each cycle
    starts at its smallest file name.
    """
    succ: dict[str, list[str]] = {}
    by_pair: dict[tuple[str, str], Edge] = {}
    for e in edges:
        succ.setdefault(e.src, []).append(e.dst)
        by_pair[(e.src, e.dst)] = e
    for children in succ.values():
        children.sort()
    nodes = {e.src for e in edges} | {e.dst for e in edges}
    group_of: dict[str, int] = {}
    for number, group in enumerate(strongly_connected(nodes, succ)):
        for node in group:
            group_of[node] = number
    seen: set[tuple[str, ...]] = set()
    cycles: list[list[Edge]] = []
    for e in sorted(edges):
        if group_of[e.src] != group_of[e.dst]:
            continue
        # Shortest path back from e.dst to e.src inside the group (breadth first).
        parent: dict[str, str] = {e.dst: e.dst}
        queue = deque([e.dst])
        while queue and e.src not in parent:
            node = queue.popleft()
            for child in succ.get(node, []):
                if child not in parent and group_of[child] == group_of[e.src]:
                    parent[child] = node
                    queue.append(child)
        back = [e.src]
        while back[-1] != e.dst:
            back.append(parent[back[-1]])
        chain = [e.src, *reversed(back)]  # e.src -> e.dst -> ... -> e.src
        ring = chain[:-1]
        first = ring.index(min(ring))
        ring = ring[first:] + ring[:first]
        if tuple(ring) in seen:
            continue
        seen.add(tuple(ring))
        closed = [*ring, ring[0]]
        cycles.append([by_pair[(a, b)] for a, b in pairwise(closed)])
    return sorted(cycles, key=lambda c: (len(c), [e.src for e in c]))


# --- Command line -----------------------------------------------------------------------------


def edges_of(root: Path, shown: str) -> list[Edge]:
    """The edges of one root, with files named as `shown/relative path`."""
    if not root.is_dir():
        raise UsageError(f"not a directory: {shown}")
    if (root / "lib.rs").is_file() or (root / "main.rs").is_file():
        found = rust_edges(root)
    elif any(root.rglob("*.py")):
        found = python_edges(root)
    else:
        raise UsageError(f"neither a Rust crate's src folder (lib.rs) nor Python sources: {shown}")
    prefix = shown.rstrip("/") + "/"
    return [Edge(prefix + e.src, prefix + e.dst, e.line, e.text) for e in found]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(
        prog="check_import_cycles.py",
        description="Report import cycles among the files of Rust crates and Python packages.",
    )
    parser.add_argument(
        "roots",
        nargs="*",
        help="a Rust crate's src folder or a Python package folder (default: "
        + ", ".join(DEFAULT_ROOTS)
        + " of this repository)",
    )
    parser.add_argument("--graph", action="store_true", help="print every edge first")
    try:
        args = parser.parse_args(argv)
        roots = [(Path(r), r) for r in args.roots] or [(REPO / r, r) for r in DEFAULT_ROOTS]
        edges = [e for root, shown in roots for e in edges_of(root, shown)]
    except UsageError as err:
        print(f"check_import_cycles.py: error: {err}", file=sys.stderr)
        return 2
    if args.graph:
        for e in edges:
            print(f"{e.src} -> {e.dst}  ({e.line}: {e.text})")
    cycles = find_cycles(edges)
    for cycle in cycles:
        print("cycle: " + " -> ".join([cycle[0].src, *(e.dst for e in cycle)]))
        for e in cycle:
            print(f"    {e.src}:{e.line}: {e.text}")
    if cycles:
        files = {e.src for c in cycles for e in c}
        print(f"{len(cycles)} import cycle(s) among {len(files)} file(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
