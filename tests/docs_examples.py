"""The code examples of the docs, loaded so that tests run them verbatim."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs"


def python_blocks(page: str) -> list[str]:
    """Every fenced Python block of ``docs/<page>``, in order."""
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(encoding="utf-8"), re.S)


def load_route(name: str = "route") -> Callable[..., Awaitable[tuple[int, Any]]]:
    """A router example of ``docs/grpc.md``: ``route()`` on messages, ``route_fleet()`` over
    a fleet, ``route_bytes()`` on bytes. The page's Python blocks run in order in one
    namespace, as a reader reads them."""
    blocks = python_blocks("grpc.md")
    assert len(blocks) == 3
    assert len(blocks[0].strip().splitlines()) < 30
    namespace: dict[str, Any] = {}
    for block in blocks:
        exec(compile(block, str(DOCS / "grpc.md"), "exec"), namespace)
    route: Callable[..., Awaitable[tuple[int, Any]]] = namespace[name]
    return route
