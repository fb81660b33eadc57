"""The demo's text model keeps its KV cache in pages: a shared system prompt, beam search with
copy-on-write, waste and sharing reported; nothing grows by copy."""

from __future__ import annotations

from npumem.workloads import run_demo
from npumem.workloads.models import build_models
from npumem.workloads.service import BEAMS, make_requests


def test_requests_mix_beams_and_the_system_prompt() -> None:
    reqs = [r for r in make_requests(400, build_models(), seed=0) if r.model == "text"]
    assert any(r.beams == BEAMS and r.batch == 1 for r in reqs)
    assert any(r.system_prompt for r in reqs) and not all(r.system_prompt for r in reqs)


def test_demo_uses_the_paged_kv_cache() -> None:
    result = run_demo(requests=120, workers=1, seed=1)
    assert result.ok
    # The pool starts with the weights and half the rest, and grows once, by all the rest: a
    # region is more than the largest request (an activation arena), whatever triggers growth.
    assert result.grow_events == 1 and result.regions == 2
    grown = result.end_snapshot.regions[1]
    assert grown.length == result.capacity - result.start_capacity
    kv = result.kv
    assert kv.peak_pages > 0 and kv.page_bytes == 16 * 4 * 768 * 2 * 2
    assert kv.peak_shared_saved_bytes > 0, "the system prompt and the beams share pages"
    assert kv.copies > 0 and kv.bytes_copied == kv.copies * kv.page_bytes
    assert kv.beam_forks > 0
    assert 0 < kv.mean_waste_share < 0.5
    assert result.peak_snapshot.kv and result.peak_snapshot.kv[0].tag == "text.kv-cache"
    assert len(result.end_snapshot.blocks) == 3, "every page went back to the pool"
