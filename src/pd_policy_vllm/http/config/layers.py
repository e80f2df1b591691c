"""One rule for where a setting comes from: the flag, else the environment, else the
configuration file, else the default.

A value from the environment or the file is read as its flag reads it (its type, its
bounds, its choices), so the same value is good or bad wherever it is written. Every
error is one line naming the setting and where it was written:
[`ConfigError`][pd_policy_vllm.http.config.layers.ConfigError].
"""

from __future__ import annotations

import argparse
import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from pd_policy import InvalidConfiguration

from .settings import Kind, Setting

__all__ = ["FILE_ONLY", "ConfigError", "Resolved", "resolve"]

#: Keys of the file that are no flag's: the workers it describes.
FILE_ONLY: Final = frozenset({"workers", "discover"})

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


#: A setting that cannot be read (unknown, or of a bad value): the core's
#: [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration], whose message is one
#: line naming the key and where it was written, and whose ``param`` is the key.
ConfigError = InvalidConfiguration


@attrs.frozen(slots=True)
class Resolved:
    """The settings' values (as the command line's namespace), and where each came from:
    ``"flag"``, ``"env"``, ``"file"`` or ``"default"``."""

    args: argparse.Namespace
    sources: Mapping[str, str]


def _bad(setting: Setting, where: str, why: object) -> ConfigError:
    return ConfigError(f"{where}: {setting.key}: {why}", param=setting.key)


def _from_env(setting: Setting, text: str) -> Any:
    where = f"${setting.env}"
    try:
        if setting.kind is Kind.BOOL:
            word = text.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ValueError(f"{text!r} is not true or false")
            return word in _TRUE
        if setting.kind is Kind.LIST:
            return [setting.convert(item.strip()) for item in text.split(",") if item.strip()]
        return setting.convert(text)
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise _bad(setting, where, exc) from None


def _scalar(setting: Setting, value: Any) -> str:
    # A table (a JSON object a flag takes) is written as the flag's JSON; a number or a
    # string as its text. A bool is no value of a setting that is not one.
    if isinstance(value, bool | list):
        raise ValueError(f"{json.dumps(value)} is not a {setting.key} value")
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, int | float | str):
        return str(value)
    raise ValueError(f"a {type(value).__name__} is not a {setting.key} value")


def _from_file(setting: Setting, value: Any, path: str) -> Any:
    try:
        if setting.kind is Kind.BOOL:
            if not isinstance(value, bool):
                raise ValueError(f"{json.dumps(value, default=str)} is not true or false")
            return value
        if setting.kind is Kind.LIST:
            items = value if isinstance(value, list) else [value]
            return [setting.convert(_scalar(setting, item)) for item in items]
        return setting.convert(_scalar(setting, value))
    except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
        raise _bad(setting, path, exc) from None


def _check_keys(file: Mapping[str, Any], known: Sequence[str], path: str) -> None:
    for key in file:
        if key in known or key in FILE_ONLY:
            continue
        near = difflib.get_close_matches(key, known, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ConfigError(f"{path}: {key}: no such setting{hint}", param=key)


def _given(cli: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    # The flags given, and only those: each action's default is set aside for the parse
    # (and put back), so that a flag left out falls through to the other layers.
    saved = [(a, a.default, a.required) for a in cli._actions if a.option_strings]
    try:
        for action, _, _ in saved:
            if action.dest != "help":
                action.default, action.required = argparse.SUPPRESS, False
        return cli.parse_args(argv)
    finally:
        for action, default, required in saved:
            action.default, action.required = default, required


def resolve(
    cli: argparse.ArgumentParser,
    settings: Sequence[Setting],
    argv: Sequence[str],
    environ: Mapping[str, str],
    file: Mapping[str, Any] | None = None,
    path: str = "the configuration file",
) -> Resolved:
    """The value of every setting of ``cli``: from ``argv``, else ``environ``, else
    ``file`` (the configuration file's top-level table, read from ``path``), else its
    default. Raises [`ConfigError`][pd_policy_vllm.http.config.layers.ConfigError] for a
    key of ``file`` no setting has, or a value that is not its setting's; exits as
    ``argparse`` does for a bad flag."""
    file = file or {}
    _check_keys(file, [s.key for s in settings], path)
    given = vars(_given(cli, argv))
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for setting in settings:
        key = setting.key
        if key in given:
            values[key], sources[key] = given[key], "flag"
        elif environ.get(setting.env, "") != "":
            values[key], sources[key] = _from_env(setting, environ[setting.env]), "env"
        elif key in file:
            values[key], sources[key] = _from_file(setting, file[key], path), "file"
        else:
            values[key], sources[key] = setting.default, "default"
    for action in cli._actions:  # the flags that are no setting (--config, ...)
        if action.dest != "help" and action.dest not in values:
            values[action.dest] = given.get(action.dest, action.default)
    return Resolved(argparse.Namespace(**values), sources)
