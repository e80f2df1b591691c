"""How the proxy's log lines look: ``--log-format text`` (the default) or ``json``.

Every line carries an ISO-8601 UTC timestamp (milliseconds), its level and its logger.
In JSON each line is one object (``time``, ``level``, ``logger``, ``message``, and
``exception`` with a traceback); a request's own record (the
``pd_policy_vllm.http.requests`` line) is its fields at the top level of that object, so
a log pipeline parses it with no prefix to strip. A line logged while a request is
served carries its ``request_id`` (the proxy's, the one its workers saw) and, when the
client sent a W3C ``traceparent``, its ``trace_id``. What a line may say is the log
filter's to redact ([`log_filter`][pd_policy_vllm.http.log_filter]): it runs before
any formatter.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, Final

from pd_policy.trace_context import trace_id_of

__all__ = [
    "FORMATS",
    "REQUEST_ID",
    "TRACE_ID",
    "JsonFormatter",
    "TextFormatter",
    "configure",
    "trace_id_of",
]

#: The formats ``--log-format`` takes.
FORMATS: Final = ("text", "json")
#: The request being served by the running task, and its client's trace (if any).
REQUEST_ID: Final[ContextVar[str | None]] = ContextVar("pd_policy_request_id", default=None)
TRACE_ID: Final[ContextVar[str | None]] = ContextVar("pd_policy_trace_id", default=None)


def _time(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _context(record: logging.LogRecord) -> dict[str, str]:
    seen = {"request_id": REQUEST_ID.get(), "trace_id": TRACE_ID.get()}
    return {key: value for key, value in seen.items() if value is not None}


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE``, and `` [request_id=... trace_id=...]`` while a
    request is served."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_time(record)} {record.levelname} {record.name}: {record.getMessage()}"
        context = _context(record)
        if context and not isinstance(getattr(record, "fields", None), Mapping):
            line += " [" + " ".join(f"{k}={v}" for k, v in context.items()) + "]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module docs)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _time(record), "level": record.levelname,
                                "logger": record.name}  # fmt: skip
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):  # a request's record: its fields are the line
            line.update(_context(record))
            line.update({k: v for k, v in fields.items() if k not in ("time", "level", "logger")})
        else:
            line["message"] = record.getMessage()
            line.update(_context(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The proxy's own handler on the root logger: the one ``configure`` replaces. It
    writes to the standard error the process has when a record comes, not the one it
    had when configured (a host, or a test's capture, may have swapped it since)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure(log_format: str = "text", level: int = logging.INFO) -> None:
    """Log to standard error in ``log_format`` (one of ``FORMATS``), at ``level``. The
    handler a previous call put on the root logger is replaced; any other is left (a
    host application's, a test's). Raises ``ValueError`` for another format."""
    if log_format not in FORMATS:
        raise ValueError(f"no log format {log_format!r} (one of {', '.join(FORMATS)})")
    handler = _Handler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
