"""The registry of shared server fleets: one running at a time, started once per run of
the modules that share it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import pytest
from fleets import Fleets


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def fleet(self, name: str) -> Callable[[], AbstractContextManager[str]]:
        @contextmanager
        def start() -> Iterator[str]:
            self.events.append(f"start {name}")
            try:
                yield name
            finally:
                self.events.append(f"stop {name}")

        return start


def test_a_fleet_starts_once_for_every_module_that_shares_it() -> None:
    log, fleets = Log(), Fleets()
    assert fleets.get("a", log.fleet("a"), user="m1") == "a"
    assert fleets.get("a", log.fleet("a"), user="m2") == "a"
    assert (log.events, fleets.running, fleets.starts) == (["start a"], "a", {"a": 1})
    fleets.close()
    assert (log.events, fleets.running) == (["start a", "stop a"], None)


def test_starting_another_fleet_stops_the_running_one_first() -> None:
    log, fleets = Log(), Fleets()
    fleets.get("a", log.fleet("a"), user="m1")
    assert fleets.get("b", log.fleet("b"), user="m2") == "b"
    assert log.events == ["start a", "stop a", "start b"]
    fleets.get("a", log.fleet("a"), user="m3")
    assert fleets.starts == {"a": 2, "b": 1}


def test_a_module_may_not_hold_two_fleets() -> None:
    log, fleets = Log(), Fleets()
    fleets.get("a", log.fleet("a"), user="m1")
    with pytest.raises(RuntimeError, match="one fleet per module"):
        fleets.get("b", log.fleet("b"), user="m1")
    assert (log.events, fleets.running) == (["start a"], "a")  # the first is left running


def test_a_fleet_that_fails_to_start_leaves_none_running() -> None:
    fleets = Fleets()

    @contextmanager
    def broken() -> Iterator[str]:
        raise OSError("no port")
        yield "never"

    with pytest.raises(OSError, match="no port"):
        fleets.get("a", broken, user="m1")
    assert fleets.running is None and fleets.starts == {}
