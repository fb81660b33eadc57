"""npumem.fileio: one JSON reader with one typed error line, one atomic writer."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import npumem
from npumem import fileio
from npumem.cli import main
from npumem.fileio import (
    json_text,
    path_argument,
    read_json_object,
    write_bytes,
    write_json,
    write_text,
)
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
        (b'{"a": ' + b"1" * 5000 + b"}", "line 1, column 7: a number of 5,000 digits is too long"),
        (b"\xff\xfe{}", "not a UTF-8 text file"),
    ],
)
def test_bad_content_is_one_typed_line(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    assert words in _read_error(path)


@pytest.mark.parametrize(
    ("content", "key", "where"),
    [
        (b'{"a": 1, "a": 1}', "a", "the top-level object"),
        (b'{"a": 1, "b": 2, "a": 3}', "a", "the top-level object"),
        (b'{"buffers": [{"id": "x"}, {"id": "y", "size": 1, "size": 2}]}', "size", "buffers[1]"),
        (b'{"config": {"cores": 1, "cores": 2}}', "cores", "config"),
        (b'{"a b": {"c": [{"k": 1, "k": 1}]}}', "k", "['a b'].c[0]"),
        # The key as text once decoded: an escape names the same key.
        (rb'{"\u0061": 1, "a": 2}', "a", "the top-level object"),
        # An object kept only by the last of two values is no longer in the result: the object
        # that gave the key twice is named.
        (b'{"p": {"q": {"x": 1, "x": 2}, "q": 3}}', "q", "p"),
    ],
)
def test_a_key_given_twice_is_refused_naming_the_key_and_the_object(
    tmp_path: Path, content: bytes, key: str, where: str
) -> None:
    path = tmp_path / "dup.json"
    path.write_bytes(content)
    message = _read_error(path)
    assert f"the key {key!r} is given twice in {where} " in message, message


def test_keys_that_differ_are_not_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"a": {"a": 1, "A": 2}, "b": [{"a": 1}, {"a": 2}], "a ": 3}')
    assert read_json_object(path) == {"a": {"a": 1, "A": 2}, "b": [{"a": 1}, {"a": 2}], "a ": 3}


def test_text_that_is_not_json_is_reported_before_a_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "both.json"
    path.write_text('{"a": 1, "a": 2, "b": }')
    assert "line 1, column 23: not JSON" in _read_error(path)


def test_every_reader_refuses_a_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"buffers": [], "buffers": []}')
    for call, error in (
        (Problem.from_json, ProblemFormatError),
        (Graph.from_json, GraphError),
        (load_snapshot, FileFormatError),
        (load_trace, FileFormatError),
    ):
        with pytest.raises(error, match="the key 'buffers' is given twice in the top-level"):
            call(path)


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
    assert indented.read_text() == (
        '{\n "name": "caf\\u00e9",\n "n": [1, 2.5, null, true],\n "nested": {"k": "v"}\n}\n'
    )
    assert json_text(obj) == json.dumps(obj, separators=(",", ":")) + "\n"


_FINITE = st.floats(allow_nan=False, allow_infinity=False)
_SCALAR = st.none() | st.booleans() | st.integers() | _FINITE | st.text()
_JSON = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(obj=st.dictionaries(st.text(), _JSON, max_size=5), indent=st.integers(0, 3))
def test_indented_text_reads_back_and_puts_each_row_on_one_line(
    obj: dict[str, object], indent: int
) -> None:
    text = json_text(obj, indent=indent)
    assert json.loads(text) == obj

    def lines(value: object) -> int:  # a scalar, an empty container or a row: one line
        items = list(value.values()) if isinstance(value, dict) else value
        if not isinstance(items, list) or all(not isinstance(v, (dict, list)) for v in items):
            return 1
        return 2 + sum(lines(v) for v in items)

    assert text.count("\n") == lines(obj)
    for line in text.splitlines():
        value = line.strip().removesuffix(",")
        if value.startswith('"'):  # a key, or a string in a list
            _, end = json.JSONDecoder().raw_decode(value)
            value = value[end + 2 :] if value[end:].startswith(": ") else ""
        if value.startswith(("{", "[")) and value not in ("{", "["):
            row = json.loads(value)  # an inline container is a whole row ...
            items = row.values() if isinstance(row, dict) else row
            assert all(not isinstance(v, (dict, list)) for v in items)  # ... of scalars only


def test_indented_text_keeps_non_string_keys_as_json_does() -> None:
    obj = {"rows": [{"a": {1: 2, None: 3}}], "flat": {2.5: 1}}
    assert json.loads(json_text(obj, indent=2)) == json.loads(json.dumps(obj))
    with pytest.raises(ValueError, match="not JSON compliant"):
        json_text({"rows": [{"x": float("inf")}], "more": [[1]]}, indent=1)


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


def test_a_symbolic_link_is_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "target.json"
    target.write_text("x\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    chain = tmp_path / "chain.json"
    chain.symlink_to("link.json")  # a link to a link, relative
    write_json(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert read_json_object(target) == {"a": 1}
    write_json(chain, {"b": 2})
    assert chain.is_symlink() and link.is_symlink()
    assert read_json_object(target) == {"b": 2}
    # The temporary file went next to the target and is gone.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chain.json", "elsewhere", "link.json"]
    assert [p.name for p in elsewhere.iterdir()] == ["target.json"]


def test_a_dangling_link_makes_the_file_it_names(tmp_path: Path) -> None:
    link = tmp_path / "link.json"
    link.symlink_to("made.json")
    write_text(link, "{}\n")
    assert link.is_symlink() and (tmp_path / "made.json").read_text() == "{}\n"


def _fake_file_type(monkeypatch: pytest.MonkeyPatch, path: Path, kind: int) -> None:
    """Make `os.stat` report `path` as a file of type `kind` (a device, a socket), which a test
    must not create or write for real."""
    real_stat = os.stat

    def fake_stat(p: object, *args: object, **kwargs: object) -> os.stat_result:
        st = real_stat(p, *args, **kwargs)  # type: ignore[arg-type]
        if os.fspath(p) == os.fspath(path):  # type: ignore[arg-type]
            return os.stat_result((kind | 0o666, *tuple(st)[1:]))
        return st

    monkeypatch.setattr(os, "stat", fake_stat)


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("fifo", "it is a FIFO, not a regular file"),
        ("link to fifo", "which is a FIFO, not a regular file"),
        ("directory", "it is a directory, not a regular file"),
        ("link to directory", "which is a directory, not a regular file"),
        pytest.param(stat.S_IFCHR, "it is a character device, not a", id="char device"),
        pytest.param(stat.S_IFBLK, "it is a block device, not a regular file", id="block device"),
        pytest.param(stat.S_IFSOCK, "it is a socket, not a regular file", id="socket"),
    ],
)
def test_a_path_that_is_not_a_regular_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str | int, words: str
) -> None:
    path = tmp_path / "out.json"
    special = tmp_path / "special"
    if kind in ("fifo", "link to fifo"):
        os.mkfifo(special)
    elif kind in ("directory", "link to directory"):
        special.mkdir()
    else:
        special.write_text("stands for a device\n")
        assert isinstance(kind, int)
        _fake_file_type(monkeypatch, special, kind)
    if isinstance(kind, str) and kind.startswith("link"):
        path.symlink_to(special)
    else:
        path = special
    before = os.lstat(path)
    with pytest.raises(OSError) as info:
        write_bytes(path, b"{}\n")
    monkeypatch.undo()
    assert words in str(info.value.strerror)
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)  # not replaced
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted({"special", path.name})  # no temporary file left
    if isinstance(kind, int):
        assert special.read_text() == "stands for a device\n"


BAD_PATHS = [
    (None, npumem.ArgumentTypeError, "must be a str or an os.PathLike, got NoneType"),
    (123, npumem.ArgumentTypeError, "got int"),
    (b"out.json", npumem.ArgumentTypeError, "got bytes"),
    (["out.json"], npumem.ArgumentTypeError, "got list"),
    ("", npumem.InvalidArgumentError, "is empty"),
    ("a\x00b", npumem.InvalidArgumentError, "contains a NUL character"),
]


@pytest.mark.parametrize(("path", "error", "words"), BAD_PATHS)
def test_a_path_that_is_not_a_path_is_a_typed_error(
    path: object, error: type[Exception], words: str, tmp_path: Path
) -> None:
    for call in (
        lambda: read_json_object(path),  # type: ignore[arg-type]
        lambda: write_text(path, "x"),  # type: ignore[arg-type]
        lambda: write_json(path, {}),  # type: ignore[arg-type]
        lambda: path_argument(path),
    ):
        with pytest.raises(error, match=words):
            call()
    assert list(tmp_path.iterdir()) == []


def test_a_readers_error_type_is_kept_for_a_path_no_file_can_have() -> None:
    with pytest.raises(FileFormatError, match="contains a NUL character"):
        load_snapshot("a\x00b")
    with pytest.raises(FileFormatError, match="is empty"):
        load_trace("")


@pytest.mark.parametrize("data", [None, "text", 3, ["x"]])
def test_write_bytes_takes_bytes_and_write_text_takes_text(data: object, tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(npumem.ArgumentTypeError, match="data must be bytes"):
        write_bytes(out, data)  # type: ignore[arg-type]
    if not isinstance(data, str):
        with pytest.raises(npumem.ArgumentTypeError, match="text must be a str"):
            write_text(out, data)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# A signal's Python handler raises its exception (`KeyboardInterrupt`; `SystemExit(143)` under
# the CLI's SIGTERM handler) where the interpreter checks for signals: as a call returns and as
# a function starts. This script sends the signal at each such point of one write in turn,
# through a profile hook (`c_return` events, and `call` events of functions that are not
# generators: a generator resumes inside its own `try` blocks, which a hook's exception there
# would bypass), and checks, once the exception is caught, that each file is whole (old or
# new) and that no temporary file is left. It prints one line per failure, then the number of
# points tried and how many of them interrupted the write.
_INTERRUPT_AT_EVERY_POINT = r"""
import os
import signal
import sys
from pathlib import Path

