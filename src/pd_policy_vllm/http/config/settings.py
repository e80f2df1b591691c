"""Every setting of ``pd-policy-proxy``, read off its command line: one name each.

The command line ([`parser`][pd_policy_vllm.http.flags.parser]) is the one source of
truth for a setting's name, default, type and help. Each flag's destination is the
setting's key in the configuration file (``--max-body-mib`` is ``max_body_mib``;
``--no-access-log`` is ``access_log = false``) and, upper-cased behind ``PD_POLICY_``,
its environment variable (``PD_POLICY_MAX_BODY_MIB``). The docs' table is generated from
these records, and a test holds the table to them.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Iterator, Sequence
from typing import Any, Final

import attrs

__all__ = ["ENV_PREFIX", "Kind", "Setting", "settings"]

#: What every setting's environment variable starts with.
ENV_PREFIX: Final = "PD_POLICY_"

#: Settings whose environment variable predates the rule: the admins' keys, a
#: comma-separated list, as ``$PD_POLICY_ADMIN_API_KEYS`` has always been read.
_ENV_NAMES: Final = {"admin_api_key": "PD_POLICY_ADMIN_API_KEYS"}

#: Settings whose value is a secret: never shown (``--print-config`` masks it).
SECRET_KEYS: Final = frozenset({"admin_api_key"})

#: Flags that act at once and are no setting of a running proxy.
_NOT_SETTINGS: Final = frozenset({"help", "version", "print_config", "config"})


class Kind(enum.Enum):
    """How a setting's value is written outside the command line."""

    #: ``true``/``false`` in the file; ``1``/``0``, ``true``/``false``, ``yes``/``no``,
    #: ``on``/``off`` in the environment.
    BOOL = "bool"
    #: A list in the file; comma-separated in the environment.
    LIST = "list"
    #: One value: the flag's own text, or the file's number, string or table.
    VALUE = "value"


@attrs.frozen(slots=True)
class Setting:
    """One setting: its key, the flags that set it, its environment variable, the
    ``--help`` group it is in, its help and default, and how it is written."""

    key: str
    flags: tuple[str, ...]
    env: str
    group: str
    help: str
    default: Any
    kind: Kind
    choices: tuple[str, ...] | None
    secret: bool
    #: Required unless the configuration file describes workers of its role.
    required: bool
    #: The command line's actions for it (two for a ``--x``/``--no-x`` pair).
    actions: tuple[argparse.Action, ...] = attrs.field(eq=False, repr=False)

    def convert(self, text: str) -> Any:
        """``text`` read as the flag reads it: its type and its choices. Raises
        ``argparse.ArgumentTypeError``, ``TypeError`` or ``ValueError``."""
        action = self.actions[0]
        value = action.type(text) if callable(action.type) else text
        if action.choices is not None and value not in action.choices:
            allowed = ", ".join(map(str, action.choices))
            raise ValueError(f"{text!r} is not one of {allowed}")
        return value


def _kind(action: argparse.Action) -> Kind:
    if isinstance(action, argparse._StoreConstAction) and isinstance(action.const, bool):
        return Kind.BOOL
    if isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+"):
        return Kind.LIST
    return Kind.VALUE


def _groups(cli: argparse.ArgumentParser) -> dict[int, str]:
    titles: dict[int, str] = {}
    for group in cli._action_groups:
        for action in group._group_actions:
            titles[id(action)] = group.title or ""
    return titles


def _actions(cli: argparse.ArgumentParser) -> Iterator[tuple[str, list[argparse.Action]]]:
    by_key: dict[str, list[argparse.Action]] = {}
    for action in cli._actions:
        if action.dest in _NOT_SETTINGS or not action.option_strings:
            continue
        by_key.setdefault(action.dest, []).append(action)
    yield from by_key.items()


def settings(cli: argparse.ArgumentParser) -> tuple[Setting, ...]:
    """Every setting of ``cli``, in the order of its ``--help``."""
    titles = _groups(cli)
    out = []
    for key, actions in _actions(cli):
        first = actions[0]
        kind = _kind(first)
        if kind is Kind.BOOL:
            # A --x/--no-x pair, or one flag: its default is the pair's (None: unsaid).
            default = first.default
            flags: Sequence[str] = [flag for a in actions for flag in a.option_strings]
        else:
            default, flags = first.default, first.option_strings
        choices = tuple(map(str, first.choices)) if first.choices is not None else None
        out.append(
            Setting(
                key=key,
                flags=tuple(flags),
                env=_ENV_NAMES.get(key, ENV_PREFIX + key.upper()),
                group=titles.get(id(first), ""),
                help=" ".join((first.help or "").split()),
                default=default,
                kind=kind,
                choices=choices,
                secret=key in SECRET_KEYS,
                required=bool(first.required),
                actions=tuple(actions),
            )
        )
    return tuple(out)
