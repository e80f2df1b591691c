"""``docs/http.md`` agrees with the code: its table is generated, its example runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pd_policy.tools.tables import splice
from pd_policy_vllm.openai.tools import identity_table, tables

DOC = Path(__file__).resolve().parents[2] / "docs" / "http.md"


def test_the_decision_table_is_current() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert splice(text, tables.NAME, tables.decision_table()) == text, "run `make docs-tables`"


def test_the_shaping_example_runs() -> None:
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    exec(compile(block, str(DOC), "exec"), {})


def test_the_table_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tables.main([]) == 0
    assert capsys.readouterr().out.strip() == tables.decision_table()
    doc = tmp_path / "http.md"
    doc.write_text(
        "x\n<!-- BEGIN GENERATED: http-decisions -->\n<!-- END GENERATED: http-decisions -->\n"
    )
    assert tables.main(["--write", str(doc)]) == 0
    assert tables.decision_table() in doc.read_text()
    assert tables.main(["--bogus"]) == 2


def test_the_media_identity_table_is_current() -> None:
    doc = DOC.parent / "index.md"
    text = doc.read_text(encoding="utf-8")
    table = identity_table.identity_table()
    assert splice(text, identity_table.NAME, table) == text, "run `make docs-tables`"
    # The incident: a remote URL is never identified by its text, on any path.
    remote = next(line for line in table.splitlines() if line.startswith("| remote URL"))
    assert "bytes (fetched once" in remote and "uncached" in remote and "worker's hash" in remote
    assert identity_table.main([]) == 0
    assert identity_table.main(["--bogus"]) == 2
