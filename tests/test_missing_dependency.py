"""A missing extra: one MissingDependencyError class, reachable from plan and monitor, and the
commands report it as bad input (exit 2) with the extra to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import npumem
import npumem.errors
import npumem.monitor
import npumem.plan
from npumem.cli import main
from npumem.exit_status import ExitStatus


def test_one_class() -> None:
    cls = npumem.errors.MissingDependencyError
    assert npumem.plan.MissingDependencyError is cls
    assert npumem.monitor.MissingDependencyError is cls
    assert issubclass(cls, npumem.NpumemError) and issubclass(cls, ImportError)


def test_plan_without_onnx(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"\x08\x07")
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` raises ImportError
    with pytest.raises(npumem.errors.MissingDependencyError, match=r"npumem\[onnx\]"):
        npumem.plan.Problem.from_onnx(model)
    assert main(["plan", str(model)]) == ExitStatus.USAGE
    assert "pip install 'npumem[onnx]'" in capsys.readouterr().err


def test_plot_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = npumem.Pool(4 << 20, cores=1).snapshot().save(tmp_path / "snap.json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["plot", str(snapshot), "-o", str(tmp_path / "map.png")]) == ExitStatus.USAGE
    assert "pip install npumem[plot]" in capsys.readouterr().err
    assert not (tmp_path / "map.png").exists()
