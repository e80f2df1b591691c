"""Server fleets shared by several test modules, at most one running at a time.

A ``vllm serve`` worker takes 25-70 s to start on two cores and about 2.8 GiB, so the
modules that test one model over HTTP (P/D, E/P/D) share one fleet instead of starting
their own; and so that fleets never add up in memory, starting one stops any other.
``tests/vllm/conftest.py`` stops the running fleet as soon as the run leaves the last
module that uses it; the modules of one fleet are named so that they run together.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from typing import Any

__all__ = ["Fleets"]


class Fleets:
    """The session's shared fleets: ``get`` starts one (stopping any other) or returns the
    one already running under that key."""

    def __init__(self) -> None:
        self._stack = ExitStack()
        self._key: str | None = None
        self._fleet: Any = None
        self._users: set[str] = set()
        #: How many fleets were started this session, by key (a restart shows here).
        self.starts: dict[str, int] = {}

    @property
    def running(self) -> str | None:
        """The key of the running fleet, if any."""
        return self._key

    def get(self, key: str, start: Callable[[], AbstractContextManager[Any]], *, user: str) -> Any:
        """The fleet ``key``, started by entering ``start()`` unless it is running.

        ``user`` (a module's name) may hold one fleet: asking for a second one while its
        first runs would stop the first under it, and is a ``RuntimeError``."""
        if self._key == key:
            self._users.add(user)
            return self._fleet
        if self._key is not None and user in self._users:
            raise RuntimeError(f"{user} uses both {self._key} and {key}: one fleet per module")
        self.close()
        self._fleet = self._stack.enter_context(start())
        self._key, self._users = key, {user}
        self.starts[key] = self.starts.get(key, 0) + 1
        return self._fleet

    def close(self) -> None:
        """Stop the running fleet, if any."""
        try:
            self._stack.close()
        finally:
            self._key, self._fleet, self._users = None, None, set()
