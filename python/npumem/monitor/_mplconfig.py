"""Where matplotlib keeps its configuration and font cache, chosen before it is imported.

matplotlib writes a font cache under `~/.config/matplotlib` and `~/.cache/matplotlib` (or
`$XDG_CONFIG_HOME`, `$XDG_CACHE_HOME`). When those cannot be written (a read-only or missing
home, another user's `HOME`), it makes a temporary folder itself and warns on stderr, twice,
on every run: noise around a command's one line of output. `use_writable_config_dir()` makes
that temporary folder first, quietly, and names it in `MPLCONFIGDIR`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["use_writable_config_dir"]


def use_writable_config_dir() -> None:
    """Before matplotlib's first import: when `MPLCONFIGDIR` is not set and matplotlib's own
    folders cannot be written, set it to a new temporary folder, removed as the process exits.
    Does nothing once matplotlib is imported or when `MPLCONFIGDIR` is set."""
    if "matplotlib" in sys.modules or os.environ.get("MPLCONFIGDIR"):
        return
    if all(_writable(folder) for folder in _default_folders()):
        return
    folder = tempfile.mkdtemp(prefix="npumem-matplotlib-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["MPLCONFIGDIR"] = folder


def _default_folders() -> list[Path]:
    """matplotlib's configuration and cache folders when `MPLCONFIGDIR` is not set."""
    try:
        home = Path.home()
    except (KeyError, RuntimeError):  # no home at all
        home = Path("/nonexistent")
    config = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    cache = os.environ.get("XDG_CACHE_HOME") or str(home / ".cache")
    return [Path(config) / "matplotlib", Path(cache) / "matplotlib"]


def _writable(folder: Path) -> bool:
    """Whether `folder` exists, or can be made, and can be written to."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)
