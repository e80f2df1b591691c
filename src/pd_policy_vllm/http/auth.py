"""Who may call the proxy, and the key it calls its workers with.

Production workers run ``vllm serve --api-key``, and a proxy is a front door. The
workers' key goes on every leg (``Authorization: Bearer``); the clients' keys, when any
are set, are required of every request but ``/health``, and compared in constant time.
The admins' keys are another set: only they admit ``/admin/*`` (a client's key never
does), and they admit nothing else unless also listed as a client's. Keys come from the
environment or from files (an admin key also from ``--admin-api-key``, for a start-up
script that has it), and no repr, log line, error or metric ever holds one: an admin is
logged by [`key_id`][pd_policy_vllm.http.auth.key_id].
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import attrs

from pd_policy import InvalidConfiguration
from pd_policy_vllm.openai.media.tenant import bearer

__all__ = [
    "ADMIN_KEYS_ENV",
    "CLIENT_KEYS_ENV",
    "WORKER_KEY_ENV",
    "Keys",
    "bearer",
    "for_url",
    "key_id",
    "read_keys",
]

#: The environment variable the workers' key is read from.
WORKER_KEY_ENV: Final = "PD_POLICY_WORKER_API_KEY"
#: The environment variable the clients' keys are read from (comma-separated).
CLIENT_KEYS_ENV: Final = "PD_POLICY_API_KEYS"
#: The environment variable the admins' keys are read from (comma-separated).
ADMIN_KEYS_ENV: Final = "PD_POLICY_ADMIN_API_KEYS"


def _hidden(value: object) -> str:
    return "<unset>" if not value else "<redacted>"


def key_id(key: str) -> str:
    """The name a key is logged by: the first 8 hex digits of its SHA-256, which say which
    key it was (``printf %s "$KEY" | sha256sum | cut -c1-8``) and not what it is."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def _matching(authorization: str | None, keys: Sequence[str]) -> str | None:
    # Every key is compared, each in constant time, with no early exit: the time taken
    # says nothing about which key, or how much of one, matched.
    presented = bearer(authorization)
    if presented is None:
        return None
    given = presented.encode("utf-8", "surrogatepass")
    found = None
    for key in keys:
        if hmac.compare_digest(given, key.encode("utf-8", "surrogatepass")):
            found = key
    return found


@attrs.frozen(slots=True)
class Keys:
    """The workers' key (``None``: they take none), the keys clients may present
    (empty: any client may call) and the admins' keys (empty: no one is an admin)."""

    worker: str | None = attrs.field(default=None, repr=_hidden)
    clients: tuple[str, ...] = attrs.field(default=(), repr=_hidden)
    admins: tuple[str, ...] = attrs.field(default=(), repr=_hidden)

    def worker_headers(self) -> dict[str, str]:
        """The headers every leg to a worker carries."""
        return {"Authorization": f"Bearer {self.worker}"} if self.worker else {}

    def admits(self, authorization: str | None) -> bool:
        """Whether a request whose ``Authorization`` header is ``authorization`` may call.

        Every key is compared, each in constant time, so the time taken says nothing about
        which key, or how much of one, matched. An admin's key is not a client's."""
        return not self.clients or _matching(authorization, self.clients) is not None

    def admin(self, authorization: str | None) -> str | None:
        """The [`key_id`][pd_policy_vllm.http.auth.key_id] of the admin whose key
        ``authorization`` presents; ``None`` for anyone else (no key, a client's key, a
        wrong one). Compared as [`admits`][pd_policy_vllm.http.auth.Keys.admits] does."""
        found = _matching(authorization, self.admins)
        return key_id(found) if found is not None else None


def for_url(headers: Mapping[str, str] | None, url: str) -> dict[str, str]:
    """``headers`` for a call to ``url``. A worker URL that carries its own credentials
    (``http://user:password@host``) is called with them, and the workers' key is left
    off: one request has one ``Authorization``, and aiohttp refuses both (a 500 for the
    client, where the operator asked for the URL's)."""
    out = dict(headers or {})
    if "@" in urlsplit(url).netloc:
        out.pop("Authorization", None)
    return out


def _lines(path: Path, what: str) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError):
        # The path may be secret-bearing; name the setting, not the file's content.
        raise InvalidConfiguration(f"cannot read the {what} file", param=what) from None
    # Stripped before the comment check: an indented "# old key" is a comment, not a key.
    stripped = (line.strip() for line in text.splitlines())
    return [line for line in stripped if line and not line.startswith("#")]


def read_keys(
    env: Mapping[str, str] | None = None,
    *,
    worker_key_file: Path | None = None,
    client_keys_file: Path | None = None,
    admin_keys: Sequence[str] = (),
    admin_keys_file: Path | None = None,
) -> Keys:
    """The keys, from files when given, else from the environment (``env``: the process's
    by default). A worker key file holds one key; a client or admin keys file one key a
    line (``#`` starts a comment). The admins' are ``admin_keys`` (``--admin-api-key``)
    and those of their file or, without one, of the environment. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a file that
    cannot be read, or that holds no key, or more than one worker key."""
    env = os.environ if env is None else env
    if worker_key_file is not None:
        lines = _lines(worker_key_file, "worker_api_key_file")
        if len(lines) != 1:
            raise InvalidConfiguration(
                "the worker key file must hold one key", param="worker_api_key_file"
            )
        worker: str | None = lines[0]
    else:
        worker = env.get(WORKER_KEY_ENV) or None
    if client_keys_file is not None:
        clients = _lines(client_keys_file, "api_keys_file")
        if not clients:
            raise InvalidConfiguration("the client keys file holds no key", param="api_keys_file")
    else:
        clients = _listed(env, CLIENT_KEYS_ENV)
    if admin_keys_file is not None:
        admins = _lines(admin_keys_file, "admin_api_keys_file")
        if not admins:
            raise InvalidConfiguration(
                "the admin keys file holds no key", param="admin_api_keys_file"
            )
    else:
        admins = _listed(env, ADMIN_KEYS_ENV)
    admins = [k.strip() for k in admin_keys if k.strip()] + admins
    return Keys(worker, tuple(clients), tuple(admins))


def _listed(env: Mapping[str, str], name: str) -> list[str]:
    return [k.strip() for k in env.get(name, "").split(",") if k.strip()]