from npumem import fileio
from npumem.cli import _terminate_as_exit

folder, sig, writer = Path(sys.argv[1]), signal.Signals[sys.argv[2]], sys.argv[3]
a, b = folder / "a.txt", folder / "b.txt"
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # for _terminate_as_exit() to take it
GENERATOR = 0x20  # inspect.CO_GENERATOR


def write():
    if writer == "write_bytes":
        fileio.write_bytes(a, b"new")
    elif writer == "text_writer":
        with fileio.text_writer(a) as f:
            f.write("new")
    else:
        fileio.write_texts({a: "new", b: "new"})


def hook_at(point, where):
    seen = 0

    def hook(frame, event, arg):
        nonlocal seen
        if event == "c_return" or (event == "call" and not frame.f_code.co_flags & GENERATOR):
            if seen == point:
                name = getattr(arg, "__qualname__", "") if event == "c_return" else ""
                where.append(f"{event} {name} in {frame.f_code.co_name}:{frame.f_lineno}")
                signal.raise_signal(sig)  # its handler raises here
            seen += 1

    return hook


def state():
    names = sorted(os.listdir(folder))
    return names, a.read_text(), b.read_text()


points = interrupted = 0
with _terminate_as_exit():
    while True:
        for name in os.listdir(folder):  # a failure is reported once, at its own point
            os.unlink(folder / name)
        a.write_text("old")
        b.write_text("old")
        where = []
        sys.setprofile(hook_at(points, where))
        try:
            write()
        except (KeyboardInterrupt, SystemExit):
            pass  # released here, as the CLI releases it before it exits
        finally:
            sys.setprofile(None)
        names, new_a, new_b = state()
        if where:
            interrupted += 1
            if names != ["a.txt", "b.txt"] or {new_a, new_b} - {"old", "new"}:
                print(f"at {where}: {names}, a.txt {new_a!r}, b.txt {new_b!r}")
        else:
            wanted = "new" if writer == "write_texts" else "old"
            if names != ["a.txt", "b.txt"] or (new_a, new_b) != ("new", wanted):
                print(f"not interrupted: {names}, a.txt {new_a!r}, b.txt {new_b!r}")
        points += 1
        if not where:  # the write ended before the point: every point was tried
            break
