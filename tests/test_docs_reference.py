"""The API reference shows constructors and fields: the options and extensions it needs.

Building the site takes seconds, so these tests check what the build relies
on instead: the mkdocstrings options in mkdocs.yml, and that the local Griffe
extensions (docs/hooks/griffe_*.py) give every attrs class of the core the
constructor attrs really generates.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import griffe
import pytest

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / "docs" / "hooks"


def _load(name: str) -> ModuleType:
    # The extensions are files mkdocstrings loads by path, not installed modules.
    spec = importlib.util.spec_from_file_location(f"pd_policy_docs_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


griffe_attrs = _load("griffe_attrs")
griffe_sphinx = _load("griffe_sphinx")


def _python_handler() -> dict[str, Any]:
    yaml = importlib.import_module("yaml")

    class Loader(yaml.SafeLoader):  # type: ignore[misc,name-defined]
        """Reads python/name tags as None: only the plain options matter here."""

    Loader.add_multi_constructor("", lambda _loader, _suffix, _node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)
    (plugin,) = [p for p in config["plugins"] if isinstance(p, dict) and "mkdocstrings" in p]
    handler: dict[str, Any] = plugin["mkdocstrings"]["handlers"]["python"]
    return handler


def test_the_reference_options_show_signatures_and_fields() -> None:
    options = _python_handler()["options"]
    expected = {
        # The class heading shows the constructor, on its own line, with types.
        "merge_init_into_class": True,
        "show_signature": True,
        "separate_signature": True,
        "show_signature_annotations": True,
        # attrs fields mostly have no docstring, and are the API all the same.
        "show_if_no_docstring": True,
        "show_bases": True,
        "members_order": "source",
        "docstring_style": "sphinx",
    }
    assert {k: options.get(k) for k in expected} == expected
    assert options["extensions"] == [
        "docs/hooks/griffe_attrs.py:AttrsFields",
        "docs/hooks/griffe_sphinx.py:SphinxComments",
    ]
    for entry in options["extensions"]:
        path, _, name = entry.partition(":")
        assert hasattr(_load(Path(path).stem), name)


@pytest.fixture(scope="module")
def core() -> griffe.Module:
    """The core as the reference sees it: read statically, through both extensions."""
    extensions = griffe.load_extensions(griffe_attrs.AttrsFields, griffe_sphinx.SphinxComments)
    module = griffe.load("pd_policy", search_paths=[str(ROOT / "src")], extensions=extensions)
    assert isinstance(module, griffe.Module)
    return module


def _attrs_classes(module: griffe.Module) -> list[griffe.Class]:
    found: list[griffe.Class] = []

    def walk(obj: griffe.Module | griffe.Class) -> None:
        for member in obj.members.values():
            if member.is_alias:
                continue
            if isinstance(member, griffe.Class):
                if any(str(d.value).startswith("attrs.") for d in member.decorators):
                    found.append(member)
                walk(member)
            elif isinstance(member, griffe.Module):
                walk(member)

    walk(module)
    return found


def test_every_attrs_class_gets_the_constructor_attrs_generates(core: griffe.Module) -> None:
    classes = _attrs_classes(core)
    names = {c.name for c in classes}
    assert {"Request", "MultimodalBatch", "WorkerCapability", "TensorDescriptor"} <= names
    for cls in classes:
        runtime = importlib.import_module(cls.module.path)
        real = getattr(runtime, cls.name)
        init = cls.members["__init__"]
        assert isinstance(init, griffe.Function), cls.path
        shown = [(p.name, p.required) for p in init.parameters][1:]
        actual = [(f.alias, f.default is attrs.NOTHING) for f in attrs.fields(real) if f.init]
        assert shown == actual, cls.path


def test_the_request_signature_reads_like_the_code(core: griffe.Module) -> None:
    request = core["request.Request"]
    params = {p.name: p for p in request.members["__init__"].parameters}
    assert str(params["request_id"].annotation) == "str" and params["request_id"].required
    assert str(params["input_ids"].annotation) == "tuple[int, ...] | None"
    assert str(params["input_ids"].default) == "None"
    assert str(params["n"].default) == "1"
    # A field shows as what an instance holds, not as the attrs.field(...) call.
    n = request.members["n"]
    assert str(n.value) == "1" and "class-attribute" not in n.labels
    assert str(request.members["request_id"].value) == "None"


def test_attribute_comments_become_docstrings(core: griffe.Module) -> None:
    cache_salt = core["tools.outcome.Outcome"].members["cache_salt"]
    assert cache_salt.docstring is not None
    assert "decode worker gives the leg" in cache_salt.docstring.value


def test_cross_references_are_written_in_the_docs_tools_syntax() -> None:
    # Sphinx roles print raw in the site; autorefs links are resolved by the strict build.
    role = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|exc|mod|obj|const):`")
    src = Path(__file__).resolve().parents[1] / "src"
    found = [
        f"{path.relative_to(src)}:{n}"
        for path in sorted(src.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if role.search(line)
    ]
    assert found == []


def test_short_names_resolve_to_where_they_are_defined(core: griffe.Module) -> None:
    capability = core["worker.WorkerCapability"]
    assert capability.docstring is not None
    assert "[`Support`][pd_policy.worker.Support]" in capability.docstring.value


#: Modules the reference leaves to their package's page, each for a reason: an import
#: shim, a test connector's internals, and the generators behind the vectors' own page.
UNLISTED = {
    "pd_policy_vllm.http.aio",
    "pd_policy_vllm.transfer_connector.blocks",
    "pd_policy_vllm.transfer_connector.connector",
}
UNLISTED_UNDER = ("pd_policy.tools.vectors.",)


def test_every_public_module_is_in_the_reference() -> None:
    # A module added without its `:::` line builds fine and is simply missing from the
    # site; this finds it.
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    shown = set(re.findall(r"^::: ([\w.]+)", pages, re.MULTILINE))
    missing = []
    for package in ("pd_policy", "pd_policy_grpc", "pd_policy_vllm"):
        base = ROOT / "src" / package
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(ROOT / "src").with_suffix("").parts
            if any(p.startswith("_") for p in parts[1:]):
                continue
            name = ".".join(parts)
            if name in UNLISTED or name.startswith(UNLISTED_UNDER):
                continue
            if name not in shown and not any(s.startswith(name + ".") for s in shown):
                missing.append(name)
    assert missing == []
