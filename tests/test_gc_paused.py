"""`npumem._gc.gc_paused`: the collector is off inside, and afterwards as it was before, even
when the block raises or the caller had turned it off."""

from __future__ import annotations

import gc

import pytest

from npumem._gc import gc_paused


def test_the_collector_is_off_inside_and_on_again_after() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_inside_turns_it_on_again() -> None:
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("inside")
    assert gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
