"""The proxy's configuration: every setting a flag, a key of the configuration file and
an environment variable, with one precedence (flag, environment, file, default), and the
workers the file describes.

Its modules: [`settings`][pd_policy_vllm.http.config.settings] (the settings, read off
the command line), [`layers`][pd_policy_vllm.http.config.layers] (the precedence),
[`toml_file`][pd_policy_vllm.http.config.toml_file] (the file),
[`workers`][pd_policy_vllm.http.config.workers] (its ``[[workers]]``),
[`shown`][pd_policy_vllm.http.config.shown] (``--print-config`` and the docs' table) and
[`load`][pd_policy_vllm.http.config.load] (all of them, for the command).
"""

from .layers import ConfigError, Resolved, resolve
from .settings import ENV_PREFIX, Kind, Setting, settings
from .toml_file import read_config_file
from .workers import WorkerEntry, file_workers

__all__ = [
    "ENV_PREFIX",
    "ConfigError",
    "Kind",
    "Resolved",
    "Setting",
    "WorkerEntry",
    "file_workers",
    "read_config_file",
    "resolve",
    "settings",
]
