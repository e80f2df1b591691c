"""The seed's policy vendors alone: exactly the files ``docs/vendoring.md`` lists, copied under
another package name, import in an interpreter that sees only them and ``attrs``, and
answer the decision, leg and handoff conformance vectors as the reference does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import attr
import attrs

import pd_policy

ROOT: Final = Path(__file__).resolve().parent.parent
# The core as imported (a mutant's copy, under `make mutants`).
CORE: Final = Path(pd_policy.__file__).resolve().parent
DOC: Final = ROOT / "docs" / "vendoring.md"
VECTORS: Final = ROOT / "tests" / "vectors" / "pd-policy-vectors.json"


def listed() -> list[str]:
    """The files the docs tell a gateway to copy."""
    block = DOC.read_text(encoding="utf-8").split("<!-- the seed's files -->")[1]
    return sorted(block.split("```")[1].split())


def test_the_docs_list_exactly_the_top_of_the_core() -> None:
    top = sorted(p.name for p in CORE.iterdir() if p.is_file() and p.suffix in (".py", ".typed"))
    assert listed() == top


def test_the_seeds_policy_alone_answers_the_vectors(tmp_path: Path) -> None:
    vendor, site = tmp_path / "gateway", tmp_path / "site"
    (vendor / "pd_seed").mkdir(parents=True)
    for name in listed():
        shutil.copy(CORE / name, vendor / "pd_seed" / name)
    for package in (attr, attrs):  # attrs alone, from wherever it is installed
        assert package.__file__ is not None
        folder = Path(package.__file__).parent
        shutil.copytree(folder, site / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
    runner = ROOT / "tests" / "vendored_runner.py"
    done = subprocess.run(
        [sys.executable, "-S", "-E", str(runner), str(vendor), str(site), "pd_seed", str(VECTORS)],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    cases = json.loads(VECTORS.read_text(encoding="utf-8"))["cases"]
    expected = {op: sum(c["operation"] == op for c in cases) for op in report["matched"]}
    assert report["matched"] == expected and set(expected) == {"plan", "kv_handoff", "fold_salt"}
    assert report["foreign"] == [] and report["wrong"] == []
    # No sub-package came with it, nor was one looked for and found.
    parts = re.compile(r"pd_seed\.(fleet|exchange|cache|media)(\.|$)")
    assert not [m for m in report["modules"] if parts.match(m)]
