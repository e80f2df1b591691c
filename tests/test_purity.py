"""The core imports nothing but the standard library and attrs, and no adapter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "src" / "pd_policy"


def test_import_loads_only_stdlib_and_attrs() -> None:
    probe = (
        "import sys, json; before = set(sys.modules); import pd_policy; "
        "print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = json.loads(done.stdout)
    foreign = {
        m
        for m in loaded
        if m.split(".")[0] not in sys.stdlib_module_names
        and m.split(".")[0] not in {"pd_policy", "attrs", "attr"}
    }
    assert "pd_policy" in loaded
    assert not foreign


def test_no_core_module_imports_an_adapter_or_a_third_party_package() -> None:
    for path in CORE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "attrs", f"{path.name}: {name}"
