"""The configuration as an operator reads it: ``--print-config`` (the effective values, as
a file that would give them, each with where it came from, secrets hidden) and the
docs' table of every setting.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .layers import Resolved
from .settings import Kind, Setting
from .workers import WorkerEntry

__all__ = ["TABLE_NAME", "effective", "settings_table"]

#: The generated block of ``docs/configuration.md`` that the table fills.
TABLE_NAME: Final = "configuration-settings"

_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+")


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Path | ipaddress.IPv4Network | ipaddress.IPv6Network):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Mapping):
        items = (f"{_key(k)} = {_toml(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }" if value else "{}"
    if isinstance(value, Iterable):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _hidden(value: Any) -> str:
    count = len(value) if isinstance(value, list | tuple) else int(bool(value))
    return f"{count} hidden" if count else "none"


def effective(
    settings: Sequence[Setting], resolved: Resolved, workers: Sequence[WorkerEntry] = ()
) -> str:
    """The effective configuration as TOML that would give it: every setting with its
    value and where it came from; an unset one commented out; a secret never shown (its
    count only); then the file's workers."""
    lines = ["# pd-policy-proxy: the effective configuration (flag > env > file > default)"]
    group = None
    for setting in settings:
        if setting.group != group:
            group = setting.group
            lines += ["", f"# {group}"]
        value = getattr(resolved.args, setting.key)
        source = resolved.sources.get(setting.key, "default")
        if setting.secret:
            lines.append(f"# {setting.key}: {_hidden(value)} ({source})")
        elif value is None:
            lines.append(f"# {setting.key} = (unset)  # {source}")
        else:
            lines.append(f"{setting.key} = {_toml(value)}  # {source}")
    for entry in workers:
        lines += ["", "[[workers]]"]
        for name, value in _entry_items(entry):
            lines.append(f"{name} = {_toml(value)}")
    return "\n".join(lines) + "\n"


def _entry_items(entry: WorkerEntry) -> Iterable[tuple[str, Any]]:
    for name in entry.__slots__:
        value = getattr(entry, name, None)
        if value is None or value == {} or name.startswith("__"):
            continue
        yield name, value.value if hasattr(value, "value") else value


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_table(settings: Sequence[Setting], reloaded: Collection[str] = ()) -> str:
    """The docs' table of every setting, by group: its file key, its flags, its
    environment variable, its default, what a reload does to it (applied, for a key in
    ``reloaded``; else it takes a restart) and its help."""
    out = []
    group = None
    for setting in settings:
        if setting.group != group:
            if group is not None:
                out.append("")
            group = setting.group
            out += [f"**{group}**", "",
                    "| key | flag | environment | default | on reload | meaning |"]  # fmt: skip
            out.append("|---|---|---|---|---|---|")
        default = setting.default
        shown = "" if default is None or default == [] else _toml(default)
        kind = " (list)" if setting.kind is Kind.LIST else ""
        flags = ", ".join(f"`{f}`" for f in setting.flags)
        out.append(
            f"| `{setting.key}`{kind} | {flags} | `{setting.env}` | "
            f"{'`' + _cell(shown) + '`' if shown else ''} | "
            f"{'applied' if setting.key in reloaded else 'restart'} | {_cell(setting.help)} |"
        )
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pd_policy_vllm.http.config.shown --write docs/configuration.md``: write
    the settings table into the page (``make docs-tables``); without ``--write``, print it."""
    import argparse

    from pd_policy.tools.tables import splice
    from pd_policy_vllm.http.flags import parser

    from .reloaded import RELOADED
    from .settings import settings

    cli = argparse.ArgumentParser(description=main.__doc__)
    cli.add_argument("--write", type=Path, metavar="PAGE")
    args = cli.parse_args(argv)
    table = settings_table(settings(parser()), RELOADED)
    if args.write is None:
        print(table)
    else:
        args.write.write_text(splice(args.write.read_text(), TABLE_NAME, table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
