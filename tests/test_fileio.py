"""npumem.fileio: one JSON reader with one typed error line, one atomic writer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import npumem
from npumem.fileio import json_text, read_json_object, write_json, write_text
from npumem.monitor import FileFormatError, load_snapshot, load_trace
from npumem.plan import Graph, GraphError, Problem, ProblemFormatError


def _read_error(path: Path) -> str:
    with pytest.raises(npumem.InvalidArgumentError) as info:
        read_json_object(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "line 1, column 1: not JSON (Expecting value)"),
        (b"   \n", "not JSON"),
        (b"{", "not JSON"),
        (b'{"a": 1,}', "line 1, column 9: not JSON"),
        (b'{"a": 1}\n{"b": 2}', "line 2, column 1: not JSON (Extra data)"),
        (b"[1, 2]", "expected a JSON object, found list"),
        (b"null", "expected a JSON object, found null"),
        (b'"text"', "expected a JSON object, found str"),
        (b"3", "expected a JSON object, found int"),
        (b'{"a": NaN}', "NaN is not allowed"),
        (b'{"a": -Infinity}', "-Infinity is not allowed"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"a": ' + b"1" * 5000 + b"}", "not readable JSON"),
        (b"\xff\xfe{}", "not a UTF-8 text file"),
    ],
)
def test_bad_content_is_one_typed_line(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert words in _read_error(path)


def test_missing_and_directory(tmp_path: Path) -> None:
    assert "cannot read the file (no such file)" in _read_error(tmp_path / "missing.json")
    assert "is a directory" in _read_error(tmp_path)


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": [1, "\xc3\xa9"]}')
    assert read_json_object(path) == {"a": [1, "\u00e9"]}


def test_the_caller_chooses_the_error_type(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[]")
    with pytest.raises(ProblemFormatError, match="expected a JSON object with a 'buffers' list"):
        Problem.from_json(path)
    with pytest.raises(GraphError, match="expected a JSON object with 'tensors' and 'ops'"):
        Graph.from_json(path)
    with pytest.raises(FileFormatError, match="expected a JSON object, found list"):
        load_snapshot(path)
    with pytest.raises(FileFormatError, match="expected a JSON object, found list"):
        load_trace(path)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for call, error in (
        (Problem.from_json, ProblemFormatError),
        (Graph.from_json, GraphError),
        (load_snapshot, FileFormatError),
    ):
        with pytest.raises(error, match="nested too deeply"):
            call(deep)


def test_write_json_round_trip_and_encoding(tmp_path: Path) -> None:
    obj = {"name": "caf\u00e9", "n": [1, 2.5, None, True], "nested": {"k": "v"}}
    path = write_json(tmp_path / "out.json", obj)
    assert read_json_object(path) == obj
    raw = path.read_bytes()
    assert raw.endswith(b"}\n") and b"\n" not in raw[:-1]  # compact, one line
    assert not raw.startswith(b"\xef\xbb\xbf")
    raw.decode("ascii")  # non-ASCII text is escaped: the file is plain ASCII, valid UTF-8
    indented = write_json(tmp_path / "indented.json", obj, indent=1)
    assert indented.read_text() == json.dumps(obj, indent=1) + "\n"
    assert json_text(obj) == json.dumps(obj, separators=(",", ":")) + "\n"


def test_non_finite_floats_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json(path, {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "out.txt"
    write_text(path, "old\n")
    mode = path.stat().st_mode

    def fail(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space left"):
        write_text(path, "new\n" * 1000)
    monkeypatch.undo()
    assert path.read_text() == "old\n"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]  # no temporary file left
    write_text(path, "new\n")
    assert path.read_text() == "new\n" and path.stat().st_mode == mode


def test_writing_into_a_missing_folder_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_text(tmp_path / "no" / "such" / "out.txt", "x")
    assert list(tmp_path.iterdir()) == []
