"""The cycle collector as the proxy sets it before serving: start-up's objects frozen out
of its sight, the youngest generation collected less often, and cycles still freed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from pd_policy_vllm.http.collector import YOUNG, settle


@pytest.fixture
def restored() -> Iterator[None]:
    threshold = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)


class _Node:
    def __init__(self) -> None:
        self.other: object = self


@pytest.mark.usefixtures("restored")
def test_settle_freezes_start_up_and_collects_the_young_less_often() -> None:
    middle, oldest = gc.get_threshold()[1:]
    settle()
    assert gc.get_freeze_count() > 0  # what start-up made is out of sight
    assert gc.get_threshold() == (YOUNG, middle, oldest)
    assert YOUNG > 700  # Python's own threshold, which it raises


@pytest.mark.usefixtures("restored")
def test_a_cycle_made_after_settling_is_still_freed() -> None:
    settle()
    node = _Node()
    alive = weakref.ref(node)
    del node
    assert alive() is not None  # a cycle: its counts never reach zero
    gc.collect()
    assert alive() is None