print(points, interrupted)
"""


@pytest.mark.parametrize("writer", ["write_bytes", "text_writer", "write_texts"])
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_at_any_point_of_a_write_leaves_a_whole_file_and_no_temporary_file(
    tmp_path: Path, writer: str, sig: str
) -> None:
    """Every point of a write where a signal's handler can raise (in a subprocess: the signals
    are real) leaves each file old or new and no temporary file, the point right after the
    temporary file is made included."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPT_AT_EVERY_POINT, str(tmp_path), sig, writer],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    *failures, summary = done.stdout.splitlines()
    assert failures == []
    points, interrupted = map(int, summary.split())
    assert interrupted == points - 1 > 10  # each point but the last, after the write, interrupts


# ----- named pipes ------------------------------------------------------------------------------


def _read_in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """`call()` in a daemon thread, so that a read that hangs fails the test rather than
    stopping it; the list gets the result or the exception."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


READERS = [
    (read_json_object, npumem.InvalidArgumentError),
    (load_snapshot, FileFormatError),
    (Problem.from_csv, ProblemFormatError),
    (Graph.from_json, GraphError),
]


@pytest.mark.parametrize(("read", "error"), READERS)
def test_a_named_pipe_no_writer_opens_is_refused_after_the_wait(
    read: Callable[[Path], object],
    error: type[Exception],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fileio, "FIFO_WAIT", 0.2)
    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    thread, outcome = _read_in_thread(lambda: read(fifo))
    thread.join(20)
    if thread.is_alive():  # let the hung read go before failing
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("the read waits for a writer for ever")
    assert len(outcome) == 1 and isinstance(outcome[0], error), outcome
    assert str(outcome[0]) == (
        f"{fifo}: cannot read the named pipe (no writer opened it within 0.2 s)"
    )
    assert not [t for t in threading.enumerate() if t.name == "npumem-fifo-open"]


def test_a_command_given_a_named_pipe_no_writer_opens_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fileio, "FIFO_WAIT", 0.2)
    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)
    for command in ("report", "replay", "plan"):
        thread, outcome = _read_in_thread(lambda command=command: main([command, str(fifo)]))
        thread.join(20)
        assert not thread.is_alive(), f"npumem {command} waits for a writer for ever"
        assert outcome == [2]
        assert capsys.readouterr().err == (
            f"npumem {command}: error: {fifo}: cannot read the named pipe (no writer opened it "
            "within 0.2 s)\n"
        )


def test_a_named_pipe_is_read_once_a_writer_opens_it_however_slow_its_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is for a writer to open the pipe; once one has, its data may come later."""
    monkeypatch.setattr(fileio, "FIFO_WAIT", 0.5)
    fifo = tmp_path / "in.json"
    os.mkfifo(fifo)

    def write_slowly() -> None:
        time.sleep(0.1)
        with open(fifo, "w") as f:
            time.sleep(1.0)  # longer than FIFO_WAIT
            f.write('{"a": [1, 2]}')

    writer = threading.Thread(target=write_slowly, daemon=True)
    writer.start()
    thread, outcome = _read_in_thread(lambda: read_json_object(fifo))
    thread.join(20)
    writer.join(20)
    assert outcome == [{"a": [1, 2]}]


