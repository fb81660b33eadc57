"""``npumem view`` in a real browser (headless chromium) and ``npumem export --format perfetto``:
the page is one file that fetches nothing, draws every block, and shows a block's details (tag,
size, exact handle, the Python stack) when the mouse is over it; the export is a Chrome trace
that Perfetto reads."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest

import npumem
from browser_helpers import screenshot, self_test
from npumem.cli import main
from npumem.compaction import Compactor
from npumem.monitor import TraceRecorder
from npumem.monitor.perfetto import chrome_trace

MIB = 1 << 20


def allocate_for_the_view(pool: npumem.Pool) -> list[npumem.Block]:
    """A named function, so that the recorded stacks can be recognised."""
    held = [pool.alloc(n, tag=t) for n, t in ((3 * MIB, "weights"), (700_000, "kv-cache"))]
    held += [pool.alloc(200_000 + i * 1000, tag="activations") for i in range(30)]
    return held


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("view")
    pool = npumem.Pool(16 * MIB, cores=1, name="viewer")
    with TraceRecorder(pool, stacks=True) as rec:
        held = allocate_for_the_view(pool)
        for b in held[2::2]:
            b.free()
        with contextlib.suppress(npumem.OutOfMemoryError):
            pool.alloc(15 * MIB, tag="too-big")
        Compactor(pool).compact("full")
        snap = pool.snapshot()
        for b in held[:2] + held[3::2]:
            b.free()
    counts = rec.trace.counts()
    assert counts["move"] > 0 and counts["failed"] == 1
    return {
        "trace": rec.trace.save(out / "trace.json"),
        "snapshot": snap.save(out / "snap.json"),
        "dir": out,
    }


def _view(files: dict[str, Path], kind: str) -> Path:
    page = files["dir"] / f"{kind}.html"
    assert main(["view", str(files[kind]), "-o", str(page)]) == 0
    return page


@pytest.mark.parametrize("kind", ["trace", "snapshot"])
def test_the_page_is_self_contained(files: dict[str, Path], kind: str) -> None:
    html = _view(files, kind).read_text()
    assert html.startswith("<!DOCTYPE html>")
    # Nothing loads from elsewhere: no src or href attributes, no fetch, no imports.
    assert not re.search(r"""\b(src|href)\s*=|fetch\(|import\(|@import|url\(""", html)


def test_the_trace_page_draws_and_shows_details_on_hover(files: dict[str, Path]) -> None:
    result = self_test(_view(files, "trace"))
    trace = json.loads(files["trace"].read_text())
    blocks = sum(1 for e in trace["events"] if e[1] == "alloc")
    assert result["rects"] >= blocks  # one rectangle per block, more for moved blocks
    assert result["drawn"] == result["rects"]
    assert result["painted"] > 50_000  # pixels that are not the white background
    text = result["viaEvent"]  # the tooltip a real mousemove event opened
    assert text is not None and text == result["hover"]
    assert "tag         weights" in text and "size        3.0 MiB (3,145,728 B)" in text
    handle = next(e[6] for e in trace["events"] if e[1] == "alloc" and e[3] == 3 * MIB)
    assert f"handle {handle}" in text  # all 65 bits, as JavaScript shows them
    assert "allocate_for_the_view" in text and "test_viewer.py" in text  # the stack


def test_the_snapshot_page_draws_and_shows_details_on_hover(files: dict[str, Path]) -> None:
    result = self_test(_view(files, "snapshot"))
    assert result["drawn"] == result["rects"] > 0 and result["painted"] > 50_000
    text = result["viaEvent"]
    assert text is not None and "block bytes" in text and "core        0" in text


def test_a_screenshot_of_the_page_is_not_blank(files: dict[str, Path]) -> None:
    png = screenshot(_view(files, "trace"), files["dir"] / "shot.png")
    data = png.read_bytes()
    assert data[:4] == b"\x89PNG" and len(data) > 20_000


def test_view_refuses_plans_and_other_extensions(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["view", str(files["trace"]), "-o", str(tmp_path / "x.png")]) == 2
    assert "name it .html" in capsys.readouterr().err


def test_perfetto_export(files: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    assert main(["export", "--format", "perfetto", str(files["trace"]), "-o", str(out)]) == 0
    obj = json.loads(out.read_text())
    assert obj["otherData"]["format"] == "npumem-chrome-trace"
    events = obj["traceEvents"]
    assert all({"ph", "pid"} <= e.keys() for e in events)
    assert all("ts" in e for e in events if e["ph"] != "M")
    begins = [e["id"] for e in events if e["ph"] == "b"]
    ends = [e["id"] for e in events if e["ph"] == "e"]
    assert sorted(begins) == sorted(ends) and begins  # every slice closes
    assert all(isinstance(i, str) for i in begins)  # handles exact
    assert any(e["ph"] == "C" and e["name"] == "bytes live" for e in events)
    assert any(e["ph"] == "i" and e["cat"] == "failed" for e in events)
    assert any(e["ph"] == "i" and e["cat"] == "compaction" for e in events)
    stamps = [e["ts"] for e in events if e["ph"] != "M"]
    assert stamps == sorted(stamps)


def test_perfetto_export_of_an_empty_trace() -> None:
    from npumem.monitor import Trace

    obj = chrome_trace(Trace(pool="p", config={}))
    assert obj["traceEvents"][0]["ph"] == "M"


# Free text that the HTML parser would act on inside a script element, or that names a
# placeholder of the page's template.
AWKWARD_TAGS = ["<!--<script>", "</script><p>", "a & b > c", "__DATA__", "__TITLE__"]


def _awkward_files(tmp_path: Path, pool_name: str) -> dict[str, Path]:
    """A trace and a snapshot of the pool `pool_name` whose blocks carry `AWKWARD_TAGS`."""
    pool = npumem.Pool(1 * MIB, cores=1, name=pool_name)
    with TraceRecorder(pool) as rec:
        held = [pool.alloc(4096, tag=tag) for tag in AWKWARD_TAGS]
        snap = pool.snapshot()
        for b in held:
            b.free()
    return {
        "trace": rec.trace.save(tmp_path / "trace.json"),
        "snapshot": snap.save(tmp_path / "snap.json"),
    }


def _data_block(html: str) -> str:
    """The text of the page's data element: from its start tag to the first "</script" after
    it, where the HTML parser ends it when the text holds no "<"."""
    start = '<script id="data" type="application/json">'
    begin = html.index(start) + len(start)
    return html[begin : html.index("</script", begin)]


@pytest.mark.parametrize("kind", ["trace", "snapshot"])
def test_tags_cannot_change_the_script_elements(tmp_path: Path, kind: str) -> None:
    from npumem.monitor import load_snapshot, load_trace
    from npumem.monitor.viewer import page_data

    source = _awkward_files(tmp_path, "tags")[kind]
    page = tmp_path / "page.html"
    assert main(["view", str(source), "-o", str(page)]) == 0
    html = page.read_text()
    data = _data_block(html)
    # Inside a script element the parser acts only on text that starts with "<" ("</script",
    # "<!--"): with none in the data, the element ends right after it.
    assert not re.search("[<>&]", data)
    loaded = load_trace(source) if kind == "trace" else load_snapshot(source)
    assert json.loads(data) == page_data(loaded)
    assert set(AWKWARD_TAGS) <= set(json.loads(data)["tags"])
    assert html.count("<script") == 2  # the data and the viewer's code, nothing else


@pytest.mark.parametrize("pool_name", ["__DATA__", "__TITLE__", "<b>&"])
def test_names_like_placeholders_stay_as_they_are(tmp_path: Path, pool_name: str) -> None:
    source = _awkward_files(tmp_path, pool_name)["trace"]
    page = tmp_path / "page.html"
    assert main(["view", str(source), "-o", str(page)]) == 0
    html = page.read_text()
    escaped = pool_name.replace("&", "&amp;").replace("<", "&lt;")
    assert f"<title>npumem: trace of pool '{escaped}'</title>" in html
    assert json.loads(_data_block(html))["title"] == f"trace of pool {pool_name!r}"
