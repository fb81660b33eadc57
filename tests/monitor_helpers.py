"""Helpers shared by the monitoring and command-line tests."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def assert_png(path: Path, size: tuple[int, int] | None = None) -> None:
    """A PNG whose chunks are intact (CRCs), of ``size`` pixels when given, not trivially
    small."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    at, kinds = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"chunk {kind!r} of {path} is damaged"
        kinds.append(kind)
        at += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    width, height = struct.unpack(">II", data[16:24])
    if size is not None:
        assert (width, height) == size
    assert width >= 400 and height >= 300
    assert 10_000 < len(data) < 5_000_000, f"{path}: {len(data)} bytes"