# ----- the output file, not its temporary file, in errors ---------------------------------------


@pytest.mark.parametrize("where", ["open", "fsync"])
def test_a_failed_write_names_the_output_not_its_temporary_file(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out.json"

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".out.json.tmp"))

    if where == "open":
        out = tmp_path / "missing" / "out.json"  # its temporary file cannot be made
    else:
        monkeypatch.setattr(fileio.os, "fsync", full)
    with pytest.raises(OSError) as info:
        write_bytes(out, b"{}")
    assert info.value.filename == str(out)
    assert info.value.filename2 is None
    assert str(info.value).endswith(f"{str(out)!r}"), "no second name, not even None"
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["x" * 250 + ".json", "é" * 122 + ".json", "x" * 255])
def test_a_name_as_long_as_the_file_system_allows_is_written(tmp_path: Path, name: str) -> None:
    """The temporary file beside the output has a longer name than the output: it is cut short
    so that every name that can be written can be written (all three ways of writing)."""
    assert len(os.fsencode(name)) <= 255
    target = tmp_path / name
    fileio.write_bytes(target, b"one")
    assert target.read_bytes() == b"one"
    fileio.write_texts({target: "two"})
    assert target.read_text() == "two"
    with fileio.text_writer(target) as f:
        f.write("three")
    assert target.read_text() == "three"
    assert [p.name for p in tmp_path.iterdir()] == [name]
