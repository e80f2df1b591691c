"""Every install command the README and the docs give is one a newcomer can run today
from a clone: no package index holds pd-policy, so each installs the clone itself
(``.``), with extras the project defines."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
#: ``pip install`` and what it installs, up to the end of the command.
_INSTALL = re.compile(r"pip install ((?:-[\w-]+(?:[= ]\S+)? )*)(\S+)")


def _commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for match in _INSTALL.finditer(page.read_text()):
            found.append((page.name, match.group(2).rstrip(".,;:)").strip("`'\"")))
    return found


def test_the_pages_give_install_commands() -> None:
    assert len(_commands()) >= 8


def test_every_install_command_installs_the_clone_with_extras_that_exist() -> None:
    for page, target in _commands():
        if target in ("build", "-r", "-c") or target.startswith(("$", "-")):
            continue
        spec = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", target)
        assert spec is not None, f"{page}: pip install {target}: not the clone"
        extras = set(filter(None, (spec.group(1) or "").split(",")))
        assert extras <= EXTRAS, f"{page}: pip install {target}: no extra {extras - EXTRAS}"


def test_no_page_names_a_release_on_a_package_index() -> None:
    for page in PAGES:
        assert not re.search(r"pip install '?pd-policy", page.read_text()), page.name
