"""The proxy's configuration, loaded: the command line, the environment and the file
by the one precedence, and the file's workers."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from pd_policy_vllm.http.flags import parser

from .discover import file_discovery
from .layers import ConfigError, resolve
from .settings import ENV_PREFIX, settings
from .shown import effective
from .toml_file import read_config_file
from .workers import file_workers

__all__ = ["configuration"]


def configuration(
    argv: Sequence[str], environ: Mapping[str, str]
) -> tuple[argparse.Namespace, str]:
    """The settings of ``argv``, ``environ`` and the ``--config`` file (or
    ``$PD_POLICY_CONFIG``), by the one precedence, with the file's workers as
    ``workers``; and the effective configuration as ``--print-config`` shows it. Raises
    [`ConfigError`][pd_policy_vllm.http.config.layers.ConfigError] for a bad file, key
    or value, or a fleet with no prefill or no decode worker."""
    cli = parser()
    known = settings(cli)
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--config", type=Path)
    path = first.parse_known_args(argv)[0].config or environ.get(ENV_PREFIX + "CONFIG") or None
    file = read_config_file(Path(path)) if path else {}
    where = str(path) if path else "the configuration file"
    resolved = resolve(cli, known, argv, environ, file, where)
    args = resolved.args
    args.workers = file_workers(file, where)
    args.discover = file_discovery(file, where)
    args.argv = list(argv)  # read again on SIGHUP
    args.config_path = Path(path) if path else None  # watched for a change
    for role in ("prefill", "decode"):
        listed = [*args.workers, *args.discover]
        if not getattr(args, role) and not any(e.role == role for e in listed):
            raise ConfigError(
                f"no {role} worker: --{role} URL, ${ENV_PREFIX}{role.upper()} or a "
                f'[[workers]] table with role = "{role}" in --config',
                param=role,
            )
    return args, effective(known, resolved, args.workers)
