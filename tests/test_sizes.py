"""Byte counts: every unit, decimals, scientific notation and bad input (npumem.sizes)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

import npumem
from cli_contract import run_cli
from npumem._argtypes import byte_count, positive_byte_count
from npumem.monitor import TraceRecorder
from npumem.sizes import UNITS, byte_unit, format_bytes, parse_bytes

KIB, MIB, GIB, TIB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1048576", MIB),
        ("1_000_000", 1_000_000),
        ("1_024K", 1_024 * KIB),
        ("2_0.2_5 KiB", 20_736),
        ("+7", 7),
        ("12B", 12),
        ("12 b", 12),
        ("512K", 512 * KIB),
        ("100k", 100 * KIB),
        ("512KiB", 512 * KIB),
        ("64MiB", 64 * MIB),
        ("64mib", 64 * MIB),
        ("1m", MIB),
        ("3G", 3 * GIB),
        ("1.5GiB", 3 * GIB // 2),
        ("2T", 2 * TIB),
        ("1 TiB", TIB),
        ("4 kB", 4_000),
        ("4kb", 4_000),
        ("2MB", 2_000_000),
        ("2 GB", 2_000_000_000),
        ("1.5TB", 1_500_000_000_000),
        ("1e6", 1_000_000),
        ("1E6", 1_000_000),
        ("2.5e3", 2_500),
        ("1e3KiB", 1_000 * KIB),
        ("0.5KiB", 512),
        ("0.25 MiB", MIB // 4),
        ("  8MiB  ", 8 * MIB),
        (".5K", 512),
        ("1.", 1),
        ("1e1_0", 10**10),
        ("1_0e+0_3 kB", 10_000_000),
        (".5e1", 5),
    ],
)
def test_parse_bytes_accepts(text: str, value: int) -> None:
    assert parse_bytes(text) == value
    assert isinstance(parse_bytes(text), int)


def test_every_unit_is_accepted_in_any_case() -> None:
    for unit, scale in UNITS.items():
        for spelled in (unit, unit.upper(), unit.capitalize()):
            assert parse_bytes(f"3{spelled}") == 3 * scale
            assert parse_bytes(f"3 {spelled}") == 3 * scale


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "examples"),
        ("   ", "examples"),
        ("MiB", "examples"),
        ("1..5", "examples"),
        ("1,5M", "examples"),
        ("12XB", "unknown unit 'XB'"),
        ("1 MiBs", "unknown unit"),
        ("5 KB extra", "examples"),
        ("-1", "negative"),
        ("-1.5GiB", "negative"),
        ("nan", "finite"),
        ("NaN", "finite"),
        ("inf", "finite"),
        ("-Infinity", "finite"),
        ("1.5", "not a whole number"),
        ("0.3KiB", "307.2 bytes"),
        ("1.0000000000000000000000000000001KiB", "not a whole number"),
        ("1e-9999999999", "fraction of a byte"),
        ("1e30", "below 2**64"),
        ("16384 PiB", "unknown unit"),
        ("20000000TB", "below 2**64"),
        ("_1", "an `_` must stand alone between two digits"),
        ("1_", "an `_` must stand alone between two digits"),
        ("1__0", "an `_` must stand alone between two digits"),
        ("1_.5K", "an `_` must stand alone between two digits"),
        ("1._5K", "an `_` must stand alone between two digits"),
        ("1_e3", "an `_` must stand alone between two digits"),
        ("+_1MiB", "an `_` must stand alone between two digits"),
        ("1e_3", "an `_` must stand alone between two digits"),
        ("1e3_", "an `_` must stand alone between two digits"),
        ("1e+_3", "an `_` must stand alone between two digits"),
        ("1e1__0", "an `_` must stand alone between two digits"),
        ("1e", "unknown unit 'e'"),
        ("1e1.5", "examples"),
        ("0x10", "examples"),
        ("1,000", "examples"),
        ("1 000", "examples"),
        ("1e-3KiB", "not a whole number"),
    ],
)
def test_parse_bytes_refuses(text: str, why: str) -> None:
    with pytest.raises(npumem.InvalidArgumentError) as info:
        parse_bytes(text)
    message = str(info.value)
    assert message.startswith(f"{text!r} is not a byte count: ")
    assert why in message
    assert isinstance(info.value, ValueError)


def test_parse_bytes_refuses_non_text() -> None:
    with pytest.raises(npumem.ArgumentTypeError, match="must be text, got int"):
        parse_bytes(5)  # type: ignore[arg-type]


def test_argparse_types() -> None:
    assert byte_count("1.5GiB") == 3 * GIB // 2
    assert byte_count("0") == 0
    assert positive_byte_count("1") == 1
    with pytest.raises(argparse.ArgumentTypeError, match="is not a byte count: it is negative"):
        byte_count("-2K")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1 byte"):
        positive_byte_count("0")


@pytest.mark.parametrize(
    ("n", "text", "short"),
    [
        (0, "0 B", "0 B"),
        (1000, "1000 B", "1000 B"),
        (1023, "1023 B", "1023 B"),
        (KIB, "1.0 KiB", "1 KiB"),
        (1536, "1.5 KiB", "1.5 KiB"),
        (3 * MIB, "3.0 MiB", "3 MiB"),
        (5 * GIB, "5.0 GiB", "5 GiB"),
        (3 * GIB // 2, "1.5 GiB", "1.5 GiB"),
        (2 * TIB, "2.0 TiB", "2 TiB"),
        (2048 * TIB, "2,048.0 TiB", "2048 TiB"),
        (1500.0, "1.5 KiB", "1.5 KiB"),
    ],
)
def test_format_bytes(n: float, text: str, short: str) -> None:
    assert format_bytes(n) == text
    assert format_bytes(n, short=True) == short


def test_format_then_parse_round_trips() -> None:
    for n in (0, 1, 1000, KIB, 3 * MIB, 3 * GIB // 2, 7 * TIB):
        assert parse_bytes(format_bytes(n).replace(",", "")) == n


def test_byte_unit() -> None:
    assert byte_unit(0) == (1, "B")
    assert byte_unit(1023) == (1, "B")
    assert byte_unit(KIB) == (KIB, "KiB")
    assert byte_unit(3 * MIB) == (MIB, "MiB")
    assert byte_unit(5 * TIB) == (TIB, "TiB")
    assert byte_unit(3 * MIB, at_least=4) == (KIB, "KiB")  # plot axes: 3072 KiB, not 3 MiB
    assert byte_unit(4 * GIB, at_least=4) == (GIB, "GiB")


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{trace}", "--capacity", "_1"],
        ["replay", "{trace}", "--chunk-size", "1_"],
        ["plan", "{csv}", "-o", "{out}", "--capacity", "1__0"],
        ["plan", "{csv}", "-o", "{out}", "--pool", "sram=_2MiB"],
    ],
)
def test_misplaced_underscores_are_one_line_on_the_command_line(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        pool.alloc(100).free()
    trace = rec.trace.save(tmp_path / "t.json")
    csv = tmp_path / "p.csv"
    csv.write_text("id,lower,upper,size\na,0,2,4\n")
    out = tmp_path / "plan.json"
    args = [a.format(trace=trace, csv=csv, out=out) for a in argv]
    status, _, err = run_cli(args, capsys, output=out)
    assert status == 2
    assert "an `_` must stand alone between two digits" in err


# Texts that name a byte count, and texts that do not (with what the refusal says).
AGREED = ["64MiB", "1e3", "1e3KiB", "1_000", "1_024 K", "1.5GiB", "1e1_0", "+7", ".5K"]
REFUSED = ["1__0", "1e_3", "0.3KiB", "-1MiB", "1e", "nan", "0x10", "1,000", "1e30"]


@pytest.mark.parametrize("text", AGREED + REFUSED)
def test_the_command_line_and_the_python_api_read_byte_counts_alike(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One parser: `parse_bytes`, the command line's options (`--capacity`, `--pool`) and
    the Python API's pool texts (`npumem.plan.tiers.parse_pools`) accept the same texts as
    the same counts, and refuse the same texts with the same message."""
    import json

    from npumem.plan.tiers import parse_pools

    try:
        expected: int | str = parse_bytes(text)
    except npumem.InvalidArgumentError as exc:
        expected = str(exc)
    assert (text in AGREED) == isinstance(expected, int), expected
    csv = tmp_path / "p.csv"
    csv.write_text("id,lower,upper,size\na,0,2,4\n")
    out = tmp_path / "plan.json"
    status, _, err = run_cli(["plan", str(csv), "-o", str(out), "--capacity", text], capsys)
    if isinstance(expected, int):
        assert byte_count(text) == expected
        assert parse_pools([f"sram={text}", "hbm"])[0] == ("sram", expected)
        assert json.loads(out.read_text())["capacity"] == expected
        assert status in (0, 1)  # 1: the plan does not fit a capacity this small
    else:
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            byte_count(text)
        assert str(refused.value) == expected
        with pytest.raises(Exception, match="is not a byte count") as refused_pool:
            parse_pools([f"sram={text}", "hbm"])
        assert str(refused_pool.value) == f"pool 'sram': {expected}"
        assert status == 2 and expected in err
