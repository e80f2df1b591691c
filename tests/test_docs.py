"""The docs agree with the code: generated tables are current, the README example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pd_policy.tools.tables import TABLES, splice

ROOT = Path(__file__).resolve().parent.parent
DOCS = {
    "connectors": ROOT / "docs" / "grpc.md",
    "decisions": ROOT / "docs" / "decisions.md",
    "epd": ROOT / "docs" / "epd.md",
    "errors": ROOT / "docs" / "errors.md",
    "exchange": ROOT / "docs" / "architecture.md",
    "router-fields": ROOT / "docs" / "security.md",
    "wires": ROOT / "docs" / "wires.md",
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_generated_tables_are_current(name: str) -> None:
    text = DOCS[name].read_text(encoding="utf-8")
    assert splice(text, name, TABLES[name]()) == text, f"run `make docs-tables` ({name})"


def test_splice_needs_markers() -> None:
    with pytest.raises(ValueError, match="no generated block"):
        splice("# nothing here", "errors", "x")


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def test_the_readme_example_runs() -> None:
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "the README lost its usage example"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
