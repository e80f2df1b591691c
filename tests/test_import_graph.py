"""The import graph of ``src/``: no circle anywhere, type-only imports included, and the core's
folders import one another only as ``docs/architecture.md`` writes down.

Every ``import`` of every module is an edge, wherever it is written (at the top, in a
function, under ``TYPE_CHECKING``): a circle a type checker walks is one a reader walks
too. ``from package import name`` is an edge to ``package.name`` when that is a module,
and to the package otherwise.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

import pd_policy

# Where the core is imported from (a mutant's copy, under `make mutants`), and beside it
# the adapters.
SRC: Final = Path(pd_policy.__file__).resolve().parent.parent
PACKAGES: Final = ("pd_policy", "pd_policy_grpc", "pd_policy_vllm", "pd_policy_ray")
DOC: Final = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
#: The core's sub-packages; the rest of the core's modules are its top, the seed's policy.
SUBPACKAGES: Final = ("fleet", "exchange", "cache", "media")


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (SRC / package).rglob("*.py"):
            if "_pb2" not in path.name:
                found[_module_name(path)] = path
    return found


MODULES: Final = _modules()


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports_of(module: str, source: str | None = None) -> Iterator[str]:
    """The modules of ``src/`` that ``module`` imports, anywhere in it (in ``source``, when
    given, instead of its file)."""
    path = MODULES[module]
    text = source if source is not None else path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]  # a name of a module: the module
            if target and target != module:
                yield target


GRAPH: Final = {module: set(imports_of(module)) for module in MODULES}


def _circles() -> list[list[str]]:
    # Tarjan's strongly connected components, iteratively: each of more than one module
    # is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(GRAPH):
        if root in index:
            continue
        work = [(root, iter(sorted(GRAPH[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for child in edges:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(GRAPH[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_circle_anywhere_in_src_type_only_imports_included() -> None:
    assert _circles() == []


def test_the_walk_sees_type_only_and_local_imports() -> None:
    # What the walk must see for the test above to mean anything: an import under
    # TYPE_CHECKING, one in a function, and one of a name that is a module.
    source = """
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from pd_policy_grpc.kv_routing import KvRouting
def later():
    import pd_policy.catalog
from pd_policy import cache
from .wire import pb
"""
    assert set(imports_of("pd_policy_grpc.fleet", source)) == {
        "pd_policy_grpc.kv_routing",
        "pd_policy.catalog",
        "pd_policy.cache",
        "pd_policy_grpc.wire",
    }


def test_a_circle_is_found() -> None:
    GRAPH["pd_policy.errors"].add("pd_policy.catalog")
    try:
        assert any({"pd_policy.catalog", "pd_policy.errors"} <= set(c) for c in _circles())
    finally:
        GRAPH["pd_policy.errors"].discard("pd_policy.catalog")


def _part(module: str) -> str | None:
    # The core's part a module belongs to: a sub-package, or "top"; None outside the core.
    parts = module.split(".")
    if parts[0] != "pd_policy" or parts[1:2] == ["tools"]:
        return None
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "top"


def _allowed() -> dict[str, set[str]]:
    # docs/architecture.md's table: | `pd_policy.<part>` | ... | may import |
    table = DOC.read_text(encoding="utf-8").split("<!-- core parts -->")[1]
    rows = re.findall(r"^\| `pd_policy(?:\.(\w+))?`[^|]*\|[^|]*\| ([^|]*) \|$", table, re.M)
    allowed = {}
    for part, imports in rows:
        named = set(re.findall(r"`pd_policy\.(\w+)`", imports))
        allowed[part or "top"] = named | ({"top"} if "the top" in imports else set())
    return allowed


def test_the_docs_name_what_each_part_of_the_core_may_import() -> None:
    assert set(_allowed()) == {"top", *SUBPACKAGES}


@pytest.mark.parametrize("part", ["top", *SUBPACKAGES])
def test_each_part_of_the_core_imports_only_what_the_docs_allow(part: str) -> None:
    allowed = _allowed()[part] | {part}
    wrong = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        if _part(module) == part and module != "pd_policy"  # the package's front names all
        for target in targets
        if _part(target) is not None and _part(target) not in allowed
    )
    assert wrong == []


def test_every_public_name_of_the_core_is_importable_from_it() -> None:
    missing = [name for name in pd_policy.__all__ if not hasattr(pd_policy, name)]
    assert missing == []
    assert pd_policy.Exchange.__module__ == "pd_policy.exchange.machine"
    assert pd_policy.Roster.__module__ == "pd_policy.fleet.roster"
