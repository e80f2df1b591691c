"""The values a setting takes beyond a number or a word: each parses a flag's text (and the
environment's, and the file's), raising ``argparse.ArgumentTypeError`` with why not."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["bind_host", "json_object", "ratio", "seconds"]


def bind_host(value: str) -> str:
    """An address to bind; an IPv6 literal as a URL writes it (``[::1]``) binds as the
    bare address."""
    return value[1:-1] if value.startswith("[") and value.endswith("]") else value


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value


def ratio(text: str) -> float:
    """A share, from 0 to 1."""
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, not {text}")
    return value


def json_object(text: str) -> dict[str, Any]:
    """A JSON object, as vLLM's ``--kv-transfer-config`` takes one."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object, as vLLM's --kv-transfer-config takes")
    return value
