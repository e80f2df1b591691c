"""``docs/security.md`` agrees with the code: each limit's default is the flag's, each
hostile worker's status is the one its error maps to, and each refusal it names exists."""

from __future__ import annotations

import re
from pathlib import Path

from pd_policy import ERROR_CATALOG
from pd_policy_vllm.http.flags import parser
from pd_policy_vllm.http.upstream import DEFAULT_LIMITS

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def _limits() -> dict[str, str]:
    rows = re.findall(r"^\| `(--[a-z-]+)` \| ([^|]+) \|", DOC.read_text(encoding="utf-8"), re.M)
    return {flag: default.strip() for flag, default in rows}


def test_every_limit_in_the_table_is_the_flags_default() -> None:
    documented = _limits()
    defaults = {option: action.default for action in parser()._actions
                for option in action.option_strings}  # fmt: skip
    assert len(documented) >= 10
    for flag, default in documented.items():
        assert flag in defaults, f"{flag} is not a flag of pd-policy-proxy"
        value = defaults[flag]
        shown = "none" if value is None else str(value) if isinstance(value, int) else f"{value:g}"
        assert shown == default, flag


def test_every_limit_flag_is_in_the_table() -> None:
    # A limit added without its line here is a limit an operator cannot find.
    limits = {option for action in parser()._actions for option in action.option_strings
              if re.search(r"timeout|max-|attempts", option)} - {"--startup-timeout"}  # fmt: skip
    assert limits <= set(_limits()), limits - set(_limits())


def test_the_fixed_bounds_are_the_codes() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert f"at most {DEFAULT_LIMITS.max_head_bytes // 1024} KiB" in text
    assert f"{DEFAULT_LIMITS.connect_timeout:g} s to connect to a worker" in text


def test_every_error_code_named_is_in_the_catalog() -> None:
    named = set(
        re.findall(r"`((?:pd|prefill|decode|no)_[a-z_]+)`", DOC.read_text(encoding="utf-8"))
    )
    assert named and named <= set(ERROR_CATALOG), named - set(ERROR_CATALOG)
    for code in named:
        status = ERROR_CATALOG[code].status
        assert re.search(rf"{status} `{code}`", DOC.read_text(encoding="utf-8")), code
