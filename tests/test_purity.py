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


def test_the_core_never_imports_its_tools() -> None:
    # Vendoring the policy alone drops tools/: nothing outside it may need it.
    for path in CORE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert not module.startswith(("tools", "pd_policy.tools")), path.name
                assert not (node.level and module.split(".")[0] == "tools"), path.name


def _names_only(path: Path) -> bool:
    # A package's front that only names what its modules define: imports (a guarded one
    # among them), and assignments to its own names (__all__, __version__).
    tree = ast.parse(path.read_text(encoding="utf-8"))
    allowed = (ast.Import, ast.ImportFrom, ast.Assign, ast.Expr, ast.Try)
    return all(isinstance(node, allowed) for node in tree.body)


def test_every_module_stays_small() -> None:
    # One idea per module: about 300 lines at most, across the three packages. A
    # package's front that only names what its modules define is a list, read as one:
    # the core's names every adapter imports from it take it a little past.
    src = CORE.parent
    sizes = {
        p: len(p.read_text(encoding="utf-8").splitlines())
        for p in src.rglob("*.py")
        if "_pb2" not in p.name
    }
    limit = {p: 320 if p.name == "__init__.py" and _names_only(p) else 310 for p in sizes}
    assert {str(p.relative_to(src)): n for p, n in sizes.items() if n > limit[p]} == {}


def test_the_vendoring_recipe_of_the_docs(tmp_path: Path) -> None:
    # docs/index.md: copy the folder under another name, drop tools/. In a fresh
    # interpreter that sees only the copy (and attrs), a request is served.
    import shutil

    target = tmp_path / "gateway" / "vendored_policy"
    shutil.copytree(CORE, target, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.rmtree(target / "tools")
    probe = (
        "import sys; sys.path[:0] = [sys.argv[1]]\n"
        "import vendored_policy as p\n"
        "assert 'pd_policy' not in sys.modules\n"
        "worker = p.WorkerCapability.from_labels({'supports_vision': 'false'})\n"
        "batch = p.MultimodalBatch(mm_hashes=('h1',), placeholders=(p.PlaceholderRange(1, 2),))\n"
        "request = p.Request('r', input_ids=(1, 2, 3, 4), batches=(batch,))\n"
        "form, leg = p.build_decode_leg(request, worker)\n"
        "assert form is p.DecodeForm.TEXT_PLUS_HASHES, form\n"
        "print(p.decode_cache_salt(leg))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(target.parent)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("mm1:")
