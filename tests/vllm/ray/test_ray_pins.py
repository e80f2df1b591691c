"""The Ray release the adapter is pinned to is the one installed and the one the extra asks
for: its seam is Ray's internal API, so the three must move together."""

from __future__ import annotations

import tomllib
from pathlib import Path

import ray

from pd_policy_ray import RAY_VERSION

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_ray_is_the_pinned_one() -> None:
    assert ray.__version__ == RAY_VERSION


def test_the_extra_pins_that_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extra = project["project"]["optional-dependencies"]["ray"]
    assert f"ray[serve]=={RAY_VERSION}" in extra


def test_the_seam_imports_on_the_pinned_release() -> None:
    from pd_policy_ray import seam

    assert all(getattr(seam, name) is not None for name in seam.__all__)
