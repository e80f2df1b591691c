"""The tiny checkpoints are reproducible: a rebuild gives the same bytes, so every run and
every machine tests the same models."""

from __future__ import annotations

from pathlib import Path

from tiny_models import BUILDERS, TinyModel


def _contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def test_a_rebuild_is_byte_identical(tiny_models: dict[str, TinyModel], tmp_path: Path) -> None:
    for name, build in BUILDERS.items():
        again, built = build(tmp_path / name), tiny_models[name]
        assert (again.image_token_id, again.image_tokens) == (
            built.image_token_id,
            built.image_tokens,
        )
        assert _contents(again.path) == _contents(built.path), name


def test_the_llava_checkpoint_has_the_layout_vllm_loads(tiny_models: dict[str, TinyModel]) -> None:
    import safetensors

    with safetensors.safe_open(tiny_models["llava"].path / "model.safetensors", "pt") as f:
        # safe_open is no mapping: keys() is the only way to list the tensors.
        tower = [k for k in f.keys() if k.startswith("vision_tower.")]  # noqa: SIM118
    assert tower
    assert all(k.startswith("vision_tower.vision_model.") for k in tower)
