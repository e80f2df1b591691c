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


def load_route() -> Callable[..., Awaitable[tuple[int, Any]]]:
    """``route()``, the router example of ``docs/grpc.md`` (its only Python block)."""
    (block,) = python_blocks("grpc.md")
    assert len(block.strip().splitlines()) < 30
    namespace: dict[str, Any] = {}
    exec(compile(block, str(DOCS / "grpc.md"), "exec"), namespace)
    route: Callable[..., Awaitable[tuple[int, Any]]] = namespace["route"]
    return route
