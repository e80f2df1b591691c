"""Keeping keys out of the proxy's log.

``aiohttp``'s server answers a header line it cannot parse with a 400 and logs the
line, in the traceback of an ERROR record of ``aiohttp.server``: a client that sends
``Authorization: Bearer KEY`` followed by a byte no header may hold puts its key in the
log. So the proxy puts one filter on ``aiohttp``'s loggers, its own and ``asyncio``'s
(where an exception no task retrieved is logged): every record's message (its
arguments merged in), traceback and stack lose every key the proxy knows
([`Redactor`][pd_policy_vllm.http.redact.Redactor]) and any credential by its pattern,
known or not: what follows ``Bearer``, ``Basic`` or an ``Authorization`` header name,
and the user information of a URL (``http://user:password@host``). A record whose
traceback it changed carries it as text only (``exc_text``): a handler that would format
the exception itself finds none to print.

One filter serves the process; [`install`][pd_policy_vllm.http.log_filter.install] adds
a proxy's keys to it (two proxies in one process: both their keys) and puts it on the
loggers. A logger created after it, outside those names, is not covered, nor is a
handler's own record of what a request carried (an access-log format that prints a
header, say).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Final

from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.redact import REDACTED, Redactor

__all__ = ["FILTER", "KeysFilter", "install", "redacted"]

#: The loggers filtered: ``aiohttp``'s, the proxy's and ``asyncio``'s, with every logger
#: under them that exists when the filter is installed.
LOGGERS: Final = (
    "aiohttp", "aiohttp.access", "aiohttp.client", "aiohttp.internal", "aiohttp.server",
    "aiohttp.web", "aiohttp.websocket", "asyncio", "pd_policy", "pd_policy_vllm",
    "pd_policy_vllm.http", "pd_policy_vllm.http.admin", "pd_policy_vllm.http.requests",
)  # fmt: skip
_UNDER: Final = ("aiohttp.", "pd_policy")

# A credential by its pattern: a Bearer or Basic token (up to a blank or a quote, so a key
# followed by a byte aiohttp escapes goes whole), an Authorization header's value of no
# known scheme, and a URL's user information.
_SCHEMES: Final = re.compile(r"(?i)\b(bearer|basic)(\s+)[^\s'\"]+")
_HEADER: Final = re.compile(
    r"(?i)(authorization['\"]?\s*[:=]\s*['\"]?)(?!(?:bearer|basic)\s)[^\s'\",;]+"
)
_USERINFO: Final = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"]+@")


def redacted(text: str, redactor: Redactor) -> str:
    """``text`` without ``redactor``'s keys and without any credential by its pattern."""
    text = redactor.text(text)
    text = _SCHEMES.sub(rf"\1\2{REDACTED}", text)
    text = _HEADER.sub(rf"\1{REDACTED}", text)
    return _USERINFO.sub(rf"\1{REDACTED}@", text)


class KeysFilter(logging.Filter):
    """Redacts each record it sees (see the module docs); never drops one."""

    def __init__(self) -> None:
        super().__init__()
        self._keys: set[str] = set()
        self.redactor = Redactor()

    def add(self, keys: Iterable[str | None]) -> None:
        """Redact ``keys`` too, from now on."""
        new = {k for k in keys if k} - self._keys
        if new:
            self._keys |= new
            self.redactor = Redactor(self._keys)

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = self.redactor
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit: the handler reports it
            message = None
        if message is not None:
            clean = redacted(message, redactor)
            if clean != message:
                record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            text = logging.Formatter().formatException(record.exc_info)
            clean = redacted(text, redactor)
            if clean != text:  # its text only: the exception still holds the key
                record.exc_text, record.exc_info = clean, None
        elif record.exc_text:
            record.exc_text = redacted(record.exc_text, redactor)
        if record.stack_info:
            record.stack_info = redacted(record.stack_info, redactor)
        return True


#: The process's one filter.
FILTER: Final = KeysFilter()


def install(keys: Keys) -> None:
    """Redact ``keys`` (the workers', the clients', the admins') from the log, and put
    the filter on the loggers (see the module docs). Idempotent."""
    FILTER.add((keys.worker, *keys.clients, *keys.admins))
    names = set(LOGGERS) | {
        name for name in logging.root.manager.loggerDict if name.startswith(_UNDER)
    }
    for name in sorted(names):
        logging.getLogger(name).addFilter(FILTER)
