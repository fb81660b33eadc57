"""Drive Debian's chromium headless: load a page and read what its test hook wrote."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest


def chromium() -> str:
    """The browser; the test is skipped without one, unless ``make test`` asks for it
    (``NPUMEM_REQUIRE_BROWSER=1``: ``make browser`` installs it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if os.environ.get("NPUMEM_REQUIRE_BROWSER"):
            pytest.fail("chromium is missing: run `make browser` (apt-get install chromium)")
        pytest.skip("chromium is not installed (make browser installs it)")
    return path


def _args(user_dir: str) -> list[str]:
    return [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={user_dir}",
        "--window-size=1400,900",
    ]


def self_test(page: Path) -> dict[str, Any]:
    """Load ``page#selftest`` and return the JSON its test hook wrote into the DOM."""
    with tempfile.TemporaryDirectory() as user_dir:
        done = subprocess.run(
            [
                *_args(user_dir),
                "--virtual-time-budget=10000",
                "--dump-dom",
                f"{page.resolve().as_uri()}#selftest",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    found = re.search(r'<pre id="selftest">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the page wrote no self-test result; chromium said: {done.stderr[-2000:]}"
    text = found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    result: dict[str, Any] = json.loads(text)
    return result


def screenshot(page: Path, out: Path) -> Path:
    """A PNG of ``page`` as the browser draws it."""
    with tempfile.TemporaryDirectory() as user_dir:
        subprocess.run(
            [*_args(user_dir), f"--screenshot={out}", page.resolve().as_uri()],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return out
