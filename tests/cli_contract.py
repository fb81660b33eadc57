"""The contract every ``npumem`` command keeps on any input: it succeeds (status 0 or 1), or it
exits with status 2 and exactly one line on stderr and nothing on stdout; never a traceback,
never a partial output file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from npumem.cli import main


def run_cli(
    argv: Sequence[str],
    capsys: pytest.CaptureFixture[str],
    *,
    output: Path | None = None,
) -> tuple[int, str, str]:
    """Run ``npumem argv`` in this process; check the contract and return (status, out, err).

    ``output``: the file the command writes, which must not exist after a refusal.
    """
    capsys.readouterr()
    if output is not None:
        output.unlink(missing_ok=True)
    try:
        status = main(list(argv))
    except SystemExit as exc:  # argparse refusing an argument
        status = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    if status == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, f"expected one line on stderr, got {err!r}"
        assert lines[0].startswith(("npumem ", "npumem: ")) and "error" in lines[0], lines
        assert out == "", f"partial output on stdout: {out!r}"
        if output is not None:
            assert not output.exists(), f"{output} written although the command failed"
    else:
        assert status in (0, 1), (status, err)
    return status, out, err


def save_snapshot_and_trace(folder: Path, name: str) -> dict[str, Path]:
    """A snapshot and a trace of a few blocks of a pool named `name`, saved in `folder`: the
    inputs of the commands that read saved files."""
    import npumem
    from npumem.monitor import TraceRecorder

    pool = npumem.Pool(16 << 20, cores=1, name=name)
    with TraceRecorder(pool) as rec:
        blocks = [pool.alloc(1000, tag="x") for _ in range(4)]
        snap = pool.snapshot()
        for b in blocks:
            b.free()
    return {"snapshot": snap.save(folder / "s.json"), "trace": rec.trace.save(folder / "t.json")}
