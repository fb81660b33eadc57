"""npumem's files on disk: one JSON reader, one JSON writer, atomic writes.

Every file is UTF-8. The reader also accepts a byte-order mark (editors on Windows add one); the
writers never write one. The reader returns a JSON object or raises the caller's error type with
one line that starts with the file and says what is wrong (missing, a directory, not UTF-8, not
JSON with the line and column, nested too deeply, a number out of range, a key given twice in
one object, not an object, larger than `MAX_INPUT_BYTES`, an integer too long to convert), never
a traceback from inside the `json` module, and a value it quotes is cut short (`npumem._shown`).
A named pipe (FIFO) is read like a file once a writer opens it; one that no writer opens within
`FIFO_WAIT` seconds is refused rather than waited on for ever. Writers replace the
file atomically: a reader sees the old file or the new one, and a failed write leaves no partial
file behind (its clean-up never raises over the error it reports). A symbolic link is written
through (the file it points to is replaced and the link stays a link); an existing path that is
neither a regular file nor a link to one (a directory, a FIFO, a device, a socket) is refused.

`path_argument()` is the one check of a file path argument: the reader and the writers here
start with it, and so should any function that takes a path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import secrets
import stat
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from npumem._shown import shown, shown_plain
from npumem.errors import ArgumentTypeError, InvalidArgumentError

__all__ = [
    "FIFO_WAIT",
    "MAX_INPUT_BYTES",
    "MAX_INTEGER_DIGITS",
    "check_output_path",
    "decode_text",
    "is_same_file",
    "json_object_from_text",
    "json_text",
    "path_argument",
    "read_bytes",
    "read_json_object",
    "remove_quietly",
    "text_writer",
    "write_bytes",
    "write_json",
    "write_text",
    "write_texts",
]

ENCODING = "utf-8"
"""The encoding of every file npumem writes."""

_READ_ENCODING = "utf-8-sig"  # UTF-8, with or without a byte-order mark

MAX_INPUT_BYTES = 1 << 30
"""The largest file (or stream) the reader takes: 1 GiB. A trace of a million events takes
about 75 MB (100 MB with call stacks), so this holds traces of more than ten million events;
anything larger, or an endless stream such as `/dev/zero`, is refused without reading past
the limit."""

_READ_CHUNK = 1 << 20

FIFO_WAIT = 30.0
"""Seconds the reader waits for a writer to open a named pipe (FIFO) it is given: opening a FIFO
waits until a writer opens it too, and a command must not hang for ever on a pipe that nobody
writes to. A writer that opens the pipe in time may take as long as it needs to write."""

MAX_INTEGER_DIGITS = sys.int_info.default_max_str_digits
"""The most digits of an integer in a text file (4,300: Python's default limit of conversion
from text; no figure of npumem's formats has more than 29)."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _finite_float(text: str) -> float:
    """A JSON number with a fraction or an exponent, refused when it does not fit in a double
    (`1e400` would read as infinity, which no writer can write back)."""
    value = float(text)
    if value in (math.inf, -math.inf):
        raise ValueError(f"the number {shown_plain(text)} is out of range")
    return value


class _LongInteger(ValueError):
    """A JSON integer of more than `MAX_INTEGER_DIGITS` digits."""


def _bounded_int(text: str) -> int:
    """A JSON integer, refused (`_LongInteger`) beyond `MAX_INTEGER_DIGITS` digits rather than
    failing inside `int()` with advice meant for Python programmers."""
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _LongInteger(text)
    return int(text)


def integer_too_long(digits: int) -> str:
    """The message for an integer of `digits` digits that no reader converts."""
    return f"a number of {digits:,} digits is too long (at most {MAX_INTEGER_DIGITS:,})"


def _long_integer_place(text: str) -> str:
    """`, line L, column C` of the first JSON integer of more than `MAX_INTEGER_DIGITS` digits
    in `text` (empty when it cannot be told)."""
    match = re.search(rf"(?:^|[:\[,])\s*(-?[0-9]{{{MAX_INTEGER_DIGITS + 1},}})", text)
    if match is None:
        return ""
    start = match.start(1)
    line = text.count("\n", 0, start) + 1
    column = start - text.rfind("\n", 0, start)
    return f", line {line}, column {column}"


def remove_quietly(path: Path) -> None:
    """Remove `path` if it exists; a failure to remove it (a parent that is not a folder, no
    permission) is ignored, so that clean-up never hides the error being reported."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def path_argument(
    value: object,
    what: str = "the path",
    *,
    error: Callable[[str], Exception] = InvalidArgumentError,
) -> Path:
    """`value`, a file path argument, as a `Path`: a `str` or an `os.PathLike` of text.

    Any other type (`None`, a number, `bytes`, a list) raises `ArgumentTypeError`; an empty path
    or one with a NUL character (no file can have it) raises `error(message)`. `what` names the
    argument in the message (`"the output path"`).
    """
    try:
        text = os.fspath(value)  # type: ignore[call-overload]
    except TypeError:
        text = None
    if not isinstance(text, str):
        raise ArgumentTypeError(
            f"{what} must be a str or an os.PathLike, got {type(value).__name__}"
        )
    if not text:
        raise error(f"{what} is empty")
    if "\0" in text:
        raise error(f"{what} {shown(text)} contains a NUL character")
    return Path(text)


def read_json_object(
    path: str | os.PathLike[str],
    *,
    error: Callable[[str], Exception] = InvalidArgumentError,
    expected: str = "a JSON object",
) -> dict[str, Any]:
    """The JSON object in the file at `path`.

    Anything else raises `error(message)`: the message starts with the path and names the
    problem; `expected` describes the wanted object in it (`"a JSON object with a 'buffers'
    list"`). `NaN` and `Infinity`, which are not JSON, are refused too, and so is an object that
    gives one key twice (`json` would keep the last value without a word), the message naming
    the key and the object (`buffers[3]`). A path that is not a path raises as
    `path_argument()` says.
    """
    p = path_argument(path, error=error)
    text = decode_text(read_bytes(p, error=error), str(p), error=error)
    return json_object_from_text(text, str(p), error=error, expected=expected)


def read_bytes(path: Path, *, error: Callable[[str], Exception] = InvalidArgumentError) -> bytes:
    """The bytes of the file (or pipe) at `path`, read once; a file that cannot be read, or
    that holds more than `MAX_INPUT_BYTES`, raises `error(message)`, the message naming it and
    saying why. A stream is read up to the limit and no further."""
    limit = MAX_INPUT_BYTES
    too_large = f"{path}: cannot read the file (larger than the limit of {limit:,} bytes)"
    try:
        with _open_input(path, error) as f:
            st = os.fstat(f.fileno())
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
            if stat.S_ISREG(st.st_mode) and st.st_size > limit:
                raise error(too_large)
            if stat.S_ISREG(st.st_mode):
                # One read of the file's size, without a copy: a read of the limit would
                # reserve a buffer of the limit (1 GiB) for any file, which a machine that
                # does not overcommit memory refuses. A file that grew since is read on, up to
                # the limit.
                data = f.read(st.st_size + 1)
                if len(data) > st.st_size:
                    data += _read_up_to(f, limit + 1 - len(data))
            else:
                piece = _read_up_to(f, limit + 1)
                if len(piece) > limit:
                    raise error(too_large)  # before a copy of the whole stream
                data = bytes(piece)
    except FileNotFoundError:
        raise error(f"{path}: cannot read the file (no such file)") from None
    except IsADirectoryError:
        raise error(f"{path}: cannot read the file (it is a directory, not a file)") from None
    except MemoryError:
        raise error(f"{path}: cannot read the file (out of memory)") from None
    except OSError as exc:
        raise error(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise error(too_large)
    return data


def _open_input(path: Path, error: Callable[[str], Exception]) -> BinaryIO:
    """`path` opened for reading (binary); a named pipe waits for its writer at most
    `FIFO_WAIT` seconds (`_open_fifo`)."""
    try:
        is_fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except (OSError, ValueError):
        is_fifo = False  # `open()` below says what is wrong
    if not is_fifo:
        return open(path, "rb")
    return _open_fifo(path, error)


def _open_fifo(path: Path, error: Callable[[str], Exception]) -> BinaryIO:
    """The named pipe `path` opened for reading once a writer opens it, or `error(message)`
    when none does within `FIFO_WAIT` seconds.

    `open()` of a FIFO waits in the kernel for a writer, and no timeout applies to it, so a
    thread waits there while this one waits for the thread. When the time is up, this opens
    the pipe for writing (without waiting: a reader is there), which lets the thread's open
    return, and closes both ends: nothing is left waiting. An anonymous pipe (`<(command)`,
    `/dev/stdin`) always has its writer: its open returns at once."""
    opened: list[int] = []
    failed: list[OSError] = []

    def wait_for_writer() -> None:
        try:
            opened.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except OSError as exc:
            failed.append(exc)

    waiter = threading.Thread(target=wait_for_writer, name="npumem-fifo-open", daemon=True)
    waiter.start()
    waited_in_vain = True
    try:
        waiter.join(FIFO_WAIT)
        waited_in_vain = waiter.is_alive()
    finally:
        if waited_in_vain:  # no writer in time, or Ctrl-C while waiting
            _release(path, waiter)
            for fd in opened:
                os.close(fd)
    if failed:
        raise failed[0]
    if waited_in_vain:
        raise error(
            f"{path}: cannot read the named pipe (no writer opened it within {FIFO_WAIT:g} s)"
        )
    return os.fdopen(opened[0], "rb")


def _release(path: Path, waiter: threading.Thread) -> None:
    """End `waiter`'s wait for a writer of the FIFO `path`: open it for writing without
    waiting, which succeeds because `waiter` is a reader, and close it once `waiter` is done."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return  # not waiting there: the thread is left to end on its own (it is a daemon)
    try:
        waiter.join(1.0)
    finally:
        os.close(fd)


def _read_up_to(f: BinaryIO, most: int) -> bytearray:
    """What is left in `f`, read in pieces, but no more than `most` bytes."""
    buf = bytearray()
    while len(buf) < most:
        piece = f.read(min(_READ_CHUNK, most - len(buf)))
        if not piece:
            break
        buf += piece
    return buf


def decode_text(
    data: bytes, label: str, *, error: Callable[[str], Exception] = InvalidArgumentError
) -> str:
    """`data` as UTF-8 text (a byte-order mark is dropped); otherwise `error(message)`, the
    message starting with `label` (the file's name). A NUL byte is no text's: refused too (a
    CSV reader would keep it inside a field)."""
    try:
        text = data.decode(_READ_ENCODING)
    except UnicodeDecodeError as exc:
        raise error(f"{label}: not a UTF-8 text file ({exc.reason})") from None
    nul = text.find("\0")
    if nul >= 0:
        raise error(f"{label}: not a text file (a NUL byte at character {nul})")
    return text


def json_object_from_text(
    text: str,
    label: str,
    *,
    error: Callable[[str], Exception] = InvalidArgumentError,
    expected: str = "a JSON object",
) -> dict[str, Any]:
    """The JSON object `text` holds, or `error(message)` as `read_json_object()` says, the
    message starting with `label` (the file's name)."""
    duplicated: list[_DuplicateKey] = []
    try:
        obj = json.loads(
            text,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
            object_pairs_hook=_unique_keys(duplicated),
        )
    except MemoryError:
        raise error(f"{label}: not readable JSON (out of memory while parsing it)") from None
    except json.JSONDecodeError as exc:
        raise error(
            f"{label}, line {exc.lineno}, column {exc.colno}: not JSON ({exc.msg})"
        ) from None
    except RecursionError:
        raise error(f"{label}: not readable JSON (nested too deeply)") from None
    except _LongInteger as exc:
        digits = len(str(exc).lstrip("-"))
        raise error(f"{label}{_long_integer_place(text)}: {integer_too_long(digits)}") from None
    except ValueError as exc:  # NaN, Infinity, 1e400, an integer with too many digits
        raise error(f"{label}: not readable JSON ({exc})") from None
    if not isinstance(obj, dict):
        found = "null" if obj is None else type(obj).__name__
        raise error(f"{label}: expected {expected}, found {found}")
    if duplicated:
        key, where = _first_duplicate(obj)
        raise error(
            f"{label}: the key {shown(key)} is given twice in {where} (a key may appear once in "
            "an object)"
        )
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(obj, label, error)
    return obj


class _DuplicateKey(dict[str, Any]):
    """An object of the JSON text that gives `key` more than once (the last value kept, as
    `json` keeps it), left in the parsed tree so that its place can be named afterwards."""

    __slots__ = ("key",)
    key: str


def _unique_keys(duplicated: list[_DuplicateKey]) -> Callable[[list[tuple[str, Any]]], Any]:
    """An `object_pairs_hook` that makes each object a dict, as `json` does, and marks one that
    gives a key twice: it becomes a `_DuplicateKey`, also appended to `duplicated`. Parsing goes
    on, so that text that is not JSON further on is reported as such first."""

    def make(pairs: list[tuple[str, Any]]) -> Any:
        obj = dict(pairs)
        if len(obj) == len(pairs):
            return obj
        marked = _DuplicateKey(obj)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                marked.key = key
                break
            seen.add(key)
        duplicated.append(marked)
        return marked

    return make


def _first_duplicate(obj: object) -> tuple[str, str]:
    """The key given twice in the first object (depth first, in the file's order) of `obj` that
    gives one twice, and where that object is: `"the top-level object"`, `"buffers[3]"`,
    `"config.per_core[0]"`."""
    # (item, path) with path a chain of (parent path, key or index), so that a string is made
    # only for the object found.
    stack: list[tuple[object, Any]] = [(obj, None)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, _DuplicateKey):
            return item.key, _path_text(path)
        if isinstance(item, dict):
            children = list(item.items())
        elif isinstance(item, list):
            children = list(enumerate(item))
        else:
            continue
        stack.extend(
            (value, (path, step))
            for step, value in reversed(children)
            if isinstance(value, dict | list)
        )
    raise AssertionError("no object with a duplicate key")  # pragma: no cover


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _path_text(path: Any) -> str:
    """`buffers[3].id` for a chain of steps made by `_first_duplicate`."""
    steps: list[str | int] = []
    while path is not None:
        path, step = path
        steps.append(step)
    if not steps:
        return "the top-level object"
    text = ""
    for step in reversed(steps):
        if isinstance(step, int):
            text += f"[{step}]"
        elif _IDENTIFIER.fullmatch(step):
            text += f".{step}" if text else step
        else:
            text += f"[{shown(step)}]"
    return text


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: paired ones decode to one character, a lone one stays
a surrogate, which no UTF-8 text (a report, a page, an output file) can hold."""


def _refuse_lone_surrogates(obj: object, label: str, error: Callable[[str], Exception]) -> None:
    """`error(message)` when a string of `obj` (a key or a value, at any depth) holds a lone
    surrogate (`"\\ud800"` in the JSON text)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode(ENCODING)
            except UnicodeEncodeError:
                raise error(
                    f"{label}: not valid text: the string {shown(item)} holds a lone UTF-16 "
                    "surrogate escape (\\ud800-\\udfff)"
                ) from None


_SCALARS = frozenset((str, int, float, bool, type(None)))
_ROW_ENCODER = json.JSONEncoder(separators=(", ", ": "), allow_nan=False)


class _NotStringKey(Exception):
    """A dict key that is not a str: the indented writer leaves such an object to `json`."""


def json_text(obj: Mapping[str, Any], *, indent: int | None = None) -> str:
    """`obj` as JSON text ending in a newline: compact, or `indent` spaces per level.

    Indented text puts each row on one line: a dict or list whose values are all scalars (a
    plan's buffer, a table's record) is written inline, `{"id": "a", "size": 64}`, and only
    the containers that hold containers are spread over lines. So a file of a million rows
    is a million lines, and writing it runs in `json`'s C encoder row by row rather than in
    its pure-Python indenting encoder.

    Floats that are not finite are refused (`ValueError`): they have no JSON form.
    """
    if indent is None:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n"
    parts: list[str] = []
    try:
        _indented(obj, " " * indent, "", parts)
    except _NotStringKey:
        return json.dumps(obj, indent=indent, separators=(",", ": "), allow_nan=False) + "\n"
    parts.append("\n")
    return "".join(parts)


def _is_row(value: dict[Any, Any] | list[Any]) -> bool:
    """Whether every value in `value` is a plain scalar (subclasses such as enums count as
    not: their container is spread over lines, which is still correct JSON)."""
    for item in value.values() if isinstance(value, dict) else value:
        if type(item) not in _SCALARS:
            return False
    return True


def _indented(value: Any, step: str, margin: str, parts: list[str]) -> None:
    """Append `value`'s indented text to `parts`; `margin` is the indent of its own line."""
    if isinstance(value, (dict, list)) and value and not _is_row(value):
        inner = margin + step
        if isinstance(value, dict):
            parts.append("{")
            for n, (key, item) in enumerate(value.items()):
                if not isinstance(key, str):
                    raise _NotStringKey
                parts.append(("\n" if n == 0 else ",\n") + inner)
                parts.append(_ROW_ENCODER.encode(key) + ": ")
                _indented(item, step, inner, parts)
            parts.append("\n" + margin + "}")
        else:
            parts.append("[")
            for n, item in enumerate(value):
                parts.append(("\n" if n == 0 else ",\n") + inner)
                _indented(item, step, inner, parts)
            parts.append("\n" + margin + "]")
    else:
        parts.append(_ROW_ENCODER.encode(value))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically and return the path (see
    `write_bytes()`)."""
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str, got {type(text).__name__}")
    return write_bytes(path, text.encode(ENCODING))


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically and return the path.

    The bytes go to a temporary file next to the file they replace, which the temporary file
    then replaces, so readers never see half a file and a failed write leaves any old file as it
    was. A symbolic link `path` is written through: the file it points to (made if missing) is
    replaced and the link stays. An existing `path` that is not a regular file or a link to one
    (a directory, a FIFO, a device, a socket) is refused with an `OSError` whose `strerror` says
    what it is, and nothing is written.
    """
    out = path_argument(path, "the output path")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ArgumentTypeError(f"data must be bytes, got {type(data).__name__}")
    with _AtomicFile(out, "wb") as f:
        f.write(data)
    return out


def write_texts(files: Mapping[Path, str]) -> None:
    """Write each text (UTF-8) to its path, all or none: by the rules of `write_bytes()`
    (links written through, special files refused), every path is checked before anything is
    written, each text goes to a temporary file next to the file it replaces, and the
    temporaries replace their files only once all are written. An `OSError` whose `filename`
    is the path given otherwise, with no temporary file left."""
    targets = {path: _replaced_file(path_argument(path, "the output path")) for path in files}
    temporary: dict[Path, Path] = {}
    path = next(iter(files), Path())
    try:
        for path, text in files.items():
            target = targets[path]
            # Named before it is made, so that the clean-up below removes it whenever this
            # stops after it exists (a signal raises right after the call that made it).
            temporary[target] = tmp = _temporary_name(target)
            try:
                f = open(tmp, "x", encoding=ENCODING, newline="")  # noqa: SIM115
            except FileExistsError:
                del temporary[target]  # another file of that name, not ours to remove
                raise
            with f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        for path in files:
            os.replace(temporary[targets[path]], targets[path])
    except OSError as exc:
        exc.filename = str(path)
        raise
    finally:
        for tmp in temporary.values():
            remove_quietly(tmp)


def text_writer(path: str | os.PathLike[str]) -> contextlib.AbstractContextManager[TextIO]:
    """A text file (UTF-8) that replaces `path` atomically when the `with` block ends, for a
    writer that makes its output piece by piece rather than in memory all at once: the same
    rules as `write_bytes()` (the old file stays until the new one is complete; an exception
    or `KeyboardInterrupt` in the block removes the temporary file and leaves no partial
    output; links are written through, special files refused before anything is written)."""
    return _AtomicFile(path_argument(path, "the output path"), "w")


class _AtomicFile:
    """A temporary file next to the file `out` replaces, opened with `mode` (`"wb"` or `"w"`)
    by `with`, which replaces that file once the block ends without an exception and is
    removed otherwise.

    A signal handler's exception (`KeyboardInterrupt`, the CLI's `SystemExit` for SIGTERM) can
    be raised as any call returns and as any function starts. So the temporary file is named
    before it is made, and from its making to its replacing or removal a `try` of `__enter__`
    or `__exit__` owns it; no handler runs between `__enter__` returning and the block
    starting. One point is left that no `try` can cover, the start of `__exit__`: an exception
    raised there skips `__exit__`, and the file goes when this object does (`__del__`), once
    that exception is released.

    An `OSError` on the way names `out` (its `filename`), the file the caller asked for, not the
    temporary file, which the caller never heard of.
    """

    def __init__(self, out: Path, mode: str) -> None:
        self._tmp: Path | None = None  # the temporary file while it may exist
        self._file: Any = None
        self._mode = mode
        self._out = out
        self._target = _replaced_file(out)  # may raise: `__del__` finds the fields above

    def __enter__(self) -> Any:
        encoding, newline = (None, None) if "b" in self._mode else (ENCODING, "")
        # Mode "x" makes the file (O_CREAT | O_EXCL) with the mode the umask leaves, as for any
        # new file. The descriptor is a file object's from the start: one dropped by a signal
        # raised as `open()` returns closes itself.
        create = self._mode.replace("w", "x")
        self._tmp = tmp = _temporary_name(self._target)
        try:
            self._file = open(tmp, create, encoding=encoding, newline=newline)
        except FileExistsError as exc:
            self._tmp = None  # another file of that name, not ours to remove
            self._name_output(exc)
            raise
        except BaseException as exc:
            self._discard()
            self._name_output(exc)
            raise
        return self._file

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        try:
            if exc_type is None:
                f = self._file
                f.flush()
                os.fsync(f.fileno())
                f.close()
                os.replace(self._tmp, self._target)  # type: ignore[arg-type]
                self._tmp = None
        except OSError as exc:
            self._name_output(exc)
            raise
        finally:
            self._discard()

    def _name_output(self, exc: BaseException) -> None:
        """Make `exc`, if an `OSError`, name the output file rather than the temporary one."""
        if isinstance(exc, OSError):
            exc.filename = str(self._out)
            # Deleted, not set to None: a None second name prints as "-> None".
            del exc.filename2

    def __del__(self) -> None:
        self._discard()

    def _discard(self) -> None:
        """Close the temporary file and remove it, if it may still exist. A failure to close
        or remove never hides the exception being reported. The removal is the first call of
        its own `finally` (not `contextlib.suppress()`, itself a call after which a handler may
        raise), so that a second signal raised while closing (a second Ctrl-C) does not skip
        it."""
        tmp, self._tmp = self._tmp, None
        if tmp is None:
            return
        try:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
        finally:
            try:  # noqa: SIM105
                os.unlink(tmp)
            except OSError:
                pass


def _temporary_name(target: Path) -> Path:
    """A new name next to `target` for the temporary file that replaces it once written:
    `.NAME.PID.HEX.tmp`, with NAME cut short where the whole would be longer than a file name
    may be there (so that every name that can be written can be written this way)."""
    suffix = f".{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        name_max = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    name = os.fsencode(target.name)[: max(1, name_max - len(suffix) - 1)]
    return target.with_name(f".{os.fsdecode(name)}{suffix}")


def is_same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether paths `a` and `b` name one existing file (through links too): an output that
    would replace a command's own input."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """`path` as a `Path` if a writer here could replace it: `path_argument()` with "the
    output path", then an `OSError` (as `write_bytes()` raises it) when it exists and is not a
    regular file or a link to one. Commands that write several files check them all first."""
    out = path_argument(path, "the output path")
    _replaced_file(out)
    return out


_NOT_FILES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _replaced_file(out: Path) -> Path:
    """The file that a write to `out` replaces: `out` itself, or the file the symbolic link
    `out` points to, through any chain of links. Raises `OSError` when that file exists and is
    not a regular file: replacing it would destroy a directory, a FIFO or a device node."""
    target = Path(os.path.realpath(out)) if out.is_symlink() else out
    try:
        # Through the links, as `open()` goes: a link of /proc (`/dev/stdout` to a pipe)
        # leads to a file that its resolved path does not name.
        mode = os.stat(out).st_mode
    except FileNotFoundError:
        return target  # a new file (or a link to one not made yet)
    if stat.S_ISREG(mode):
        return target
    kind = next((name for is_kind, name in _NOT_FILES if is_kind(mode)), "a special file")
    code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL
    if target == out:
        what = "it is"
    elif os.path.lexists(target):
        what = f"it links to {target}, which is"
    else:  # a pipe or a socket, which has no path
        what = "it links to"
    raise OSError(code, f"{what} {kind}, not a regular file", str(out))


def write_json(
    path: str | os.PathLike[str], obj: Mapping[str, Any], *, indent: int | None = None
) -> Path:
    """Write `obj` as JSON (`json_text()`) to `path` atomically; returns the path."""
    return write_text(path, json_text(obj, indent=indent))
