"""The configuration file: TOML, read with the standard library.

Its top-level keys are the settings' ([`settings`][pd_policy_vllm.http.config.settings]),
and ``[[workers]]`` the workers it describes
([`workers`][pd_policy_vllm.http.config.workers]).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .layers import ConfigError

__all__ = ["read_config_file"]


def read_config_file(path: Path) -> dict[str, Any]:
    """The top-level table of the TOML file at ``path``. Raises
    [`ConfigError`][pd_policy_vllm.http.config.layers.ConfigError], one line, for a file
    that cannot be read or is not TOML (with the line and column tomllib names)."""
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror}", param="config") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not TOML: {exc}", param="config") from None
